#!/usr/bin/env bash
# Base image for ansible-builder, made locally (no registry is reachable): Debian trixie
# minbase (debootstrap, the host's apt mirror, as tests/fleet/build-image.sh) with python3
# and pip. ansible-builder v3 drives a dnf-style package manager (`install -y`, `clean
# all`): /usr/local/bin/ee-pkgmgr maps those to apt-get (options.package_manager_path).
# The host's CA bundle goes in so pip inside the build reaches the package index.
#
#   tests/ee/build-base-image.sh [--force]      image: EE_BASE_IMAGE (localhost/hermes-ops-ee-base:trixie)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
image="${EE_BASE_IMAGE:-localhost/hermes-ops-ee-base:trixie}"
packages="python3,python3-pip,python3-venv,ca-certificates,sudo"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/../fleet/containers.conf}"
t0=$(date +%s)
stamp() { echo "[ee-base] $(($(date +%s) - t0))s: $*"; }

if [ "${1:-}" != --force ] && podman image exists "$image" \
    && [ "$(podman image inspect --format '{{ index .Labels "hermes.ee.packages" }}' "$image")" = "$packages" ]; then
    stamp "image $image exists (--force rebuilds)"; exit 0
fi
mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
mirror="${EE_MIRROR:-${mirror:-http://deb.debian.org/debian}}"
work="$(mktemp -d "${TMPDIR:-/tmp}/hermes-ee-rootfs.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
stamp "debootstrap --variant=minbase trixie (+ $packages) from $mirror"
debootstrap --variant=minbase --include="$packages" trixie "$rootfs" "$mirror" >"$work/log" 2>&1 \
    || { tail -n 30 "$work/log" >&2; exit 1; }
cat >"$rootfs/usr/local/bin/ee-pkgmgr" <<'SHIM'
#!/bin/sh
# dnf-style calls of ansible-builder's scripts, done with apt-get (Debian base image).
set -e
cmd="$1"; shift
case "$cmd" in
    install) apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(printf '%s\n' "$@" | grep -v '^-') ;;
    clean) apt-get clean; rm -rf /var/lib/apt/lists/* ;;
    *) echo "ee-pkgmgr: $cmd: not supported" >&2; exit 1 ;;
esac
SHIM
chmod 755 "$rootfs/usr/local/bin/ee-pkgmgr"
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/usr/local/share/ca-bundle.crt"
printf '[global]\ncert = /usr/local/share/ca-bundle.crt\nbreak-system-packages = true\n' >"$rootfs/etc/pip.conf"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
stamp "podman import -> $image"
tar --numeric-owner -C "$rootfs" -c . | podman --runtime runc import \
    --change 'ENV LANG=C.UTF-8' --change "LABEL hermes.ee.packages=$packages" - "$image" >/dev/null
stamp "done"
