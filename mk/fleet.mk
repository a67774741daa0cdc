# Fleet test, scheduling proven where it runs for real: molecule scenario molecule/fleet on podman containers that run
# the real cron daemon. Included by the Makefile (`include mk/fleet.mk`); uses its .venv
# ($(BIN), $(STAMP)) and collection-link. Everything else the scenario needs is installed
# by tests/fleet/run.sh, each step idempotent: podman/runc/debootstrap (apt-get), the
# image localhost/hermes-ops-fleet:bookworm (debootstrap + podman import, cached) and the
# systemd host's localhost/hermes-ops-fleet-systemd:bookworm (podman build + apt-get, cached),
# containers.podman (extracted from the `ansible` wheel on PyPI into .cache/fleet).

BIN ?= $(CURDIR)/.venv/bin
# Bound of the molecule run (seconds): a hang is stopped. The fleet issue asks for < 15 min on
# the baseline machine (560 s there); a CI machine 2.5-3x slower, beside molecule and the fresh
# machine, took 850 s and the old bound of 840 s stopped a healthy run; beside a fresh-machine job
# that had fallen back to pip (load 12) a healthy run reached 1500 s.  CI budget: 1800 s.
FLEET_TIMEOUT ?= 1700

.PHONY: fleet fleet-image fleet-collections fleet-create fleet-verify fleet-destroy

fleet: $(STAMP) collection-link ## fleet test: molecule test -s fleet (3 podman hosts, cron fires the job)
	FLEET_BIN=$(BIN) FLEET_TIMEOUT=$(FLEET_TIMEOUT) bash tests/fleet/run.sh test

fleet-image: ## build the fleet's container images if missing (tests/fleet/build-image.sh, build-systemd-image.sh)
	bash tests/fleet/build-image.sh
	bash tests/fleet/build-systemd-image.sh

fleet-collections: $(STAMP) ## extract containers.podman from the ansible wheel into .cache/fleet
	bash tests/fleet/install-collections.sh $(BIN)/python

fleet-create: $(STAMP) collection-link ## start the fleet and seed it (molecule create + prepare), keep it
	FLEET_BIN=$(BIN) bash tests/fleet/run.sh create
	FLEET_BIN=$(BIN) bash tests/fleet/run.sh prepare

fleet-verify: $(STAMP) collection-link ## converge + verify on a running fleet (after fleet-create)
	FLEET_BIN=$(BIN) bash tests/fleet/run.sh converge
	FLEET_BIN=$(BIN) bash tests/fleet/run.sh verify

fleet-destroy: $(STAMP) ## remove the fleet's containers (the image stays cached)
	FLEET_BIN=$(BIN) bash tests/fleet/run.sh destroy
