# The literal copies of the engine's option and result tables (DOCUMENTATION, RETURN, the doc
# fragment, the role's defaults / argument specs / config template, playbooks/maintain.yml,
# the README's, the role README's and the guides' tables) and of the support matrix
# (tests/matrix.yml: the cores, the Pythons, the SQLite builds, the Hermes releases, into the
# Makefile, mk/sqlite.mk, .ci/run, sanity.sh, the requirements pins, meta/runtime.yml, the role's
# meta, the EE, CONTRIBUTING.md's support table and the README's support line) are written by
# scripts/generate.py between BEGIN/END GENERATED markers.
# `make lint` runs generated-check: it fails when a copy differs from what the script writes.

.PHONY: generate generated-check

generate: $(STAMP) ## rewrite every generated block from the option/result tables and tests/matrix.yml
	$(BIN)/python scripts/generate.py

generated-check: $(STAMP) ## fail (with a diff) when a generated block differs from the option/result tables
	$(BIN)/python scripts/generate.py --check
