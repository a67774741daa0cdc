# The collection's docs site, as antsibull-docs builds one for every collection: the
# module and role pages plus the guides (docs/*.md, converted to RST at build time as the
# extra docs of docs/docsite/extra-docs.yml; the Markdown stays the one source).
# antsibull-docs, Sphinx, sphinx-ansible-theme and pandoc (pypandoc-binary) live in their
# own venv under .cache/ (requirements/docs-site.txt), so .venv is not rebuilt for them.

DOCS_VENV := $(CURDIR)/.cache/docs-site-venv

.PHONY: docs-lint docs-site docs-site-setup

$(DOCS_VENV)/.stamp: requirements/docs-site.txt
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet --no-input -r requirements/docs-site.txt $(PIP_FILTER)
	touch $@

docs-site-setup: $(DOCS_VENV)/.stamp ## the venv of docs-lint / docs-site (.cache/docs-site-venv)

docs-lint: $(DOCS_VENV)/.stamp ## antsibull-docs lint-collection-docs (plugin and role docs, the guides as extra docs, every reference)
	bash scripts/docs_site.sh $(DOCS_VENV)/bin lint

docs-site: $(DOCS_VENV)/.stamp ## the HTML docs site (antsibull-docs sphinx-init + its build.sh) in build/docs-site/sphinx/build/html
	bash scripts/docs_site.sh $(DOCS_VENV)/bin site

# tests/integration/test_docs_site.py builds the site with this venv where chromium is
# there to open it (without chromium it skips, or fails with CI=true, before the venv is
# needed); the controller matrix does not run it again (Makefile, CONTROLLER_TESTS):
# the site does not depend on the controller.
integration: $(if $(shell command -v chromium 2>/dev/null),$(DOCS_VENV)/.stamp)
