#!/usr/bin/env bash
# Build the execution environment of extras/execution-environment/ for real, without a
# registry: on the local Debian base image of tests/ee/build-base-image.sh, with podman.
#
#   scripts/ee_image.sh BUILDER_VENV_BIN            image: EE_IMAGE (localhost/hermes-ops-ee:<version>)
#
# The definition used is extras/execution-environment/execution-environment.yml with these
# changes written into build/ee-image/ (the example itself stays as users copy it): the
# local base image, ansible-builder's package manager pointed at the base's apt shim (and its
# pip used as it is: Debian's python3 has no ensurepip), and
# ansible-core / ansible-runner pinned as requirements/ee.txt pins them, and the podman
# client as a system package (for the test fleet's connection, below).
set -euo pipefail
bin="$1"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$repo/build/ee-image"
export CONTAINERS_CONF="$repo/tests/fleet/containers.conf"
t0=$(date +%s)
stamp() { echo "[ee-image] $(($(date +%s) - t0))s: $*"; }

bash "$repo/tests/ee/build-base-image.sh"
base="${EE_BASE_IMAGE:-localhost/hermes-ops-ee-base:trixie}"
rm -rf "$work" && mkdir -p "$work"
"$bin/ansible-galaxy" collection build --force --output-path "$work" "$repo" >/dev/null
artifact="$(ls "$work"/hermes_agent-ops-*.tar.gz)"
version="$(basename "$artifact" .tar.gz)"; version="${version#hermes_agent-ops-}"
image="${EE_IMAGE:-localhost/hermes-ops-ee:$version}"
cp "$repo/extras/execution-environment/requirements.yml" "$work/"
"$bin/python" - "$repo" "$work" "$base" <<'PY'
import re, sys, yaml
repo, work, base = sys.argv[1:]
with open(f"{repo}/extras/execution-environment/execution-environment.yml") as f:
    ee = yaml.safe_load(f)
pins = dict(re.match(r"^([\w-]+)==(\S+)", line).groups()
            for line in open(f"{repo}/requirements/ee.txt") if re.match(r"^[\w-]+==", line))
ee["images"]["base_image"]["name"] = base
ee["options"]["package_manager_path"] = "/usr/local/bin/ee-pkgmgr"
ee["options"]["skip_pip_install"] = True  # Debian has no ensurepip; the base has python3-pip
ee["dependencies"]["ansible_core"]["package_pip"] = "ansible-core==" + pins["ansible-core"]
ee["dependencies"]["ansible_runner"]["package_pip"] = "ansible-runner==" + pins["ansible-runner"]
# The podman client, for the test fleet's connection only (containers.podman: `podman
# --remote exec` through the host's podman API socket; scripts/ee_run.sh). A real fleet is
# reached over SSH and needs nothing from the image beyond ansible-core.
ee["dependencies"]["system"] = ["podman"]
with open(f"{work}/execution-environment.yml", "w") as f:
    yaml.safe_dump(ee, f, sort_keys=False)
PY
stamp "definition $work/execution-environment.yml (base $base), building $image"
(cd "$work" && "$bin/ansible-builder" build -f execution-environment.yml -c context -t "$image" \
    --container-runtime podman --extra-build-cli-args "--network host" -v 2) >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; echo "ee-image: ansible-builder build failed (log $work/build.log)" >&2; exit 1; }
tail -n 3 "$work/build.log"
podman run --rm "$image" ansible-galaxy collection list hermes_agent.ops | tail -n 1
stamp "done: $image ($(podman image inspect --format '{{.Size}}' "$image") bytes)"
