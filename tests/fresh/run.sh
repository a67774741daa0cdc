#!/usr/bin/env bash
# The fresh-machine job: the README's prerequisite line and its two commands, on a plain
# Debian built with debootstrap, with nothing else from this host but its CA bundle and a
# pip configuration that points at it (this machine reaches the package registries only
# through that bundle).
#
#   tests/fresh/run.sh [SUITE] [fast|full|image]      default: trixie fast
#
# `full` runs the README's `make demo` and `make test`; `fast` (what CI runs, to stay in its
# time) runs `make demo` and `make test TEST_STEPS="$FRESH_FAST_STEPS"` (default: lint; the
# whole of `make test`'s set-up: the controller venv, the nine Hermes release venvs, the
# collection link).
#
# Steps: (1) a minbase rootfs of SUITE from the mirror the host's apt uses, cached as
# .cache/fresh/<suite>-rootfs.tar and imported as localhost/hermes-ops-fresh:<suite>;
# (2) a clone of this repository's HEAD (committed work only); (3) in a new container
# (podman --runtime runc, host network, default capabilities): apt-get install of exactly
# the line between the README's `<!-- prerequisites -->` markers, `git clone` of (2),
# then the two commands, as a new user would type them. Each one's wall time is printed;
# the container's output is kept in build/fresh/<suite>-<part>.log.
# Env: FRESH_MIRROR (default: read from the apt sources), FRESH_REBUILD=1 (new rootfs),
# FRESH_CACHE (where the rootfs is kept, default .cache/fresh; an empty directory times the
# job as CI runs it, from a clean clone with no cache), FRESH_TEST_RUNS=N (the test command N
# times in a row in the same container, after one `make demo`: a flaky test shows up as a
# failed run among N; default 1).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
suite=${1:-trixie}
part=${2:-fast}
# The fast part runs no test suite: `make demo` has just run the main playbook in the container,
# and the host's `make test` ran every suite on the same Python minor (3.13) just before; on a CI machine 2.5-3x slower than the baseline the engine suite here made this job
# the last to end, past CI's deadline. FRESH_FAST_STEPS="lint unit" (unit: without the timing
# tests, as CI runs this job beside the fleet's) or "lint unit integration" adds them back.
case "$part" in
    fast) test_cmd="make test TEST_STEPS='${FRESH_FAST_STEPS:-lint}' PYTEST_MARKERS='not matrix and not timing'" ;;
    full) test_cmd="make test" ;;
    image) test_cmd="" ;;  # only make (or find) the image: `make prepare` with the images lane
    *) echo "usage: $0 [SUITE] [fast|full|image]" >&2; exit 2 ;;
esac
runs=${FRESH_TEST_RUNS:-1}
case "$runs" in
    '' | *[!0-9]* | 0) echo "error: FRESH_TEST_RUNS must be a whole number of runs, 1 or more (got '$runs')" >&2; exit 2 ;;
esac
test_cmds=""
[ -n "$test_cmd" ] && for _ in $(seq "$runs"); do test_cmds+=" \"$test_cmd\""; done
image=localhost/hermes-ops-fresh:$suite
cache=${FRESH_CACHE:-$repo/.cache/fresh}
rootfs_tar=$cache/$suite-rootfs.tar
logdir=$repo/build/fresh
export CONTAINERS_CONF=${CONTAINERS_CONF:-$repo/tests/fleet/containers.conf}
podman=(podman --runtime runc)
t0=$(date +%s)
say() { echo "[fresh-machine $suite] $(($(date +%s) - t0))s: $*"; }
mkdir -p "$cache" "$logdir"

for tool in podman runc debootstrap git; do
    command -v "$tool" >/dev/null || { echo "error: fresh-machine needs $tool on this host (apt-get install $tool)" >&2; exit 1; }
done

# The README's line is the contract: read it, do not repeat it here.
prereq=$(sed -n "/<!-- prerequisites -->/,/<!-- \/prerequisites -->/p" "$repo/README.md" | grep -m1 "apt-get install" \
    | sed -E 's/^.*(apt-get install)/\1/; s/`.*$//')
case "$prereq" in
    *"apt-get install"*) ;;
    *) echo "error: README.md has no apt-get install line between <!-- prerequisites --> markers" >&2; exit 1 ;;
esac

apt_mirror() {
    local f m=""
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        m=$(awk '/^URIs:/ && $2 ~ /debian\/?$/ { print $2; exit }' "$f")
        [ -n "$m" ] && break
    done
    if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
        m=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:.*debian\/?$/) { print $i; exit } }' /etc/apt/sources.list)
    fi
    echo "${m:-http://deb.debian.org/debian}"
}

# 1. the image ---------------------------------------------------------------------------
if [ "${FRESH_REBUILD:-0}" = 1 ] || [ ! -s "$rootfs_tar" ]; then
    mirror=${FRESH_MIRROR:-$(apt_mirror)}
    work=$(mktemp -d "${TMPDIR:-/tmp}/hermes-fresh-$suite.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    say "debootstrap --variant=minbase $suite from $mirror (cached in $rootfs_tar)"
    if ! debootstrap --variant=minbase "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
        tail -n 30 "$work/debootstrap.log" >&2
        echo "error: debootstrap $suite from $mirror failed" >&2
        exit 1
    fi
    rm -f "$work"/rootfs/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$work/rootfs" -cf "$rootfs_tar.tmp" .
    mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$work"
    trap - EXIT
    "${podman[@]}" rmi -f "$image" >/dev/null 2>&1 || true
fi
# The stamp pairs the tar's mtime with the image podman holds under the tag: another cache
# directory's run (FRESH_CACHE) re-tags the image, and this one must then import its own again.
image_stamp() { echo "$(stat -c %Y "$rootfs_tar") $("${podman[@]}" image inspect --format '{{.Id}}' "$image" 2>/dev/null)"; }
if [ "$(cat "$cache/$suite.image-id" 2>/dev/null)" != "$(image_stamp)" ] \
    || ! "${podman[@]}" image exists "$image"; then
    say "podman import $rootfs_tar -> $image"
    "${podman[@]}" import --quiet --change 'ENV LANG=C.UTF-8' "$rootfs_tar" "$image" >/dev/null
    image_stamp >"$cache/$suite.image-id"
fi

if [ "$part" = image ]; then
    say "image $image ready"
    exit 0
fi

# 2. a clean clone of HEAD ----------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/hermes-fresh-src.XXXXXX")
name=hermes-ops-fresh-$suite-$$
# shellcheck disable=SC2317  # called by the trap
cleanup() { "${podman[@]}" rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
git clone --quiet --bare "$repo" "$work/hermes-ops.git"
say "clone of HEAD $(git -C "$repo" rev-parse --short HEAD)"

# 3. what the host lends: its CA bundle and a pip config naming it, nothing else ----------
ca=${FRESH_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -r "$ca" ] || { echo "error: no CA bundle at $ca (FRESH_CA_BUNDLE=...)" >&2; exit 1; }
cp "$ca" "$work/ca-bundle.crt"
printf '[global]\ncert = /etc/hermes-fresh/ca-bundle.crt\n' >"$work/pip.conf"

# The container's script: the README's line, the clone, then each target with its time.
cat >"$work/inside.sh" <<INSIDE
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cp /etc/hermes-fresh/pip.conf /etc/pip.conf
. /etc/os-release
echo "== \$PRETTY_NAME; README prerequisites: $prereq"
t=\$(date +%s)
{ apt-get update -qq && $prereq -y -qq --no-install-recommends; } >/tmp/apt.log 2>&1 || { tail -n 30 /tmp/apt.log; exit 1; }
echo "== prerequisites installed in \$((\$(date +%s) - t))s (\$(python3 -c 'import sqlite3, sys; print("Python", sys.version.split()[0], "with SQLite", sqlite3.sqlite_version)'))"
git clone --quiet /src/hermes-ops.git /root/hermes-ops
cd /root/hermes-ops
rc=0
for cmd in "make demo"$test_cmds; do
    echo "== \$cmd"
    t=\$(date +%s)
    if eval "\$cmd"; then status=ok; else status=FAILED; rc=1; fi
    echo "== \$cmd: \$status in \$((\$(date +%s) - t))s"
done
exit \$rc
INSIDE

log=$logdir/$suite-$part.log
say "container $name: README line, git clone, make demo, $test_cmd ($runs time(s)) (log: $log)"
rc=0
"${podman[@]}" run --name "$name" --network host --hostname "fresh-$suite" \
    -v "$work/hermes-ops.git:/src/hermes-ops.git:ro" \
    -v "$work/ca-bundle.crt:/etc/hermes-fresh/ca-bundle.crt:ro" \
    -v "$work/pip.conf:/etc/hermes-fresh/pip.conf:ro" \
    -v "$work/inside.sh:/etc/hermes-fresh/inside.sh:ro" \
    "$image" bash /etc/hermes-fresh/inside.sh 2>&1 | tee "$log" || rc=$?
say "$([ "$rc" -eq 0 ] && echo passed || echo FAILED) (make demo, $test_cmd)"
exit "$rc"
