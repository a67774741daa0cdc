# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One profile's action plan: every decision of a run, taken once before any write.

Check mode reports this plan and the real run executes it, so the dry run and the run
cannot disagree: the backup (taken, deferred to an archive, none and why), the reclaim
(VACUUM full, incremental or skipped and why), the other files and stores. Only a change
of the world between the plan and the step (a process that opened the file since, a full
disk) makes the run leave a planned full VACUUM out, and it then says why. Sizes are
not decisions: check mode gives the bytes an estimate (``freed=~...``), the run measures them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..apply.elision import PAYLOAD_PREFIX
from ..apply.files import describe
from ..apply.reclaim import plan_reclaim, window_declined
from ..apply.storage_upgrade import storage_upgrade_pending
from ..apply.window import configured as window_configured
from ..apply.window import plan_window
from .deleter import planned_counts, record_pruned

if TYPE_CHECKING:
    import sqlite3

    from ..apply.prune import PruneResult
    from ..options import Options
    from ..plan.selection import Plan
    from ..results import ProfileResult
    from ..store.schema import Schema
    from .profile import Decision, Profile

FILE = "file"  # a whole-file backup
ARCHIVE = "archive"  # the rows the prune deletes and the closes, archived (rollback-journal mode, live gateway)


class Actions:
    """What a run does to one profile besides the rows (those are the Plan of plan.selection)."""

    def __init__(self) -> None:
        self.backup: str | None = None  # FILE, ARCHIVE or None
        self.backup_due = False  # a backup is due (something changes, or backup_interval_days passed)
        self.backup_deferred: str | None = None  # why the whole-file backup is replaced by an archive, or None
        self.reclaim: dict[str, Any] = {}  # apply.reclaim.plan_reclaim's decision
        self.files: Any = None  # apply.files.plan_files's plan
        self.stores: dict[str, Any] | None = None  # apply.files.plan_stores's plan, or None
        self.window: dict[str, Any] | None = None  # apply.window.plan_window's plan, or None (no window configured)


def plan_actions(
    conn: sqlite3.Connection, db_path: str, opts: Options, schema: Schema, plan: Plan,
    preflight: dict[str, Any], *, backup_due: bool, messages_total: int, files: Any, stores: dict[str, Any] | None,
) -> Actions:  # fmt: skip
    """The decisions for one profile, from its row plan and what the file is now (reads only)."""
    actions = Actions()
    actions.backup_due = bool(backup_due)
    if backup_due and preflight["live_rollback"]:
        # A whole-file copy would block every commit of the gateway for as long as it takes.
        actions.backup_deferred = deferred_reason(preflight, pruned=bool(plan.delete_order), closed=bool(plan.zombies))
        actions.backup = ARCHIVE if plan.delete_order or plan.zombies else None
    elif backup_due:
        actions.backup = FILE
    actions.reclaim = plan_reclaim(
        conn, db_path, opts, schema,
        pruned=plan.messages, messages_total=messages_total, extra_bytes=payload_bytes_saved(plan),
        live_rollback=preflight["live_rollback"], window=window_configured(opts),
    )  # fmt: skip
    upgrade = planned_storage_upgrade(conn, opts, messages_total, plan)
    plan_service_window(actions, opts, db_path, storage_upgrade=upgrade)
    actions.files, actions.stores = files, stores
    return actions


def planned_storage_upgrade(
    conn: sqlite3.Connection, opts: Options, messages_total: int, plan: Plan
) -> dict[str, Any] | None:
    """Hermes's optimize-storage for the window: ``{"pending", "messages"}`` (the messages it re-indexes
    after the prune) when it has work and ``hermes_python`` names the release that runs it, else None."""
    if not (window_configured(opts) and opts.hermes_python):
        return None
    pending = storage_upgrade_pending(conn)
    return {"pending": pending, "messages": max(0, messages_total - plan.messages_pruned)} if pending else None


def plan_service_window(
    actions: Actions, opts: Options, db_path: str, storage_upgrade: dict[str, Any] | None = None
) -> None:
    """The window for the steps that need the file alone; a VACUUM planned for a window that does not
    open is skipped as it is without one."""
    actions.window = plan_window(
        opts, actions.reclaim, db_path,
        backup_deferred=bool(actions.backup_deferred), storage_upgrade=storage_upgrade,
    )  # fmt: skip
    if not (actions.window and actions.window["opened"]):
        window_declined(actions.reclaim, actions.window["reason"] if actions.window else None)
    actions.reclaim.pop("held", None)


def payload_bytes_saved(plan: Plan) -> int:
    """The content bytes the tool-payload elision takes out of the messages (its bodies less their
    tombstones), which the reclaim estimate adds to the rows the prune deletes."""
    payloads = plan.payloads
    if not payloads or not payloads.items:
        return 0
    return max(0, int(payloads.bytes) - sum(len(item[3].encode()) for item in payloads.items))


def deferred_reason(preflight: dict[str, Any], pruned: bool, closed: bool) -> str:
    """Why no whole-file backup, what is kept instead (the rows the run deletes and the sessions it
    closes, archived first) and when the whole-file backup comes."""
    return (
        "state.db is in rollback-journal mode (journal_mode=%s) and %d other process(es) hold it: a whole-file "
        "copy would block every commit of the gateway for as long as it takes; %s. A run with no holder "
        "(maintain.yml with hermes_gateway_service) takes the whole-file backup"
        % (
            preflight["journal_mode"],
            preflight["holders"],
            _archived_words(pruned, closed),
        )
    )


def _archived_words(pruned: bool, closed: bool) -> str:
    if pruned and closed:
        return "the rows to prune are archived instead, and the sessions to close as they were before"
    if pruned:
        return "the rows to prune are archived instead"
    if closed:
        return "the sessions to close are archived instead, as they were before"
    return "nothing is deleted or closed, so nothing is archived"


def backup_path(backup_dir: str, name: str, kind: str, compress: bool) -> str:
    """Where check mode says the backup goes (the run's name carries the time it is taken)."""
    if kind == ARCHIVE:
        return os.path.join(backup_dir, "hermes-ops-archive_%s_<timestamp>.db" % name)
    return os.path.join(backup_dir, "hermes-ops_%s_<timestamp>.db%s" % (name, ".gz" if compress else ""))


def report_check(profile: Profile, decision: Decision, opts: Options) -> None:
    """Check mode's result: the decision's counts (the deleter's prediction), actions and the ``after``
    they lead to. A prediction that fails (the installed Hermes could not run) leaves the plan's counts."""
    result, plan, actions = profile.result, decision.plan, decision.actions
    if plan.payloads is not None:
        archive = payload_archive_path(decision.backup_dir, profile.name) if plan.payloads.items else None
        result["tool_payloads"] = plan.payloads.report(archive)
    predicted = planned_counts(plan)
    try:
        predicted = decision.deleter.predict(profile, decision, opts)
    finally:
        record_pruned(result, len(plan.zombies), predicted, decision.deleter)
        report_plan(result, plan, actions, predicted, decision.backup_dir, profile.name, opts.backup_compress)
    if opts.file_retention:
        result["file_retention"] = describe(actions.files)
    result["stores"] = actions.stores


def report_plan(
    result: ProfileResult, plan: Plan, actions: Actions, pruned: PruneResult, backup_dir: str, name: str,
    compress: bool = False,
) -> None:  # fmt: skip
    """The plan's decisions in check mode's result and the ``after`` they lead to (``pruned``: the counts)."""
    before = result["before"]
    result["changed"] = (
        plan.has_changes or actions.backup is not None or bool(actions.reclaim["action"])
        or bool(actions.reclaim["fts_automerge_restored"])
    )  # fmt: skip
    result["backup_deferred"] = actions.backup_deferred
    result["window"] = actions.window
    if actions.backup:
        result["backup"] = {
            "kind": actions.backup,
            "path": backup_path(backup_dir, name, actions.backup, compress),
            "bytes": None,
            "verified": None,
        }
    result["reclaim"] = dict(actions.reclaim, bytes_freed=estimated_bytes_freed(before, actions.reclaim))
    after = dict(before)
    after["sessions"] = before["sessions"] - pruned.sessions
    after["messages"] = before["messages"] - pruned.messages
    after["open_sessions"] = before["open_sessions"] - len({sid for sid, _last in plan.zombies})
    if actions.reclaim["action"]:  # estimates: see estimated_bytes_freed
        after["free_pages"] = 0
        after["page_count"] = before["page_count"] - actions.reclaim["free_pages_predicted"]
        after["db_bytes"] = max(0, before["db_bytes"] - actions.reclaim["free_pages_predicted"] * before["page_size"])
        if actions.reclaim["action"] == "full":
            after["wal_bytes"] = 0
    else:
        after["free_pages"] = actions.reclaim["free_pages_predicted"]
    result["after"] = after


def payload_archive_path(backup_dir: str, name: str) -> str:
    """Where check mode says the payload archive goes (the run's name carries its time)."""
    return os.path.join(backup_dir, PAYLOAD_PREFIX + "%s_<timestamp>.db" % name)


def estimated_bytes_freed(before: dict[str, Any], reclaim: dict[str, Any]) -> float:
    """What the planned vacuum is expected to give back: the free pages predicted after the prune
    (none without a vacuum: a prune alone leaves its pages free inside the file), and the -wal a
    full VACUUM's TRUNCATE checkpoint empties (it runs only when no other process holds the file)."""
    if not reclaim["action"]:
        return 0
    wal = before["wal_bytes"] if reclaim["action"] == "full" else 0
    freed: float = reclaim["free_pages_predicted"] * before["page_size"] + wal
    return freed


def human_size(nbytes: float) -> str:
    """``0B``, ``950B``, ``290KB``, ``1.2MB``, ``3.4GB``: decimal units, as ``ls -h --si`` and disks count."""
    nbytes = max(0, int(nbytes))
    if nbytes < 1000:
        return "%dB" % nbytes
    if round(nbytes / 1000.0) < 1000:
        return "%dKB" % round(nbytes / 1000.0)
    if round(nbytes / 1000.0**2, 1) < 1000:
        return "%.1fMB" % (nbytes / 1000.0**2)
    return "%.1fGB" % (nbytes / 1000.0**3)
