#!/usr/bin/env bash
# The one place that finds Python interpreters for the build.
#
#   scripts/find_python.sh X.Y          a working pythonX.Y: pyenv's newest X.Y.* first
#                                       ($PYENV_ROOT, else `pyenv root`, else ~/.pyenv), then
#                                       pythonX.Y on PATH, then the one `make prepare` unpacked
#                                       from Debian's packages (scripts/build_debian_python.sh)
#   scripts/find_python.sh controller   a Python that can run the controller (ansible-core 2.21:
#                                       3.12 to 3.14): python3.13, python3.14, python3.12 on PATH
#                                       in that order (3.13 is CI's), then python3, then pyenv's
#                                       newest 3.13, 3.14, 3.12
#
# Prints the interpreter's path; exits 1 (printing nothing) when there is none. An
# interpreter counts only if it starts and imports sqlite3: pyenv's shims exist for
# versions that are not active, and a Python built without SQLite is no use here.
set -uo pipefail

works() { [ -n "$1" ] && [ -x "$1" ] && "$1" -c 'import sqlite3' >/dev/null 2>&1; }

pyenv_root() {
    if [ -n "${PYENV_ROOT:-}" ]; then echo "$PYENV_ROOT"
    elif command -v pyenv >/dev/null 2>&1; then pyenv root
    else echo "$HOME/.pyenv"; fi
}

find_version() {
    local ver=$1 candidate
    # newest patch release first
    for candidate in $(printf '%s\n' "$(pyenv_root)"/versions/"$ver".*/bin/python"$ver" | sort -rV) \
        "$(command -v "python$ver" 2>/dev/null)" \
        "$(cd "$(dirname "$0")/.." && pwd -P)/.cache/python/$ver/root/usr/bin/python$ver"; do
        if works "$candidate"; then echo "$candidate"; return 0; fi
    done
    return 1
}

find_controller() {
    local name path
    for name in python3.13 python3.14 python3.12 python3 \
        "$(find_version 3.13)" "$(find_version 3.14)" "$(find_version 3.12)"; do
        [ -n "$name" ] || continue
        path=$(command -v "$name" 2>/dev/null) || continue
        works "$path" || continue
        if "$path" -c 'import sys; sys.exit(0 if (3, 12) <= sys.version_info[:2] <= (3, 14) else 1)' 2>/dev/null; then
            # the interpreter itself, not a shim or alias that may point elsewhere later
            "$path" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    return 1
}

case "${1:-}" in
    controller) find_controller ;;
    [0-9].[0-9]*) find_version "$1" ;;
    *) echo "usage: $0 controller | X.Y" >&2; exit 2 ;;
esac
