# Benchmark and full-size live-writer proof (the figures docs/benchmarks.md quotes). Included by the Makefile's
# `-include $(wildcard mk/*.mk)`; nothing here is part of `make test`.
#
#   make bench        bench/run.py: Hermes 0.19.0's prune+vacuum vs ours at 50k/200k/800k
#                     messages under a live writer; prints the targets table, writes
#                     bench/results/wal-0.19.json and rewrites docs/benchmarks.md with its plots
#   make bench-sweep  the same plus the batch_size x batch_pause x batch_time grid behind the defaults
#   make bench-report docs/benchmarks.md, its plots (docs/benchmarks/*.png) and bench/results/*.md
#                     rewritten from bench/results/*.json alone (no run; seconds)
#   make live-full    tests/unit/.../test_live_writer.py at the full size (prunes 110k messages)
#   make bench-durability  bench/durability.py: what the power-loss fsyncs cost beside the 20 ms writer
#                     (WAL commit with and without commits_durable, rollback journal EXTRA vs FULL);
#                     prints its table (about 3 minutes; the controller venv, no plots)
#   make bench-elision  bench/elision.py: tool-payload elision (tool_payload_days: 30) on a 0.7 GB 0.22.2
#                     file whose bytes are mostly tool output (made once into build/bench/), beside a
#                     0.22.2 writer appending every 20 ms and once with no holder: bodies/s, the writer's
#                     worst stall, and `storage` before and after; prints its table (ELISION_BENCH_ARGS:
#                     e.g. --compare <another checkout> --runs 2)
#   make bench-gateway  bench/gateway.py: what a client of a REAL Hermes 0.22.2 gateway (a request every
#                     100 ms) sees during our prune and during `hermes sessions prune --force`, on a 0.7 GB
#                     file (GATEWAY_BENCH_ARGS="--sizes 0.7GB,5GB": also 5 GB, its template made once into
#                     build/bench-gateway/, ~20 min); writes bench/results/gateway-0.22.json and rewrites
#                     docs/benchmarks.md. Measure on a quiet machine (under
#                     `flock /tmp/hermes-host.lock` on a shared one)
#
# The bench targets run in their own venv (.cache/bench-venv, requirements/bench.txt: matplotlib
# for the plots), made on first use; `make test` and CI never make it.
#
# The release matrix itself runs in `make test` (tests/unit/.../test_release_resume.py,
# test_scenarios.py); `make matrix` (Makefile) runs whatever is marked `matrix`.

BENCH_ARGS ?=
ELISION_BENCH_ARGS ?=
GATEWAY_BENCH_ARGS ?=
BENCH_VENV ?= $(CURDIR)/.cache/bench-venv
BENCH_PY := $(BENCH_VENV)/bin/python

.PHONY: bench bench-sweep bench-setup bench-report live-full bench-durability bench-elision bench-gateway

$(BENCH_VENV)/.stamp: requirements/bench.txt
	test -x $(BENCH_PY) || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install --quiet --no-input -r requirements/bench.txt $(PIP_FILTER)
	touch $@

bench-setup: $(BENCH_VENV)/.stamp ## the venv of the bench targets (.cache/bench-venv: matplotlib for the plots)

bench-report: bench-setup ## rewrite docs/benchmarks.md and its plots from bench/results/*.json (no run)
	$(BENCH_PY) bench/report.py

bench: $(STAMP) collection-link bench-setup ## benchmark vs Hermes's own prune (not CI; ~15 min; writes docs/benchmarks.md)
	$(BENCH_PY) bench/run.py $(BENCH_ARGS)

bench-sweep: $(STAMP) collection-link bench-setup ## bench plus the batch_size x batch_pause x batch_time grid (writes the docs page)
	$(BENCH_PY) bench/run.py --sweep $(BENCH_ARGS)

live-full: $(STAMP) collection-link ## live-writer test at full size (prune of 110k messages under a 20 ms writer)
	@HERMES_LIVE_SIZE=full bash scripts/pytest.sh $(BIN)/pytest tests/unit/plugins/module_utils/test_live_writer.py \
		-m "" $(PYTEST_ARGS)

bench-durability: $(STAMP) collection-link ## what the power-loss fsyncs cost beside a live 20 ms writer (prints a table; ~3 min)
	$(BIN)/python bench/durability.py $(BENCH_ARGS)

bench-elision: $(STAMP) collection-link ## tool-payload elision beside a live 20 ms writer on a 0.7 GB tool-heavy file (prints a table)
	$(BIN)/python bench/elision.py $(ELISION_BENCH_ARGS)

bench-gateway: $(STAMP) collection-link bench-setup ## a real 0.22.2 gateway's clients during our prune and Hermes's --force one (0.7 GB; writes docs/benchmarks.md)
	$(BENCH_PY) bench/gateway.py $(GATEWAY_BENCH_ARGS)
