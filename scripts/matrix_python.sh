#!/usr/bin/env bash
# Managed-node Python matrix: the engine unit tests (tests/unit/plugins/module_utils, the real
# engine against real SQLite files) on each Python the collection supports on managed hosts.
#
# For each version, a small venv .cache/matrix/py<ver> (pytest etc. pinned in
# requirements/matrix-python.txt, recreated when that file changes) is made from the
# interpreter found under pyenv (or on PATH), then pytest runs with the project's
# pyproject.toml settings. Every run prints the Python and the SQLite library it links
# (tests/unit/conftest.py); a summary table follows. A version with no interpreter here
# is a leg that could not run (scripts/missing_leg.sh: in the summary; an error with CI=true).
#
# A leg whose interpreter and SQLite are the controller venv's own (MATRIX_SAME_AS: that venv's
# python) is not run again: `make units` + `make unit-timing` run the whole suite there; its
# row says so. Each leg runs scripts/pytest_split.sh's two passes (-n 2, then timing alone).
# MATRIX_TIMING_PYTHONS (make: none): the versions whose timing pass runs (live writers, stall
# bounds: what they measure is SQLite's locking, the same 3.40.1 on every pyenv Python here, which
# unit-timing measures on the controller's Python; matrix-sqlite-timing on each other SQLite);
# "none": no leg's; unset: every version's.
# MATRIX_RELEASE_PYTHONS (make: the oldest and the newest): the versions that also run the tests on
# files built by a real Hermes release (marker `releases`); the versions between them run the
# engine on the schema-built layouts (every code path, every schema) and leave the release
# dimension to those and to `units`. Unset: every version runs them.
#
# MATRIX_SQLITE_PYTHONS (make: from MATRIX_SQLITES' SUITE@X.Y entries): the versions whose leg
# runs in matrix-sqlite on another SQLite (scripts/matrix_sqlite.sh: the diagonal), both passes,
# release tests included; their rows here say so.
#
# Usage: scripts/matrix_python.sh "3.9 3.10 ..." "MARKERS" [extra pytest args...]
#        scripts/matrix_python.sh --setup-only "3.9 3.10 ..."    only make the venvs (make prepare)
set -uo pipefail
setup_only=0
if [ "${1:-}" = --setup-only ]; then setup_only=1; shift; set -- "$1" ""; fi
versions=$1
markers=$2
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo" || exit 1
reqs=requirements/matrix-python.txt
req_hash=$(sha256sum "$reqs" | cut -c1-16)
logdir=build/matrix
mkdir -p "$logdir" .cache/matrix
# shellcheck source=scripts/matrix_legs.sh
. scripts/matrix_legs.sh  # leg_pytest, matrix_summary
pip_filter() { grep -v 'is ignored: it is neither a file nor a directory' || true; }

declare -a rows=()
failed=0
missing=0
for ver in $versions; do
    start=$(date +%s)
    echo
    echo "---------------------------------------------------------------- Python $ver"
    if ! py=$(bash scripts/find_python.sh "$ver"); then
        rows+=("$(printf '%-6s %-10s %-8s %-8s %5ss' "$ver" "-" "-" "MISSING" 0)")
        missing=$((missing + 1))
        bash scripts/missing_leg.sh matrix-python "Python $ver" "no python$ver here (pyenv versions/$ver.* or python$ver on PATH)" \
            || failed=$((failed + 1))
        continue
    fi
    venv=.cache/matrix/py$ver
    if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$req_hash $py" ]; then
        echo "+ $py -m venv $venv; pip install -r $reqs"
        rm -rf "$venv"
        if ! { "$py" -m venv "$venv" \
            && "$venv/bin/python" -m pip install --quiet --no-input --disable-pip-version-check -r "$reqs" 2>&1 | pip_filter; } \
            || ! "$venv/bin/python" -m pytest --version >/dev/null 2>&1; then
            echo "error: could not set up $venv" >&2
            rows+=("$(printf '%-6s %-10s %-8s %-8s %5ss' "$ver" "-" "-" "SETUP" $(($(date +%s) - start)))")
            failed=$((failed + 1))
            continue
        fi
        echo "$req_hash $py" >"$venv/.stamp"
    fi
    full=$("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])')
    sqlite=$("$venv/bin/python" -c 'import sqlite3; print(sqlite3.sqlite_version)')
    if [ "$setup_only" = 1 ]; then
        echo "Python $ver: $venv ready (Python $full, SQLite $sqlite)"
        continue
    fi
    if [[ " ${MATRIX_SQLITE_PYTHONS:-} " == *" $ver "* ]]; then
        echo "+ Python $ver: its leg runs in matrix-sqlite, on another SQLite (MATRIX_SQLITES)"
        rows+=("$(printf '%-6s %-10s %-8s %-8s %5ss  %s' "$ver" "$full" "$sqlite" "covered" 0 "by matrix-sqlite (Python $ver on another SQLite)")")
        continue
    fi
    if [ -n "${MATRIX_SAME_AS:-}" ] && [ "$(leg_identity "$venv/bin/python")" = "$(leg_identity "$MATRIX_SAME_AS")" ]; then
        echo "+ Python $ver is the controller venv's own interpreter with SQLite $sqlite: covered by make units + make unit-timing"
        rows+=("$(printf '%-6s %-10s %-8s %-8s %5ss  %s' "$ver" "$full" "$sqlite" "covered" 0 "by units + unit-timing (same Python, same SQLite)")")
        continue
    fi
    if [ "${PYTEST_PASS:-both}" = timing ] && ! [[ " ${MATRIX_TIMING_PYTHONS:-$versions} " == *" $ver "* ]]; then
        by="Python $MATRIX_TIMING_PYTHONS and unit-timing"
        [ "$MATRIX_TIMING_PYTHONS" = none ] && by="unit-timing (the controller's Python, SQLite $sqlite) and matrix-sqlite-timing"
        echo "+ Python $ver: its timing pass is left to $by (MATRIX_TIMING_PYTHONS)"
        rows+=("$(printf '%-6s %-10s %-8s %-8s %5ss  %s' "$ver" "$full" "$sqlite" "covered" 0 "timing tests: by $by")")
        continue
    fi
    leg_markers=$markers note=""
    if [ -n "${MATRIX_RELEASE_PYTHONS+set}" ] && ! [[ " $MATRIX_RELEASE_PYTHONS " == *" $ver "* ]]; then
        leg_markers="($markers) and not releases"
        note="; release-built files: by Python $MATRIX_RELEASE_PYTHONS and units"
    fi
    echo "+ pytest tests/unit/plugins/module_utils -m \"$leg_markers\" $* in two passes (Python $full at $py, SQLite $sqlite)"
    leg_pytest "$logdir/py$ver.log" "Python $ver" "$venv/bin/python" "$leg_markers" \
        tests/unit/plugins/module_utils -p no:cacheprovider "$@"
    rows+=("$(printf '%-6s %-10s %-8s %-8s %5ss  %s' "$ver" "$full" "$sqlite" "$leg_status" $(($(date +%s) - start)) "$leg_counts$note")")
done

[ "$setup_only" = 1 ] && exit "$failed"
matrix_summary "managed-node Python matrix" '%-6s %-10s %-8s %-8s %6s  %s' python version sqlite result time tests
if [ "$failed" -ne 0 ]; then
    echo "matrix-python: $failed of $(wc -w <<<"$versions") Pythons FAILED (logs in $logdir/)"
    exit 1
fi
total=$(wc -w <<<"$versions")
if [ "$missing" -ne 0 ]; then
    echo "matrix-python: $((total - missing)) of $total Pythons passed; $missing not on this machine (listed in make test's summary)"
else
    echo "matrix-python: all $total Pythons passed"
fi
