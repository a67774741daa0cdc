#!/usr/bin/env bash
# Run each make target in turn (all of them, even after a failure), each with its output
# in build/logs/<target>.log: a passing step prints one line, a failing one the end of its
# log. Then the summary a newcomer reads: one row per step, and what could not run here
# and why (legs whose interpreter or program is missing: scripts/missing_leg.sh; tests
# pytest skipped for want of a privilege the machine does not give, e.g. in a container).
# Exits non-zero if any step failed. With CI=true a privilege skip fails the run too.
#
#   scripts/run_steps.sh MAKE TARGET...        env: STEP_TAIL (lines shown of a failed log, 60)
set -uo pipefail
make_cmd=$1
shift
logs=build/logs
mkdir -p "$logs"
: >"$logs/missing-legs.txt"
: >"$logs/privilege-skips.txt"
tail_lines=${STEP_TAIL:-60}
# pytest's -ra lines for tests that need what a container or a non-root user lacks
privilege_skip='^SKIPPED \[[0-9]+\] [^ ]+: (needs root|cannot mount a tmpfs)'

declare -a results=()
failed=0
total_start=$(date +%s)
for target in "$@"; do
    log=$logs/$target.log
    start=$(date +%s)
    printf '%-24s ... ' "make $target"
    # -k: inside a step, independent parts still run after one fails (all lint findings at once)
    if $make_cmd -k "$target" >"$log" 2>&1; then status=ok; else status=FAILED; failed=$((failed + 1)); fi
    secs=$(($(date +%s) - start))
    echo "$status (${secs}s)"
    if [ "$status" = FAILED ]; then
        echo "---- last $tail_lines lines of $log"
        tail -n "$tail_lines" "$log"
        echo "---- end of $log"
    fi
    grep -E "$privilege_skip" "$log" | sed "s/^/$target: /" >>"$logs/privilege-skips.txt" || true
    results+=("$(printf '%-18s %-7s %5ss' "$target" "$status" "$secs")")
done

echo
echo "================================================================ summary"
printf '%-18s %-7s %6s\n' step result time
printf '%s\n' "${results[@]}"
printf '%-18s %-7s %5ss  (logs: %s/<step>.log)\n' total "" "$(($(date +%s) - total_start))" "$logs"
if [ -s "$logs/missing-legs.txt" ] || [ -s "$logs/privilege-skips.txt" ]; then
    echo
    echo "Could not run on this machine (CI=true makes these failures):"
    sed 's/^/  /' "$logs/missing-legs.txt"
    # "unit: SKIPPED [1] tests/lib/x.py:171: cannot mount a tmpfs here: mount: /tmp/x: denied" lines,
    # one per test, become "unit: 8 tests skipped: cannot mount a tmpfs here: mount: denied"
    awk '{
        step = $1; n = $3; gsub(/[][]/, "", n)
        reason = $0; sub(/^[^ ]+ SKIPPED \[[0-9]+\] [^ ]+ /, "", reason); gsub(/ \/[^ :]*:/, "", reason)
        key = step " " reason
        if (!(key in count)) order[++keys] = key
        count[key] += n
    } END { for (i = 1; i <= keys; i++) { k = order[i]; split(k, parts, " ")
        printf "  %s %d test%s skipped: %s\n", parts[1], count[k], count[k] == 1 ? "" : "s", substr(k, length(parts[1]) + 2) } }' \
        "$logs/privilege-skips.txt"
    if [ "${CI:-}" = true ] && [ -s "$logs/privilege-skips.txt" ]; then
        echo "error: CI=true: tests were skipped for want of a privilege CI has to give (root, tmpfs mounts)"
        failed=$((failed + 1))
    fi
fi
if [ "$failed" -ne 0 ]; then
    echo "make test: FAILED (${failed} of $# steps; see the logs above)"
    exit 1
fi
echo "make test: all $# steps passed"
