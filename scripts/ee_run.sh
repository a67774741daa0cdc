#!/usr/bin/env bash
# Run the collection's playbooks from the EE image (make ee-image), as AWX runs a job:
# ansible-runner with process isolation (podman), the playbooks by their FQCN from the
# collection installed in the image.
#
#   scripts/ee_run.sh BUILDER_VENV_BIN [local|fleet]   image: EE_IMAGE (localhost/hermes-ops-ee:<version>)
#
# local: against a Hermes home generated on the host (playbooks/files/hermes_demo_home.py),
#        mounted into the job's container at /hermes: maintain.yml --check leaves every
#        state.db byte-identical; report.yml lists each profile.
# fleet: against the running fleet of `make fleet-create` (molecule/fleet/inventory), its
#        containers.podman connection going through the host's podman API socket
#        (`podman system service`, started here and stopped at the end): maintain.yml
#        --check and report.yml from the image, then the same two from the controller
#        (ansible-runner without isolation, the same ansible-core); what the modules
#        predicted and found (scripts/ee_results.py) must be the same, host by host.
set -euo pipefail
bin="$1" target="${2:-local}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="$(awk '/^version:/ { print $2 }' "$repo/galaxy.yml")"
image="${EE_IMAGE:-localhost/hermes-ops-ee:$version}"
work="$repo/build/ee-run"
export CONTAINERS_CONF="$repo/tests/fleet/containers.conf"
podman image exists "$image" || { echo "ee-run: no image $image: run make ee-image" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work"

# pdd DIR EXTRAVARS...: an ansible-runner private data dir; no colour, the report's table
# in the job output only (as the job template "Hermes: report" sets it).
pdd() {
    mkdir -p "$1/env" "$1/project"
    printf -- '---\nANSIBLE_NOCOLOR: "1"\nANSIBLE_FORCE_COLOR: "0"\n%s' "${ENVVARS:-}" >"$1/env/envvars"
    printf -- '---\nhermes_report_markdown: ""\nhermes_report_csv: ""\n%s' "${2:-}" >"$1/env/extravars"
}
# --user=0: the image runs as uid 1000 (ansible-builder's USER), and the private data dir
# ansible-runner mounts at /runner is root's 0700 here (AWX makes it the job user's).
in_ee() {
    local dir="$1" playbook="$2"; shift 2
    "$bin/ansible-runner" run "$dir" -p "$playbook" --process-isolation --process-isolation-executable podman \
        --container-image "$image" --container-option=--user=0 "$@"
}
recap_ok() { grep -qE "^$1 +: ok=[0-9]+ +changed=[0-9]+ +unreachable=0 +failed=0" "$2"; }

if [ "$target" = local ]; then
    python3 "$repo/playbooks/files/hermes_demo_home.py" "$work/hermes" --profiles default,work --sessions 200 --force >/dev/null
    pdd "$work/pdd"
    mkdir -p "$work/pdd/inventory"
    cat >"$work/pdd/inventory/hosts.yml" <<'YML'
all:
  hosts:
    ee-local:
      ansible_connection: local
      ansible_python_interpreter: /usr/bin/python3
      hermes_maintenance_homes: [/hermes]
      hermes_maintenance_become: false
      hermes_maintenance_zombie_days: 1
      hermes_maintenance_prune_days: 90
YML
    sums() { find "$work/hermes" -name 'state.db*' -type f -print0 | sort -z | xargs -0 sha256sum; }
    before="$(sums)"
    mount=(--container-volume-mount "$work/hermes:/hermes")
    echo "+ ansible-runner run -p hermes_agent.ops.maintain --cmdline=--check --process-isolation (image $image)"
    in_ee "$work/pdd" hermes_agent.ops.maintain "${mount[@]}" --cmdline=--check >"$work/maintain-check.log"
    grep -A3 '"msg": \[' "$work/maintain-check.log" | grep zombies= || true
    tail -n 2 "$work/maintain-check.log"
    [ "$(sums)" = "$before" ] || { echo "ee-run: maintain.yml --check changed a state.db" >&2; exit 1; }
    recap_ok ee-local "$work/maintain-check.log"
    echo "ee-run: --check left every state.db byte-identical"
    echo "+ ansible-runner run -p hermes_agent.ops.report --process-isolation"
    in_ee "$work/pdd" hermes_agent.ops.report "${mount[@]}" >"$work/report.log"
    grep -E '^ *"\| ee-local' "$work/report.log" | head -n 2
    recap_ok ee-local "$work/report.log"
    echo "ee-run: ok (logs in $work)"
    exit 0
fi

[ "$target" = fleet ] || { echo "ee-run: target $target: local or fleet" >&2; exit 2; }
for name in hermes-fleet-1 hermes-fleet-2 hermes-fleet-3; do
    podman container exists "$name" || { echo "ee-run: no container $name: run make fleet-create" >&2; exit 1; }
done
fleet_collections="$(cd "$repo/.cache/fleet/collections" && pwd -P)"
sock="$work/podman.sock"
podman system service --time=0 "unix://$sock" &
service=$!
trap 'kill "$service" 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.2; done
[ -S "$sock" ] || { echo "ee-run: podman system service did not make $sock" >&2; exit 1; }

# The fleet's inventory says ssh (make fleet's connection); these runs go through podman's API,
# so that the job's container needs no route and no key into the fleet's containers.
ENVVARS="ANSIBLE_COLLECTIONS_PATH: /usr/share/ansible/collections:/fleet-collections
" pdd "$work/ee" 'ansible_connection: containers.podman.podman
ansible_podman_extra_args: "--remote --url unix:///run/podman.sock"
'
ENVVARS="ANSIBLE_COLLECTIONS_PATH: $repo/build/collections:$fleet_collections
" pdd "$work/controller" 'ansible_connection: containers.podman.podman
'
for dir in "$work/ee" "$work/controller"; do cp -r "$repo/molecule/fleet/inventory" "$dir/inventory"; done
mounts=(--container-volume-mount "$sock:/run/podman.sock" --container-volume-mount "$fleet_collections:/fleet-collections:ro")
for playbook in maintain report; do
    args=(); [ "$playbook" = maintain ] && args=(--cmdline=--check)
    echo "+ ansible-runner run -p hermes_agent.ops.$playbook ${args[*]} --process-isolation (image $image) -> fleet"
    in_ee "$work/ee" "hermes_agent.ops.$playbook" "${mounts[@]}" "${args[@]}" >"$work/ee-$playbook.log" || true
    tail -n 6 "$work/ee-$playbook.log" | grep -E ': ok='
    echo "+ ansible-runner run -p hermes_agent.ops.$playbook ${args[*]} (controller)"
    PATH="$bin:$PATH" "$bin/ansible-runner" run "$work/controller" -p "hermes_agent.ops.$playbook" "${args[@]}" \
        >"$work/controller-$playbook.log" || true
done
"$bin/python" "$repo/scripts/ee_results.py" "$work/ee/artifacts" >"$work/ee-results.json"
"$bin/python" "$repo/scripts/ee_results.py" "$work/controller/artifacts" >"$work/controller-results.json"
diff -u "$work/controller-results.json" "$work/ee-results.json" \
    || { echo "ee-run: the image's runs found other results than the controller's" >&2; exit 1; }
"$bin/python" - "$work/ee-results.json" <<'PY'
import json, sys
found = json.load(open(sys.argv[1]))
hosts = ["fleet1", "fleet1-hermes2", "fleet2", "fleet3"]
assert sorted(found) == hosts, sorted(found)
for host in hosts:
    for action in ("hermes_agent.ops.session_maintenance", "hermes_agent.ops.state_db_info"):
        assert found[host].get(action), (host, action)
    maintain = found[host]["hermes_agent.ops.session_maintenance"]
    for profile, (status, zombies, pruned, messages) in sorted(maintain.items()):
        print(f"ee-run: {host} {profile}: {status} zombies={zombies} pruned={pruned} messages={messages}")
assert found["fleet3"]["hermes_agent.ops.session_maintenance"]["broken"][0] == "failed"
PY
echo "ee-run: fleet ok: the image's maintain.yml --check and report.yml found what the controller's did (logs in $work)"
