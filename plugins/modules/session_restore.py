#!/usr/bin/python
# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: session_restore
short_description: Put pruned Hermes Agent sessions back from an archive, while the gateway runs
version_added: 0.1.0
description:
  - Restores sessions from an archive written by M(hermes_agent.ops.session_maintenance)
    (C(hermes-ops-archive_<profile>_<time>.db), holding the sessions a prune deleted, their messages and the rows tied
    to them, taken instead of a whole-file backup when C(state.db) is in rollback-journal mode and the gateway holds
    it) into the profile's C(state.db), in place. The file, its inode and its journal mode stay as they are, so
    a running Hermes gateway keeps writing; nothing has to be stopped.
  - Only a finished archive is used; a hidden C(.partial) file, another file name, a file others can write, one
    that fails C(quick_check) or lacks any of the sessions it lists is refused, naming the reason.
  - Refuses an archive taken from a newer C(schema_version) than the file's (an older Hermes would not know its
    columns), a file lacking a column or table the archive's rows need, and a session id the archive does not
    hold. Columns are matched by name; a parent session that is neither in the file nor restored with its child
    is dropped from the row (C(parent_session_id) null), as Hermes's own prune orphans children.
  - Parents go before their children, one session per write transaction, its messages 500 per transaction with
    a pause between, C(INSERT OR IGNORE). What is already there is left as it is (restoring twice changes
    nothing), and a restore interrupted at any point is completed by running it again. Hermes's own triggers
    rebuild the full-text rows, so a restored session is found by search at once.
  - Holds the profile's maintenance lock (C(state.db.auto-maintenance.lock), shared with Hermes's own
    auto-maintenance) and refuses while Hermes repairs, quarantines or rebuilds the file (its
    C(state.db.repair.lock), C(.quarantine.lock), C(.fts_rebuild.lock) held).
  - As root on a file another user owns, the work runs in a child switched to that user.
author:
  - hermes_agent.ops contributors (!UNKNOWN)
attributes:
  check_mode:
    details:
      - Verifies the archive and reads C(state.db) in short read transactions; the counts it returns are exactly
        what the real run restores. No file is created beside C(state.db).
  diff_mode:
    support: full
    details:
      - One line per session, before and after (absent, or present with how many of its archived messages).
  idempotent:
    support: full
extends_documentation_fragment:
  - hermes_agent.ops.restore
options:
  archive:
    description:
      - The archive, as a path or as a file name in O(backup_dir).
    type: str
    required: true
  sessions:
    description:
      - The ids of the sessions to restore. Omitted, every session the archive holds.
      - Check mode without it lists them all in RV(sessions).
    type: list
    elements: str
  # BEGIN GENERATED: options (scripts/generate.py)
  busy_timeout:
    description:
      - Seconds to wait for a lock held by Hermes before giving up on the profile (it is skipped; the next run takes
        it up again).
    type: float
    default: 5
  batch_pause:
    description:
      - Seconds to pause between transactions, so that a live gateway's writes get the lock.
      - A waiting writer polls the lock every 25 ms or more, so a pause shorter than that can starve it.
    type: float
    default: 0.03
  # END GENERATED
seealso:
  - module: hermes_agent.ops.session_maintenance
  - module: hermes_agent.ops.state_db_restore
"""

EXAMPLES = r"""
- name: See which sessions an archive holds and which are missing from state.db
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    archive: hermes-ops-archive_default_20261201T040001Z.db
  check_mode: true
  register: archive_plan

- name: Put two pruned sessions back while the gateway runs
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    archive: hermes-ops-archive_default_20261201T040001Z.db
    sessions:
      - 20261020_101500_ab12cd
      - 20261021_090000_ef34gh
"""

RETURN = r"""
db:
  description: The C(state.db) restored into.
  returned: always
  type: str
archive:
  description:
    - The archive, verified (V(path), V(profile) and V(source) it was taken from, V(created_at), V(schema_version),
      V(sessions) and V(messages) it holds).
  returned: success
  type: dict
db_schema_version:
  description: The C(schema_version) of C(state.db).
  returned: success
  type: int
sessions:
  description:
    - Each session asked for (all the archive holds when none were named), parents first, as found before the
      restore, with V(id), V(present) (its row is in C(state.db)), V(messages_archived), V(messages_missing) (archived
      messages not in C(state.db)), V(rows_missing) (archived rows of the other tables tied to it, such as
      C(session_model_usage), not in C(state.db)), V(orphaned) (its parent is gone, so it is restored without it).
  returned: success
  type: list
  elements: dict
after:
  description: The same list as RV(sessions), read again after the restore. Not in check mode.
  returned: changed and not check mode
  type: list
  elements: dict
sessions_restored:
  description: Sessions whose row was put back (predicted in check mode).
  returned: success
  type: int
sessions_present:
  description: Sessions whose row was already there (their missing messages, if any, are still put back).
  returned: success
  type: int
messages_restored:
  description: Messages put back (predicted in check mode).
  returned: success
  type: int
rows_restored:
  description: Rows of other tables tied to the sessions (C(session_model_usage)) put back (predicted in check mode).
  returned: success
  type: int
orphaned:
  description: Sessions restored without their parent (C(parent_session_id) set null).
  returned: success
  type: int
msg:
  description: One line saying what was (or would be) done.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hermes_agent.ops.plugins.module_utils._ansible_support import (
    option_spec,
    restore_argument_spec,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_db import MaintenanceError
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_session_restore import restore_from_archive


def main():
    module = AnsibleModule(
        argument_spec=restore_argument_spec(
            archive=dict(type="str", required=True),
            sessions=dict(type="list", elements="str"),
            busy_timeout=option_spec("busy_timeout"),
            batch_pause=option_spec("batch_pause"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    db = os.path.join(p["hermes_home"], "state.db")
    for name in ("busy_timeout", "batch_pause"):
        if p[name] < 0:
            module.fail_json(msg="%s must be >= 0, got %s" % (name, p[name]), db=db)
    try:
        result = restore_from_archive(
            p["hermes_home"], p["profile"], p["archive"], p["sessions"],
            backup_dir=p["backup_dir"], check_mode=module.check_mode,
            busy_timeout=p["busy_timeout"], pause=p["batch_pause"],
        )  # fmt: skip
    except (MaintenanceError, OSError) as exc:
        module.fail_json(msg="restore of sessions into %s: %s" % (db, exc), db=db)
    result.pop("done", None)
    changed = result.pop("changed")
    result["msg"] = describe(result, module.check_mode)
    if module._diff:
        result["diff"] = {
            "before_header": "%s (before)" % result["db"],
            "after_header": "%s (after)" % result["db"],
            "before": lines(result["sessions"]),
            "after": lines(result.get("after") or predicted(result["sessions"])),
        }
    module.exit_json(changed=changed, **result)


def predicted(sessions):
    return [dict(s, present=True, messages_missing=0) for s in sessions]


def lines(sessions):
    out = []
    for s in sessions:
        if not s["present"]:
            out.append("%s: absent" % s["id"])
        else:
            out.append(
                "%s: present, %d of %d archived messages"
                % (s["id"], s["messages_archived"] - s["messages_missing"], s["messages_archived"])
            )
    return "\n".join(out) + "\n"


def describe(result, check_mode):
    verb = "would restore" if check_mode else "restored"
    return "%s %d session(s) and %d message(s) from %s into %s; %d of the %d asked for were already there%s" % (
        verb,
        result["sessions_restored"],
        result["messages_restored"],
        result["archive"]["path"],
        result["db"],
        result["sessions_present"],
        len(result["sessions"]),
        ", %d without their parent" % result["orphaned"] if result["orphaned"] else "",
    )


if __name__ == "__main__":
    main()
