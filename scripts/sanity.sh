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
# Runs: ansible-test sanity --venv --python <the controller's X.Y> (all tests), then the
# compile and import tests on the oldest and the newest managed-node Python (3.9, 3.13) when
# not the controller's. An interpreter this machine lacks, or a missing shellcheck, is a leg that
# could not run (scripts/missing_leg.sh: listed in the summary; an error with CI=true).
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
controller=$("$(dirname "$ansible_test")/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
rc=0
# ansible-test only warns when shellcheck is missing; say it where it is read.
command -v shellcheck >/dev/null 2>&1 \
    || bash scripts/missing_leg.sh sanity "shellcheck (the shell scripts)" "shellcheck is not installed (apt-get install shellcheck)" \
    || rc=1
cd "$dest"
echo "+ ansible-test sanity --venv --python $controller $* (in $dest)"
"$ansible_test" sanity --venv --python "$controller" --color no "$@" || rc=$?

# 4. The engine and the modules run on managed hosts with Python 3.9+: compile and import
#    them on the oldest and the newest managed-node Python too (SANITY_PYTHONS; empty skips
#    it). The ones between are bracketed: syntax and the standard library only gain on the
#    way up and lose on the way out, so what compiles and imports on 3.9 and on 3.13 does on
#    3.10-3.12; and every leg of matrix-python/matrix-sqlite imports and runs the engine on its
#    Python. SANITY_PYTHONS="3.9 3.10 3.11 3.12 3.13" runs each.
#    ansible-test finds pythonX.Y on PATH; scripts/find_python.sh finds the interpreters.
# BEGIN GENERATED: sanity-pythons (scripts/generate.py, from tests/matrix.yml)
default_pythons="3.9 3.14"
# END GENERATED
for ver in ${SANITY_PYTHONS-$default_pythons}; do
    [ "$ver" = "$controller" ] && continue
    if ! py=$(bash "$repo/scripts/find_python.sh" "$ver"); then
        bash "$repo/scripts/missing_leg.sh" sanity "compile/import on Python $ver" \
            "no python$ver here (pyenv versions/$ver.* or python$ver on PATH)" || rc=1
        continue
    fi
    echo "+ ansible-test sanity --venv --python $ver --test compile --test import (python$ver: $py)"
    PATH="$(dirname "$py"):$PATH" "$ansible_test" sanity --venv --python "$ver" --test compile --test import \
        --color no "$@" || rc=$?
done
exit "$rc"
