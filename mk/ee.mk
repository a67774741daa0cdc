# Execution environment (AWX / Automation Platform): `make ee-context` turns the example
# definition extras/execution-environment/execution-environment.yml into a build context
# with ansible-builder (from PyPI, in its own venv under .cache/) and checks the galaxy
# and introspection steps of an image build on this host (scripts/ee_context.sh). Building
# the image itself needs the base image from a registry.

EE_VENV := $(CURDIR)/.cache/builder-venv

.PHONY: ee-context

$(EE_VENV)/.stamp: requirements/ee.txt
	test -x $(EE_VENV)/bin/python || $(PYTHON) -m venv $(EE_VENV)
	$(EE_VENV)/bin/python -m pip install --quiet --no-input -r requirements/ee.txt $(PIP_FILTER)
	touch $@

ee-context: $(STAMP) $(EE_VENV)/.stamp ## ansible-builder create on the example EE, then its galaxy + introspect steps
	bash scripts/ee_context.sh $(EE_VENV)/bin/ansible-builder $(BIN)/ansible-galaxy $(EE_VENV)/bin/python
