# Benchmark and full-size live-writer proof (the figures docs/benchmarks.md quotes). Included by the Makefile's
# `-include $(wildcard mk/*.mk)`; nothing here is part of `make test`.
#
#   make bench        bench/run.py: Hermes 0.19.0's prune+vacuum vs ours at 50k/200k/800k
#                     messages under a live writer; prints the table, writes docs/benchmarks.md
#   make bench-sweep  the same plus the batch_size x batch_pause x batch_time grid behind the defaults
#   make live-full    tests/unit/.../test_live_writer.py at the full size (prunes 110k messages)
#
# The release matrix itself runs in `make test` (tests/unit/.../test_release_resume.py,
# test_scenarios.py); `make matrix` (Makefile) runs whatever is marked `matrix`.

BENCH_ARGS ?=

.PHONY: bench bench-sweep live-full

bench: $(STAMP) collection-link ## benchmark vs Hermes's own prune (not CI; ~15 min; writes docs/benchmarks.md)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

bench-sweep: $(STAMP) collection-link ## bench plus the batch_size x batch_pause x batch_time grid (writes the docs page)
	$(BIN)/python bench/run.py --sweep $(BENCH_ARGS)

live-full: $(STAMP) collection-link ## live-writer test at full size (prune of 110k messages under a 20 ms writer)
	@HERMES_LIVE_SIZE=full bash scripts/pytest.sh $(BIN)/pytest tests/unit/plugins/module_utils/test_live_writer.py \
		-m "" $(PYTEST_ARGS)
