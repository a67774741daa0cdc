#!/usr/bin/env bash
# Install the collections the fleet test needs besides hermes_agent.ops itself:
# containers.podman (the podman connection plugin). Galaxy is not reachable, so it is
# taken from the `ansible` package on PyPI, which bundles it: the wheel is downloaded
# with pip (no install) and only ansible_collections/containers/podman is extracted to
#   $FLEET_COLLECTIONS (default <repo>/.cache/fleet/collections).
# Idempotent: nothing is downloaded when the extracted collection is there.
#
#   tests/fleet/install-collections.sh [PYTHON]     (PYTHON: runs pip; default .venv's)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# ansible 12.x (built on ansible-core 2.19): its containers.podman requires_ansible ">=2.8" admits the
# controller venv's core (2.21); the wheel only supplies the collection.
ansible_wheel_version="${FLEET_ANSIBLE_WHEEL:-12.3.0}"
dest="${FLEET_COLLECTIONS:-$repo/.cache/fleet/collections}"
wheels="$repo/.cache/fleet/wheels"
py="${1:-$repo/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
t0=$(date +%s)

manifest="$dest/ansible_collections/containers/podman/MANIFEST.json"
if [ -f "$manifest" ] && [ -f "$dest/.from-ansible-$ansible_wheel_version" ]; then
    echo "[collections] containers.podman present ($dest)"
    exit 0
fi

mkdir -p "$wheels" "$dest"
wheel="$wheels/ansible-$ansible_wheel_version-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
    echo "[collections] pip download ansible==$ansible_wheel_version (wheel only, not installed)"
    "$py" -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" "ansible==$ansible_wheel_version"
fi
rm -rf "$dest/ansible_collections/containers/podman"
"$py" - "$wheel" "$dest" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "ansible_collections/containers/podman/"
with zipfile.ZipFile(wheel) as zf:
    names = [n for n in zf.namelist() if n.startswith(prefix)]
    if not names:
        sys.exit("no %s in %s" % (prefix, wheel))
    zf.extractall(dest, names)
print("[collections] extracted %d files of containers.podman" % len(names))
PY
rm -f "$dest"/.from-ansible-*
touch "$dest/.from-ansible-$ansible_wheel_version"
version=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["collection_info"]["version"])' "$manifest")
echo "[collections] containers.podman $version from ansible $ansible_wheel_version in $dest ($(( $(date +%s) - t0 ))s)"
