#!/usr/bin/python
# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: state_db_info
short_description: Report sizes, counts and maintenance needs of Hermes Agent's state.db files
version_added: 0.1.0
description:
  - Read-only statistics for every profile of the given Hermes homes, for reports and for deciding when to
    maintain.
  - Opens each database read-only and creates no file. It reports even on files that
    M(hermes_agent.ops.session_maintenance) would refuse (for example a schema newer than it knows).
  - The open / idle / prunable counts use the same selection code as M(hermes_agent.ops.session_maintenance).
author:
  - Hermes Agent Ops maintainers (@hermes-agent-ops)
extends_documentation_fragment:
  - hermes_agent.ops.hermes
  - hermes_agent.ops.pacing
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details:
      - Never changes anything, in check mode or not.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  idempotent:
    description: Run twice in a row outside check mode with the same arguments, the second run reports no change.
    support: full
options: {}
seealso:
  - module: hermes_agent.ops.session_maintenance
"""

EXAMPLES = r"""
- name: Gather state.db facts of the Hermes user
  hermes_agent.ops.state_db_info:
    hermes_home: /home/hermes/.hermes
    prune_days: 30
  register: hermes_db

- name: Warn about big databases
  ansible.builtin.debug:
    msg: "{{ item.name }} is {{ (item.db_bytes / 1048576) | round(1) }} MB, {{ item.prunable_sessions }} prunable"
  loop: "{{ hermes_db.profiles }}"
  when: item.status == 'ok' and item.db_bytes > 1073741824
"""

RETURN = r"""
# BEGIN GENERATED: return (scripts/generate.py, from plugins/module_utils/_hermes/results.py)
profiles:
  description: One entry per profile found.
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
      description: V(ok) or V(failed) (then RV(profiles[].error) says why).
      type: str
    error:
      description: Why the profile could not be read; null when ok.
      type: str
    db_bytes:
      description: Size of C(state.db).
      type: int
    wal_bytes:
      description: Size of C(state.db-wal).
      type: int
    sessions:
      description: Sessions in the database.
      type: int
    messages:
      description: Messages in the database.
      type: int
    open_sessions:
      description: Sessions without C(ended_at).
      type: int
    idle_open:
      description: Open sessions maintenance would close as zombies with the given O(zombie_days).
      type: int
    prunable_sessions:
      description: Sessions maintenance would prune with the given O(prune_days).
      type: int
    prunable_messages:
      description: Messages maintenance would prune.
      type: int
    bad_time_rows:
      description: Sessions whose time values are not unix seconds.
      type: int
    free_pages:
      description: Pages on the freelist.
      type: int
    page_count:
      description: Pages in the file.
      type: int
    page_size:
      description: Page size in bytes.
      type: int
    auto_vacuum:
      description: "SQLite's C(auto_vacuum) mode: V(0) none, V(1) full, V(2) incremental."
      type: int
    storage:
      description:
        - Where the file's bytes are, read-only. V(page_size), V(page_count), V(free_pages), V(free_bytes) (the
          freelist). V(by_object) maps each table and index to V(kind) (V(table), V(index) with its V(table), or
          V(fts), an FTS5 index with its shadow tables C(_data), C(_idx), C(_content), C(_docsize), C(_config)
          counted under it), V(pages) and V(bytes), from SQLite's C(dbstat) (overflow pages included; page 1 is
          V(sqlite_schema)). V(by_object) is null, and V(by_object_unavailable) says why, where the SQLite lacks
          C(dbstat) (built without C(SQLITE_ENABLE_DBSTAT_VTAB)); V(by_object_unavailable) also names the objects
          not measured beside a gateway in rollback-journal mode (each would have been a read longer than 100 ms,
          which holds back its commits).
        - V(by_role) and V(by_source) (the session's source) map to V(messages), V(content_bytes) (bytes of
          C(messages.content)) and V(payload_bytes), the bytes of C(content) plus C(api_content), C(tool_calls),
          C(reasoning), C(reasoning_content), C(reasoning_details), C(codex_reasoning_items) and
          C(codex_message_items), those of them the file has (V(payload_columns)); bytes as stored (UTF-8), not
          characters. V(largest_sessions), the 10 sessions with the most payload bytes, with V(id), V(source),
          V(started_at), V(ended_at), V(messages), V(content_bytes), V(payload_bytes), V(tool_bytes) (of its V(tool)
          messages). V(live_rollback) is true when the file was read beside a gateway in rollback-journal mode, in
          statements of about 40 ms each.
      type: dict
    mode:
      description: Permission bits of C(state.db) in octal, such as V(600).
      type: str
    schema_version:
      description: Hermes's C(schema_version).
      type: int
    fts_layout:
      description: V(none), V(inline), V(external-content) or V(external-content-views).
      type: str
    fts_unusable:
      description: FTS indexes whose tokenizer this host's SQLite lacks (deletes would fail).
      type: list
      elements: str
    holders:
      description:
        - Processes holding the file open, or that may hold it (V(pid), V(command), V(evidence)).
        - V(evidence) is V(descriptor) (its open file seen in C(/proc)), V(lock) (SQLite's own lock on the file or
          its C(-shm), seen with C(fcntl); V(pid) may then be null) or V(unreadable) (a process whose descriptors
          cannot be read and that could open the file, so it cannot be ruled out) or V(filesystem) (the file is on a
          network or VM-shared filesystem, where processes on other hosts may hold it unseen).
      type: list
      elements: dict
    hermes_locks_held:
      description:
        - Hermes's own lock files held right now (V(file), V(operation)), such as C(state.db.repair.lock) while
          Hermes repairs the file; maintenance skips the profile while one is held.
      type: list
      elements: dict
    litestream:
      description: Litestream's tables found in the file (a replicated database).
      type: list
      elements: str
    hermes_auto_maintenance:
      description:
        - What Hermes's own auto-maintenance recorded and is set to, read-only. V(last_auto_prune) and
          V(last_vacuum) from C(state_meta), and V(config) with the C(sessions.*) settings read from the home's
          C(config.yaml) (V(auto_prune), V(retention_days), V(min_interval_hours), V(vacuum_after_prune),
          V(min_vacuum_interval_days), V(source)).
      type: dict
    database_backend:
      description:
        - Where Hermes stores this profile's sessions, read from its C(config.yaml) (untrusted text, no YAML
          library). V(backend) is V(sqlite), or V(postgres) and the profile is V(skipped) untouched; V(source) is
          the file that said so.
      returned: when the file was found
      type: dict
    catalogue:
      description:
        - The file's own catalogue, matched against the objects this collection knows. V(unknown) (foreign keys to
          C(sessions)/C(messages) and triggers on their deletes or updates it does not know, and tables, views and
          C(state_meta) key families naming sessions; then the profile refuses what they could affect and fails,
          naming them), V(known) and V(runtime_ledger) (whether the gateway runtime ledger of upstream Hermes is
          there).
      returned: when the schema was read
      type: dict
    sqlite:
      description: The SQLite that read the profile, as RV(sqlite).
      type: dict
    newest_backup:
      description: Newest backup of this collection (V(path), V(age_days)), or null.
      type: dict
    backups:
      description: Number of this collection's backups of the profile.
      type: int
    newest_archive:
      description:
        - Newest archive of the rows a run deleted (V(path), V(age_days)), kept instead of a whole-file backup
          beside a gateway holding a rollback-journal C(state.db); or null.
      type: dict
    archives:
      description: Number of this collection's archives of the profile.
      type: int
    home_files:
      description:
        - Every file of the profile's home (the directory holding its C(state.db); the default profile's leaves out
          C(profiles/)), by kind, read-only. V(kinds) maps each kind found to V(count) (items, where a
          C(state.db.retired-wal-*) or C(state-snapshots/<id>) directory is one), V(bytes), V(oldest) and V(newest)
          (mtimes, unix seconds); V(bytes) is the home's total and V(named_bytes) what is in a named kind (the rest
          is V(other)). V(stores) gives C(cron/executions.db), C(cron/deliveries.db) and C(cron/notepad.db) with
          V(bytes), V(page_count), V(page_size), V(free_pages), V(reclaimable_bytes) (what a VACUUM would give back;
          nothing is reclaimed), V(journal_mode), V(auto_vacuum) and V(error).
        - The kinds (plan.inventory.KINDS) are V(state_db), V(malformed_backup), V(retired_wal) (messages may be
          missing from C(state.db), see docs/fleet.md), V(pre_update_emergency), V(hermes_locks),
          V(hermes_backup_zip), V(hermes_ops_archive), V(hermes_ops_backup), V(state_snapshots),
          V(pending_messages), V(transcripts), V(orphaned_transcripts) (whose session is no longer in C(state.db)),
          V(cron_executions), V(cron_deliveries), V(notepad), V(cron_other), V(logs), V(caches), V(agent_data),
          V(config), V(other).
      type: dict
sqlite:
  description:
    - The SQLite that did the work, with V(version), V(wal_reset_affected) (whether it has the WAL-reset bug, SQLite
      3.7.0 to 3.51.2 but 3.50.7 and 3.44.6; then it never checkpoints a WAL file another process holds) and
      V(python) (the interpreter).
  returned: always
  type: dict
# END GENERATED
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hermes_agent.ops.plugins.module_utils._ansible_support import shared_argument_spec
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError


def main():
    module = AnsibleModule(argument_spec=shared_argument_spec(), supports_check_mode=True)
    try:
        info = gather_info(dict(module.params))
    except MaintenanceError as exc:
        module.fail_json(msg="invalid options: %s" % exc)
    module.exit_json(changed=False, profiles=info["profiles"], sqlite=info["sqlite"])


if __name__ == "__main__":
    main()
