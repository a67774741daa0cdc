# Power-loss trials beyond `make test` (included by the Makefile's `-include $(wildcard mk/*.mk)`).
#
#   make powerloss-trials                                  every path, every crash point, both models, every negative control
#   make powerloss-trials POWERLOSS_PATHS=restore POWERLOSS_CONTROLS=none   one path, no controls
#
# `make test` runs tests/unit/plugins/module_utils/test_powerloss.py: four crash points per path
# (HERMES_POWERLOSS_POINTS) and each negative control. Needs strace (CI installs it).

POWERLOSS_PATHS ?= prune-wal-frames,prune-wal-gz-vacuum,prune-rollback-vacuum,restore,session-restore,file-retention,metrics-log
POWERLOSS_CONTROLS ?= backup_dir_created_durably,transcripts_after_durable_commit,rollback_synchronous_extra,restore_aside_durable,session_restore_pending_after_commits,retention_newest_durable,metrics_rename_durable,runner_log_durable

.PHONY: powerloss-trials

powerloss-trials: $(STAMP) collection-link ## power loss: crash states of recorded runs, every path in the strict and ext4 models, and the negative controls
	@$(BIN)/python tests/lib/powerloss_trials.py --paths "$(POWERLOSS_PATHS)" --controls "$(POWERLOSS_CONTROLS)"
