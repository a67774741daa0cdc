#!/usr/bin/env bash
# Build the image of the fleet's systemd host: the fleet image (build-image.sh) with systemd as
# init (systemd, systemd-sysv; dbus, libpam-systemd and dbus-user-session for logind and each
# user's own manager and bus, which `systemctl --user --machine=USER@` reaches), installed with
# apt-get from the container's network (the host's Debian mirror, bridge).
#
#   tests/fleet/build-systemd-image.sh [--force]
#
# Idempotent: skipped when the image exists, built from the current base image with the same
# packages (label hermes.fleet.systemd; unless --force). Env: FLEET_IMAGE (the base),
# FLEET_SYSTEMD_IMAGE (default localhost/hermes-ops-fleet-systemd:bookworm).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
base="${FLEET_IMAGE:-localhost/hermes-ops-fleet:bookworm}"
image="${FLEET_SYSTEMD_IMAGE:-localhost/hermes-ops-fleet-systemd:bookworm}"
packages="systemd systemd-sysv dbus dbus-user-session libpam-systemd"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
t0=$(date +%s)
stamp() { echo "[build-systemd-image] $(( $(date +%s) - t0 ))s: $*"; }

"$here/build-image.sh" >/dev/null
label="$packages from $(podman image inspect --format '{{.Id}}' "$base")"
if [ "${1:-}" != "--force" ] && podman image exists "$image" \
    && [ "$(podman image inspect --format '{{ index .Labels "hermes.fleet.systemd" }}' "$image")" = "$label" ]; then
    stamp "image $image exists, nothing to do (use --force to rebuild)"
    exit 0
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/hermes-fleet-systemd.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# policy-rc.d: no daemon started during the build; pam_loginuid: sshd's PAM session cannot write
# /proc/self/loginuid in a container (the base image does the same for cron).
cat > "$work/Containerfile" <<CONTAINERFILE
FROM $base
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /usr/sbin/policy-rc.d \
 && sed -i 's/^\(session[[:space:]]\+required[[:space:]]\+pam_loginuid.so\)/# \1/' /etc/pam.d/sshd
LABEL hermes.fleet.systemd="$label"
CMD ["/sbin/init"]
CONTAINERFILE
stamp "podman build $image (apt-get install $packages)"
if ! podman build --runtime runc --tag "$image" "$work" >"$work/build.log" 2>&1; then
    tail -n 30 "$work/build.log" >&2
    echo "build-systemd-image: podman build failed (apt-get install $packages in $base)" >&2
    exit 1
fi
stamp "done: $(podman image inspect --format '{{.Id}}' "$image" | cut -c1-12)"
