# Fresh-machine job: the README's prerequisite line and its two commands in a plain Debian
# container built with debootstrap (tests/fresh/run.sh; rootfs cached in .cache/fresh/).
# Needs root, podman, runc and debootstrap on this host; CI runs the `fast` part.
#
#   make fresh-machine                                  Debian 13, make demo + the fast part of make test
#   make fresh-machine FRESH_PART=full                  Debian 13, make demo + the whole make test
# (Debian 12's python3 is 3.11: too old for the contributors' controller venv, ansible-core 2.21;
# an operator's ansible-core 2.19 runs on it: make fresh-walk.)
#   FRESH_TEST_RUNS=3 make fresh-machine FRESH_SUITE=trixie FRESH_PART=full   ... make test three times in a row
#   FRESH_CACHE=$(mktemp -d) make fresh-machine         as CI runs it: no cached rootfs, debootstrap first

#
# The operator's walk (tests/fresh/walk.sh): docs/getting_started.md's marked commands as written,
# in the same plain Debian images, beside a real Hermes 0.22.2 gateway serving chats; Debian 12
# (rollback-journal state.db, Python 3.11 and ansible-core 2.19), then Debian 13 (WAL).
#   make fresh-walk                                     both, one after the other
#   make fresh-walk FRESH_WALK_SUITES=bookworm          Debian 12 only

FRESH_SUITE ?= trixie
FRESH_PART ?= fast
FRESH_WALK_SUITES ?= bookworm trixie

.PHONY: fresh-machine fresh-image fresh-walk

fresh-image: ## only build (or find cached) the fresh-machine job's and the walk's Debian images (make prepare's images lane)
	@for suite in $(sort $(FRESH_SUITE) $(FRESH_WALK_SUITES)); do bash tests/fresh/run.sh $$suite image || exit 1; done

fresh-walk: ## the operator's walk through getting_started beside a live Hermes gateway, on Debian 12 and 13 (FRESH_WALK_SUITES)
	@for suite in $(FRESH_WALK_SUITES); do bash tests/fresh/walk.sh $$suite || exit 1; done

fresh-machine: ## README's apt line + make demo + make test in a plain Debian container (FRESH_SUITE, FRESH_PART=fast|full)
	@bash tests/fresh/run.sh $(FRESH_SUITE) $(FRESH_PART)
