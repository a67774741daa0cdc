# Metrics and alerts: the textfile metrics the runner writes, parsed by prometheus_client's
# own parser and `promtool check metrics`, and the shipped alerting rules checked and
# unit-tested with `promtool check rules` / `promtool test rules`.
# promtool: the one on PATH (Debian: apt-get install prometheus), else extracted from the
# Debian package into .cache/prometheus without installing it (no server is started).

METRICS_VENV := $(CURDIR)/.cache/metrics-venv
PROMTOOL ?= $(or $(shell command -v promtool 2>/dev/null),$(CURDIR)/.cache/prometheus/usr/bin/promtool)
ALERT_RULES := roles/session_maintenance/files/prometheus/hermes-ops.rules.yml
ALERT_TESTS := tests/prometheus/hermes-ops.rules.test.yml

.PHONY: metrics metrics-setup alert-rules

metrics-setup: $(METRICS_VENV)/.stamp $(PROMTOOL) ## venv with prometheus_client, promtool

$(METRICS_VENV)/.stamp: requirements/metrics.txt
	test -x $(METRICS_VENV)/bin/python || $(PYTHON) -m venv $(METRICS_VENV)
	$(METRICS_VENV)/bin/python -m pip install --quiet --no-input -r requirements/metrics.txt $(PIP_FILTER)
	touch $@

$(CURDIR)/.cache/prometheus/usr/bin/promtool:
	mkdir -p .cache/debs
	# Debian 13 ships promtool as a package of its own, Debian 12 inside prometheus.
	cd .cache/debs && { apt-get download promtool 2>/dev/null || apt-get download prometheus; }
	for deb in .cache/debs/*.deb; do dpkg-deb -x "$$deb" .cache/prometheus; done
	test -x $@

alert-rules: $(PROMTOOL) ## promtool check rules + test rules on the shipped alerting rules
	$(PROMTOOL) check rules $(ALERT_RULES)
	$(PROMTOOL) test rules $(ALERT_TESTS)

metrics: $(STAMP) collection-link metrics-setup alert-rules ## metrics written by real runs, parsed; the alert rules tested
	HERMES_METRICS_REQUIRED=1 HERMES_METRICS_PYTHON=$(METRICS_VENV)/bin/python HERMES_PROMTOOL=$(PROMTOOL) \
		$(BIN)/pytest -q tests/unit/plugins/module_utils/test_metrics.py
