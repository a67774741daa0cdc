# shellcheck shell=bash
# Sourced first by scripts/sanity.sh and scripts/units.sh, with their ANSIBLE_TEST argument:
#   . "$(dirname "$0")/ansible_test_env.sh" "$1"; shift
# Sets $ansible_test (absolute path of that ansible-test) and $repo, and cds to $repo.
# ansible-test keeps its venvs and caches under ~/.ansible/test: point HOME at the workspace
# (.cache/ansible-test-home) so a run builds and uses its own, not another run's or session's.
# The user's pip configuration (index, local wheels) is carried over.
set -euo pipefail
# shellcheck disable=SC2034  # read by the script that sources this file
ansible_test=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$repo"
if [ -z "${HERMES_ANSIBLE_TEST_HOME_SET:-}" ]; then
    # scripts/find_python.sh looks under pyenv's root, which is found through the real HOME
    PYENV_ROOT=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}
    export PYENV_ROOT
    user_pip_conf=${XDG_CONFIG_HOME:-$HOME/.config}/pip/pip.conf
    [ -f "$user_pip_conf" ] && [ -z "${PIP_CONFIG_FILE:-}" ] && export PIP_CONFIG_FILE=$user_pip_conf
    export HOME=${ANSIBLE_TEST_HOME:-$repo/.cache/ansible-test-home} HERMES_ANSIBLE_TEST_HOME_SET=1
    unset XDG_CONFIG_HOME XDG_CACHE_HOME
    mkdir -p "$HOME"
fi
