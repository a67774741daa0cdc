#!/usr/bin/env bash
# Prepare a copy of the collection for ansible-test, which must run from a directory whose
# *real* path ends in ansible_collections/<namespace>/<name> (the build/collections symlink
# resolves to the repo root, so it cannot be used).
#
# Copies the tracked and untracked-but-not-ignored files to DEST_ROOT/ansible_collections/
# hermes_agent/ops, gives the copy its own git repository (ansible-test lists content through
# the nearest enclosing one), and installs the pip bootstrap stand-in that `ansible-test --venv`
# needs here. Prints the copy's path.
#
# Usage: scripts/ansible_test_tree.sh ANSIBLE_TEST DEST_ROOT
set -euo pipefail
ansible_test=$1
dest_root=$2
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo"

dest=$dest_root/ansible_collections/hermes_agent/ops
rm -rf "$dest_root"
mkdir -p "$dest"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # tracked + untracked files, minus .gitignore'd ones; deleted-but-tracked files are skipped
    git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' p; do [ -e "$p" ] || [ -L "$p" ] && printf '%s\0' "$p"; done \
        | tar --null --no-recursion -T - -cf - | tar -xf - -C "$dest"
else
    tar --exclude=./build --exclude=./.venv --exclude='./.venv-*' --exclude=./.cache --exclude=./tests/output \
        --exclude=__pycache__ --exclude=.pytest_cache --exclude=.ruff_cache --exclude=./.git -cf - . \
        | tar -xf - -C "$dest"
fi
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
    # sanity and units run at the same time in make test: replace the file whole, never half-written
    cp scripts/ansible_test_get_pip.py "$get_pip.$$" && mv -f "$get_pip.$$" "$get_pip"
fi
echo "$dest"
