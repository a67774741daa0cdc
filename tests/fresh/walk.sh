#!/usr/bin/env bash
# The operator's walk: docs/getting_started.md's commands as written, on a plain Debian
# container (the fresh-machine job's image), beside a real Hermes 0.22.2 gateway serving chats.
#
#   tests/fresh/walk.sh [SUITE]      default: bookworm (Debian 12: python3 3.11, SQLite 3.40.1,
#                                    so the gateway's state.db is in rollback-journal mode)
#
# In the container (tests/fresh/walk_inside.sh): python3, cron, sudo and git from apt; a clone of
# this repository's HEAD at /path/to/checkout (getting_started's git+file address); the gateway
# (tests/fresh/walk_gateway.py) as the user hermes, in /home/hermes/.hermes; ansible-core from PyPI,
# after checking that pip admits each supported core on this Python as the README says; then each
# command of a `<!-- walk -->` block (tests/fresh/walk_commands.py), and the checks of what the
# docs say of them (tests/fresh/walk_check.py). The host lends its CA bundle (pip) and, read-only
# at its own path, its 0.22.2 venv (make prepare's) where that runs in the container; else the
# container installs the release from PyPI. Output: build/fresh/<suite>-walk.log.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
suite=${1:-bookworm}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$repo/tests/fleet/containers.conf}
podman=(podman --runtime runc)
image=localhost/hermes-ops-fresh:$suite
logdir=$repo/build/fresh
mkdir -p "$logdir"
t0=$(date +%s)
say() { echo "[fresh-walk $suite] $(($(date +%s) - t0))s: $*"; }

# Any plain image of the suite will do (make prepare's, or the fresh-machine job's): made only when missing.
"${podman[@]}" image exists "$image" || bash "$repo/tests/fresh/run.sh" "$suite" image

work=$(mktemp -d "${TMPDIR:-/tmp}/hermes-walk-src.XXXXXX")
name=hermes-ops-walk-$suite-$$
# shellcheck disable=SC2317  # called by the trap
cleanup() { "${podman[@]}" rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
git clone --quiet --bare "$repo" "$work/hermes-ops.git"
ca=${FRESH_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -r "$ca" ] || { echo "error: no CA bundle at $ca (FRESH_CA_BUNDLE=...)" >&2; exit 1; }
cp "$ca" "$work/ca-bundle.crt"
printf '[global]\ncert = /etc/hermes-fresh/ca-bundle.crt\n' >"$work/pip.conf"

# The host's release venv, and the interpreter it was made from when that is not the system's.
mounts=()
venv=""
if [ -x "$repo/.cache/venvs/hermes-0.22.2.post1/bin/python" ]; then
    venv=$(readlink -f "$repo/.cache/venvs/hermes-0.22.2.post1")
    base=$(dirname "$(sed -n 's/^home = //p' "$venv/pyvenv.cfg")")
    mounts+=(-v "$venv:$venv:ro")
    case "$base" in
        /usr | /usr/*) ;;
        *) mounts+=(-v "$base:$base:ro") ;;
    esac
fi
# A mount under /root: the Hermes user must pass through it, as it does on the host.
inside="chmod 0711 /root; bash /etc/hermes-fresh/walk_inside.sh"

log=$logdir/$suite-walk.log
say "container $name: the operator's walk (log: $log)"
rc=0
"${podman[@]}" run --name "$name" --network host --hostname "walk-$suite" \
    -e WALK_HERMES_VENV="$venv" \
    -v "$work/hermes-ops.git:/src/hermes-ops.git:ro" \
    -v "$work/ca-bundle.crt:/etc/hermes-fresh/ca-bundle.crt:ro" \
    -v "$work/pip.conf:/etc/hermes-fresh/pip.conf:ro" \
    -v "$repo/tests/fresh/walk_inside.sh:/etc/hermes-fresh/walk_inside.sh:ro" \
    "${mounts[@]}" "$image" bash -c "$inside" 2>&1 | tee "$log" || rc=$?
say "$([ "$rc" -eq 0 ] && echo passed || echo FAILED) (the operator's walk)"
exit "$rc"
