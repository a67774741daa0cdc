# Our prune against each Hermes release's own prune_sessions, on many random files.
# `make test` runs the same test with HERMES_RULE_SEEDS=2 files per release (~40 s);
# this target runs more (RULE_SEEDS, default 25: about 5 minutes).
#
#   make release-rules [RULE_SEEDS=N]

RULE_SEEDS ?= 25

.PHONY: release-rules

release-rules: $(STAMP) collection-link ## our prune vs 0.19.0 / 0.20.1 / 0.22.2's own, on RULE_SEEDS random files each
	@HERMES_RULE_SEEDS=$(RULE_SEEDS) bash scripts/pytest.sh $(BIN)/pytest \
		tests/unit/plugins/module_utils/test_release_rules.py -m "" $(PYTEST_ARGS)
