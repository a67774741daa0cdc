#!/usr/bin/python
# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: session_maintenance
short_description: Close zombie sessions, prune old ones, back up and compact Hermes Agent's state.db
version_added: 0.1.0
description:
  - Maintains every C(state.db) of a host's Hermes Agent homes (one per profile), safely while Hermes is live.
  - Per profile, under Hermes's own maintenance lock (C(state.db.auto-maintenance.lock)), it checks the file
    (header, C(quick_check), schema, FTS tokenizers, time columns), closes zombie sessions, prunes old ended
    sessions with their messages, FTS rows and transcript files following Hermes's own rules, takes a verified
    backup before the first change, and gives space back.
  - Deletes run in short transactions (at most O(batch_size) messages and O(batch_time) seconds each, with
    O(batch_pause) between them) so a live gateway writing to the same file is never stalled for long.
  - It never replaces C(state.db), never renames onto it, never deletes its C(-wal)/C(-shm) files and never
    changes its C(application_id). A full C(VACUUM) runs only when no other process holds the file.
  - Run as root, it does each profile's work as the owner of that C(state.db), so every file it creates belongs
    to the Hermes user.
  - One profile's failure never stops the others; the task then fails naming each failed profile, with
    RV(profiles) still in the result.
author:
  - Hermes Agent Ops maintainers (@hermes-agent-ops)
extends_documentation_fragment:
  - hermes_agent.ops.hermes
  - hermes_agent.ops.hermes.ATTRIBUTES
options:
  end_reason:
    description:
      - C(end_reason) written on closed zombies. The default is one Hermes treats as recoverable.
    type: str
    default: startup_orphan_reap
  backup:
    description:
      - Take a verified backup before the first change to a profile. If the backup fails, nothing in that
        profile is changed.
      - Verified means the copy opens and holds every session about to be pruned with all its messages; the
        full C(quick_check) runs on C(state.db) at the start of the run and on a backup before any restore.
    type: bool
    default: true
  backup_keep_days:
    description:
      - Remove this collection's backups of a profile older than this many days (the newest is always kept).
        Files it did not write, such as Hermes's C(pre-update-*.zip), are never touched.
    type: float
    default: 30
  backup_keep_count:
    description:
      - Keep at most this many backups per profile. No limit when omitted.
    type: int
  backup_interval_days:
    description:
      - Also take a backup when the newest one is older than this many days, even if nothing else changes.
    type: float
  backup_compress:
    description:
      - Gzip the backup.
    type: bool
    default: false
  vacuum_mode:
    description:
      - V(auto) reclaims in short C(incremental_vacuum) steps where the file is in incremental mode, and
        otherwise runs a full C(VACUUM) when free pages pass O(vacuum_threshold), nobody else holds the file,
        and the disk has room.
      - V(full) runs a full C(VACUUM) whenever there are free pages (same safety conditions); use it in a
        service window with the gateway stopped.
      - V(incremental) only uses C(incremental_vacuum); V(never) reclaims nothing.
    type: str
    choices: [auto, full, incremental, never]
    default: auto
  vacuum_threshold:
    description:
      - Free pages, in percent of the file, above which V(auto) runs a full C(VACUUM).
    type: float
    default: 25
  vacuum_switch_incremental:
    description:
      - A full C(VACUUM) also sets C(auto_vacuum=INCREMENTAL), so later runs can reclaim in short steps while
        Hermes is live.
    type: bool
    default: true
  batch_size:
    description:
      - Most messages deleted in one transaction (messages fire Hermes's FTS triggers). O(batch_time) usually
        ends a transaction first; this also bounds a single statement on a very long session.
    type: int
    default: 2000
  batch_time:
    description:
      - Seconds one transaction may hold the write lock before it commits and lets the gateway in. Wall time,
        so a busy machine cannot stretch the stall a live writer sees.
      - With O(batch_pause), the defaults kept a live Hermes writer's worst stall within 250 ms at about 0.8x the
        speed of Hermes's own single-transaction prune in the collection's benchmark (docs/benchmarks.md).
    type: float
    default: 0.06
  batch_pause:
    description:
      - Seconds to pause between transactions, so that a live gateway's writes get the lock.
      - A waiting writer polls the lock every 25 ms or more, so a pause shorter than that can starve it.
    type: float
    default: 0.03
  allow_unknown_schema:
    description:
      - Maintain a C(schema_version) newer than any this collection knows. Refused by default.
    type: bool
    default: false
  allow_foreign_owner:
    description:
      - Work on a C(state.db) owned by another user when not running as root.
    type: bool
    default: false
seealso:
  - module: hermes_agent.ops.state_db_info
  - name: Hermes Agent
    description: The agent whose state.db this maintains.
    link: https://pypi.org/project/hermes-agent/
"""

EXAMPLES = r"""
- name: Maintain every profile of the Hermes user's home
  become: true
  become_user: hermes
  hermes_agent.ops.session_maintenance:

- name: Dry run with a diff for two homes, 30-day retention
  hermes_agent.ops.session_maintenance:
    hermes_home:
      - /home/alice/.hermes
      - /home/bob/.hermes
    prune_days: 30
  check_mode: true
  diff: true

- name: Service window - full VACUUM once the gateway is stopped
  hermes_agent.ops.session_maintenance:
    hermes_home: /srv/hermes/.hermes
    profiles: [default, work]
    vacuum_mode: full
    backup_compress: true
  register: maintenance

- name: Show the seed-style lines
  ansible.builtin.debug:
    var: maintenance.summary
"""

RETURN = r"""
summary:
  description: One line per profile, in the form of the monthly script it replaces.
  returned: always
  type: list
  elements: str
  sample: ["default: zombies=3 pruned=12 freed=45MB remaining=150 sessions, 8420 messages"]
failed_profiles:
  description: Names of the profiles that failed.
  returned: always
  type: list
  elements: str
profiles:
  description: What happened to each profile (in check mode, what would happen).
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: V(default) for C(HOME/state.db), else the profile's directory name.
      type: str
    home:
      description: The Hermes home.
      type: str
    path:
      description: The C(state.db) path.
      type: str
    status:
      description: V(ok), V(skipped) (lock held, database busy; nothing lost, the next run retries) or V(failed).
      type: str
    error:
      description: Why it was skipped or failed, naming the thing and what to do; null when ok.
      type: str
    changed:
      description: Whether this profile changed (or would change).
      type: bool
    zombies_closed:
      description: Open sessions closed.
      type: int
    sessions_pruned:
      description: Sessions deleted, including delegate children deleted with their parent.
      type: int
    messages_pruned:
      description: Messages deleted (their FTS rows go with them).
      type: int
    sessions_orphaned:
      description: Kept child sessions whose pruned parent was unlinked (C(parent_session_id) set to null).
      type: int
    transcripts_removed:
      description: Files removed from C(HOME/sessions/).
      type: int
    prompts_collected:
      description: C(system_prompts) rows no longer referenced after the prune.
      type: int
    sessions_left_alone:
      description: Planned sessions that stopped qualifying during the run (resumed by Hermes) and were kept.
      type: int
    bad_time_rows:
      description: Sessions never selected because a time value in them is not unix seconds.
      type: int
    backup:
      description:
        - The backup taken, or null when none was needed. V(path), V(bytes), V(verified), V(compressed),
          V(sessions) and V(messages) in the copy, and V(copied_by) (V(files) for the byte copy of C(state.db)
          and its C(-wal), V(backup_api) when SQLite's backup API copied it).
      type: dict
    reclaim:
      description:
        - V(mode), V(action) (V(full), V(incremental) or null), V(bytes_freed), V(skipped_reason),
          V(fts_merge_steps).
      type: dict
    before:
      description:
        - V(db_bytes), V(wal_bytes), V(sessions), V(messages), V(open_sessions), V(free_pages),
          V(page_size), V(page_count).
      type: dict
    after:
      description: The same figures after the run (predicted in check mode).
      type: dict
    duration:
      description: Seconds spent on the profile.
      type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hermes_agent.ops.plugins.module_utils._ansible_support import diff_of, shared_argument_spec
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_db import MaintenanceError
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_engine import DEFAULTS, run_maintenance


def main():
    argument_spec = shared_argument_spec()
    argument_spec.update(
        end_reason=dict(type="str", default=DEFAULTS["end_reason"]),
        backup=dict(type="bool", default=True),
        backup_keep_days=dict(type="float", default=DEFAULTS["backup_keep_days"]),
        backup_keep_count=dict(type="int"),
        backup_interval_days=dict(type="float"),
        backup_compress=dict(type="bool", default=False),
        vacuum_mode=dict(type="str", default="auto", choices=["auto", "full", "incremental", "never"]),
        vacuum_threshold=dict(type="float", default=DEFAULTS["vacuum_threshold"]),
        vacuum_switch_incremental=dict(type="bool", default=True),
        batch_size=dict(type="int", default=DEFAULTS["batch_size"]),
        batch_pause=dict(type="float", default=DEFAULTS["batch_pause"]),
        batch_time=dict(type="float", default=DEFAULTS["batch_time"]),
        allow_unknown_schema=dict(type="bool", default=False),
        allow_foreign_owner=dict(type="bool", default=False),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    try:
        result = run_maintenance(dict(module.params), check_mode=module.check_mode)
    except MaintenanceError as exc:
        module.fail_json(msg="invalid options: %s" % exc)
    output = dict(
        changed=result["changed"],
        profiles=result["profiles"],
        summary=result["summary"],
        failed_profiles=result["failed"],
        sqlite=result["sqlite"],
    )
    if module._diff:
        output["diff"] = diff_of(result["profiles"])
    if result["failed"]:
        failed = [p for p in result["profiles"] if p["status"] == "failed"]
        module.fail_json(
            msg="maintenance failed for %d profile(s): %s"
            % (len(failed), "; ".join("%s (%s): %s" % (p["name"], p["path"], p["error"]) for p in failed)),
            **output,
        )
    module.exit_json(**output)


if __name__ == "__main__":
    main()
