# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run's modules reported, from ansible-runner's job events (its artifacts dir).

    ee_results.py ARTIFACTS_DIR          prints JSON {host: {task action: {profile: [...]}}}

Per host and profile of every hermes_agent.ops.session_maintenance / state_db_info task:
status and the counts it predicted or found. The same for a run from the execution
environment and one from the controller, so scripts/ee_run.sh can compare the two.
"""

import glob
import json
import os
import sys

KEYS = {
    "hermes_agent.ops.session_maintenance": ("status", "zombies_closed", "sessions_pruned", "messages_pruned"),
    "hermes_agent.ops.state_db_info": ("status", "sessions", "messages", "prunable_sessions"),
}


def main(artifacts):
    found = {}
    for path in sorted(glob.glob(os.path.join(artifacts, "*", "job_events", "*.json"))):
        with open(path, encoding="utf-8") as f:
            event = json.load(f)
        data = event.get("event_data", {})
        keys = KEYS.get(data.get("task_action"))
        if keys is None or event["event"] not in ("runner_on_ok", "runner_on_failed"):
            continue
        profiles = found.setdefault(data["host"], {}).setdefault(data["task_action"], {})
        for profile in data["res"].get("profiles", []):
            profiles[profile.get("name") or profile.get("profile")] = [profile.get(key) for key in keys]
    json.dump(found, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
