#!/usr/bin/env bash
# Run the fleet scenario (molecule/fleet) with the environment it needs.
#
#   tests/fleet/run.sh [MOLECULE_COMMAND [ARGS...]]     default: test
#   e.g. tests/fleet/run.sh test | create | converge | verify | side-effect | login | destroy
#
# Needs a venv with ansible-core + molecule (FLEET_BIN, default <repo>/.venv/bin: `make
# setup`). Does the rest itself, each step idempotent: the image (build-image.sh),
# containers.podman (install-collections.sh), the Hermes release venvs
# (tests/setup_hermes_venvs.sh), the hermes_agent.ops collection symlink in
# build/collections. Whole run bounded by FLEET_TIMEOUT seconds (default 900).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${FLEET_BIN:-$repo/.venv/bin}"
timeout_s="${FLEET_TIMEOUT:-900}"
[ "$#" -gt 0 ] || set -- test
t0=$(date +%s)
stamp() { echo "[fleet] $(( $(date +%s) - t0 ))s: $*"; }

for tool in python molecule ansible-playbook; do
    [ -x "$bin/$tool" ] || { echo "fleet: $bin/$tool missing: run \`make setup\` (or set FLEET_BIN)" >&2; exit 2; }
done

export CONTAINERS_CONF="$repo/tests/fleet/containers.conf"
"$repo/tests/fleet/build-image.sh"
"$repo/tests/fleet/build-systemd-image.sh"
stamp "images ready"
"$repo/tests/fleet/install-collections.sh" "$bin/python"
# Hermes releases that write some of the fleet's databases (hermes-0.x layouts)
bash "$repo/tests/setup_hermes_venvs.sh"
stamp "controller prerequisites ready"

# hermes_agent.ops from this work tree (same link as the Makefile's collection-link)
link="$repo/build/collections/ansible_collections/hermes_agent/ops"
mkdir -p "$(dirname "$link")"
if [ -e "$link" ] && [ ! -L "$link" ]; then echo "fleet: $link exists and is not a symlink" >&2; exit 2; fi
ln -sfn ../../../.. "$link"

export PATH="$bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$repo/build/collections:$repo/.cache/fleet/collections"
export MOLECULE_GLOB="molecule/*/molecule.yml"
export ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 PY_COLORS=0
cd "$repo"
stamp "molecule $* -s fleet (timeout ${timeout_s}s)"
rc=0
timeout --kill-after=30 "$timeout_s" molecule "$1" -s fleet "${@:2}" || rc=$?
[ "$rc" = 124 ] && echo "fleet: molecule $1 did not finish within ${timeout_s}s" >&2
stamp "molecule $1 exited $rc"
exit "$rc"
