#!/usr/bin/env bash
# Build the base image of the fleet test: Debian bookworm minbase with python3, cron,
# sudo, sqlite3, procps, restic, openssh (client and server), prometheus-node-exporter
# (no image registry is reachable: debootstrap + podman import).
#
#   tests/fleet/build-image.sh [--force]
#
# Idempotent: installs the host tools (podman, runc, debootstrap) only when missing and
# skips the build when the image already exists with the same package list (label
# hermes.fleet.packages; unless --force). Reads the Debian mirror
# from the host's apt sources. Env: FLEET_IMAGE (default localhost/hermes-ops-fleet:bookworm),
# FLEET_MIRROR (override the mirror), FLEET_SUITE (default bookworm).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
image="${FLEET_IMAGE:-localhost/hermes-ops-fleet:bookworm}"
suite="${FLEET_SUITE:-bookworm}"
# restic + openssh-client: a host's off-site push to the SFTP repository; openssh-server: the
# fourth container that serves it (the disk-loss drill). One image for all four keeps one build.
packages="python3,cron,sudo,sqlite3,procps,acl,ca-certificates,adduser,init-system-helpers,restic,openssh-client,openssh-server"
# Installed after debootstrap with daemons held back (policy-rc.d): its postinst would
# start node_exporter in the chroot, on the host's network.
late_packages="prometheus-node-exporter"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
force=0
[ "${1:-}" = "--force" ] && force=1

t0=$(date +%s)
stamp() { echo "[build-image] $(( $(date +%s) - t0 ))s: $*"; }

# 1. host tools -------------------------------------------------------------------------
need=()
for tool in podman:podman runc:runc debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "build-image: need root to apt-get install ${need[*]}" >&2; exit 1; }
    stamp "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # uidmap/slirp4netns/fuse-overlayfs are podman recommends; keep them out (root, --network none)
    apt-get install -y -qq --no-install-recommends "${need[@]}" catatonit conmon >/dev/null
    stamp "host tools installed"
else
    stamp "host tools present ($(podman --version))"
fi

# 2. cached? --------------------------------------------------------------------------
if [ "$force" = 0 ] && podman image exists "$image"; then
    built_with=$(podman image inspect --format '{{ index .Labels "hermes.fleet.packages" }}' "$image" 2>/dev/null || true)
    if [ "$built_with" = "$packages,$late_packages" ]; then
        stamp "image $image exists, nothing to do (use --force to rebuild)"
        exit 0
    fi
    stamp "image $image was built with other packages (${built_with:-unknown}): rebuilding"
fi

# 3. mirror from apt sources ------------------------------------------------------------
mirror="${FLEET_MIRROR:-}"
if [ -z "$mirror" ]; then
    # deb822 (*.sources): a URIs: line in a stanza whose Suites: has the bare suite
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        mirror=$(awk -v suite="$suite" '
            /^[[:space:]]*$/ { if (u != "" && s ~ ("(^| )" suite "( |$)")) { print u; exit } u=""; s="" }
            /^URIs:/ { u=$2 } /^Suites:/ { $1=""; s=$0 }
            END { if (u != "" && s ~ ("(^| )" suite "( |$)")) print u }' "$f" | head -n1)
        [ -n "$mirror" ] && break
    done
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk -v suite="$suite" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { if ($(i+1) == suite) { print $i; exit } } }' /etc/apt/sources.list)
fi
mirror="${mirror:-http://deb.debian.org/debian}"
stamp "mirror: $mirror"

# 4. debootstrap ------------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/hermes-fleet-rootfs.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
stamp "debootstrap --variant=minbase $suite (+ $packages)"
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 30 "$work/debootstrap.log" >&2
    [ -f "$rootfs/debootstrap/debootstrap.log" ] && tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
    echo "build-image: debootstrap failed (mirror $mirror)" >&2
    exit 1
fi
stamp "debootstrap done ($(du -sh "$rootfs" | cut -f1))"

# 4b. packages whose postinst starts a daemon: from the host's apt (same suite), no start
stamp "install $late_packages (daemons not started)"
( cd "$work" && apt-get download $late_packages >"$work/download.log" 2>&1 ) || { cat "$work/download.log" >&2; exit 1; }
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"
chmod 755 "$rootfs/usr/sbin/policy-rc.d"
mkdir -p "$rootfs/tmp/late-debs"
cp "$work"/*.deb "$rootfs/tmp/late-debs/"
chroot "$rootfs" sh -c 'dpkg -i /tmp/late-debs/*.deb' >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; exit 1; }
rm -rf "$rootfs/tmp/late-debs" "$rootfs/usr/sbin/policy-rc.d"

# 5. container tweaks -------------------------------------------------------------------
# pam_loginuid cannot write /proc/self/loginuid in a container: cron would refuse to run jobs.
sed -i 's/^\(session[[:space:]]\+required[[:space:]]\+pam_loginuid.so\)/# \1/' "$rootfs/etc/pam.d/cron"
# no daemons from postinst scripts inside the rootfs, no apt caches in the image
rm -f "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* 2>/dev/null || true
echo "hermes-fleet" > "$rootfs/etc/hostname"
printf 'fleet image built %s from %s\n' "$(date -u +%FT%TZ)" "$mirror" > "$rootfs/etc/hermes-fleet-release"

# 6. import -----------------------------------------------------------------------------
stamp "podman import -> $image"
tar --numeric-owner -C "$rootfs" -c . | podman import \
    --change 'CMD ["/usr/sbin/cron", "-f"]' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL hermes.fleet.packages=$packages,$late_packages" \
    - "$image" >/dev/null
stamp "done: $(podman image inspect --format '{{.Id}} {{.Size}}' "$image" | cut -c1-12,65-) bytes"
