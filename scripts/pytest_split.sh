#!/usr/bin/env bash
# One pytest selection in two passes, so that CI can use both cores without making the
# timing-sensitive tests flaky:
#   1. everything NOT marked `timing`, on PYTEST_WORKERS xdist workers (default 2), a test
#      file per worker (--dist loadfile: the tests of a file share users, crontabs and
#      module-scoped fixtures, so they stay together and in order);
#   2. the `timing` tests (live writers, stall bounds, race-dependent crash trials), one at
#      a time, with nothing else of this run beside them.
# Fails if either pass fails; "no tests collected" (exit 5) is a failure only when neither
# pass collected anything. PYTEST_WORKERS=0 runs pass 1 without xdist too; PYTEST_PASS runs
# one pass only (parallel or timing).
#
# Usage: scripts/pytest_split.sh LOG_PREFIX MARKERS PYTEST_CMD... -- [pytest args...]
#   e.g. scripts/pytest_split.sh build/logs/unit "not matrix" .venv/bin/pytest -- tests/unit
#   LOG_PREFIX: each pass's output also goes to LOG_PREFIX.parallel.log / .timing.log ("" = none).
set -uo pipefail
prefix=$1
markers=$2
shift 2
cmd=()
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
    cmd+=("$1")
    shift
done
[ "${1:-}" = -- ] && shift
workers=${PYTEST_WORKERS:-2}

run_pass() {  # run_pass NAME MARKER-EXPRESSION [pytest args...]
    local name=$1 expr=$2 rc
    shift 2
    echo "+ pass $name: ${cmd[*]} -m \"$expr\" $*"
    if [ -n "$prefix" ]; then
        "${cmd[@]}" -m "$expr" "$@" 2>&1 | tee "$prefix.$name.log"
        rc=${PIPESTATUS[0]}
    else
        "${cmd[@]}" -m "$expr" "$@"
        rc=$?
    fi
    return "$rc"
}

# The slowest tests of each pass, in its log: where CI's minutes go, measured where they are spent.
durations=(--durations=15 --durations-min=10)
if [ "$workers" -gt 0 ] 2>/dev/null; then
    xdist=(-n "$workers" --dist loadfile)
else
    xdist=(-p no:xdist)
fi
# PYTEST_PASS=parallel or timing runs that pass alone (make test runs the timing passes as
# steps of their own, last, so that nothing else of CI runs beside them); both by default.
pass=${PYTEST_PASS:-both}
rc1=5 rc2=5
case "$pass" in
    both | parallel | timing) ;;
    *) echo "error: PYTEST_PASS=$pass: give parallel, timing or both" >&2; exit 2 ;;
esac
if [ "$pass" != timing ]; then
    run_pass parallel "($markers) and not timing" "${xdist[@]}" "${durations[@]}" "$@"
    rc1=$?
fi
if [ "$pass" != parallel ]; then
    run_pass timing "($markers) and timing" -p no:xdist "${durations[@]}" "$@"
    rc2=$?
fi
# A timing pass alone may select nothing (a suite without timing tests): that is no failure.
[ "$pass" = timing ] && [ "$rc2" -eq 5 ] && { echo "(no timing tests in: $*)"; exit 0; }

if [ "$rc1" -eq 5 ] && [ "$rc2" -eq 5 ]; then
    echo "error: pytest collected no tests for: $* -m \"$markers\" (exit code 5); an empty suite is a failure here" >&2
    exit 5
fi
for rc in "$rc1" "$rc2"; do
    [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || exit "$rc"
done
exit 0
