#!/usr/bin/env bash
# test_restore.py's refusal test in a fresh podman container, as root without CAP_SYS_PTRACE
# (podman's default capabilities): there root can list a gateway's /proc/PID/fd but not
# read where the descriptors point, so only the lock probe can find the holder.
# Usage: scripts/restore-noptrace.sh [PYTEST_ARGS...]   (make restore-noptrace; needs root, podman)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
image="${FLEET_IMAGE:-localhost/hermes-ops-fleet:bookworm}"
export CONTAINERS_CONF="$repo/tests/fleet/containers.conf"
FLEET_IMAGE="$image" bash "$repo/tests/fleet/build-image.sh"
python_base="$("$repo/.venv/bin/python" -c 'import sys; print(sys.base_prefix)')"
mounts=(-v "$repo:$repo" -v "$python_base:$python_base:ro")
for link in "$repo/.venv" "$repo/.cache/venvs"; do  # shared venvs may live outside the clone
    real="$(readlink -f "$link")"
    [ "$real" = "$link" ] || mounts+=(-v "$real:$real:ro")
done
exec podman --runtime runc run --rm --name "hermes-ops-noptrace-$$" --network host "${mounts[@]}" \
    -w "$repo" -e CI=true "$image" bash -c '
        if [ $(( 0x$(awk "/^CapEff:/ {print \$2}" /proc/self/status) >> 19 & 1 )) = 1 ]; then
            echo "CAP_SYS_PTRACE is present in the container: this run would prove nothing" >&2; exit 2
        fi
        .venv/bin/pytest -q -p no:cacheprovider tests/integration/test_restore.py \
            -k test_restore_refused_while_the_gateway_holds_the_file "$@"' bash "$@"
