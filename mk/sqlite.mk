# SQLite matrix (included by the Makefile's `-include $(wildcard mk/*.mk)`): the engine unit
# tests, real-release scenarios included, on the SQLite of Debian 12 (the system's), Debian 13
# (trixie, 3.46) and Debian sid (3.53, free of the WAL-reset bug, so Hermes 0.22 runs WAL).
#
#   make matrix-sqlite                       trixie and sid (system: `make unit`, or MATRIX_SQLITES="system trixie sid")
#   make matrix-sqlite MATRIX_SQLITES=sid    one
#   make sqlite-builds                       only build (or find cached) the libraries
#   make live-wal-full                       test_identity_guards.py on sid's SQLite at 100k messages
#
# Each non-system entry is Debian's own sqlite3 source package, built by scripts/build_sqlite.sh
# with that package's compile options (about 1.5 min per suite, once), then put first on
# LD_LIBRARY_PATH for the whole pytest run. Needs apt-get, dpkg-dev, gcc, make, tcl.

# SUITE@X.Y: that SQLite under the managed-node matrix's Python X.Y (scripts/matrix_sqlite.sh), a
# diagonal of the Python x SQLite cross: 3.11 and 3.12 run the engine suite here, not again on
# the system's SQLite in matrix-python (3.9 and 3.10 run there, 3.13 is the controller's).
# BEGIN GENERATED: matrix-sqlites (scripts/generate.py, from tests/matrix.yml)
MATRIX_SQLITES ?= trixie@3.11 sid@3.14
MATRIX_SQLITES_TIMING ?= sid@3.14
# END GENERATED
# The release line (marker release_line) runs here too: on sid's SQLite 0.21.3+ run WAL inside
# their identity guards, which no other leg shows.
MATRIX_SQLITE_MARKERS ?= not matrix and not slow
# The timing pass (live writers, stall bounds: SQLite's locking) runs on sid's SQLite only. On
# trixie's 3.46.1, as on the system's 3.40.1, Hermes has the WAL-reset bug and runs DELETE mode,
# so its timing pass measured what unit-timing measures on 3.40.1 (the same rollback-journal
# locking) a second time (75 s of CI); sid's 3.53 is where Hermes 0.22 runs WAL.
SQLITE_SUITES := $(foreach e,$(filter-out system,$(MATRIX_SQLITES)),$(firstword $(subst @, ,$(e))))

.PHONY: matrix-sqlite sqlite-builds live-wal-full

matrix-sqlite: $(STAMP) collection-link ## engine unit tests + release scenarios on SQLite 3.40 (system), 3.46 (trixie), 3.53 (sid)
	@bash scripts/matrix_sqlite.sh $(BIN)/python \
		"$(if $(filter timing,$(PYTEST_PASS)),$(MATRIX_SQLITES_TIMING),$(MATRIX_SQLITES))" "$(MATRIX_SQLITE_MARKERS)" $(PYTEST_ARGS)

sqlite-builds: ## build Debian's libsqlite3 of each suite in MATRIX_SQLITES into .cache/sqlite/ (cached)
	@for suite in $(SQLITE_SUITES); do bash scripts/build_sqlite.sh $$suite >/dev/null || exit 1; \
		echo "$$suite: SQLite $$(cat .cache/sqlite/$$suite/VERSION) in .cache/sqlite/$$suite/lib"; done

live-wal-full: $(STAMP) collection-link ## Hermes 0.22.2 in WAL mode (sid's SQLite) inside its identity guards, 100k messages
	@lib=$$(bash scripts/build_sqlite.sh sid | tail -n 1) && HERMES_LIVE_SIZE=full LD_LIBRARY_PATH=$$lib \
		bash scripts/pytest.sh $(BIN)/pytest tests/unit/plugins/module_utils/test_identity_guards.py -s -m "" $(PYTEST_ARGS)
