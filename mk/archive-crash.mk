# SIGKILL trials on the archive path (rollback-journal mode beside a live Hermes 0.22.2) and on
# the restore of archived sessions, beyond what `make test` runs. Included by the Makefile's
# `-include $(wildcard mk/*.mk)`.
#
#   make crash-trials-archive                        a kill at every step of the archive, the prune and the restore,
#                                                    plus ARCHIVE_CRASH_TRIALS random kills (default 20)
#   make crash-trials-archive CRASH_SEED=4242 ARCHIVE_CRASH_TRIALS=1   replay one random kill
#
# `make test` runs the same tests at every step of the archive and every tenth of the prune,
# with 4 random kills.

ARCHIVE_CRASH_TRIALS ?= 20
CRASH_SEED ?=

.PHONY: crash-trials-archive

crash-trials-archive: $(STAMP) collection-link ## SIGKILL the archive path and the session restore at every step (needs the 0.22.2 venv)
	@HERMES_ARCHIVE_KILL_POINTS=all HERMES_ARCHIVE_CRASH_TRIALS=$(ARCHIVE_CRASH_TRIALS) HERMES_CRASH_SEED=$(CRASH_SEED) \
		bash scripts/pytest.sh $(BIN)/pytest tests/unit/plugins/module_utils/test_archive_crash.py \
		-s --timeout=0 $(PYTEST_ARGS)
