# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The last step of a profile's maintenance outside check mode: execute the decision.

Back up, close zombies, prune (through the decision's deleter), elide tool payloads, reclaim,
then the other files and stores; each step reports what it committed even when a later one fails.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from ..apply.elision import ElideResult, elide, take_payload_archive
from ..apply.files import reclaim_stores, remove_files
from ..apply.prune import PruneResult, Stop, close_zombies, turn_after_commit
from ..apply.reclaim import fts_optimize_live, optimize_bound, reclaim, wal_budget
from ..backup.archive import list_archives, take_archive
from ..backup.whole_file import apply_retention, check_backup_dir, take_backup
from ..sqlite.db import resume_fts_automerge
from ..store.schema import stats
from .actions import ARCHIVE, FILE
from .deleter import record_pruned
from .profile import Decision, Profile, total_bytes

if TYPE_CHECKING:
    from ..apply.elision import PayloadPlan
    from ..options import Options

ROLLBACK_CACHE_KB = 32768  # page cache of the maintenance connection beside a live rollback-mode gateway


def execute(profile: Profile, decision: Decision, opts: Options) -> None:
    """The run: the rows and the reclaim (``apply_decision``), then the counts after it, the files
    and the stores; the window's steps come after every profile's live work (maintain.run.service_window)."""
    result, actions = profile.result, decision.actions
    apply_decision(profile, decision, opts)
    result["after"] = stats(profile.conn, profile.db_path, profile.short_reads)
    result["reclaim"]["bytes_freed"] = max(0, total_bytes(result["before"]) - total_bytes(result["after"]))
    result["window"] = actions.window  # opened after every profile's live work (service_window)
    if opts.file_retention:
        result["file_retention"] = remove_files(profile.root, profile.home, actions.files)
    stores = actions.stores
    result["stores"] = reclaim_stores(stores, float(opts.busy_timeout)) if stores else stores


def apply_decision(profile: Profile, decision: Decision, opts: Options) -> None:
    """Back up, close zombies, prune, reclaim, as the decision says; report what was committed even
    when a step fails.

    Beside a live gateway in rollback-journal mode the backup is an archive of the rows the
    prune deletes and of the sessions the zombie close changes, instead of a whole-file copy
    (which would block every commit of the gateway for as long as it takes): verified and
    fsynced before the first close, so undo puts each session back as it was before the run.
    """
    conn, result, plan = profile.conn, profile.result, decision.plan
    if profile.short_reads:
        # A transaction whose dirty pages outgrow the page cache spills them into state.db before
        # it commits, which needs the EXCLUSIVE lock and a journal sync in the middle of the batch.
        conn.execute("PRAGMA cache_size=-%d" % ROLLBACK_CACHE_KB)  # this connection only
    # a pause of FTS5's automerge that a run killed midway left (sqlite.db.fts_automerge_paused): back
    # first, so the backup never holds it and this run's own pauses start from the file as Hermes set it
    resume_fts_automerge(conn, decision.actions.reclaim["fts_automerge_restored"])
    if decision.actions.backup == FILE:
        take_file_backup(profile, decision, opts)
    closed: list[str] = []
    pruned = PruneResult()
    stop = wal_budget(conn, profile.db_path, profile.schema.get("litestream"))
    try:
        result["backup_deferred"] = decision.actions.backup_deferred
        if decision.actions.backup == ARCHIVE:
            take_rows_archive(profile, decision, opts)
        close_zombies(
            conn, plan, profile.schema, end_reason=opts.end_reason,
            pause=float(opts.batch_pause), closed=closed,
        )  # fmt: skip
        decision.deleter.execute(profile, decision, opts, pruned, stop)
    finally:  # also when a later transaction failed: report what was committed
        record_pruned(result, len(closed), pruned, decision.deleter)
        result["changed"] = result["changed"] or bool(closed or pruned.sessions)
    result["stopped_early"] = pruned.stopped
    elided = 0
    if plan.payloads is not None:
        elide_payloads(profile, decision, opts, plan.payloads, stop)
        elided = result["tool_payloads"]["elided"]
        result["stopped_early"] = result["stopped_early"] or result["tool_payloads"].get("stopped_early")
    result["reclaim"] = reclaim(
        conn, profile.db_path, opts, profile.schema, decision.actions.reclaim,
        pruned=pruned.sessions > 0 or elided > 0, stop=stop,
    )  # fmt: skip
    if result["reclaim"]["action"] or result["reclaim"]["fts_automerge_restored"]:
        result["changed"] = True


def take_file_backup(profile: Profile, decision: Decision, opts: Options) -> None:
    """The whole-file backup, verified to hold every message the prune deletes, then the retention."""
    profile.result["backup"] = take_backup(
        profile.conn, profile.db_path, decision.backup_dir, profile.name,
        compress=opts.backup_compress, must_contain=decision.plan.messages,
        busy_timeout=float(opts.busy_timeout),
    )  # fmt: skip
    retain(profile, opts, decision.backup_dir, lister=None)


def take_rows_archive(profile: Profile, decision: Decision, opts: Options) -> None:
    """Beside a live rollback-mode gateway: the rows the prune deletes and the sessions it closes,
    archived (verified, fsynced) before the first close, then the retention."""
    plan, end_reason = decision.plan, opts.end_reason
    profile.result["backup"] = take_archive(
        profile.conn, profile.db_path, decision.backup_dir, profile.name, plan.delete_order, plan.messages,
        profile.schema["schema_version"], closes=[(sid, last, end_reason) for sid, last in plan.zombies],
    )  # fmt: skip
    retain(profile, opts, decision.backup_dir, lister=list_archives)


def retain(profile: Profile, opts: Options, backup_dir: str, *, lister: Callable[..., Any] | None) -> None:
    """Retention after a new backup (or archive), which is never removed itself."""
    result = profile.result
    result["changed"] = True
    result["backups_removed"] = apply_retention(
        backup_dir, profile.name,
        keep_days=opts.backup_keep_days, keep_count=opts.backup_keep_count, now=profile.now,
        keep_path=result["backup"]["path"], lister=lister,
    )  # fmt: skip


def elide_payloads(
    profile: Profile, decision: Decision, opts: Options, payloads: PayloadPlan, stop: Stop | None
) -> None:
    """Archive the planned tool bodies (fsynced before any change), then elide them, paced as the prune."""
    conn, result, schema = profile.conn, profile.result, profile.schema
    report = payloads.report()
    result["tool_payloads"] = report
    if not payloads.items:
        return
    if stop and stop():
        report.update(elided=0, bytes=0, bytes_after=0, sessions=0, stopped_early=stop())
        return
    check_backup_dir(decision.backup_dir, os.stat(profile.db_path).st_uid, create=True)
    report["archive"] = take_payload_archive(
        conn, profile.db_path, decision.backup_dir, profile.name, payloads, schema["schema_version"]
    )
    result["changed"] = True
    done = ElideResult()
    wait = turn_after_commit(conn, float(opts.batch_pause))
    try:
        elide(
            conn, schema, report["archive"], batch_size=int(opts.batch_size), batch_time=float(opts.batch_time),
            pause=float(opts.batch_pause), wait=wait, live_rollback=profile.short_reads, stop=stop, result=done,
        )  # fmt: skip
    finally:  # also when a later transaction failed: report what was committed
        report.update(
            elided=done.elided, bytes=done.bytes, bytes_after=done.bytes_after, sessions=len(done.sessions),
            left_alone=done.left_alone, stopped_early=done.stopped, retries=done.retries,
        )  # fmt: skip
    if done.elided:  # the replaced bodies' old index entries: FTS5's optimize, in steps a writer can work beside
        report["fts_optimize_steps"], report["fts_optimize_stopped"] = fts_optimize_live(
            conn, schema["fts"], wait, stop, bound=optimize_bound(opts, profile.db_path)
        )
