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
  - hermes_agent.ops.pacing
  - hermes_agent.ops.pacing.BATCH_PAUSE
options:
  # BEGIN GENERATED: options (scripts/generate.py, from plugins/module_utils/_hermes/options.py)
  end_reason:
    description:
      - C(end_reason) written on closed zombies. The default is one Hermes treats as recoverable.
    type: str
    default: startup_orphan_reap
  backup:
    description:
      - Take a verified backup before the first change to a profile. If the backup fails, nothing in that profile is
        changed.
      - Verified means the copy opens and holds every session about to be pruned with all its messages; the full
        C(quick_check) runs on C(state.db) at the start of the run and on a backup before any restore.
      - In rollback-journal mode (C(journal_mode=DELETE), what Hermes 0.20 and later run on an SQLite with the
        WAL-reset bug) with another process holding C(state.db), a whole-file copy would block every commit of the
        gateway for as long as it takes. The backup is then an archive of the rows the prune deletes
        (C(hermes-ops-archive_<profile>_<time>.db) in the backup directory, quick_checked and fsynced before the first
        delete); the whole-file copy is taken by a run with no holder (the result says so in C(backup_deferred)).
    type: bool
    default: true
  metrics_dir:
    description:
      - After a real run (not in check mode), write Prometheus text-format metrics of every profile to
        C(METRICS_DIR/hermes_ops_<user>.prom) for node_exporter's textfile collector, through a temporary file renamed
        into place, mode 0644 (sizes, counts, times and a status reason only, no chat content).
      - Debian's collector directory is C(/var/lib/prometheus/node-exporter). Not written when omitted.
      - A failure to write them is a warning; the maintenance result stands.
    type: path
  backup_keep_days:
    description:
      - Remove this collection's backups of a profile older than this many days (the newest is always kept). Files it
        did not write, such as Hermes's C(pre-update-*.zip), are never touched.
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
      - V(auto) reclaims in short C(incremental_vacuum) steps where the file is in incremental mode, and otherwise
        runs a full C(VACUUM) when free pages pass O(vacuum_threshold), nobody else holds the file, and the disk has
        room.
      - V(full) runs a full C(VACUUM) whenever there are free pages (same safety conditions); use it in a service
        window with the gateway stopped.
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
      - A full C(VACUUM) also sets C(auto_vacuum=INCREMENTAL), so later runs can reclaim in short steps while Hermes
        is live.
    type: bool
    default: true
  gateway_service:
    description:
      - The systemd unit of the Hermes gateway, for a service window inside the run. The steps that need C(state.db)
        alone (a full C(VACUUM), which also makes the one-time switch to C(auto_vacuum=INCREMENTAL) with
        O(vacuum_switch_incremental), after FTS5's optimize of what the gateway wrote since) run with the gateway
        drained and stopped, when they pay and their estimated time fits O(max_downtime). Everything else runs with
        the gateway up.
      - A system unit, or the Hermes user's own C(systemctl --user) unit as C(hermes gateway install) makes it
        (C(hermes-gateway), or C(hermes-gateway-<profile>)); the system unit is used where there is one of that name.
        Off when omitted (with O(gateway_stop_command) it is not given).
      - The window drains the gateway first (Hermes's own C(HERMES_HOME/.drain_request.json), so no new turn starts
        and the turns in flight finish), then stops it. It is always started again, on any failure too, and the run
        checks that it is back (the unit active, and a holder on C(state.db) again). Each profile's C(window) says
        whether it opened, why not, the steps and the downtime.
    type: str
  gateway_stop_command:
    description:
      - The command (an argv list, the program by its absolute path) that stops the Hermes gateway, for a service
        window under another supervisor (a container, supervisord, s6); with O(gateway_start_command), instead of
        O(gateway_service). It must return once the gateway is stopped, with exit code 0.
      - As root both commands run as root, so their program and every directory above it must not be writable by the
        owner of C(state.db) (the run refuses the window otherwise).
    type: list
    elements: str
  gateway_start_command:
    description:
      - The command (an argv list, the program by its absolute path) that starts the Hermes gateway again after the
        window; exit code 0 and a holder on C(state.db) again within 90 seconds mean it is back.
    type: list
    elements: str
  max_downtime:
    description:
      - Seconds the service window may keep the gateway from serving, from the drain until it is back. A window whose
        estimated time does not fit is not opened (the profile's C(window) says so); a step still running at the bound
        is interrupted and rolled back, and the gateway started again.
    type: float
    default: 120
  batch_size:
    description:
      - Most messages deleted in one transaction (messages fire Hermes's FTS triggers); this also bounds a single
        statement on a very long session. While nobody has written to the file for half a second and O(batch_time) is
        set (an idle gateway), a transaction of whole sessions may take up to 8 times as many, O(batch_time) still
        ending it; the gateway's first commit puts the bound back.
    type: int
    default: 4000
  batch_time:
    description:
      - Seconds one transaction may hold the write lock before it commits and lets the gateway in. Wall time, so a
        busy machine cannot stretch the stall a live writer sees. While no other connection commits to the file (an
        idle gateway) the bound grows to at most 0.12 s and a O(batch_pause) longer than a waiting writer's next poll
        shrinks towards it; the gateway's first commit puts both back.
      - With O(batch_pause), the defaults kept a live Hermes writer's worst stall within 250 ms in the collection's
        benchmark (docs/benchmarks.md), at 0.6x to 0.8x the speed of Hermes 0.19's own single-transaction prune and
        0.37x to 0.72x that of 0.22's. Where Hermes runs WAL on a fixed SQLite, V(0.1) brought 0.22 to 0.5x with
        stalls within 131 ms.
    type: float
    default: 0.06
  tool_payload_days:
    description:
      - In the sessions the prune keeps, replace the content of C(role=tool) messages older than this many days with a
        short tombstone saying what was there. Off by default.
      - The tombstone is the one Hermes's own proposed tool-payload retention writes (C([elided) C(tool output older
        than 30d - retention policy])), followed by size, tool and day (C(48213 bytes of terminal output from
        2026-08-01)), so a Hermes with that retention reads it as its own.
      - Tool output (web extracts, terminal dumps, browser trees) and its two full-text indexes are most of a
        long-lived C(state.db); the conversation stays. Sessions a rule keeps (pinned, a live lease, the runtime
        ledger's fence) are not touched, nor anything when the file holds objects this collection does not know.
      - The original bytes go first to an owner-only C(hermes-ops-payloads_<profile>_<time>.db) in the backup
        directory, fsynced before the first change; M(hermes_agent.ops.session_restore) with C(tool_payloads=true)
        puts them back from it, or from the run's whole-file backup where its rows match the tombstones. Paced like
        the prune; Hermes's own triggers keep both full-text indexes in step. A second run elides nothing; check mode
        gives the exact count and bytes (C(tool_payloads) of each profile).
    type: float
  file_retention:
    description:
      - Remove some of the other files of each profile's home, by kind (the kinds of state_db_info's C(home_files)).
        Off by default; a mapping of kind to a rule, as follows.
      - V(state_snapshots) (C(state-snapshots/<id>/) of C(hermes backup --quick) and C(hermes update)),
        V(hermes_backup_zip) (C(hermes-backup-*.zip), C(backups/pre-update-*.zip), C(backups/pre-migration-*.zip)) and
        V(pre_update_emergency) (C(state.db.pre-update-emergency-*.bak)) take C(keep) (keep that many newest) and/or
        C(days) (remove those older); never the newest one, never a partial one, never while Hermes's backup slot
        C(.backup.lock) is held or C(hermes update) runs.
      - V(malformed_backup) (Hermes's forensic copies, with their sidecars) and V(orphaned_transcripts) (C(sessions/)
        files whose session is not in C(state.db)) take C(days); a transcript is removed only when no process has it
        open and no retired WAL generation is in the home. Retired WAL generations are never removed.
      - Check mode lists exactly what a real run removes (C(file_retention) of each profile in the result).
    type: dict
  reclaim_stores:
    description:
      - Also VACUUM the home's other SQLite stores (C(cron/executions.db), C(cron/deliveries.db), C(cron/notepad.db))
        when nothing holds them, their free pages pass O(vacuum_threshold) (any free pages in incremental mode) and
        the disk has room for the copy. No row is deleted from them (Hermes prunes C(cron/executions.db) itself).
    type: bool
    default: false
  allow_unknown_schema:
    description:
      - Maintain a C(schema_version) newer than any this collection knows. Refused by default.
    type: bool
    default: false
  unknown_schema:
    description:
      - What to do with a C(schema_version) newer than any this collection knows (unless O(allow_unknown_schema)).
      - V(refuse) leaves the profile untouched and fails it. V(release_rules) asks the Hermes installed on the host
        (O(hermes_python), run as the Hermes user, never as root) which sessions its own C(prune_sessions) would
        delete, on a private scratch copy of the file, and prunes only the sessions both it and this collection's
        rules select; each profile's C(release_rules) in the result says which release answered.
    type: str
    choices: [refuse, release_rules]
    default: refuse
  hermes_python:
    description:
      - The Python interpreter of the Hermes installed on the host (the one its C(hermes) entry point names), needed
        when O(unknown_schema) is V(release_rules) or O(delete_with) is V(hermes).
      - With a service window (O(gateway_service), O(gateway_stop_command)) it also runs that Hermes's own C(hermes
        sessions optimize-storage) in the window, as the owner of C(state.db), where the file still has the FTS
        storage upgrade to do (C(state_meta.fts_optimize_available), or an interrupted one).
    type: path
  delete_with:
    description:
      - Who deletes the sessions the prune selected (each profile's C(deleted_by) says who did).
      - V(engine) deletes with this collection's own statements.
      - V(hermes) has the delete code of the Hermes installed on the host do it (O(hermes_python), run as the owner of
        C(state.db), never as root), its bulk C(delete_sessions) where it has one, else C(delete_session) one session
        at a time, in transactions paced as the engine's own (O(batch_size), O(batch_time), the gateway's turn between
        them); a session it refuses is kept and named in C(sessions_refused). Check mode runs it on a private scratch
        copy.
      - V(auto) lets the engine delete where this collection knows every object of the file; where it does not, the
        installed Hermes (O(hermes_python)) when its own delete publishes upstream's deletion fence (asked of what it
        ships, not of its version), else the engine, refusing what those objects could affect and naming them, and why
        the installed Hermes was not used.
    type: str
    choices: [auto, engine, hermes]
    default: auto
  allow_empty_homes:
    description:
      - Accept a home that does not exist yet or holds no C(state.db) in it nor under C(profiles/) (a host where
        Hermes is not set up yet). The run then reports V(no_profiles) for it, never success, instead of failing.
      - The role refuses such a home at apply time unless this is set (mostly it is a mistyped path).
    type: bool
    default: false
  allow_foreign_owner:
    description:
      - Work on a C(state.db) owned by another user when not running as root.
    type: bool
    default: false
  # END GENERATED
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

- name: Maintain and write metrics for node_exporter's textfile collector
  become: true
  become_user: hermes
  hermes_agent.ops.session_maintenance:
    metrics_dir: /var/lib/prometheus/node-exporter

- name: Show the seed-style lines
  ansible.builtin.debug:
    var: maintenance.summary
"""

RETURN = r"""
# BEGIN GENERATED: return (scripts/generate.py, from plugins/module_utils/_hermes/results.py)
status:
  description:
    - V(ok), V(failed) (a profile failed) or V(no_profiles) (a home held no C(state.db)).
    - V(no_profiles) means nothing was maintained in that home, which is never a success.
  returned: always
  type: str
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
      description:
        - V(ok), V(skipped) (lock held, database busy; nothing lost, the next run retries), V(failed) or
          V(no_profiles) (the home exists but holds no C(state.db); the entry stands for the home).
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
    retention:
      description:
        - Which retention applied to what. V(prune_days), V(by_source) (O(prune_days_by_source), V({}) when unset)
          and V(selected), the sessions the plan selected for the prune by their source (before a stop;
          RV(profiles[].sessions_pruned) says what was deleted).
      type: dict
    prompts_collected:
      description: C(system_prompts) rows no longer referenced after the prune.
      type: int
    sessions_left_alone:
      description: Planned sessions that stopped qualifying during the run (resumed by Hermes) and were kept.
      type: int
    sessions_refused:
      description:
        - Deletes Hermes's own store refused, each kept and named. V(session), V(by) (the trigger whose
          C(RAISE(ABORT)) or C(RAISE(FAIL)) stopped it, or the runtime ledger's C(ON DELETE RESTRICT) key) and
          V(message). The profile stays V(ok); they are counted in RV(profiles[].sessions_left_alone) too.
      type: list
      elements: dict
    sessions_kept:
      description:
        - Sessions old enough for the prune that the plan keeps, each named with V(session) and V(reason) (pinned, a
          live lease, a gateway route without the runtime ledger, the runtime ledger's live work, what upstream's
          deletion fence leaves to Hermes (a ledger payload its media retirement cannot read, hosted rooms, a
          segment of a local conversation not all due), rows of an object this collection does not know, or tied to
          such a session). Check mode names the same. A session deleted across several transactions that stopped
          qualifying before its last (resumed, written to, leased, new ledger work, the store's guard) is put back
          whole and named here too.
      type: list
      elements: dict
    bad_time_rows:
      description: Sessions never selected because a time value in them is not unix seconds.
      type: int
    database_backend:
      description:
        - Where Hermes stores this profile's sessions, read from its C(config.yaml) (untrusted text, no YAML
          library). V(backend) is V(sqlite), or V(postgres) and the profile is V(skipped) untouched; V(source) is
          the file that said so.
      returned: when the file was found
      type: dict
    hermes_retention:
      description:
        - Hermes's own auto-prune as the home's C(config.yaml) sets it (else Hermes's default). V(auto_prune),
          V(retention_days), V(source), and V(longer), the retentions of this run longer than Hermes's
          (V(prune_days), or a source of V(prune_days_by_source), with their days), whose sessions Hermes deletes at
          its V(retention_days) first (empty when Hermes's prune is off or no shorter), and V(note), a sentence
          saying so and what to set (null when V(longer) is empty).
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
    deleted_by:
      description:
        - Who deleted the pruned sessions (O(delete_with)), V(engine) or V(hermes) (the installed Hermes's own
          delete code, named in RV(profiles[].release_delete)), or null when nothing was deleted.
      type: str
    release_delete:
      description:
        - The Hermes that deleted, with V(release) (its package and version), V(version), V(python) and V(bulk)
          (whether it has a bulk C(delete_sessions)).
      returned: when the installed Hermes deleted (delete_with)
      type: dict
    release_rules:
      description:
        - Which Hermes decided beside this collection's rules. V(release) (its package and version), V(python),
          V(guards) (its prune kept rows under live write guards) and V(release_pruned) (sessions its own prune
          deleted from the scratch copy); only sessions in both selections were pruned.
      returned: with unknown_schema=release_rules on a newer schema
      type: dict
    schema_version:
      description: Hermes's C(schema_version) of the file.
      returned: when the schema was read
      type: int
    fts_layout:
      description: V(none), V(inline), V(external-content) or V(external-content-views).
      returned: when the schema was read
      type: str
    backup:
      description:
        - The backup taken, or null when none was needed. V(path), V(bytes), V(verified), V(compressed), V(sessions)
          and V(messages) in the copy, and V(copied_by) (V(files) for the byte copy of C(state.db) and its C(-wal),
          V(backup_api) when SQLite's backup API copied it, V(archive) for an archive).
        - V(kind) is V(file) for a copy of the whole file, V(archive) for an archive of the sessions pruned, their
          messages and the rows tied to them, and of the zombie close (rollback-journal mode beside a live gateway).
        - Each session the close ends is recorded with its C(ended_at) and C(end_reason) before (V(sessions_closed)
          counts them), which C(session_restore) puts back.
      type: dict
    backup_deferred:
      description:
        - Null, or why no whole-file backup was taken although one was due (rollback-journal mode, the file held
          open by the gateway); a run with no holder, such as C(playbooks/maintain.yml) with
          C(hermes_gateway_service), takes it.
      type: str
    backups_removed:
      description: Paths of this collection's older backups that retention removed after the new one.
      type: list
      elements: str
    sqlite:
      description:
        - The SQLite that worked on this profile, as the run's RV(sqlite) (a root run works in a child process).
      returned: when the profile was worked on
      type: dict
    litestream:
      description:
        - Litestream's tables found in the file (a replicated database); then no checkpoint and no full VACUUM, and
          incremental steps only where the file is already in incremental mode.
      returned: when the schema was read
      type: list
      elements: str
    stopped_early:
      description:
        - Null, or why the run stopped between two transactions before all its work was done (the C(-wal) reached
          its limit while another process holds the file and this SQLite may not checkpoint it); the next run
          carries on.
      type: str
    preflight:
      description:
        - How the file was checked before any change. V(journal_mode), V(holders) (other processes with the file
          open, counted in rollback-journal mode only), V(live_rollback) (both), V(check) (V(quick_check) of the
          whole file, or V(tables) for a quick_check of each small table in its own short read, beside a live
          gateway in rollback-journal mode), V(tables_checked) and V(shared_filesystem) (null, or why the file
          counts as held by processes on other hosts, on a network or VM-shared filesystem such as NFS, SMB, 9p or
          virtiofs; then no whole-file copy and no full VACUUM, and a file in WAL mode is refused).
      type: dict
    reclaim:
      description:
        - V(mode), V(action) (V(full), V(incremental) or null), V(bytes_freed) (in check mode an estimate),
          V(skipped_reason), V(free_pages_predicted) (the free pages the plan expects after the prune, which the
          vacuum rule is applied to), V(in_window) (the full VACUUM waits for the service window),
          V(fts_merge_steps) (the steps of FTS5's optimize after a prune, short write transactions sized to
          O(batch_time), beside a live gateway too), V(fts_automerge_restored) (the FTS indexes whose automatic
          merging a run killed during its prune or that optimize left paused, which this run puts back to FTS5's
          default), and after a real run V(free_pages_before_vacuum) (measured), V(stopped_early),
          V(incremental_steps) and V(incremental_retries) (the C(incremental_vacuum) steps, each sized to
          O(batch_time), and those interrupted at the hard bound and retried with fewer pages) and V(checkpoint)
          (null when none was run; V(checkpoint_skipped_reason) says why).
      type: dict
    window:
      description:
        - Null without a service window (O(gateway_service), O(gateway_stop_command)). Else V(opened) (in check
          mode, whether it would open), V(reason) (why not, or what went wrong in it), V(steps) (what needs the file
          alone, in this order V(backup) (the whole-file backup a live rollback-journal run deferred),
          V(optimize_storage) (Hermes's own C(hermes sessions optimize-storage), run with O(hermes_python) as the
          file's owner where the file has that work left), V(fts_optimize) (of what the gateway wrote since the
          run's own) and V(vacuum_full)), V(estimate_s) (the planned downtime), and after a real run V(downtime_s)
          (from the drain until the gateway was back), V(done) (the steps completed), V(gateway_back) (the gateway
          serves again; false fails the profile) and V(auto_vacuum) (the file's mode after it, 2 for incremental).
          One window serves every profile of the run that planned one.
      type: dict
    file_retention:
      description:
        - Null without O(file_retention). Else V(removed), each item removed (in check mode, to be removed) with
          V(kind), V(path), V(files) (relative to the profile's home), V(bytes) and V(why); V(bytes), their total;
          V(skipped) (kind to why it was left alone, such as Hermes's backup running) and V(errors).
      type: dict
    tool_payloads:
      description:
        - Null without O(tool_payload_days). Else V(days); V(elided), the tool messages whose content became a
          tombstone (in check mode, exactly those that will); V(bytes), their original content bytes, and
          V(bytes_after), their tombstones'; V(sessions), how many sessions they are in; V(archive), the owner-only
          file holding the original bytes (M(hermes_agent.ops.session_restore) with C(tool_payloads=true) puts them
          back); V(skipped_reason), why nothing was elided (objects this collection does not know, an FTS index this
          SQLite cannot update); after a real run V(left_alone) (changed or protected since the plan),
          V(stopped_early), V(retries) (transactions still running at the hard bound, rolled back and retried in
          halves), V(fts_optimize_steps) (FTS5's optimize after the elision, in short write transactions sized to
          O(batch_time), beside a live gateway too) and V(fts_optimize_stopped) (why it was not finished; the next
          run goes on).
      type: dict
    stores:
      description:
        - Null without O(reclaim_stores). Else each other SQLite store found, by kind, with V(path), V(bytes),
          V(free_pages), V(action) (V(full), V(incremental) or null), V(skipped_reason) and, after a real VACUUM,
          V(bytes_after).
      type: dict
    before:
      description:
        - V(db_bytes), V(wal_bytes), V(sessions), V(messages), V(open_sessions), V(free_pages), V(page_size),
          V(page_count).
      type: dict
    after:
      description:
        - The same figures after the run. In check mode V(sessions), V(messages) and V(open_sessions) are predicted
          exactly, the sizes and pages estimated.
      type: dict
    duration:
      description: Seconds spent on the profile.
      type: float
    traceback:
      description: The Python traceback of the unexpected error, for a bug report.
      returned: when an unexpected error stopped the profile
      type: str
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

from ansible_collections.hermes_agent.ops.plugins.module_utils._ansible_support import (
    diff_of,
    maintenance_argument_spec,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.host.profiles import NO_PROFILES
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.metrics import record_run
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError


def main():
    argument_spec = maintenance_argument_spec()
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    options = dict(module.params)
    metrics_dir = options.pop("metrics_dir")
    try:
        result = run_maintenance(options, check_mode=module.check_mode)
    except MaintenanceError as exc:
        module.fail_json(msg="invalid options: %s" % exc)
    if metrics_dir and not module.check_mode:
        try:
            record_run(metrics_dir, options, result)
        except Exception as exc:  # the maintenance is done; its metrics are only its report
            module.warn("cannot write metrics to %s: %s" % (metrics_dir, getattr(exc, "strerror", None) or exc))
    output = dict(
        status=result["status"],
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
    for profile in result["profiles"]:
        if profile["status"] == NO_PROFILES:  # nothing was maintained there: say so, never a plain success
            module.warn("nothing to maintain: %s" % profile["error"])
    module.exit_json(**output)


if __name__ == "__main__":
    main()
