# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``run_maintenance`` and ``gather_info`` return, written once: the run's keys and each
profile's keys.

The engine builds each profile's result from ``PROFILE_FIELDS`` (their initial values);
``scripts/generate.py`` writes the module's RETURN block and the result table of
docs/architecture.md from both tables, and state_db_info's RETURN block from ``INFO_*``.
Adding a result key: add one ``Field`` row, set it in the engine, run
``python3 scripts/generate.py``.
"""

from __future__ import annotations

import copy
from typing import Any, TypedDict, cast

SET_LATER = object()  # no initial value: the engine sets the key once it knows it


class Field:
    """One result key. ``module_key`` is its name in the module's result (None: not returned);
    ``in_return`` False leaves it out of RETURN where Ansible documents it itself (``changed``)."""

    def __init__(
        self,
        name: str,
        type: str,
        doc: tuple[str, ...],
        initial: Any = SET_LATER,
        elements: str | None = None,
        returned: str = "always",
        module_key: str | None = "",
        in_return: bool = True,
    ) -> None:
        self.name = name
        self.type = type
        self.doc = tuple(doc)
        self.initial = initial
        self.elements = elements
        self.returned = returned
        self.module_key = name if module_key == "" else module_key
        self.in_return = in_return and self.module_key is not None


# fmt: off
RUN_FIELDS = (
    Field("status", "str", doc=(
        "V(ok), V(failed) (a profile failed) or V(no_profiles) (a home held no C(state.db)).",
        "V(no_profiles) means nothing was maintained in that home, which is never a success.",
    )),
    Field("summary", "list", elements="str", doc=(
        "One line per profile, in the form of the monthly script it replaces.",
    )),
    Field("failed", "list", elements="str", module_key="failed_profiles", doc=("Names of the profiles that failed.",)),
    Field("profiles", "list", elements="dict", doc=(
        "What happened to each profile (in check mode, what would happen).",
    )),
    Field("changed", "bool", in_return=False, doc=("Whether any profile changed (or would change).",)),
    Field("sqlite", "dict", doc=(
        "The SQLite that did the work, with V(version), V(wal_reset_affected) (whether it has the WAL-reset bug, "
        "SQLite 3.7.0 to 3.51.2 but 3.50.7 and 3.44.6; then it never checkpoints a WAL file another process "
        "holds) and V(python) (the interpreter).",
    )),
    Field("check_mode", "bool", module_key=None, doc=("Whether this was a dry run (nothing was written).",)),
)

PROFILE_FIELDS = (
    Field("name", "str", initial=None, doc=("V(default) for C(HOME/state.db), else the profile's directory name.",)),
    Field("home", "str", initial=None, doc=("The Hermes home.",)),
    Field("path", "str", initial=None, doc=("The C(state.db) path.",)),
    Field("status", "str", initial="ok", doc=(
        "V(ok), V(skipped) (lock held, database busy; nothing lost, the next run retries), V(failed) or "
        "V(no_profiles) (the home exists but holds no C(state.db); the entry stands for the home).",
    )),
    Field("error", "str", initial=None, doc=(
        "Why it was skipped or failed, naming the thing and what to do; null when ok.",
    )),
    Field("changed", "bool", initial=False, doc=("Whether this profile changed (or would change).",)),
    Field("zombies_closed", "int", initial=0, doc=("Open sessions closed.",)),
    Field("sessions_pruned", "int", initial=0, doc=(
        "Sessions deleted, including delegate children deleted with their parent.",
    )),
    Field("messages_pruned", "int", initial=0, doc=("Messages deleted (their FTS rows go with them).",)),
    Field("sessions_orphaned", "int", initial=0, doc=(
        "Kept child sessions whose pruned parent was unlinked (C(parent_session_id) set to null).",
    )),
    Field("transcripts_removed", "int", initial=0, doc=("Files removed from C(HOME/sessions/).",)),
    Field("retention", "dict", initial=None, doc=(
        "Which retention applied to what. V(prune_days), V(by_source) (O(prune_days_by_source), V({}) when unset) "
        "and V(selected), the sessions the plan selected for the prune by their source (before a stop; "
        "RV(profiles[].sessions_pruned) says what was deleted).",
    )),
    Field("prompts_collected", "int", initial=0, doc=("C(system_prompts) rows no longer referenced after the prune.",)),
    Field("sessions_left_alone", "int", initial=0, doc=(
        "Planned sessions that stopped qualifying during the run (resumed by Hermes) and were kept.",
    )),
    Field("sessions_refused", "list", initial=[], elements="dict", doc=(
        "Deletes Hermes's own store refused, each kept and named. V(session), V(by) (the trigger whose "
        "C(RAISE(ABORT)) or C(RAISE(FAIL)) stopped it, or the runtime ledger's C(ON DELETE RESTRICT) key) and "
        "V(message). The profile stays V(ok); they are counted in RV(profiles[].sessions_left_alone) too.",
    )),
    Field("sessions_kept", "list", initial=[], elements="dict", doc=(
        "Sessions old enough for the prune that the plan keeps, each named with V(session) and V(reason) "
        "(pinned, a live lease, a gateway route without the runtime ledger, the runtime ledger's live work, "
        "what upstream's deletion fence leaves to Hermes (a ledger payload its media retirement cannot read, "
        "hosted rooms, a segment of a local conversation not all due), rows of an object this collection does not "
        "know, or tied to such a session). Check mode names the same. A session deleted across several "
        "transactions that stopped qualifying before its last (resumed, written to, leased, new ledger work, "
        "the store's guard) is put back whole and named here too.",
    )),
    Field("bad_time_rows", "int", initial=0, doc=(
        "Sessions never selected because a time value in them is not unix seconds.",
    )),
    Field("database_backend", "dict", returned="when the file was found", doc=(
        "Where Hermes stores this profile's sessions, read from its C(config.yaml) (untrusted text, no YAML "
        "library). V(backend) is V(sqlite), or V(postgres) and the profile is V(skipped) untouched; V(source) is "
        "the file that said so.",
    )),
    Field("hermes_retention", "dict", returned="when the file was found", doc=(
        "Hermes's own auto-prune as the home's C(config.yaml) sets it (else Hermes's default). V(auto_prune), "
        "V(retention_days), V(source), and V(longer), the retentions of this run longer than Hermes's "
        "(V(prune_days), or a source of V(prune_days_by_source), with their days), whose sessions Hermes deletes "
        "at its V(retention_days) first (empty when Hermes's prune is off or no shorter), and V(note), a sentence "
        "saying so and what to set (null when V(longer) is empty).",
    )),
    Field("catalogue", "dict", returned="when the schema was read", doc=(
        "The file's own catalogue, matched against the objects this collection knows. V(unknown) (foreign keys "
        "to C(sessions)/C(messages) and triggers on their deletes or updates it does not know, and tables, views "
        "and C(state_meta) key families naming sessions; then the profile refuses what they could affect and "
        "fails, naming them), V(known) and V(runtime_ledger) (whether the "
        "gateway runtime ledger of upstream Hermes is there).",
    )),
    Field("deleted_by", "str", initial=None, doc=(
        "Who deleted the pruned sessions (O(delete_with)), V(engine) or V(hermes) (the installed Hermes's own "
        "delete code, named in RV(profiles[].release_delete)), or null when nothing was deleted.",
    )),
    Field("release_delete", "dict", returned="when the installed Hermes deleted (delete_with)", doc=(
        "The Hermes that deleted, with V(release) (its package and version), V(version), V(python) and V(bulk) "
        "(whether it has a bulk C(delete_sessions)).",
    )),
    Field("release_rules", "dict", returned="with unknown_schema=release_rules on a newer schema", doc=(
        "Which Hermes decided beside this collection's rules. V(release) (its package and version), V(python), "
        "V(guards) (its prune kept rows under live write guards) and V(release_pruned) (sessions its own prune "
        "deleted from the scratch copy); only sessions in both selections were pruned.",
    )),
    Field("schema_version", "int", returned="when the schema was read", doc=(
        "Hermes's C(schema_version) of the file.",
    )),
    Field("fts_layout", "str", returned="when the schema was read", doc=(
        "V(none), V(inline), V(external-content) or V(external-content-views).",
    )),
    Field("backup", "dict", initial=None, doc=(
        "The backup taken, or null when none was needed. V(path), V(bytes), V(verified), V(compressed), V(sessions) "
        "and V(messages) in the copy, and V(copied_by) (V(files) for the byte copy of C(state.db) and its C(-wal), "
        "V(backup_api) when SQLite's backup API copied it, V(archive) for an archive).",
        "V(kind) is V(file) for a copy of the whole file, V(archive) for an archive of the sessions pruned, their "
        "messages and the rows tied to them, and of the zombie close (rollback-journal mode beside a live gateway).",
        "Each session the close ends is recorded with its C(ended_at) and C(end_reason) before (V(sessions_closed) "
        "counts them), which C(session_restore) puts back.",
    )),
    Field("backup_deferred", "str", initial=None, doc=(
        "Null, or why no whole-file backup was taken although one was due (rollback-journal mode, the file held "
        "open by the gateway); a run with no holder, such as C(playbooks/maintain.yml) with "
        "C(hermes_gateway_service), takes it.",
    )),
    Field("backups_removed", "list", initial=[], elements="str", doc=(
        "Paths of this collection's older backups that retention removed after the new one.",
    )),
    Field("sqlite", "dict", returned="when the profile was worked on", doc=(
        "The SQLite that worked on this profile, as the run's RV(sqlite) (a root run works in a child process).",
    )),
    Field("litestream", "list", elements="str", returned="when the schema was read", doc=(
        "Litestream's tables found in the file (a replicated database); then no checkpoint and no full VACUUM, "
        "and incremental steps only where the file is already in incremental mode.",
    )),
    Field("stopped_early", "str", initial=None, doc=(
        "Null, or why the run stopped between two transactions before all its work was done (the C(-wal) "
        "reached its limit while another process holds the file and this SQLite may not checkpoint it); the "
        "next run carries on.",
    )),
    Field("preflight", "dict", initial=None, doc=(
        "How the file was checked before any change. V(journal_mode), V(holders) (other processes with the file "
        "open, counted in rollback-journal mode only), V(live_rollback) (both), V(check) (V(quick_check) of the "
        "whole file, or V(tables) for a quick_check of each small table in its own short read, beside a live "
        "gateway in rollback-journal mode), V(tables_checked) and V(shared_filesystem) (null, or why the file "
        "counts as held by processes on other hosts, on a network or VM-shared filesystem such as NFS, SMB, "
        "9p or virtiofs; then no whole-file copy and no full VACUUM, and a file in WAL mode is refused).",
    )),
    Field("reclaim", "dict", initial=None, doc=(
        "V(mode), V(action) (V(full), V(incremental) or null), V(bytes_freed) (in check mode an estimate), "
        "V(skipped_reason), V(free_pages_predicted) (the free pages the plan expects after the prune, which the "
        "vacuum rule is applied to), V(in_window) (the full VACUUM waits for the service window), V(fts_merge_steps) "
        "(the steps of FTS5's optimize after a prune, short write transactions sized to O(batch_time), beside a "
        "live gateway too), V(fts_automerge_restored) (the FTS indexes whose automatic merging a run killed "
        "during its prune or that optimize left paused, which this run puts back to FTS5's default), "
        "and after a real run V(free_pages_before_vacuum) (measured), "
        "V(stopped_early), V(incremental_steps) and V(incremental_retries) (the C(incremental_vacuum) steps, each "
        "sized to O(batch_time), and those interrupted at the hard bound and retried with fewer pages) and "
        "V(checkpoint) (null when none was run; V(checkpoint_skipped_reason) says why).",
    )),
    Field("window", "dict", initial=None, doc=(
        "Null without a service window (O(gateway_service), O(gateway_stop_command)). Else V(opened) (in check "
        "mode, whether it would open), V(reason) (why not, or what went wrong in it), V(steps) (what needs the file "
        "alone, in this order V(backup) (the whole-file backup a live rollback-journal run deferred), "
        "V(optimize_storage) (Hermes's own C(hermes sessions optimize-storage), run with O(hermes_python) as the "
        "file's owner where the file has that work left), V(fts_optimize) (of what the gateway wrote since the "
        "run's own) and V(vacuum_full)), V(estimate_s) (the planned downtime), and after a real run "
        "V(downtime_s) (from the drain until the gateway was back), V(done) (the steps completed), "
        "V(gateway_back) (the gateway serves again; false fails the profile) and V(auto_vacuum) (the file's mode "
        "after it, 2 for incremental). One window serves every profile of the run that planned one.",
    )),
    Field("file_retention", "dict", initial=None, doc=(
        "Null without O(file_retention). Else V(removed), each item removed (in check mode, to be removed) with "
        "V(kind), V(path), V(files) (relative to the profile's home), V(bytes) and V(why); V(bytes), their total; "
        "V(skipped) (kind to why it was left alone, such as Hermes's backup running) and V(errors).",
    )),
    Field("tool_payloads", "dict", initial=None, doc=(
        "Null without O(tool_payload_days). Else V(days); V(elided), the tool messages whose content became a "
        "tombstone (in check mode, exactly those that will); V(bytes), their original content bytes, and "
        "V(bytes_after), their tombstones'; V(sessions), how many sessions they are in; V(archive), the owner-only "
        "file holding the original bytes (M(hermes_agent.ops.session_restore) with C(tool_payloads=true) puts them "
        "back); V(skipped_reason), why nothing was elided (objects this collection does not know, an FTS index "
        "this SQLite cannot update); after a real run V(left_alone) (changed or protected since the plan), "
        "V(stopped_early), V(retries) (transactions still running at the hard bound, rolled back and retried "
        "in halves), V(fts_optimize_steps) (FTS5's optimize after the elision, in short write "
        "transactions sized to O(batch_time), beside a live gateway too) and V(fts_optimize_stopped) (why it was "
        "not finished; the next run goes on).",
    )),
    Field("stores", "dict", initial=None, doc=(
        "Null without O(reclaim_stores). Else each other SQLite store found, by kind, with V(path), V(bytes), "
        "V(free_pages), V(action) (V(full), V(incremental) or null), V(skipped_reason) and, after a real VACUUM, "
        "V(bytes_after).",
    )),
    Field("before", "dict", initial=None, doc=(
        "V(db_bytes), V(wal_bytes), V(sessions), V(messages), V(open_sessions), V(free_pages), V(page_size), "
        "V(page_count).",
    )),
    Field("after", "dict", initial=None, doc=(
        "The same figures after the run. In check mode V(sessions), V(messages) and V(open_sessions) are predicted "
        "exactly, the sizes and pages estimated.",
    )),
    Field("duration", "float", initial=0.0, doc=("Seconds spent on the profile.",)),
    Field("traceback", "str", returned="when an unexpected error stopped the profile", doc=(
        "The Python traceback of the unexpected error, for a bug report.",
    )),
)


# Each key's type in RunResult and ProfileResult follows from its row (type, elements; "| None"
# where the initial value is None), except these.
TYPES_IN_RUN_RESULT = {"profiles": "list[ProfileResult]"}
TYPES_IN_PROFILE_RESULT = {name: "str" for name in ("name", "home", "path")}  # given to new_profile_result
TYPES_IN_PROFILE_RESULT["schema_version"] = "int | None"  # a file without a schema_version table has none


def _field_of(fields: tuple[Field, ...], name: str) -> Field:
    return next(field for field in fields if field.name == name)


# What state_db_info returns (the engine's gather_info): its own keys for each profile, and
# the keys it shares with a maintenance result, which mean the same there.
INFO_RUN_FIELDS = (
    Field("profiles", "list", elements="dict", doc=("One entry per profile found.",)),
    _field_of(RUN_FIELDS, "sqlite"),
)

INFO_PROFILE_FIELDS = (
    _field_of(PROFILE_FIELDS, "name"),
    _field_of(PROFILE_FIELDS, "home"),
    _field_of(PROFILE_FIELDS, "path"),
    Field("status", "str", doc=("V(ok) or V(failed) (then RV(profiles[].error) says why).",)),
    Field("error", "str", doc=("Why the profile could not be read; null when ok.",)),
    Field("db_bytes", "int", doc=("Size of C(state.db).",)),
    Field("wal_bytes", "int", doc=("Size of C(state.db-wal).",)),
    Field("sessions", "int", doc=("Sessions in the database.",)),
    Field("messages", "int", doc=("Messages in the database.",)),
    Field("open_sessions", "int", doc=("Sessions without C(ended_at).",)),
    Field("idle_open", "int", doc=(
        "Open sessions maintenance would close as zombies with the given O(zombie_days).",
    )),
    Field("prunable_sessions", "int", doc=("Sessions maintenance would prune with the given O(prune_days).",)),
    Field("prunable_messages", "int", doc=("Messages maintenance would prune.",)),
    Field("bad_time_rows", "int", doc=("Sessions whose time values are not unix seconds.",)),
    Field("free_pages", "int", doc=("Pages on the freelist.",)),
    Field("page_count", "int", doc=("Pages in the file.",)),
    Field("page_size", "int", doc=("Page size in bytes.",)),
    Field("auto_vacuum", "int", doc=("SQLite's C(auto_vacuum) mode: V(0) none, V(1) full, V(2) incremental.",)),
    Field("storage", "dict", doc=(
        "Where the file's bytes are, read-only. V(page_size), V(page_count), V(free_pages), V(free_bytes) (the "
        "freelist). V(by_object) maps each table and index to V(kind) (V(table), V(index) with its V(table), or "
        "V(fts), an FTS5 index with its shadow tables C(_data), C(_idx), C(_content), C(_docsize), C(_config) "
        "counted under it), V(pages) and V(bytes), from SQLite's C(dbstat) (overflow pages included; page 1 is "
        "V(sqlite_schema)). V(by_object) is null, and V(by_object_unavailable) says why, where the SQLite lacks "
        "C(dbstat) (built without C(SQLITE_ENABLE_DBSTAT_VTAB)); V(by_object_unavailable) also names the objects "
        "not measured beside a gateway in rollback-journal mode (each would have been a read longer than 100 ms, "
        "which holds back its commits).",
        "V(by_role) and V(by_source) (the session's source) map to V(messages), V(content_bytes) (bytes of "
        "C(messages.content)) and V(payload_bytes), the bytes of C(content) plus C(api_content), C(tool_calls), "
        "C(reasoning), C(reasoning_content), C(reasoning_details), C(codex_reasoning_items) and "
        "C(codex_message_items), those of them the file has (V(payload_columns)); bytes as stored (UTF-8), not "
        "characters. V(largest_sessions), the 10 sessions with the most payload bytes, with V(id), V(source), "
        "V(started_at), V(ended_at), V(messages), V(content_bytes), V(payload_bytes), V(tool_bytes) (of its "
        "V(tool) messages). V(live_rollback) is true when the file was read beside a gateway in rollback-journal "
        "mode, in statements of about 40 ms each.",
    )),
    Field("mode", "str", doc=("Permission bits of C(state.db) in octal, such as V(600).",)),
    Field("schema_version", "int", doc=("Hermes's C(schema_version).",)),
    Field("fts_layout", "str", doc=("V(none), V(inline), V(external-content) or V(external-content-views).",)),
    Field("fts_unusable", "list", elements="str", doc=(
        "FTS indexes whose tokenizer this host's SQLite lacks (deletes would fail).",
    )),
    Field("holders", "list", elements="dict", doc=(
        "Processes holding the file open, or that may hold it (V(pid), V(command), V(evidence)).",
        "V(evidence) is V(descriptor) (its open file seen in C(/proc)), V(lock) (SQLite's own lock on the file or "
        "its C(-shm), seen with C(fcntl); V(pid) may then be null) or V(unreadable) (a process whose descriptors "
        "cannot be read and that could open the file, so it cannot be ruled out) or V(filesystem) (the file is on a "
        "network or VM-shared filesystem, where processes on other hosts may hold it unseen).",
    )),
    Field("hermes_locks_held", "list", elements="dict", doc=(
        "Hermes's own lock files held right now (V(file), V(operation)), such as C(state.db.repair.lock) while "
        "Hermes repairs the file; maintenance skips the profile while one is held.",
    )),
    Field("litestream", "list", elements="str", doc=(
        "Litestream's tables found in the file (a replicated database).",
    )),
    Field("hermes_auto_maintenance", "dict", doc=(
        "What Hermes's own auto-maintenance recorded and is set to, read-only. V(last_auto_prune) and "
        "V(last_vacuum) from C(state_meta), and V(config) with the C(sessions.*) settings read from the home's "
        "C(config.yaml) (V(auto_prune), V(retention_days), V(min_interval_hours), V(vacuum_after_prune), "
        "V(min_vacuum_interval_days), V(source)).",
    )),
    _field_of(PROFILE_FIELDS, "database_backend"),
    _field_of(PROFILE_FIELDS, "catalogue"),
    Field("sqlite", "dict", doc=("The SQLite that read the profile, as RV(sqlite).",)),
    Field("newest_backup", "dict", doc=("Newest backup of this collection (V(path), V(age_days)), or null.",)),
    Field("backups", "int", doc=("Number of this collection's backups of the profile.",)),
    Field("newest_archive", "dict", doc=(
        "Newest archive of the rows a run deleted (V(path), V(age_days)), kept instead of a whole-file backup beside "
        "a gateway holding a rollback-journal C(state.db); or null.",
    )),
    Field("archives", "int", doc=("Number of this collection's archives of the profile.",)),
    Field("home_files", "dict", doc=(
        "Every file of the profile's home (the directory holding its C(state.db); the default profile's leaves "
        "out C(profiles/)), by kind, read-only. V(kinds) maps each kind found to V(count) (items, where a "
        "C(state.db.retired-wal-*) or C(state-snapshots/<id>) directory is one), V(bytes), V(oldest) and V(newest) "
        "(mtimes, unix seconds); V(bytes) is the home's total and V(named_bytes) what is in a named kind (the rest "
        "is V(other)). V(stores) gives C(cron/executions.db), C(cron/deliveries.db) and C(cron/notepad.db) with "
        "V(bytes), V(page_count), V(page_size), V(free_pages), V(reclaimable_bytes) (what a VACUUM would give back; "
        "nothing is reclaimed), V(journal_mode), V(auto_vacuum) and V(error).",
        "The kinds (plan.inventory.KINDS) are V(state_db), V(malformed_backup), V(retired_wal) (messages may be "
        "missing from C(state.db), see docs/fleet.md), V(pre_update_emergency), V(hermes_locks), V(hermes_backup_zip), "
        "V(hermes_ops_archive), V(hermes_ops_backup), V(state_snapshots), V(pending_messages), V(transcripts), "
        "V(orphaned_transcripts) (whose session is no longer in C(state.db)), V(cron_executions), V(cron_deliveries), "
        "V(notepad), V(cron_other), V(logs), V(caches), V(agent_data), V(config), V(other).",
    )),
)
# fmt: on


class RunResult(TypedDict, total=False):
    """What run_maintenance returns: the keys of RUN_FIELDS."""

    # BEGIN GENERATED: results-run (scripts/generate.py)
    status: str
    summary: list[str]
    failed: list[str]
    profiles: list[ProfileResult]
    changed: bool
    sqlite: Any
    check_mode: bool
    # END GENERATED


class ProfileResult(TypedDict, total=False):
    """One profile's entry in RunResult's ``profiles``: the keys of PROFILE_FIELDS."""

    # BEGIN GENERATED: results-profile (scripts/generate.py)
    name: str
    home: str
    path: str
    status: str
    error: str | None
    changed: bool
    zombies_closed: int
    sessions_pruned: int
    messages_pruned: int
    sessions_orphaned: int
    transcripts_removed: int
    retention: Any
    prompts_collected: int
    sessions_left_alone: int
    sessions_refused: list[Any]
    sessions_kept: list[Any]
    bad_time_rows: int
    database_backend: Any
    hermes_retention: Any
    catalogue: Any
    deleted_by: str | None
    release_delete: Any
    release_rules: Any
    schema_version: int | None
    fts_layout: str
    backup: Any
    backup_deferred: str | None
    backups_removed: list[str]
    sqlite: Any
    litestream: list[str]
    stopped_early: str | None
    preflight: Any
    reclaim: Any
    window: Any
    file_retention: Any
    tool_payloads: Any
    stores: Any
    before: Any
    after: Any
    duration: float
    traceback: str
    # END GENERATED


def new_profile_result(home: str, name: str, path: str) -> ProfileResult:
    """A profile's result before any work: every key that has an initial value."""
    result = {f.name: copy.copy(f.initial) for f in PROFILE_FIELDS if f.initial is not SET_LATER}
    result.update(name=name, home=home, path=path)
    return cast("ProfileResult", result)
