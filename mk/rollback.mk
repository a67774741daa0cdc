# Rollback-journal mode (Hermes >= 0.20 on an SQLite with the WAL-reset bug runs journal_mode=DELETE).
# Included by the Makefile's `-include $(wildcard mk/*.mk)`; nothing here is part of `make test`
# (which runs tests/unit/.../test_live_rollback.py at its reduced size, 40k messages).
#
#   make live-full-delete   test_live_rollback.py at full size: 120k messages, a real 0.22.2 SessionDB
#                           appending every 20 ms in DELETE mode through a whole run (prunes 60k)
#   make bench-rollback     bench/run.py --rollback: 0.22.2's own prune vs ours in DELETE mode at
#                           50k / 200k / 800k messages; writes bench/results/delete-0.22.json and
#                           rewrites docs/benchmarks.md (the venv of mk/bench.mk's bench-setup)
#                           (run it under `flock /tmp/hermes-host.lock` on a shared machine)
#   make bench-current-wal  bench/run.py --current-wal: the same rows in WAL mode, on Debian sid's
#                           libsqlite3 3.53.4 (free of the WAL-reset bug; scripts/build_sqlite.sh);
#                           writes bench/results/wal-0.22.json and rewrites docs/benchmarks.md
#   make bench-large        bench-rollback's runs (one round) on a ~5 GB file: 7.4M messages with
#                           0.22.2's schema, generated once (in chunks of 800k messages) into
#                           .cache/bench-large and kept there; needs ~20 GB free (the base file,
#                           a copy per run, the backup's copy); as root also the refusal before any
#                           write on a tmpfs that cannot hold the backup or a VACUUM (--refusals);
#                           writes bench/results/delete-0.22-large.json
#   make bench-idle         bench-rollback's runs beside a gateway that holds the file but does not
#                           write (its SessionDB open, no append during the run): the idle target
#                           (0.9x the rows/s of the ceiling run beside it); writes
#                           bench/results/delete-0.22-idle.json

ROLLBACK_BENCH_ARGS ?=
LARGE_SIZE ?= 7400k
LARGE_WORKDIR ?= $(CURDIR)/.cache/bench-large
LARGE_BENCH_ARGS ?=
IDLE_BENCH_ARGS ?=

.PHONY: live-full-delete bench-rollback bench-current-wal bench-large bench-idle

live-full-delete: $(STAMP) collection-link ## live test in DELETE mode at full size (120k messages, real 0.22.2 writer)
	@HERMES_LIVE_SIZE=full bash scripts/pytest.sh $(BIN)/pytest tests/unit/plugins/module_utils/test_live_rollback.py \
		-m "" $(PYTEST_ARGS)

bench-rollback: $(STAMP) collection-link bench-setup ## DELETE-mode bench: 0.22.2 prune vs ours (rewrites docs/benchmarks.md)
	$(BENCH_PY) bench/run.py --rollback $(ROLLBACK_BENCH_ARGS)

bench-current-wal: $(STAMP) collection-link bench-setup ## WAL-mode bench on a fixed SQLite: 0.22.2 prune vs ours (rewrites the page)
	@lib=$$(bash scripts/build_sqlite.sh sid | tail -n 1) && LD_LIBRARY_PATH=$$lib \
		$(BENCH_PY) bench/run.py --current-wal $(ROLLBACK_BENCH_ARGS)

bench-large: $(STAMP) collection-link bench-setup ## bench-rollback on a ~5 GB 0.22.2 file (made once into .cache/bench-large)
	$(BENCH_PY) bench/run.py --rollback --label large --sizes $(LARGE_SIZE) --runs 1 --workdir $(LARGE_WORKDIR) --refusals \
		$(LARGE_BENCH_ARGS)

bench-idle: $(STAMP) collection-link bench-setup ## bench-rollback beside a gateway that holds the file but does not write
	$(BENCH_PY) bench/run.py --rollback --label idle --writer-interval 3600 --runs 2 $(IDLE_BENCH_ARGS)
