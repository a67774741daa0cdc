# Next to a live Hermes (docs/safety.md): holders /proc cannot show, the WAL-reset rule,
# Hermes's lock family and auto-maintenance, Litestream replicas.
#
#   make live-hermes      tests/unit/.../test_live_hermes.py (root: gateways under another uid)
#   make bench-wal        the WAL left on the 800k bench file when the engine may not checkpoint
#   make restore-noptrace test_restore.py's refusal in a fresh podman container without CAP_SYS_PTRACE

.PHONY: live-hermes bench-wal restore-noptrace

live-hermes: $(STAMP) collection-link ## tests next to a live Hermes (real 0.22.2 locks, unreadable /proc, WAL-reset rule)
	bash scripts/pytest.sh $(BIN)/pytest tests/unit/plugins/module_utils/test_live_hermes.py $(PYTEST_ARGS)

bench-wal: $(STAMP) collection-link ## WAL left on the 800k bench file with checkpoints off (prints JSON)
	$(BIN)/python bench/wal_left.py --size $(or $(WAL_SIZE),800k)

restore-noptrace: $(STAMP) collection-link ## restore refusal test in a podman container without CAP_SYS_PTRACE (root)
	bash scripts/restore-noptrace.sh $(PYTEST_ARGS)
