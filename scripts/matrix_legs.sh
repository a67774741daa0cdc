# shellcheck shell=bash disable=SC2034,SC2154
# (SC2034, SC2154: $leg_status and $leg_counts are read, $rows is set, by the sourcing script.)
# Sourced by scripts/matrix_python.sh and scripts/matrix_sqlite.sh: the pytest run of one leg
# of a matrix and the summary table, so both matrices count and report a leg alike.
#   . "$(dirname "$0")/matrix_legs.sh"
# The sourcing script keeps its table in the array $rows and its failure count in $failed.

# leg_pytest LOG WHAT PYTHON MARKERS [pytest arguments...]
# Runs PYTHON -m pytest, its output also into LOG. Sets $leg_status (ok or FAILED) and
# $leg_counts (pytest's summary line without its time, e.g. "40 passed, 2 skipped"); a
# failed leg adds one to $failed. WHAT names the leg in the error for "no tests collected".
# The leg runs scripts/pytest_split.sh's two passes: -n 2 without the timing tests, then
# those alone; $leg_counts joins both passes' counts with " + ".
leg_pytest() {
    local log=$1 what=$2 python=$3 markers=$4 rc pass counts
    shift 4
    # one pass alone (PYTEST_PASS: make test's steps) keeps a log of its own
    [ "${PYTEST_PASS:-both}" = both ] || log=${log%.log}-$PYTEST_PASS.log
    # the passes' own logs are <log without .log>.parallel.log and .timing.log; $log holds both
    bash scripts/pytest_split.sh "${log%.log}" "$markers" "$python" -m pytest -- "$@" >"$log" 2>&1
    rc=$?
    cat "$log"
    leg_status=ok
    if [ "$rc" -ne 0 ]; then
        leg_status=FAILED
        [ "$rc" -eq 5 ] && echo "error: pytest collected no tests on $what" >&2
        failed=$((failed + 1))
    fi
    leg_counts=""
    for pass in parallel timing; do
        [ -s "${log%.log}.$pass.log" ] || continue
        counts=$(tail -n 1 "${log%.log}.$pass.log" | sed -E 's/^=+ //; s/ in [0-9.]+s.*//')
        leg_counts=${leg_counts:+$leg_counts + }$counts
    done
}

# leg_identity PYTHON: the real interpreter behind PYTHON (a venv's or not) and its SQLite
leg_identity() {
    "$1" -c 'import os, sqlite3, sys
print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)), sys.version, sqlite3.sqlite_version)' 2>/dev/null
}

# matrix_summary TITLE FORMAT HEADING... : a rule line with TITLE, the column headings printed
# with FORMAT (printf, without the newline), then the rows of $rows.
matrix_summary() {
    local title=$1 format=$2
    shift 2
    echo
    echo "---------------------------------------------------------------- $title"
    # shellcheck disable=SC2059  # the format is the caller's column layout
    printf "$format\n" "$@"
    printf '%s\n' "${rows[@]}"
}
