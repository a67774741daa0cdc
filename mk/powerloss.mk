# Power-loss trials beyond `make test` (included by the Makefile's `-include $(wildcard mk/*.mk)`).
#
#   make powerloss-trials                                  every path, every crash point, both models, every negative control
#   make powerloss-trials POWERLOSS_PATHS=restore POWERLOSS_CONTROLS=none   one path, no controls
#
# `make test` runs tests/unit/plugins/module_utils/test_powerloss.py: four crash points per path
# (HERMES_POWERLOSS_POINTS), the release's read and the rerun on every fourth state
# (HERMES_POWERLOSS_DEEP), each negative control and eatmydata. Needs strace and eatmydata (CI installs both).

# Empty: every path of tests/lib/powerloss_paths.py (PATHS), every control (CONTROLS, and eatmydata).
POWERLOSS_PATHS ?=
POWERLOSS_CONTROLS ?=
# The real release's read and the maintenance rerun on every POWERLOSS_DEEP-th state (1: each one).
POWERLOSS_DEEP ?= 1

.PHONY: powerloss-trials

powerloss-trials: $(STAMP) collection-link ## power loss: crash states of recorded runs, every path in the strict and ext4 models, and the negative controls
	@$(BIN)/python tests/lib/powerloss_trials.py $(if $(POWERLOSS_PATHS),--paths "$(POWERLOSS_PATHS)") \
		$(if $(POWERLOSS_CONTROLS),--controls "$(POWERLOSS_CONTROLS)") --deep $(POWERLOSS_DEEP)
