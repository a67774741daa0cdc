#!/usr/bin/env bash
# SQLite matrix: the engine unit tests (tests/unit/plugins/module_utils: the real engine and
# the real Hermes releases against real SQLite files) on each SQLite a current distribution
# ships, by swapping the libsqlite3.so.0 that CPython's _sqlite3 links.
#
# Each entry is `system` (the library the dev venv's Python links: Debian 12's 3.40.1 here)
# or a Debian suite (trixie = Debian 13, sid) whose sqlite3 source package
# scripts/build_sqlite.sh builds once into .cache/sqlite/<suite>/lib. pytest then runs
# with that directory first on LD_LIBRARY_PATH, so the engine AND every Hermes release
# process the tests start (they inherit the environment) use that SQLite. Before each run
# the version is checked in the dev venv and in the newest Hermes release venv, and that
# release's journal-mode choice on it is printed (Hermes >= 0.20 refuses WAL on an SQLite
# with the WAL-reset bug, < 3.51.3 outside the backports). A summary table follows.
#
# An entry SUITE@X.Y runs on the managed-node matrix's Python X.Y (.cache/matrix/pyX.Y, made
# by scripts/matrix_python.sh) instead of PYTHON: Python and SQLite crossed on a diagonal, each
# Python leg of the matrix on one SQLite, so that every Python and every SQLite runs the whole
# engine suite once, and no pair twice (scripts/matrix_python.sh leaves those Pythons'
# legs to this one: MATRIX_SQLITE_PYTHONS).
#
# Usage: scripts/matrix_sqlite.sh PYTHON "system trixie sid@3.12" "MARKERS" [extra pytest args...]
set -uo pipefail
default_python=$1
entries=$2
markers=$3
shift 3
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo" || exit 1
logdir=build/matrix-sqlite
# shellcheck source=scripts/matrix_legs.sh
. scripts/matrix_legs.sh  # leg_pytest, matrix_summary
mkdir -p "$logdir"
hermes_py=""
for candidate in .cache/venvs/hermes-0.22.*/bin/python; do
    [ -x "$candidate" ] && hermes_py=$candidate
done

# What Hermes 0.22 picks on the SQLite of LD_LIBRARY_PATH: its own WAL-reset gate.
hermes_mode() {
    [ -n "$hermes_py" ] || { echo "-"; return; }
    "$hermes_py" -c 'import sqlite3
from hermes_cli.sqlite_runtime import is_sqlite_wal_reset_vulnerable as bad
print("delete" if bad(sqlite3.sqlite_version_info) else "wal")' 2>/dev/null || echo "?"
}

base_path=${LD_LIBRARY_PATH:-}
declare -a rows=()
failed=0
for leg in $entries; do
    start=$(date +%s)
    entry=${leg%@*} python=$default_python
    if [ "$entry" != "$leg" ]; then
        ver=${leg#*@} python=$repo/.cache/matrix/py${leg#*@}/bin/python
        [ -x "$python" ] || bash scripts/matrix_python.sh --setup-only "$ver" >/dev/null \
            || { echo "error: no venv for Python $ver (scripts/matrix_python.sh --setup-only $ver)" >&2; failed=$((failed + 1)); continue; }
    fi
    echo
    echo "---------------------------------------------------------------- SQLite: $entry ($("$python" -c 'import sys; print("Python", sys.version.split()[0])'))"
    libdir=""
    if [ "$entry" != system ]; then
        # Building Debian's source package needs a compiler, tclsh and dpkg-source.
        lacking=""
        for tool in gcc tclsh dpkg-source apt-get; do command -v "$tool" >/dev/null || lacking="$lacking $tool"; done
        if [ -n "$lacking" ]; then
            bash scripts/missing_leg.sh matrix-sqlite "SQLite of Debian $entry" \
                "cannot build it without${lacking} (apt-get install gcc tcl dpkg-dev)" || failed=$((failed + 1))
            continue
        fi
        if ! libdir=$(bash scripts/build_sqlite.sh "$entry" | tail -n 1) || [ ! -s "$libdir/libsqlite3.so.0" ]; then
            echo "error: could not build the SQLite of Debian $entry (scripts/build_sqlite.sh $entry)" >&2
            rows+=("$(printf '%-8s %-8s %-7s %-7s %-8s %5ss' "$entry" "-" "-" "-" "BUILD" $(($(date +%s) - start)))")
            failed=$((failed + 1))
            continue
        fi
    fi
    if [ -n "$libdir" ]; then export LD_LIBRARY_PATH=$libdir${base_path:+:$base_path}; else export LD_LIBRARY_PATH=$base_path; fi
    version=$("$python" -c 'import sqlite3; print(sqlite3.sqlite_version)')
    expected=$(cat "$libdir/VERSION" 2>/dev/null || echo "$version")
    hermes_version=$([ -n "$hermes_py" ] && "$hermes_py" -c 'import sqlite3; print(sqlite3.sqlite_version)' || echo "$version")
    mode=$(hermes_mode)
    if [ "$version" != "$expected" ] || [ "$hermes_version" != "$expected" ]; then
        echo "error: LD_LIBRARY_PATH=$libdir gives SQLite $version (dev venv) / $hermes_version (Hermes), not $expected" >&2
        rows+=("$(printf '%-8s %-8s %-7s %-7s %-8s %5ss' "$entry" "$version" "-" "$mode" "SWAP" $(($(date +%s) - start)))")
        failed=$((failed + 1))
        continue
    fi
    # What Hermes's schema needs from a distribution's SQLite (FTS5 and its trigram tokenizer).
    if ! "$python" -c 'import sqlite3, sys
conn = sqlite3.connect(":memory:")
options = {row[0] for row in conn.execute("PRAGMA compile_options")}
conn.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize=trigram)")
sys.exit(0 if {"ENABLE_FTS5", "ENABLE_FTS4"} <= options else 1)'; then
        echo "error: SQLite $version of $entry lacks FTS5, FTS4 or the trigram tokenizer" >&2
        rows+=("$(printf '%-8s %-8s %-7s %-7s %-8s %5ss' "$entry" "$version" "-" "$mode" "OPTIONS" $(($(date +%s) - start)))")
        failed=$((failed + 1))
        continue
    fi
    echo "+ LD_LIBRARY_PATH=$libdir pytest tests/unit/plugins/module_utils -m \"$markers\" $* (SQLite $version; Hermes 0.22 picks journal_mode=$mode)"
    log=$logdir/$entry.log
    leg_pytest "$log" "SQLite $entry" "$python" "$markers" tests/unit/plugins/module_utils -p no:cacheprovider "$@"
    pyver=$("$python" -c 'import sys; print(sys.version.split()[0])')
    rows+=("$(printf '%-8s %-8s %-7s %-7s %-8s %5ss  %s' "$entry" "$version" "$pyver" "$mode" "$leg_status" $(($(date +%s) - start)) "$leg_counts")")
done

matrix_summary "SQLite matrix" \
    '%-8s %-8s %-7s %-7s %-8s %6s  %s' sqlite version python hermes result time tests
if [ "$failed" -ne 0 ]; then
    echo "matrix-sqlite: $failed of $(wc -w <<<"$entries") SQLite builds FAILED (logs in $logdir/)"
    exit 1
fi
echo "matrix-sqlite: all $(wc -w <<<"$entries") SQLite builds passed"
