#!/usr/bin/env bash
# Run each make target in turn (all of them, even after a failure), print a summary,
# and exit non-zero if any step failed.  Usage: scripts/run_steps.sh MAKE TARGET...
set -uo pipefail
make_cmd=$1
shift
declare -a results=()
failed=0
for target in "$@"; do
    echo
    echo "================================================================ make ${target}"
    start=$(date +%s)
    # -k: inside a step, independent parts still run after one fails (all lint findings at once)
    if $make_cmd -k "$target"; then status=ok; else status=FAILED; failed=$((failed + 1)); fi
    results+=("$(printf '%-18s %-7s %5ss' "$target" "$status" "$(($(date +%s) - start))")")
done
echo
echo "================================================================ summary"
printf '%s\n' "${results[@]}"
if [ "$failed" -ne 0 ]; then
    echo "make test: ${failed} of $# steps FAILED"
    exit 1
fi
echo "make test: all $# steps passed"
