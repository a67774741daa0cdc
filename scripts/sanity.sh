#!/usr/bin/env bash
# ansible-test sanity for hermes_agent.ops.
#
# ansible-test must run from a directory whose *real* path ends in
# ansible_collections/<namespace>/<name>; the build/collections symlink resolves to the
# repo root, so it cannot be used. Instead the tracked and untracked-but-not-ignored
# files are copied to build/sanity/ansible_collections/hermes_agent/ops and tested there
# (scripts/ansible_test_tree.sh).
#
# The only tolerated failures are the entries of tests/sanity/ignore-<ansible>.txt,
# and each entry must carry a "# reason" comment.
#
# Runs: ansible-test sanity --venv --python 3.11 (all tests), then the compile and import
# tests on each managed-node Python of the support matrix (3.8, 3.9, 3.10, 3.12, 3.13).
#
# Usage: scripts/sanity.sh ANSIBLE_TEST [extra ansible-test args...]
# shellcheck source=scripts/ansible_test_env.sh
. "$(dirname "$0")/ansible_test_env.sh" "$1"  # set -euo pipefail, $ansible_test, $repo, cd, HOME
shift

# 1. Every ignore entry documents why.
bad=0
for f in tests/sanity/ignore-*.txt; do
    [ -e "$f" ] || continue
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            '' | '#'*) continue ;;
        esac
        if ! printf '%s\n' "$line" | grep -Eq '[^ ]+ [^ ]+ +# *[^ ]'; then
            echo "error: $f: ignore entry without a '# reason': $line" >&2
            bad=1
        fi
    done <"$f"
done
[ "$bad" -eq 0 ] || exit 1

# 2. A clean copy of the collection at a real ansible_collections/ path (with its own git
#    repository and the pip bootstrap stand-in; see scripts/ansible_test_tree.sh).
dest=$(bash scripts/ansible_test_tree.sh "$ansible_test" build/sanity)

# 3. Run it. --venv: ansible-test installs its pinned checkers (pylint, yamllint, ...)
#    into its own venvs under ~/.ansible/test (HOME is .cache/ansible-test-home, above).
cd "$dest"
echo "+ ansible-test sanity --venv --python 3.11 $* (in $dest)"
rc=0
"$ansible_test" sanity --venv --python 3.11 --color no "$@" || rc=$?

# 4. The engine and the modules run on managed hosts with Python 3.8+: compile and import
#    them on every other Python of the support matrix too (SANITY_PYTHONS; empty skips it).
#    ansible-test finds pythonX.Y on PATH; the interpreters come from pyenv.
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
for ver in ${SANITY_PYTHONS-3.8 3.9 3.10 3.12 3.13}; do
    py=""
    for candidate in "$pyenv_root"/versions/"$ver".*/bin/python"$ver" /root/.pyenv/versions/"$ver".*/bin/python"$ver" \
        "$(command -v "python$ver" 2>/dev/null)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c 'import sys' >/dev/null 2>&1; then
            py=$candidate
            break
        fi
    done
    if [ -z "$py" ]; then
        echo "error: sanity: no Python $ver interpreter found for the compile/import tests" >&2
        rc=1
        continue
    fi
    echo "+ ansible-test sanity --venv --python $ver --test compile --test import (python$ver: $py)"
    PATH="$(dirname "$py"):$PATH" "$ansible_test" sanity --venv --python "$ver" --test compile --test import \
        --color no "$@" || rc=$?
done
exit "$rc"
