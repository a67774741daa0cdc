# The literal copies of the engine's option and result tables (DOCUMENTATION, RETURN, the doc
# fragment, the role's defaults / argument specs / config template, playbooks/maintain.yml,
# the README's, the role README's and the guides' tables) are written by scripts/generate.py between BEGIN/END GENERATED markers.
# `make lint` runs generated-check: it fails when a copy differs from what the script writes.

.PHONY: generate generated-check

generate: $(STAMP) ## rewrite every generated block from plugins/module_utils/_hermes_options.py and _hermes_results.py
	$(BIN)/python scripts/generate.py

generated-check: $(STAMP) ## fail (with a diff) when a generated block differs from the option/result tables
	$(BIN)/python scripts/generate.py --check
