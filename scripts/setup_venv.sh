#!/usr/bin/env bash
# Create or complete the controller venv: `make setup` (the Makefile's stamp rule).
#
#   scripts/setup_venv.sh PYTHON VENV STAMP [REQUIREMENTS]
#
# REQUIREMENTS: what to install (default requirements-dev.txt; `make demo` gives requirements/demo.txt).
#
# PYTHON is any Python 3.12 to 3.14 (ansible-core 2.21's controller range). A venv left
# half made by an interrupted run (no working pip, or made by another Python X.Y) is
# removed and made again; otherwise the pinned install is simply run again, which
# completes whatever an interrupted run left out. The stamp is written last, so it
# exists only after a set-up that finished. Prints one line per package installed; pip's
# full output is in build/logs/setup.log (setup-VENV.log with REQUIREMENTS).
set -euo pipefail
python=$1 venv=$2 stamp=$3 requirements=${4:-requirements-dev.txt}
log=build/logs/setup${4:+-$(basename "$venv")}.log
mkdir -p build/logs

if [ -z "$python" ] || ! command -v "$python" >/dev/null 2>&1; then
    echo "error: no Python 3.12 to 3.14 on PATH (python3.13, python3.14, python3.12 or python3) or in pyenv." >&2
    echo "       Install one (Debian 13, Ubuntu 24.04+: apt-get install python3 python3-venv; Debian 12's 3.11 is too old" >&2
    echo "       for ansible-core 2.20+) or run make PYTHON=/path/to/python3.X" >&2
    exit 1
fi
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$version" in
    3.12 | 3.13 | 3.14) ;;
    *) echo "error: $python is Python $version; the controller (ansible-core 2.21) needs Python 3.12 to 3.14 (PYTHON=...)" >&2; exit 1 ;;
esac
if [ "$requirements" = requirements-dev.txt ] && [ "$version" = 3.12 ]; then
    echo "error: $python is Python 3.12; the contributor tools of requirements-dev.txt pin Sphinx 9.2, which needs 3.13" >&2
    echo "       or later (PYTHON=/path/to/python3.13). make demo needs ansible-core alone and runs on 3.12." >&2
    exit 1
fi
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "error: $python (Python $version) cannot create virtual environments: its venv/ensurepip module is missing." >&2
    echo "       Debian/Ubuntu: apt-get install python$version-venv (or python3-venv); then run make again" >&2
    exit 1
fi

if [ -e "$venv" ]; then
    have=$("$venv/bin/python" -c 'import sys, pip; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
    if [ "$have" != "$version" ]; then
        if [ -z "$have" ]; then why="it has no working python/pip (an interrupted set-up?)"; else why="it is Python $have, not $version"; fi
        echo "setup: $venv is not usable ($why): making it again"
        rm -rf "$venv"
    fi
fi
if [ ! -e "$venv" ]; then
    echo "setup: creating $venv with Python $("$python" -c 'import sys; print(sys.version.split()[0])') ($python)"
    "$python" -m venv "$venv"
fi

# pip's "Collecting X" line is the one to show: one per package, as it starts on it.
pip_install() {
    echo "+ pip install $*" >>"$log"
    if ! "$venv/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off "$@" 2>&1 \
        | tee -a "$log" | sed -un -E 's/^Collecting ([A-Za-z0-9._-]+).*/  installing \1/p'; then
        echo "error: pip install $* failed; the end of $log:" >&2
        tail -n 25 "$log" >&2
        exit 1
    fi
}
: >"$log"
echo "setup: pinned tools into $venv ($requirements, requirements/constraints.txt; full log: $log)"
pip_install -c requirements/constraints.txt pip
pip_install -r "$requirements"
"$venv/bin/python" -m pip check >>"$log" 2>&1 || { tail -n 20 "$log" >&2; echo "error: pip check failed in $venv" >&2; exit 1; }
touch "$stamp"
# sed -n 1p reads all of it: `head -1` closed the pipe early and ansible printed a BrokenPipe traceback.
echo "setup: done ($venv: $("$venv/bin/ansible" --version | sed -n 1p), Python $version)"
