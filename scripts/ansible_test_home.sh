# shellcheck shell=bash
# Sourced by scripts/sanity.sh and scripts/units.sh after they set $repo.
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
