#!/usr/bin/env bash
# ansible-test units for hermes_agent.ops, on a copy of the collection under
# build/units/ansible_collections/hermes_agent/ops (see scripts/ansible_test_tree.sh).
#
# The copy shares the repo's .cache (the Hermes release venvs the fixtures use) through a
# symlink, and gets its own build/collections link like `make collection-link` makes, for
# the test helpers that start child processes with that path.
#
# Usage: scripts/units.sh ANSIBLE_TEST [extra ansible-test units args...]
# shellcheck source=scripts/ansible_test_env.sh
. "$(dirname "$0")/ansible_test_env.sh" "$1"  # set -euo pipefail, $ansible_test, $repo, cd, HOME
shift
dest=$(bash scripts/ansible_test_tree.sh "$ansible_test" build/units)
mkdir -p .cache "$dest/build/collections/ansible_collections/hermes_agent"
ln -sfn "$repo/.cache" "$dest/.cache"
ln -sfn ../../../.. "$dest/build/collections/ansible_collections/hermes_agent/ops"
cd "$dest"
echo "+ ansible-test units --venv $* (in $dest)"
"$ansible_test" units --venv --color no "$@"
