#!/usr/bin/python
# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: state_db_restore
short_description: Restore a Hermes Agent state.db from a backup made by this collection
version_added: 0.1.0
description:
  - Restores one profile's C(state.db) from a backup written by M(hermes_agent.ops.session_maintenance)
    (C(hermes-ops_<profile>_<time>.db) or C(.db.gz)). Unfinished backups (hidden C(.partial) files) are never used.
  - Without O(backup), the newest backup of the profile that passes C(quick_check) is used; backups that fail
    are listed in RV(rejected).
  - The backup is first copied (decompressed) to a hidden file beside C(state.db) and verified. Then the current
    C(state.db) (a second name of it) and copies of its C(-wal), C(-shm) and C(-journal) files go together into a
    new directory C(state.db.pre-restore-<UTC time>) beside them (kept, never deleted); SQLite checkpoints the
    C(-wal) into the old file (or rolls its hot journal back), so that C(state.db) alone holds every committed row,
    before the sidecars leave; the verified copy takes the name C(state.db), and is checked again (C(quick_check),
    session and message counts). A kill or a power loss at any moment leaves C(state.db) the old database with
    every committed row or the restored one. If anything fails after the move, the original files are put back.
  - A file SQLite cannot checkpoint (damaged) or a forced restore has its sidecars moved, not copied; a crash just
    before the rename then leaves the old file without them, all of it kept in the directory (docs/safety.md says
    how to put it back).
  - The restored file gets the owner and group of the file it replaces (of the profile directory when there was
    none) and mode C(0600).
  - Refuses while another process has the database open (a running Hermes gateway would keep writing to the
    moved file and refuse writes after the swap) unless O(force). Stop the gateway first; the playbook
    C(hermes_agent.ops.restore) does.
  - Holds the profile's maintenance lock (C(state.db.auto-maintenance.lock)) while it works.
author:
  - hermes_agent.ops contributors (!UNKNOWN)
attributes:
  check_mode:
    details:
      - Selects and verifies the backup (a C(.gz) is decompressed into a private temporary directory that is
        removed again) and reports what would be done; nothing beside C(state.db) is written.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - Every run restores again (and moves the current file aside again).
extends_documentation_fragment:
  - hermes_agent.ops.restore
options:
  backup:
    description:
      - The backup to restore, as a path or as a file name in O(backup_dir).
      - Omitted, the newest backup of O(profile) that verifies.
    type: str
  force:
    description:
      - Restore even while other processes have the database open. They must all be restarted afterwards.
    type: bool
    default: false
seealso:
  - module: hermes_agent.ops.session_maintenance
"""

EXAMPLES = r"""
- name: Restore the newest good backup of the default profile
  hermes_agent.ops.state_db_restore:
    hermes_home: /home/hermes/.hermes

- name: Restore a chosen backup of profile work
  hermes_agent.ops.state_db_restore:
    hermes_home: /home/hermes/.hermes
    profile: work
    backup: hermes-ops_work_20260301T040001Z.db.gz
"""

RETURN = r"""
db:
  description: The C(state.db) restored.
  returned: always
  type: str
backup:
  description:
    - The backup used (V(path), V(bytes), V(compressed), V(sessions), V(messages), V(schema_version)).
    - V(db_bytes) is the size of the database it holds (decompressed).
  returned: success
  type: dict
rejected:
  description: Newer backups that failed verification and were passed over (V(path), V(error)).
  returned: success
  type: list
  elements: dict
current:
  description:
    - The file replaced (V(exists), V(uid), V(gid), V(mode), V(files)), with V(sessions) and V(messages) when it
      could be read without its WAL, or V(error) when it is damaged.
  returned: success
  type: dict
holders:
  description: Processes that had the database open when the module started (V(pid), V(command)).
  returned: success
  type: list
  elements: dict
moved_aside:
  description:
    - Where the previous files are now (V(dir), V(files)); null when there was no file.
    - Predicted in check mode.
  returned: success
  type: dict
restored:
  description: V(sessions), V(messages) and V(schema_version) of the file now in place. Not in check mode.
  returned: changed and not check mode
  type: dict
owner:
  description: V(uid), V(gid) and V(mode) of the restored file.
  returned: changed and not check mode
  type: dict
msg:
  description: One line saying what was (or would be) done.
  returned: always
  type: str
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hermes_agent.ops.plugins.module_utils._ansible_support import restore_argument_spec
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.host.profiles import profile_path
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.whole_file import plan_restore, restore
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError


def main():
    module = AnsibleModule(
        argument_spec=restore_argument_spec(
            backup=dict(type="str"),
            force=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    db = profile_path(p["hermes_home"], p["profile"])  # named in a failure before the plan knows it
    try:
        plan = plan_restore(p["hermes_home"], p["profile"], p["backup_dir"], p["backup"])
        db = plan["db"]
        aside = plan["aside"] if plan["current"]["files"] else None
        what = describe(plan, aside)
        if module.check_mode:
            plan["moved_aside"] = {"dir": aside, "files": plan["current"]["files"]} if aside else None
            if plan["holders"] and not module.params["force"]:
                what += "; NOTE: now held open by %s, which must be stopped first" % ", ".join(
                    "%s (pid %d)" % (h["command"], h["pid"]) if h["pid"] is not None else h["command"]
                    for h in plan["holders"]
                )
            module.exit_json(changed=True, msg="would restore " + what, **plan)
        plan = restore(plan, p["force"])
    except (MaintenanceError, OSError) as exc:
        module.fail_json(msg="restore of %s: %s" % (db, exc), db=db)
    module.exit_json(changed=True, msg="restored " + describe(plan, (plan["moved_aside"] or {}).get("dir")), **plan)


def describe(plan, aside):
    backup = plan["backup"]
    return "%s (%d sessions, %d messages) to %s%s" % (
        backup["path"],
        backup["sessions"],
        backup["messages"],
        plan["db"],
        ", with %s moved aside into %s" % (", ".join(plan["current"]["files"]), aside) if aside else "",
    )


if __name__ == "__main__":
    main()
