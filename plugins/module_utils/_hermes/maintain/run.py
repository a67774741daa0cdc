# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Maintenance of every Hermes state.db of a host, one profile at a time.

Entry points: ``run_maintenance`` (modules, runner) and ``gather_info`` (read-only).
One profile's failure never stops the others; each result says what happened and why.
"""

from __future__ import annotations

import os
import pwd
import sqlite3
import time
import traceback

from ..apply.elision import (
    PAYLOAD_PREFIX,
    ElideResult,
    elide,
    plan_payloads,
    take_payload_archive,
)
from ..apply.files import describe, plan_files, plan_stores, reclaim_stores, remove_files
from ..apply.hermes_deletes import HERMES, ReleaseDeleter, choose_deleter, release_prune, release_prune_on_copy
from ..apply.prune import PruneResult, close_zombies, prune, turn_after_commit
from ..apply.reclaim import fts_optimize_live, optimize_bound, reclaim, wal_budget
from ..apply.undo import settle as settle_sliced
from ..apply.window import GatewayControl, run_window, window_words
from ..apply.window import configured as window_configured
from ..backup.archive import list_archives, take_archive
from ..backup.whole_file import apply_retention, check_backup_dir, list_backups, take_backup
from ..host.hazards import (
    auto_prune_setting,
    database_backend,
    litestream_tables,
    no_checkpoint_on_close,
    refuse_during_hermes_operation,
)
from ..host.profiles import NO_PROFILES, ProfileLock, backups_of, each_profile, owner_of, run_as_owner, sessions_dir
from ..options import BY_NAME, defaults
from ..plan.inventory import session_ids
from ..plan.selection import DAY, build_plan
from ..results import new_profile_result
from ..sqlite.db import (
    MaintenanceError,
    ProfileSkipped,
    ReadOnlyDB,
    check_db_file,
    engine_sqlite,
    holders,
    journal_mode,
    open_rw,
    refuse_wal_on_shared_filesystem,
)
from ..store.catalogue import fully_known, read_catalogue, refusal, refuses_deletes, refuses_zombie_closes, summary
from ..store.release_rules import release_prune_set
from ..store.schema import check_version, inspect_schema, quick_check, quick_check_small_tables, stats, unusable_fts
from .actions import ARCHIVE, FILE, human_size, plan_actions, report_plan
from .checked_options import for_profile, normalize_options

DEFAULTS = defaults()  # the option table's defaults (options.OPTIONS)
VACUUM_MODES = BY_NAME["vacuum_mode"].choices
ROLLBACK_CACHE_KB = 32768  # page cache of the maintenance connection beside a live rollback-mode gateway


def hermes_retention(home, opts):
    """Hermes's own auto-prune (config.yaml) beside this run's retentions (``opts`` of the profile):
    where Hermes prunes sooner, its retention wins, whatever the collection keeps."""
    setting = auto_prune_setting(home)
    days = setting["retention_days"]
    longer = {}
    if setting["auto_prune"] is True and isinstance(days, (int, float)) and not isinstance(days, bool):
        wanted = dict(opts.prune_days_by_source, prune_days=float(opts.prune_days))
        longer = {key: value for key, value in sorted(wanted.items()) if float(value) > float(days)}
    note = None
    if longer:
        note = (
            "Hermes's own auto-prune (sessions.retention_days %s, %s) deletes ended sessions after %s days, before "
            "this collection's longer retention (%s) applies: to keep them, set sessions.auto_prune: false in "
            "config.yaml; else set hermes_maintenance_prune_days (and _by_source) to at most %s"
            % (days, setting["source"], days, ", ".join("%s %gd" % (k, float(v)) for k, v in longer.items()), days)
        )
    return dict(
        auto_prune=setting["auto_prune"], retention_days=days, source=setting["source"], longer=longer, note=note
    )


def maintain_profile(home, name, db_path, opts, check_mode, now):
    """Lock, preflight, plan, back up, apply, reclaim: one profile, never raising."""
    result = new_profile_result(home, name, db_path)
    result["sqlite"] = engine_sqlite()
    started = time.time()
    opts = for_profile(opts, name)
    lock = db = conn = None
    try:
        st = check_db_file(db_path)
        _check_owner(db_path, st, opts)
        result["database_backend"] = backend = database_backend(home, db_path)
        result["hermes_retention"] = hermes_retention(home, opts)
        if backend["backend"] != "sqlite":
            raise ProfileSkipped(_elsewhere(backend))  # before the lock: nothing is written
        lock = ProfileLock(db_path, check_mode=check_mode)
        refuse_during_hermes_operation(db_path)
        db = ReadOnlyDB(db_path, opts.busy_timeout) if check_mode else None
        conn = db.conn if db else open_rw(db_path, float(opts.busy_timeout))
        result["preflight"] = preflight_check(conn, db_path)
        schema = inspect_schema(conn, home)
        release_rules = check_version(schema, opts.allow_unknown_schema, opts.unknown_schema)
        schema["catalogue"] = read_catalogue(conn)
        result["catalogue"] = summary(schema["catalogue"])
        schema["litestream"] = result["litestream"] = litestream_tables(conn)
        if schema["litestream"] and not check_mode:
            no_checkpoint_on_close(conn)
        result["schema_version"] = schema["schema_version"]
        result["fts_layout"] = schema["fts_layout"]
        short_reads = result["preflight"]["live_rollback"]
        result["before"] = stats(conn, db_path, short_reads)
        allowed = None
        if release_rules:  # only what the installed Hermes's own prune deletes too
            # the shortest retention: the release's set then holds every session any retention selects
            shortest = min([float(opts.prune_days)] + list(opts.prune_days_by_source.values()))
            answer = release_prune_set(conn, opts.hermes_python, shortest)
            allowed = answer.pop("deleted")
            result["release_rules"] = dict(answer, release_pruned=len(allowed))
        # A session an earlier run left half deleted between two slices goes back whole, then is planned.
        settled = [] if check_mode else settle_sliced(conn, db_path, float(opts.batch_pause))
        plan = build_plan(conn, schema, opts, now, sessions_dir(db_path), short_reads, allowed)
        result["bad_time_rows"] = plan.bad_time_rows
        result["sessions_kept"] = plan.kept + [
            {"session": sid, "reason": SETTLED} for sid in settled if sid not in plan.messages
        ]
        unknown = schema["catalogue"]["unknown"]
        deleter, why = choose_deleter(opts.delete_with, schema["catalogue"], opts.hermes_python, fully_known)
        schema["deleter"] = deleter
        if unknown and deleter == HERMES:
            pass  # the installed Hermes is the authority on its own store: its delete code decides
        elif unknown:
            if why:
                result["error"] = "%s (delete_with auto: %s)" % (refusal(unknown), why)
            else:
                result["error"] = refusal(unknown)
        if unknown and deleter != HERMES:
            if refuses_zombie_closes(unknown):
                plan.zombies = []
            if refuses_deletes(unknown):
                _drop_deletes(plan)
        broken_fts = unusable_fts(schema)
        if broken_fts and plan.delete_order:
            # Deleting a message fires every FTS trigger; one missing tokenizer fails them all.
            result["error"] = (
                "pruning refused: %s; this SQLite %s cannot run Hermes's delete triggers. Zombies were still closed; "
                "run with a Python whose SQLite has the tokenizer (trigram needs 3.34+), or install Hermes's "
                "CJK extension" % ("; ".join(broken_fts), sqlite3.sqlite_version)
            )
            _drop_deletes(plan)
        _retention(result, plan, opts)
        if opts.tool_payload_days is not None:
            plan.payloads = plan_payloads(
                conn, schema, plan, opts.tool_payload_days, now, _payload_refusal(schema, unknown, broken_fts)
            )
        root = os.path.dirname(db_path)
        ids = session_ids(conn) if "orphaned_transcripts" in opts.file_retention else None
        files_plan = plan_files(root, home, opts.file_retention, ids, now)
        stores_plan = plan_stores(root, float(opts.vacuum_threshold)) if opts.reclaim_stores else None
        backup_dir = backups_of(home, opts.backup_dir)
        backup_due = opts.backup and (plan.has_changes or _interval_due(opts, backup_dir, name, now))
        if backup_due:
            check_backup_dir(backup_dir, st.st_uid, create=not check_mode)
        # Every decision of the run, once: check mode reports this plan, the run executes it.
        actions = plan_actions(
            conn, db_path, opts, schema, plan, result["preflight"],
            backup_due=backup_due, messages_total=result["before"]["messages"], files=files_plan, stores=stores_plan,
        )  # fmt: skip
        if check_mode:
            report_plan(result, plan, actions, backup_dir, name, compress=opts.backup_compress)
            if plan.payloads is not None:
                archive = payload_archive_path(backup_dir, name) if plan.payloads.items else None
                result["tool_payloads"] = plan.payloads.report(archive)
            result["deleted_by"] = deleter if plan.delete_order else None
            if deleter == HERMES and plan.delete_order:  # exactly what the release deletes from a copy
                predicted, result["release_delete"] = release_prune_on_copy(
                    conn, plan, schema, opts.hermes_python,
                    batch_size=int(opts.batch_size), batch_time=float(opts.batch_time),
                    end_reason=opts.end_reason,
                )  # fmt: skip
                _predicted_by_release(result, predicted)
            if opts.file_retention:
                result["file_retention"] = describe(actions.files)
            result["stores"] = actions.stores
        else:
            _apply(
                result, conn, plan, schema, opts, actions,
                db_path=db_path, backup_dir=backup_dir, name=name, now=now,
            )  # fmt: skip
            result["after"] = stats(conn, db_path, short_reads)
            result["reclaim"]["bytes_freed"] = max(0, _bytes(result["before"]) - _bytes(result["after"]))
            result["window"] = actions.window  # opened after every profile's live work (service_window)
            if opts.file_retention:
                result["file_retention"] = remove_files(root, home, actions.files)
            stores = actions.stores
            result["stores"] = reclaim_stores(stores, float(opts.busy_timeout)) if stores else stores
        if result["file_retention"] and result["file_retention"]["removed"]:
            result["changed"] = True
        if result["stores"] and any(entry["action"] for entry in result["stores"].values()):
            result["changed"] = True
        if result["error"]:
            result["status"] = "failed"
    except ProfileSkipped as exc:
        result["status"], result["error"] = "skipped", str(exc)
    except MaintenanceError as exc:
        result["status"], result["error"] = "failed", str(exc)
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            result["status"] = "skipped"
            result["error"] = (
                "%s stayed locked by another writer for longer than busy_timeout (%ss): skipped, nothing lost; "
                "the next run retries" % (db_path, opts.busy_timeout)
            )
        else:
            result["status"], result["error"] = "failed", "%s: %s" % (db_path, exc)
    except Exception as exc:  # one profile must never stop the others
        result["status"] = "failed"
        result["error"] = "%s: unexpected %s: %s" % (db_path, type(exc).__name__, exc)
        result["traceback"] = traceback.format_exc()
    finally:
        if db is not None:
            db.close()
        elif conn is not None:
            conn.close()
        if lock is not None:
            lock.release()
    result["duration"] = round(time.time() - started, 3)
    return result


def _predicted_by_release(result, predicted):
    """Check mode with delete_with=hermes: the counts of the release's run on the scratch copy."""
    result.update(
        sessions_pruned=predicted.sessions,
        messages_pruned=predicted.messages,
        sessions_orphaned=predicted.orphaned,
        transcripts_removed=predicted.transcripts,
        prompts_collected=predicted.prompts,
        sessions_left_alone=len(predicted.left_alone),
        sessions_refused=predicted.refused,
        deleted_by=HERMES if predicted.sessions else None,
    )
    result["after"]["sessions"] = result["before"]["sessions"] - predicted.sessions
    result["after"]["messages"] = result["before"]["messages"] - predicted.messages


def _payload_refusal(schema, unknown, broken_fts):
    """Why no tool payload may be elided in this file, or None: an update fires every trigger on
    messages, so not where the catalogue holds objects we do not know, nor where an FTS index's
    tokenizer is missing from this SQLite."""
    if unknown:
        return refusal(unknown)
    if broken_fts:
        return "%s; this SQLite %s cannot run Hermes's update triggers" % (
            "; ".join(broken_fts),
            sqlite3.sqlite_version,
        )
    return None


def payload_archive_path(backup_dir, name):
    """Where check mode says the payload archive goes (the run's name carries its time)."""
    return os.path.join(backup_dir, PAYLOAD_PREFIX + "%s_<timestamp>.db" % name)


def _elide_payloads(result, conn, plan, schema, opts, *, db_path, backup_dir, name, stop):
    """Archive the planned tool bodies (fsynced before any change), then elide them, paced as the prune."""
    payloads = plan.payloads
    report = payloads.report()
    result["tool_payloads"] = report
    if not payloads.items:
        return
    if stop and stop():
        report.update(elided=0, bytes=0, bytes_after=0, sessions=0, stopped_early=stop())
        return
    check_backup_dir(backup_dir, os.stat(db_path).st_uid, create=True)
    report["archive"] = take_payload_archive(conn, db_path, backup_dir, name, payloads, schema["schema_version"])
    result["changed"] = True
    done = ElideResult()
    wait = turn_after_commit(conn, float(opts.batch_pause))
    try:
        elide(
            conn, schema, report["archive"], batch_size=int(opts.batch_size), batch_time=float(opts.batch_time),
            pause=float(opts.batch_pause), wait=wait, live_rollback=result["preflight"]["live_rollback"],
            stop=stop, result=done,
        )  # fmt: skip
    finally:  # also when a later transaction failed: report what was committed
        report.update(
            elided=done.elided, bytes=done.bytes, bytes_after=done.bytes_after, sessions=len(done.sessions),
            left_alone=done.left_alone, stopped_early=done.stopped, retries=done.retries,
        )  # fmt: skip
    if done.elided:  # the replaced bodies' old index entries: FTS5's optimize, in steps a writer can work beside
        report["fts_optimize_steps"], report["fts_optimize_stopped"] = fts_optimize_live(
            conn, schema["fts"], wait, stop, bound=optimize_bound(opts, db_path)
        )


def _drop_deletes(plan):
    plan.delete_order, plan.messages, plan.transcripts, plan.prompts, plan.orphaned = [], {}, {}, 0, 0


def _elsewhere(backend):
    return (
        "%s selects database.backend: %s: Hermes keeps its sessions there and this state.db gets no writes, "
        "so maintaining it would be pointless and misleading; skipped, nothing written"
        % (backend["source"], backend["backend"])
    )


def preflight_check(conn, db_path):
    """Check the file before any change, without stalling a live gateway; say how.

    In WAL mode (or with nobody else holding the file) a full quick_check: WAL readers block
    no writer. In rollback-journal mode with other processes holding the file, a read's
    SHARED lock blocks every commit of the gateway for as long as it lasts, so only the
    small tables are checked here, each in its own short read (quick_check_small_tables);
    the rows the prune deletes are checked through their archive.
    """
    mode = journal_mode(conn, db_path)
    shared = refuse_wal_on_shared_filesystem(db_path, mode)
    others = holders(db_path) if mode != "wal" else []
    report = {"journal_mode": mode, "live_rollback": bool(others), "holders": len(others), "shared_filesystem": shared}
    if others:
        report["check"] = "tables"
        report["tables_checked"] = quick_check_small_tables(conn, db_path)
    else:
        quick_check(conn, db_path)
        report["check"] = "quick_check"
    return report


def _bytes(stats_):
    return stats_["db_bytes"] + stats_["wal_bytes"]


def _check_owner(db_path, st, opts):
    uid = os.geteuid()
    if uid not in (0, st.st_uid) and not opts.allow_foreign_owner:
        raise MaintenanceError(
            "%s belongs to uid %d but this run is uid %d: files it creates (WAL, lock, backups) would belong to "
            "the wrong user; run as that user or as root (the engine then switches to the owner)"
            % (db_path, st.st_uid, uid)
        )


def _interval_due(opts, backup_dir, name, now):
    interval = opts.backup_interval_days
    if interval is None:
        return False
    newest = list_backups(backup_dir, name)
    return not newest or now - newest[0][1] >= float(interval) * DAY


def _apply(result, conn, plan, schema, opts, actions, *, db_path, backup_dir, name, now):
    """Back up, close zombies, prune, reclaim, as ``actions`` (the profile's action plan) says; report
    what was committed even when a step fails.

    Beside a live gateway in rollback-journal mode the backup is an archive of the rows the
    prune deletes and of the sessions the zombie close changes, instead of a whole-file copy
    (which would block every commit of the gateway for as long as it takes): verified and
    fsynced before the first close, so undo puts each session back as it was before the run.
    """
    live_rollback = result["preflight"]["live_rollback"]
    if live_rollback:
        # A transaction whose dirty pages outgrow the page cache spills them into state.db before
        # it commits, which needs the EXCLUSIVE lock and a journal sync in the middle of the batch.
        conn.execute("PRAGMA cache_size=-%d" % ROLLBACK_CACHE_KB)  # this connection only
    if actions.backup == FILE:
        result["backup"] = take_backup(
            conn, db_path, backup_dir, name,
            compress=opts.backup_compress, must_contain=plan.messages, busy_timeout=float(opts.busy_timeout),
        )  # fmt: skip
        _retain(result, opts, backup_dir=backup_dir, name=name, now=now, lister=None)
    pause = float(opts.batch_pause)
    closed, pruned = [], PruneResult()
    stop = wal_budget(conn, db_path, schema.get("litestream"))
    try:
        result["backup_deferred"] = actions.backup_deferred
        if actions.backup == ARCHIVE:
            result["backup"] = take_archive(
                conn, db_path, backup_dir, name, plan.delete_order, plan.messages, schema["schema_version"],
                closes=[(sid, last, opts.end_reason) for sid, last in plan.zombies],
            )  # fmt: skip
            _retain(result, opts, backup_dir=backup_dir, name=name, now=now, lister=list_archives)
        close_zombies(conn, plan, schema, end_reason=opts.end_reason, pause=pause, closed=closed)
        if schema.get("deleter") == HERMES and plan.delete_order:
            deleter = ReleaseDeleter(opts.hermes_python, db_path, os.path.dirname(db_path))
            result["release_delete"] = deleter.info()
            try:
                release_prune(
                    conn, plan, schema, deleter,
                    batch_size=int(opts.batch_size), batch_time=float(opts.batch_time), pause=pause,
                    result=pruned, stop=stop,
                )  # fmt: skip
            finally:
                deleter.close()
        else:
            prune(
                conn, plan, schema,
                batch_size=int(opts.batch_size), pause=pause, result=pruned, batch_time=float(opts.batch_time),
                pause_after_commit=live_rollback,  # rollback-mode commits are slower: let the gateway's next poll in
                stop=stop, keep_copy=_slice_copy(conn, db_path, backup_dir, name, schema, result.get("backup")),
            )  # fmt: skip
    finally:  # also when a later transaction failed: report what was committed
        result.update(
            zombies_closed=len(closed),
            sessions_pruned=pruned.sessions,
            messages_pruned=pruned.messages,
            sessions_orphaned=pruned.orphaned,
            transcripts_removed=pruned.transcripts,
            prompts_collected=pruned.prompts,
            sessions_left_alone=len(pruned.left_alone),
            sessions_refused=pruned.refused,
            sessions_kept=result.get("sessions_kept", []) + pruned.kept,
            changed=result["changed"] or bool(closed or pruned.sessions),
            deleted_by=(schema.get("deleter") or "engine") if pruned.sessions else None,
        )
    result["stopped_early"] = pruned.stopped
    elided = 0
    if plan.payloads is not None:
        _elide_payloads(result, conn, plan, schema, opts, db_path=db_path, backup_dir=backup_dir, name=name, stop=stop)
        elided = result["tool_payloads"]["elided"]
        result["stopped_early"] = result["stopped_early"] or result["tool_payloads"].get("stopped_early")
    result["reclaim"] = reclaim(
        conn, db_path, opts, schema, actions.reclaim, pruned=pruned.sessions > 0 or elided > 0, stop=stop
    )
    if result["reclaim"]["action"]:
        result["changed"] = True


SETTLED = (
    "an earlier run was cut short between two slices of its delete and it no longer qualifies: "
    "put back whole (its fence undone, its rows from that run's archive)"
)


def _slice_copy(conn, db_path, backup_dir, name, schema, backup):
    """``keep_copy`` of the prune: where a session deleted in slices is kept whole: the run's own
    backup or archive (fsynced before the first delete) when SQLite reads it as it is, else a
    private archive (0600, fsynced) of that session. Returns (path, whether the list owns it)."""

    def keep(order, counts):
        if backup and not backup.get("compressed"):
            return backup["path"], False
        check_backup_dir(backup_dir, os.stat(db_path).st_uid, create=True)
        return take_archive(conn, db_path, backup_dir, name, order, counts, schema["schema_version"])["path"], True

    return keep


def _retain(result, opts, *, backup_dir, name, now, lister):
    """Retention after a new backup (or archive), which is never removed itself."""
    result["changed"] = True
    result["backups_removed"] = apply_retention(
        backup_dir, name,
        keep_days=opts.backup_keep_days, keep_count=opts.backup_keep_count, now=now,
        keep_path=result["backup"]["path"], lister=lister,
    )  # fmt: skip


def service_window(opts, profiles):
    """One window for every profile whose plan opened one, after all their live work: the gateway
    drained and stopped (as the caller: root's stop and start), the steps as each file's owner, the
    gateway always started again; each profile's ``window``, ``reclaim`` and ``after`` then say
    what the window did."""
    planned = [p for p in profiles if p["status"] == "ok" and (p.get("window") or {}).get("opened")]
    if not planned:
        return
    owner = _common_owner(planned)
    if owner is None and os.geteuid() == 0:
        for p in planned:
            p["window"].update(opened=False, reason="the profiles' state.db files have different owners")
        return

    def as_owner(fn, *args):
        if os.geteuid() == 0 and owner.pw_uid != 0:
            return run_as_owner(owner.pw_uid, fn, *args)
        return fn(*args)

    entries = [
        {"home": p["home"], "path": p["path"], "name": p["name"], "steps": p["window"]["steps"],
         "backup_dir": backups_of(p["home"], opts.backup_dir)}
        for p in planned
    ]  # fmt: skip
    report = run_window(opts, entries, as_owner, owner)
    for p in planned:
        _window_result(p, report)


def _common_owner(profiles):
    """The pwd entry of the one owner of the profiles' state.db files, else None."""
    owners = {owner_of(p["path"]) for p in profiles}
    return pwd.getpwuid(owners.pop()) if len(owners) == 1 and None not in owners else None


def check_gateway(opts, profiles):
    """A ``gateway_service`` this host has neither as a system unit nor as the files' owner's user
    unit (or a stop/start command root may not run) is the operator's mistake: each profile fails
    naming the option, in check mode too and whether or not a window was due this time (the live
    work done stays done). Files of several owners are left to the window, which says so."""
    ok = [p for p in profiles if p["status"] == "ok"]
    if not (window_configured(opts) and ok):
        return
    owner = _common_owner(ok)
    if owner is None and len({owner_of(p["path"]) for p in ok}) > 1:
        return
    refused = GatewayControl(opts, owner).refusal()
    for p in ok if refused else ():
        p.update(status="failed", error=refused)
        if p.get("window"):
            p["window"].update(opened=False, reason=refused)


def _window_result(p, report):
    done = report["profiles"].get(p["path"]) or {"done": [], "reason": None}
    p["window"].update(
        opened=report["opened"], downtime_s=report["downtime_s"], gateway_back=report["gateway_back"],
        done=done["done"], reason="; ".join(why for why in (report["reason"], done["reason"]) if why) or None,
    )  # fmt: skip
    if not report["opened"]:
        p["reclaim"]["skipped_reason"] = "the service window did not open: %s" % report["reason"]
    if done.get("backup"):
        p["window"]["backup"] = done["backup"]["path"]
        p["backups_removed"] = (p.get("backups_removed") or []) + done["backup"]["removed"]
        p["changed"] = True
    if "vacuum_full" in done["done"]:
        freed = max(0, done["bytes_before"] - done["bytes_after"])
        p["reclaim"].update(action="full", skipped_reason=None, bytes_freed=p["reclaim"]["bytes_freed"] + freed)
        p["after"].update(db_bytes=done["bytes_after"], wal_bytes=0)
        p["after"].update((k, v) for k, v in done["file"].items() if k != "auto_vacuum")
        p["window"]["auto_vacuum"] = done["file"].get("auto_vacuum")
        p["changed"] = True
    if "optimize_storage" in done["done"] and "vacuum_full" not in done["done"]:  # Hermes's own VACUUM ran
        p["after"].update(db_bytes=done["bytes_after"], wal_bytes=0)
        p["changed"] = True
    if "fts_optimize" in done["done"] and p.get("tool_payloads"):
        p["tool_payloads"]["fts_optimize_stopped"] = []
    if report["gateway_back"] is False:
        p["status"] = "failed"
        p["error"] = report["reason"]


def run_maintenance(options, check_mode=False):
    """Maintain every profile of every home; see docs/architecture.md for the result."""
    opts = normalize_options(options)
    old_umask = os.umask(0o077)  # backups, lock files: private chat history
    try:
        profiles = each_profile(opts, maintain_profile, check_mode=check_mode)
        check_gateway(opts, profiles)
        if not check_mode:
            service_window(opts, profiles)
    finally:
        os.umask(old_umask)
    return {
        "status": run_status(profiles),
        "changed": any(p["changed"] for p in profiles),
        "profiles": profiles,
        "summary": [format_summary_line(p, check_mode, opts) for p in profiles],
        "failed": [p["name"] for p in profiles if p["status"] == "failed"],
        "check_mode": check_mode,
        "sqlite": engine_sqlite(),
    }


def run_status(profiles):
    """``failed`` when a profile failed, ``no_profiles`` when a home held none to maintain, else ``ok``."""
    statuses = {p["status"] for p in profiles}
    return "failed" if "failed" in statuses else NO_PROFILES if NO_PROFILES in statuses else "ok"


def _days(value):
    return "%gd" % float(value)


def _relative(path, home):
    """A backup path as the operator finds it: relative to its home when it lies under it."""
    if home and path.startswith(home.rstrip(os.sep) + os.sep):
        return path[len(home.rstrip(os.sep)) + 1 :]
    return path


def retention_words(retention, opts, name=None):
    """``retention 7d`` or, by source, ``retention 7d (2 sessions), cron 3d (5), telegram 365d (0)``;
    ``(profile NAME)`` after it when that profile's prune_days_by_profile entry applied."""
    if name is not None:
        opts = for_profile(opts, name)
    own = " (profile %s)" % name if name in opts.prune_days_by_profile else ""
    by_source = opts.prune_days_by_source
    if not by_source:
        return "retention " + _days(opts.prune_days) + own
    selected = (retention or {}).get("selected") or {}
    rest = sum(n for source, n in selected.items() if source not in by_source)
    words = ["retention %s (%d sessions)" % (_days(opts.prune_days), rest)]
    words += ["%s %s (%d)" % (src, _days(days), selected.get(src, 0)) for src, days in sorted(by_source.items())]
    return ", ".join(words) + own


def _retention(result, plan, opts):
    """Which retention applied to what (the profile's own, prune_days_by_profile): the sessions the plan selects,
    by source."""
    selected = {}
    for sid in plan.delete_order:
        source = plan.sources.get(sid)
        selected[source] = selected.get(source, 0) + 1
    result["retention"] = {
        "prune_days": float(opts.prune_days),
        "by_source": dict(opts.prune_days_by_source),
        "selected": selected,
    }


def backup_words(p, opts):
    """The backup taken, in a few words: why a whole-file copy was not (``backup_deferred``) is in the
    result, not in the line."""
    backup = p["backup"]
    if backup:
        return "backup=%s %s" % (backup.get("kind") or "file", _relative(backup["path"], p["home"]))
    if p["backup_deferred"]:
        return "no backup (whole-file deferred: the file is held)"
    return "no backup (nothing changed)" if opts.backup else "no backup (backup is off)"


def vacuum_words(reclaim_, backup):
    """``vacuum full``, or why it was skipped (its first clause; what to do about it is in the result).
    Beside a gateway holding a rollback-journal file, ``backup=archive`` already says the file is
    held: the same holder keeping the vacuum out is said once, in the result."""
    if reclaim_.get("action"):
        return ["vacuum %s" % reclaim_["action"]]
    reason = reclaim_.get("skipped_reason")
    if not reason or ((backup or {}).get("kind") == "archive" and reason.startswith("held open by ")):
        return []
    return ["vacuum skipped: %s" % reason.split("; ")[0]]


def summary_details(p, opts):
    """What was done and why, after the seed's words: retention, backup, reclaim, stopped early."""
    words = [retention_words(p.get("retention"), opts, p["name"])]
    words.append(backup_words(p, opts))
    words += vacuum_words(p["reclaim"] or {}, p["backup"])
    files = p.get("file_retention")
    if files and (files["removed"] or files["skipped"] or files["errors"]):
        words.append("files removed=%d (%s)%s%s" % (
            len(files["removed"]), human_size(files["bytes"]),
            "".join(", %s skipped: %s" % item for item in sorted(files["skipped"].items())),
            ", %d not removed: %s" % (len(files["errors"]), files["errors"][0]) if files["errors"] else "",
        ))  # fmt: skip
    payloads = p.get("tool_payloads")
    if payloads:
        if payloads["skipped_reason"]:
            words.append("tool payloads not elided: %s" % payloads["skipped_reason"])
        else:
            words.append("tool payloads elided=%d (%s, older than %s)" % (
                payloads["elided"], human_size(payloads["bytes"]), _days(payloads["days"]),
            ))  # fmt: skip
    stores = [kind for kind, entry in (p.get("stores") or {}).items() if entry["action"]]
    if stores:
        words.append("stores vacuumed: %s" % ", ".join(stores))
    if p["stopped_early"]:
        words.append("stopped early: %s" % p["stopped_early"])
    return "; ".join(words)


def format_summary_line(p, check_mode=False, opts=None):
    """The seed script's line: ``default: zombies=3 pruned=12 freed=45MB remaining=...``, its
    words first (scripts read them), then what was done and why (with ``opts``, the run's options).

    Sizes in human units (``freed=290KB``); in check mode ``freed=~...`` is the plan's estimate
    (the counts and every word after them are the plan's decisions, the same as the run's)."""
    if p["status"] in ("skipped", NO_PROFILES):
        return "%s: %s: %s" % (p["name"], p["status"], p["error"])
    if p["status"] == "failed" and not p["before"]:
        return "%s: FAILED: %s" % (p["name"], p["error"])
    before, after = p["before"], p["after"] or p["before"]
    if check_mode:
        freed = "~" + human_size((p["reclaim"] or {}).get("bytes_freed") or 0)
    else:
        freed = human_size(max(0, _bytes(before) - _bytes(after)))
    line = "%s: zombies=%d pruned=%d freed=%s remaining=%d sessions, %d messages" % (
        p["name"], p["zombies_closed"], p["sessions_pruned"], freed, after["sessions"], after["messages"],
    )  # fmt: skip
    if opts is not None:
        line += "; " + summary_details(p, opts)
    line += "".join("; " + words for words in window_words(p.get("window"), check_mode))
    if p["status"] == "failed":
        line += " FAILED: %s" % p["error"]
    return line
