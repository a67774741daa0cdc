#!/usr/bin/env bash
# Run make targets in turn (all of them, even after a failure), each with its output in
# build/logs/<target>.log, each bounded by its budget, the whole run by a deadline: a passing
# step prints one line, a failing one the end of its log. Then the summary a newcomer reads:
# one row per step (time, budget, baseline), the steps that ran 1.5x over their baseline, and
# what could not run here and why (legs whose interpreter or program is missing:
# scripts/missing_leg.sh; tests pytest skipped for want of a privilege the machine does not
# give, e.g. in a container). The summary is printed on any exit, a signal included.
# Exits non-zero if any step failed, overran its budget or did not run. With CI=true a
# privilege skip fails the run too.
#
#   scripts/run_steps.sh MAKE STEP...
#     STEP is a make target, or targets joined by "+" to run them at the same time (only for
#     steps that share no host state and run no timing-sensitive test). A group written
#     "&a+b" is started and left running while the next steps go on (it holds STEPS_QUIET_LOCK
#     shared); a step named *-timing starts only once it can take that lock alone, i.e. once
#     every such group has ended, so nothing of this run runs beside a timing test.
#   env: STEPS_TITLE (the summary's name, "make test"), STEPS_DEADLINE (seconds for the whole
#        run; default: the "total" line of the budgets file), STEPS_BUDGETS (.ci/budgets),
#        STEPS_TIMES (per-step times, merged into build/logs/times.json), STEP_TAIL (lines of a
#        failed log shown, 60), STEPS_HANG (a step name: that step first runs `sleep 100000`,
#        to prove that a hung step is stopped and named), STEPS_DRIFT_MIN (30: shorter steps are
#        never named slower than their baseline), STEPS_QUIET_LOCK (the file of the lock above;
#        exported to the steps, so a nested run's *-timing steps wait for this run's "&" groups).
set -uo pipefail
make_cmd=$1
shift
logs=build/logs
mkdir -p "$logs"
budgets_file=${STEPS_BUDGETS:-.ci/budgets}
times_file=${STEPS_TIMES:-$logs/times.json}
title=${STEPS_TITLE:-make test}
tail_lines=${STEP_TAIL:-60}
# -k: inside a step, independent parts still run after one fails (all lint findings at once);
# .ci/run gives "" so its jobs are the plain commands the README names.
make_flags=${STEPS_MAKE_FLAGS--k}
unset STEPS_MAKE_FLAGS
grace=15  # seconds between SIGTERM and SIGKILL of a step that overran
drift_min=${STEPS_DRIFT_MIN:-30}
STEPS_QUIET=${STEPS_QUIET:-}  # non-empty: no "started" line per step  # steps shorter than this are never called slow (noise)
# pytest's -ra lines for tests that need what a container or a non-root user lacks
privilege_skip='^SKIPPED \[[0-9]+\] [^ ]+: (needs root|cannot mount a tmpfs)'
if [ -z "${STEPS_NESTED:-}" ]; then
    : >"$logs/missing-legs.txt"
    : >"$logs/privilege-skips.txt"
fi
export STEPS_NESTED=1  # a run_steps.sh started by one of these steps keeps the lists above

# budgets file: "step baseline_seconds budget_seconds" per line; "total - DEADLINE".
budget_of() { awk -v s="$1" '$1 == s { print $3; exit }' "$budgets_file" 2>/dev/null; }
baseline_of() { awk -v s="$1" '$1 == s { print $2; exit }' "$budgets_file" 2>/dev/null; }
deadline=${STEPS_DEADLINE:-$(budget_of total)}
deadline=${deadline:-5100}
default_budget=1800

declare -a results=() drift=() overran=()
declare -A pid_of=() start_of=() budget_for=() recorded=()
declare -a all_steps=()
failed=0
passed=0
total_start=$(date +%s)
summary_done=0

kill_step() {  # kill_step STEP: its whole process group, TERM then KILL
    local pid=${pid_of[$1]:-}
    [ -n "$pid" ] || return 0
    kill -TERM -- "-$pid" 2>/dev/null
    local i
    for ((i = 0; i < grace; i++)); do
        kill -0 -- "-$pid" 2>/dev/null || return 0
        sleep 1
    done
    kill -KILL -- "-$pid" 2>/dev/null
}

record() {  # record STEP STATUS SECONDS
    local step=$1 status=$2 secs=$3 base budget
    recorded[$step]=1
    base=$(baseline_of "$step")
    budget=${budget_for[$step]:-$(budget_of "$step")}
    results+=("$(printf '%-18s %-8s %5ss %7s %8s' "$step" "$status" "$secs" "${budget:--}s" "${base:--}s")")
    if [ -n "$base" ] && [ "$secs" -gt "$drift_min" ] && [ $((secs * 2)) -ge $((base * 3)) ]; then
        drift+=("$step took ${secs}s, $(awk -v a="$secs" -v b="$base" 'BEGIN { printf "%.1f", a / b }')x its baseline of ${base}s")
    fi
    python3 - "$times_file" "$step" "$status" "$secs" "${budget:-0}" "${base:-0}" <<'PY' || true
import json, os, sys
path, step, status, secs, budget, base = sys.argv[1:]
try:
    with open(path) as f:
        data = json.load(f)
except (OSError, ValueError):
    data = {}
data.setdefault("steps", {})[step] = {
    "seconds": int(secs), "status": status, "budget": int(budget), "baseline": int(base) or None}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(data, f, indent=1, sort_keys=True)
os.replace(tmp, path)
PY
}

summary() {
    [ "$summary_done" = 1 ] && return
    summary_done=1
    echo
    echo "================================================================ summary: $title"
    printf '%-18s %-8s %6s %7s %8s\n' step result time budget baseline
    printf '%s\n' "${results[@]}"
    printf '%-18s %-8s %5ss %7s  (logs: %s/<step>.log; times: %s)\n' total "" "$(($(date +%s) - total_start))" \
        "${deadline}s" "$logs" "$times_file"
    if [ "${#overran[@]}" -gt 0 ]; then
        echo
        echo "Stopped (a budget, the deadline or a signal):"
        printf '  %s\n' "${overran[@]}"
    fi
    if [ "${#drift[@]}" -gt 0 ]; then
        echo
        echo "Slower than their baseline (1.5x or more; $budgets_file):"
        printf '  %s\n' "${drift[@]}"
    fi
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
        echo "$title: FAILED (${failed} of $nsteps steps; see the logs above)"
    else
        echo "$title: all $nsteps steps passed"
    fi
    # the plain closing line (steps that did not run count as failed)
    echo "steps: $passed passed, $((nsteps - passed)) failed"
}

on_signal() {
    local sig=$1 step now
    now=$(date +%s)
    echo
    echo "$title: got SIG$sig: stopping the running steps"
    for step in "${!pid_of[@]}"; do
        kill_step "$step"
        overran+=("$step: stopped by SIG$sig after $((now - start_of[$step]))s; the end of $logs/$step.log:")
        while IFS= read -r line; do overran+=("    $line"); done < <(tail -n 15 "$logs/$step.log" 2>/dev/null)
        record "$step" KILLED $((now - start_of[$step]))
        failed=$((failed + 1))
    done
    pid_of=()
    # the steps the signal kept from starting get a row too, so the summary lists every step
    for step in "${all_steps[@]}"; do
        [ -n "${recorded[$step]:-}" ] && continue
        echo "make $step: NOT RUN (SIG$sig came first)"
        record "$step" "NOT-RUN" 0
        failed=$((failed + 1))
    done
    summary
    exit 1
}
for sig in TERM INT HUP; do
    # shellcheck disable=SC2064  # the signal's name is fixed here, at trap time
    trap "on_signal $sig" "$sig"
done
trap 'summary' EXIT

quiet_lock=${STEPS_QUIET_LOCK:-}
[ -z "$quiet_lock" ] || { mkdir -p "$(dirname "$quiet_lock")" && : >>"$quiet_lock" && export STEPS_QUIET_LOCK; }

# start_step STEP [shared]: in its own process group (setsid), so that stopping it stops all it
# started; "shared": holding the quiet lock shared while it runs.
start_step() {
    local step=$1 hang="" hold=""
    [ "${STEPS_HANG:-}" = "$step" ] && hang="echo 'STEPS_HANG=$step: sleeping 100000 s' && sleep 100000 && "
    [ "${2:-}" = shared ] && [ -n "$quiet_lock" ] && hold="flock -s $(printf %q "$quiet_lock") "
    budget_for[$step]=$(budget_of "$step")
    budget_for[$step]=${budget_for[$step]:-$default_budget}
    start_of[$step]=$(date +%s)
    # shellcheck disable=SC2016  # $0 and $1 are the inner shell's
    setsid bash -c "${hang}exec ${hold}"'$0 $1 "$2"' "$make_cmd" "$make_flags" "$step" >"$logs/$step.log" 2>&1 </dev/null &
    pid_of[$step]=$!
    [ -n "$STEPS_QUIET" ] || printf '%-24s started (%ss into %s; budget %ss)\n' "make $step" \
        $((start_of[$step] - total_start)) "$title" "${budget_for[$step]}"
}

finish_step() {  # finish_step STEP STATUS
    local step=$1 status=$2 secs
    secs=$(($(date +%s) - start_of[$step]))
    unset "pid_of[$step]"
    printf '%-24s %s (%ss)\n' "make $step" "$status" "$secs"
    if [ "$status" = ok ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        # the failing tests' names and assertion lines first: the tail alone often shows only the count
        if grep -qE '^_{3,} .+ _{3,}$' "$logs/$step.log"; then
            echo "---- failed tests and their E lines in $logs/$step.log"
            grep -E '^(_{3,} .+ _{3,}|E  .*)$' "$logs/$step.log" | head -n 40
        fi
        # and an Ansible run's failed tasks and failed checks (a molecule tail shows only its recap)
        local ansible_failed='^(fatal|failed): \[|"FAIL |Failed: '
        if grep -qE "$ansible_failed" "$logs/$step.log"; then
            echo "---- failed tasks and checks in $logs/$step.log"
            grep -E "$ansible_failed" "$logs/$step.log" | cut -c1-600 | head -n 40
        fi
        echo "---- last $tail_lines lines of $logs/$step.log"
        tail -n "$tail_lines" "$logs/$step.log"
        echo "---- end of $logs/$step.log"
    fi
    grep -E "$privilege_skip" "$logs/$step.log" | sed "s/^/$step: /" >>"$logs/privilege-skips.txt" || true
    record "$step" "$status" "$secs"
}

# watch_once: one look at every running step: one that ended is finished, one over its budget
# or running at the deadline is stopped.
watch_once() {
    local now step pid rc elapsed why
    now=$(date +%s)
    for step in "${!pid_of[@]}"; do
        pid=${pid_of[$step]}
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid"
            rc=$?
            if [ "$rc" -eq 0 ]; then finish_step "$step" ok; else finish_step "$step" FAILED; fi
            continue
        fi
        elapsed=$((now - start_of[$step]))
        why=""
        if [ "$elapsed" -ge "${budget_for[$step]}" ]; then
            why="overran its budget of ${budget_for[$step]}s"
        elif [ $((now - total_start)) -ge "$deadline" ]; then
            why="was running at the ${deadline}s deadline of $title"
        fi
        [ -n "$why" ] || continue
        echo "$title: $step $why: stopping it"
        kill_step "$step"
        wait "$pid" 2>/dev/null
        overran+=("$step $why (stopped after ${elapsed}s); the end of $logs/$step.log:")
        while IFS= read -r line; do overran+=("    $line"); done < <(tail -n 15 "$logs/$step.log")
        finish_step "$step" TIMEOUT
    done
}

# quiet_now: true when no "&" group (of this run or an outer one) holds the quiet lock
quiet_now() { [ -z "$quiet_lock" ] || flock -x -n "$quiet_lock" true; }

nsteps=0
for group in "$@"; do
    IFS=+ read -r -a members <<<"${group#&}"
    nsteps=$((nsteps + ${#members[@]}))
    all_steps+=("${members[@]}")
done
for group in "$@"; do
    IFS=+ read -r -a members <<<"${group#&}"
    if [ $(($(date +%s) - total_start)) -ge "$deadline" ]; then
        for step in "${members[@]}"; do
            printf '%-24s %s\n' "make $step" "NOT RUN (the ${deadline}s deadline had passed)"
            record "$step" "NOT-RUN" 0
            failed=$((failed + 1))
        done
        continue
    fi
    if [ "$group" != "${group#&}" ]; then
        for step in "${members[@]}"; do start_step "$step" shared; done
        continue
    fi
    for step in "${members[@]}"; do
        case "$step" in
            *-timing)
                if ! quiet_now; then
                    echo "$title: $step waits until the jobs beside it have ended (timing tests run alone)"
                    until quiet_now; do
                        sleep 1
                        watch_once
                    done
                fi
                ;;
        esac
        start_step "$step"
    done
    # Watch until this group's steps have ended (an "&" group's may go on running).
    while :; do
        waiting=0
        for step in "${members[@]}"; do
            [ -n "${pid_of[$step]:-}" ] && waiting=1
        done
        [ "$waiting" = 1 ] || break
        sleep 1
        watch_once
    done
done
# Then whatever "&" group still runs.
while [ "${#pid_of[@]}" -gt 0 ]; do
    sleep 1
    watch_once
done
summary
[ "$failed" -eq 0 ]
