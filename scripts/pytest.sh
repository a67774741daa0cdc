#!/usr/bin/env bash
# Run pytest and refuse "no tests collected" (pytest exit code 5) as a pass.
# Usage: scripts/pytest.sh PYTEST [ARGS...]
set -uo pipefail
"$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "error: pytest collected no tests for: ${*:2} (exit code 5); an empty suite is a failure here" >&2
fi
exit "$rc"
