#!/usr/bin/env bash
# Run the collection's playbooks from the EE image (make ee-image), as AWX runs a job:
# ansible-runner with process isolation (podman), the playbooks by their FQCN from the
# collection installed in the image, against a Hermes home generated on the host
# (playbooks/files/hermes_demo_home.py) and mounted into the job's container at /hermes.
#
#   scripts/ee_run.sh BUILDER_VENV_BIN          image: EE_IMAGE (localhost/hermes-ops-ee:<version>)
#
# 1. maintain.yml --check: predicts, and every state.db stays byte-identical;
# 2. report.yml: one line per profile.
set -euo pipefail
bin="$1"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="$(awk '/^version:/ { print $2 }' "$repo/galaxy.yml")"
image="${EE_IMAGE:-localhost/hermes-ops-ee:$version}"
work="$repo/build/ee-run"
export CONTAINERS_CONF="$repo/tests/fleet/containers.conf"
podman image exists "$image" || { echo "ee-run: no image $image: run make ee-image" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work/pdd/inventory" "$work/pdd/env" "$work/pdd/project"
python3 "$repo/playbooks/files/hermes_demo_home.py" "$work/hermes" --profiles default,work --sessions 200 --force >/dev/null
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
# As the job template "Hermes: report" sets them: the table is in the job output.
printf -- '---\nANSIBLE_NOCOLOR: "1"\nANSIBLE_FORCE_COLOR: "0"\n' >"$work/pdd/env/envvars"
printf -- '---\nhermes_report_markdown: ""\nhermes_report_csv: ""\n' >"$work/pdd/env/extravars"
sums() { find "$work/hermes" -name 'state.db*' -type f -print0 | sort -z | xargs -0 sha256sum; }
before="$(sums)"
# --user=0: the image runs as uid 1000 (ansible-builder's USER), and the private data dir
# ansible-runner mounts at /runner is root's 0700 here (AWX makes it the job user's).
run() {
    "$bin/ansible-runner" run "$work/pdd" -p "$1" --process-isolation --process-isolation-executable podman \
        --container-image "$image" --container-volume-mount "$work/hermes:/hermes" \
        --container-option=--user=0 "${@:2}"
}
echo "+ ansible-runner run -p hermes_agent.ops.maintain --cmdline --check (image $image)"
run hermes_agent.ops.maintain --cmdline=--check | tee "$work/maintain-check.log" | tail -n 4
[ "$(sums)" = "$before" ] || { echo "ee-run: maintain.yml --check changed a state.db" >&2; exit 1; }
grep -q 'ee-local *: ok=[0-9]* .*failed=0' "$work/maintain-check.log"
echo "ee-run: --check left every state.db byte-identical"
echo "+ ansible-runner run -p hermes_agent.ops.report"
run hermes_agent.ops.report | tee "$work/report.log" | grep -E '^ *("|\|)?.*(default|work)' | head -n 6 || true
grep -q 'ee-local *: ok=[0-9]* .*failed=0' "$work/report.log"
echo "ee-run: ok (logs in $work)"
