#!/usr/bin/env bash
# ansible-test units for hermes_agent.ops, on a copy of the collection under
# build/units/ansible_collections/hermes_agent/ops (see scripts/ansible_test_tree.sh).
#
# The copy shares the repo's .cache (the Hermes release venvs the fixtures use) through a
# symlink, and gets its own build/collections link like `make collection-link` makes, for
# the test helpers that start child processes with that path.
#
# Usage: scripts/units.sh ANSIBLE_TEST [extra ansible-test units args...]
set -euo pipefail
ansible_test=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo"

# ansible-test keeps its venvs and caches under ~/.ansible/test: point HOME at the workspace
# (.cache/ansible-test-home) so a run builds and uses its own, not another run's or session's.
# The user's pip configuration (index, local wheels) is carried over.
if [ -z "${HERMES_ANSIBLE_TEST_HOME_SET:-}" ]; then
    user_pip_conf=${XDG_CONFIG_HOME:-$HOME/.config}/pip/pip.conf
    [ -f "$user_pip_conf" ] && [ -z "${PIP_CONFIG_FILE:-}" ] && export PIP_CONFIG_FILE=$user_pip_conf
    export HOME=${ANSIBLE_TEST_HOME:-$repo/.cache/ansible-test-home} HERMES_ANSIBLE_TEST_HOME_SET=1
    unset XDG_CONFIG_HOME XDG_CACHE_HOME
    mkdir -p "$HOME"
fi
dest=$(bash scripts/ansible_test_tree.sh "$ansible_test" build/units)
mkdir -p .cache "$dest/build/collections/ansible_collections/hermes_agent"
ln -sfn "$repo/.cache" "$dest/.cache"
ln -sfn ../../../.. "$dest/build/collections/ansible_collections/hermes_agent/ops"
cd "$dest"
echo "+ ansible-test units --venv $* (in $dest)"
"$ansible_test" units --venv --color no "$@"
