#!/usr/bin/env bash
# Record a leg of a test step that cannot run on this machine (an interpreter or a program
# it lacks), the way tox's skip_missing_interpreters does: it is printed now and again in
# `make test`'s summary (scripts/run_steps.sh reads build/logs/missing-legs.txt).
# With CI=true a missing leg is an error (nox's --error-on-missing-interpreters): CI
# must prove the whole matrix.
#
#   scripts/missing_leg.sh STEP LEG REASON     exit 0 (skipped), or 1 when CI=true
set -uo pipefail
step=$1 leg=$2 reason=$3
logs="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)/build/logs"
mkdir -p "$logs"
printf '%s: %s could not run: %s\n' "$step" "$leg" "$reason" >>"$logs/missing-legs.txt"
if [ "${CI:-}" = true ]; then
    echo "error: $step: $leg could not run: $reason (CI=true: every leg must run)" >&2
    exit 1
fi
echo "skipped: $step: $leg could not run: $reason (listed in the summary)" >&2
exit 0
