#!/usr/bin/env bash
# ansible-test sanity for hermes_agent.ops.
#
# ansible-test must run from a directory whose *real* path ends in
# ansible_collections/<namespace>/<name>; the build/collections symlink resolves to the
# repo root, so it cannot be used. Instead the tracked and untracked-but-not-ignored
# files are copied to build/sanity/ansible_collections/hermes_agent/ops and tested there.
#
# The only tolerated failures are the entries of tests/sanity/ignore-<ansible>.txt,
# and each entry must carry a "# reason" comment.
#
# Runs: ansible-test sanity --venv --python 3.11 (all tests), then --python 3.8 for the
# compile and import tests when a Python 3.8 is installed (the engine's floor on hosts).
#
# Usage: scripts/sanity.sh ANSIBLE_TEST [extra ansible-test args...]
set -euo pipefail
ansible_test=$1
shift
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo"

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

# 2. A clean copy of the collection at a real ansible_collections/ path.
dest=build/sanity/ansible_collections/hermes_agent/ops
rm -rf build/sanity
mkdir -p "$dest"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # tracked + untracked files, minus .gitignore'd ones; deleted-but-tracked files are skipped
    git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' p; do [ -e "$p" ] || [ -L "$p" ] && printf '%s\0' "$p"; done \
        | tar --null --no-recursion -T - -cf - | tar -xf - -C "$dest"
else
    tar --exclude=./build --exclude=./.venv --exclude=./.cache --exclude=./tests/output \
        --exclude=__pycache__ --exclude=.pytest_cache --exclude=.ruff_cache --exclude=./.git -cf - . \
        | tar -xf - -C "$dest"
fi

# ansible-test lists content through the nearest enclosing git repository, which would be
# this repo (where build/ is ignored, so it would find no targets): give the copy its own.
git -C "$dest" init -q

# ansible-test --venv bootstraps pip in each venv with a get-pip script it downloads from a
# host that is not reachable here; give it a stand-in that uses ensurepip + PyPI instead.
venv_bin=$(dirname "$ansible_test")
pip_version=$(grep -ho "pip='[0-9.]*'" "$("$venv_bin/python" -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py" | head -1 | tr -dc '0-9.')
if [ -z "$pip_version" ]; then
    echo "error: cannot find the pip version ansible-test bootstraps (ansible_test/_internal/python_requirements.py)" >&2
    exit 1
fi
get_pip="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
# (a real get-pip script already in the cache is left alone)
if [ ! -e "$get_pip" ] || { grep -q 'Stand-in for the pip bootstrap' "$get_pip" && ! cmp -s scripts/ansible_test_get_pip.py "$get_pip"; }; then
    mkdir -p "$(dirname "$get_pip")"
    cp scripts/ansible_test_get_pip.py "$get_pip"
fi

# 3. Run it. --venv: ansible-test installs its pinned checkers (pylint, yamllint, ...)
#    into its own venvs under ~/.ansible/test; nothing else is needed on the host.
cd "$dest"
echo "+ ansible-test sanity --venv --python 3.11 $* (in $dest)"
rc=0
"$ansible_test" sanity --venv --python 3.11 --color no "$@" || rc=$?

# 4. The engine and the modules run on managed hosts with Python 3.8+: compile and import
#    them there too (SANITY_PY38=0 skips this). ansible-test finds python3.8 on PATH.
if [ "${SANITY_PY38:-1}" != 0 ]; then
    py38=""
    for candidate in "$(command -v pyenv >/dev/null 2>&1 && pyenv root)"/versions/3.8*/bin/python3.8 \
        /usr/local/bin/python3.8 /usr/bin/python3.8; do
        if [ -x "$candidate" ] && "$candidate" -c 'import sys' >/dev/null 2>&1; then
            py38=$candidate
            break
        fi
    done
    if [ -n "$py38" ]; then
        echo "+ ansible-test sanity --venv --python 3.8 --test compile --test import (python3.8: $py38)"
        PATH="$(dirname "$py38"):$PATH" "$ansible_test" sanity --venv --python 3.8 --test compile --test import \
            --color no "$@" || rc=$?
    else
        echo "sanity: no Python 3.8 interpreter found; skipped the Python 3.8 compile/import check" >&2
    fi
fi
exit "$rc"
