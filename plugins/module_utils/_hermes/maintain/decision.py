# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The third step of a profile's maintenance: decide, once, everything the run does to the file.

The rows (plan.selection's Plan) less what the store refuses, who deletes them, the tool payloads,
the other files and stores, whether a backup is due, then the action plan (maintain.actions):
check mode reports this decision and the run executes it.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from ..apply.elision import plan_payloads
from ..apply.files import plan_files, plan_stores
from ..apply.hermes_deletes import HERMES, choose_deleter
from ..apply.undo import settle as settle_sliced
from ..backup.whole_file import check_backup_dir, list_backups
from ..host.profiles import backups_of, sessions_dir
from ..plan.inventory import session_ids
from ..plan.selection import DAY, build_plan
from ..store.catalogue import fully_known, refusal, refuses_deletes, refuses_zombie_closes
from ..store.schema import unusable_fts
from .actions import plan_actions
from .deleter import deleter_for
from .profile import Decision, Profile

if TYPE_CHECKING:
    from ..options import Options
    from ..plan.selection import Plan
    from ..results import ProfileResult

SETTLED = (
    "an earlier run was cut short between two slices of its delete and it no longer qualifies: "
    "put back whole (its fence undone, its rows from that run's archive)"
)


def decide(profile: Profile, opts: Options) -> Decision:
    """The rows to close, prune and elide, who deletes, and every other action: reads only (but for
    putting back what an earlier run left half deleted, which the run does first)."""
    plan = plan_rows(profile, opts)
    broken_fts = unusable_fts(profile.schema)
    choice = refuse_unsafe_deletes(profile, opts, plan, broken_fts)
    result, conn = profile.result, profile.conn
    retention(result, plan, opts)
    if opts.tool_payload_days is not None:
        unknown = profile.schema["catalogue"]["unknown"]
        plan.payloads = plan_payloads(
            conn, profile.schema, plan, opts.tool_payload_days, profile.now,
            payload_refusal(unknown, broken_fts),
        )  # fmt: skip
    ids = session_ids(conn) if "orphaned_transcripts" in opts.file_retention else None
    files_plan = plan_files(profile.root, profile.home, opts.file_retention, ids, profile.now)
    stores_plan = plan_stores(profile.root, float(opts.vacuum_threshold)) if opts.reclaim_stores else None
    backup_dir = backups_of(profile.home, opts.backup_dir)
    backup_due = opts.backup and (plan.has_changes or interval_due(opts, backup_dir, profile.name, profile.now))
    if backup_due:
        check_backup_dir(backup_dir, profile.st.st_uid, create=not profile.check_mode)
    actions = plan_actions(
        conn, profile.db_path, opts, profile.schema, plan, result["preflight"],
        backup_due=backup_due, messages_total=result["before"]["messages"], files=files_plan, stores=stores_plan,
    )  # fmt: skip
    return Decision(plan, actions, deleter_for(choice, plan), backup_dir)


def plan_rows(profile: Profile, opts: Options) -> Plan:
    """The sessions to close and to prune (a session an earlier run left half deleted between two
    slices goes back whole first, then is planned)."""
    result, conn = profile.result, profile.conn
    settled = [] if profile.check_mode else settle_sliced(conn, profile.db_path, float(opts.batch_pause))
    plan: Plan = build_plan(
        conn, profile.schema, opts, profile.now, sessions_dir(profile.db_path), profile.short_reads, profile.allowed
    )
    result["bad_time_rows"] = plan.bad_time_rows
    result["sessions_kept"] = plan.kept + [
        {"session": sid, "reason": SETTLED} for sid in settled if sid not in plan.messages
    ]
    return plan


def refuse_unsafe_deletes(profile: Profile, opts: Options, plan: Plan, broken_fts: list[str]) -> str:
    """Who deletes (``delete_with``), and what the plan loses where deleting is not safe: objects the
    engine does not know in the catalogue (unless the installed Hermes deletes), an FTS index this
    SQLite cannot update. Returns the deleter chosen (apply.hermes_deletes.ENGINE or HERMES)."""
    result, catalogue = profile.result, profile.schema["catalogue"]
    unknown = catalogue["unknown"]
    deleter, why = choose_deleter(opts.delete_with, catalogue, opts.hermes_python, fully_known)
    if unknown and deleter != HERMES:  # the installed Hermes is the authority on its own store: its delete decides
        result["error"] = "%s (delete_with auto: %s)" % (refusal(unknown), why) if why else refusal(unknown)
        if refuses_zombie_closes(unknown):
            plan.zombies = []
        if refuses_deletes(unknown):
            drop_deletes(plan)
    if broken_fts and plan.delete_order:
        # Deleting a message fires every FTS trigger; one missing tokenizer fails them all.
        result["error"] = (
            "pruning refused: %s; this SQLite %s cannot run Hermes's delete triggers. Zombies were still closed; "
            "run with a Python whose SQLite has the tokenizer (trigram needs 3.34+), or install Hermes's "
            "CJK extension" % ("; ".join(broken_fts), sqlite3.sqlite_version)
        )
        drop_deletes(plan)
    return deleter


def drop_deletes(plan: Plan) -> None:
    plan.delete_order, plan.messages, plan.transcripts, plan.prompts, plan.orphaned = [], {}, {}, 0, 0


def payload_refusal(unknown: Any, broken_fts: list[str]) -> str | None:
    """Why no tool payload may be elided in this file, or None: an update fires every trigger on
    messages, so not where the catalogue holds objects we do not know, nor where an FTS index's
    tokenizer is missing from this SQLite."""
    if unknown:
        return str(refusal(unknown))
    if broken_fts:
        return "%s; this SQLite %s cannot run Hermes's update triggers" % (
            "; ".join(broken_fts),
            sqlite3.sqlite_version,
        )
    return None


def interval_due(opts: Options, backup_dir: str, name: str, now: float) -> bool:
    interval = opts.backup_interval_days
    if interval is None:
        return False
    newest = list_backups(backup_dir, name)
    return not newest or now - newest[0][1] >= float(interval) * DAY


def retention(result: ProfileResult, plan: Plan, opts: Options) -> None:
    """Which retention applied to what (the profile's own, prune_days_by_profile): the sessions the plan selects,
    by source."""
    selected: dict[Any, int] = {}
    for sid in plan.delete_order:
        source = plan.sources.get(sid)
        selected[source] = selected.get(source, 0) + 1
    result["retention"] = {
        "prune_days": float(opts.prune_days),
        "by_source": dict(opts.prune_days_by_source),
        "selected": selected,
    }
