# Execution environment (AWX / Automation Platform): `make ee-context` turns the example
# definition extras/execution-environment/execution-environment.yml into a build context
# with ansible-builder (from PyPI, in its own venv under .cache/) and checks the galaxy
# and introspection steps of an image build on this host (scripts/ee_context.sh). Building
# the image itself: `make ee-image` (below), on a base image built locally.

EE_VENV := $(CURDIR)/.cache/builder-venv
PYTHON_XY = $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')

.PHONY: ee-context

$(EE_VENV)/.stamp: requirements/ee.txt
	@# made again when its Python is not the controller's (ansible-core 2.21 needs 3.12+)
	$(EE_VENV)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, "$(PYTHON_XY)".split("."))))' 2>/dev/null \
		|| { rm -rf $(EE_VENV) && $(PYTHON) -m venv $(EE_VENV); }
	$(EE_VENV)/bin/python -m pip install --quiet --no-input -r requirements/ee.txt $(PIP_FILTER)
	touch $@

ee-context: $(STAMP) $(EE_VENV)/.stamp ## ansible-builder create on the example EE, then its galaxy + introspect steps
	bash scripts/ee_context.sh $(EE_VENV)/bin/ansible-builder $(BIN)/ansible-galaxy $(EE_VENV)/bin/python

# The image itself, built for real on a local Debian base (tests/ee/build-base-image.sh)
# with podman, and the playbooks run from it (scripts/ee_run.sh). Not in CI: see docs/fleet.md.
.PHONY: ee-image ee-run ee-run-fleet

ee-image: $(EE_VENV)/.stamp ## build the EE image localhost/hermes-ops-ee:<version> (local base, ansible-builder, podman)
	bash scripts/ee_image.sh $(EE_VENV)/bin

ee-run: $(EE_VENV)/.stamp ## from the EE image: ansible-runner (process isolation) maintain.yml --check + report.yml on a generated home
	bash scripts/ee_run.sh $(EE_VENV)/bin

ee-run-fleet: $(EE_VENV)/.stamp ## the same against the running fleet (make fleet-create first), compared with the controller's runs
	bash scripts/ee_run.sh $(EE_VENV)/bin fleet
