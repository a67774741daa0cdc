# Fresh-machine job: the README's prerequisite line and its two commands in a plain Debian
# container built with debootstrap (tests/fresh/run.sh; rootfs cached in .cache/fresh/).
# Needs root, podman, runc and debootstrap on this host; CI runs the `fast` part.
#
#   make fresh-machine                                  Debian 13, make demo + the fast part of make test
#   make fresh-machine FRESH_PART=full                  Debian 13, make demo + the whole make test
# (Debian 12's python3 is 3.11: too old for the controller, ansible-core 2.21.)
#   FRESH_TEST_RUNS=3 make fresh-machine FRESH_SUITE=trixie FRESH_PART=full   ... make test three times in a row
#   FRESH_CACHE=$(mktemp -d) make fresh-machine         as CI runs it: no cached rootfs, debootstrap first

FRESH_SUITE ?= trixie
FRESH_PART ?= fast

.PHONY: fresh-machine fresh-image

fresh-image: ## only build (or find cached) the fresh-machine job's Debian image (make prepare's images lane)
	@bash tests/fresh/run.sh $(FRESH_SUITE) image

fresh-machine: ## README's apt line + make demo + make test in a plain Debian container (FRESH_SUITE, FRESH_PART=fast|full)
	@bash tests/fresh/run.sh $(FRESH_SUITE) $(FRESH_PART)
