# A Python linking a fixed SQLite (included by the Makefile's `-include $(wildcard mk/*.mk)`):
# Debian's CPython and standard library, its _sqlite3 linking Debian sid's SQLite (3.51.3+,
# free of the WAL-reset bug) through its own RUNPATH, in .cache/fixed-python (cached).
# tests/integration/test_role_fixed_sqlite.py builds it itself; needs patchelf and what
# scripts/build_sqlite.sh needs (gcc, tcl, dpkg-dev).

.PHONY: fixed-python

fixed-python: ## build .cache/fixed-python: Debian's python3 linking sid's SQLite (role's fixed-SQLite test)
	@bash scripts/build_fixed_python.sh /usr/bin/python3 >/dev/null && \
		echo "$$(.cache/fixed-python/bin/python3 -I -S -c 'import sqlite3, sys; print(sys.executable, "SQLite", sqlite3.sqlite_version)')"
