# Reliability runs beyond `make test` (included by the Makefile's `-include $(wildcard mk/*.mk)`).
#
#   make crash-trials                          200 SIGKILL trials, random base seed (printed)
#   make crash-trials CRASH_TRIALS=1000        more
#   make crash-trials CRASH_SEED=4242 CRASH_TRIALS=1   replay one trial printed by a failing run
#   make reliability                           every reliability test once (crash trials at the CI count)
#
# `make test` runs the same tests with the defaults HERMES_CRASH_TRIALS=20, HERMES_RESTORE_CRASH_TRIALS=8.

CRASH_TRIALS ?= 200
RESTORE_CRASH_TRIALS ?= 50
CRASH_SEED ?=
RELIABILITY_TESTS := tests/unit/plugins/module_utils/test_crash_safety.py \
	tests/unit/plugins/module_utils/test_full_disk.py \
	tests/unit/plugins/module_utils/test_permissions.py \
	tests/unit/plugins/module_utils/test_contention.py \
	tests/unit/plugins/module_utils/test_bad_input.py

.PHONY: crash-trials reliability

crash-trials: $(STAMP) collection-link ## SIGKILL maintenance (CRASH_TRIALS, default 200) and restore (RESTORE_CRASH_TRIALS, 50) at random points
	@HERMES_CRASH_TRIALS=$(CRASH_TRIALS) HERMES_RESTORE_CRASH_TRIALS=$(RESTORE_CRASH_TRIALS) HERMES_CRASH_SEED=$(CRASH_SEED) \
		bash scripts/pytest.sh $(BIN)/pytest tests/unit/plugins/module_utils/test_crash_safety.py \
		tests/unit/plugins/module_utils/test_restore_engine.py -k "sigkill" -s --timeout=0 $(PYTEST_ARGS)

reliability: $(STAMP) collection-link ## crash, full disk, permissions, contention, bad input tests; then restore.yml end to end
	@bash scripts/pytest.sh $(BIN)/pytest $(RELIABILITY_TESTS) -m "$(PYTEST_MARKERS)" $(PYTEST_ARGS)
	@$(ANSIBLE_ENV) bash scripts/pytest.sh $(BIN)/pytest tests/integration/test_restore.py $(PYTEST_ARGS)
