# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Give space back: FTS segment merges, VACUUM or incremental_vacuum, WAL checkpoint.

A full VACUUM holds the write lock for seconds and has broken live Hermes handles, so
it runs only when no other process has the file open and the disk has room for it. A
file in ``auto_vacuum=INCREMENTAL`` mode is reclaimed in short steps even while live.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..plan.estimate import predict_free_pages, read_index_levels
from ..sqlite.db import (
    MB,
    WAL_BUDGET,
    describe_holders,
    file_size,
    free_bytes,
    fts_automerge_paused,
    fts_automerge_paused_left,
    holders,
    is_wal_file,
    quoted,
    sqlite_wal_reset_affected,
    write_transaction,
)
from .prune import ROLLBACK_COMMIT_TIME, FramesPer, HolderCheckpoints, hard_bound, turn_after_commit

if TYPE_CHECKING:
    from ..options import Options
    from ..store.schema import Schema

MERGE_PAGES = 256  # FTS5 pages an untimed optimize step writes (batch_time 0)
OPTIMIZE_FIRST = 64  # FTS5 pages of the optimize's first timed step, before the rate per page is known
OPTIMIZE_MAX_STEPS = 8000
OPTIMIZE_STALLS = 100  # the gateway's turns in a row a merge under way may wait behind its newer segments
OPTIMIZE_CUTS = 8  # steps of one page in a row rolled back at the hard bound before the optimize gives up
INCREMENTAL_PAGES = 1000  # pages freed per incremental_vacuum step without a time bound (30-80 ms here)
INCREMENTAL_FIRST = 200  # pages of the first timed step, before the rate per page is known
INCREMENTAL_MOST = 4000  # pages of one timed step at most
INCREMENTAL_PROGRESS = 100  # SQLite VM steps between two looks at the clock (a page is a few of them)
# In WAL mode a step's frames stay in the -wal until a checkpoint, and the -wal keeps the size of the
# most frames written between two restarts: steps of at most about the gateway's own checkpoint interval
# (SQLite's 1000 frames). Measured on a 0.19.0 file: an FTS5 merge writes 3.5-3.9 frames a page, an
# incremental_vacuum step about 1.3 a page freed.
FTS_WAL_MOST = 256
INCREMENTAL_WAL_MOST = 800
AUTO_VACUUM_INCREMENTAL = 2

Stop = Callable[[], Optional[str]]  # why the work stops between two transactions now, or None
Wait = Callable[[float], object]  # the gateway's turn after a transaction that held the lock that long
FtsIndexes = Sequence[Mapping[str, Any]]  # the schema's ``fts``: each index's "name" and "error"
Decision = tuple[Optional[str], Optional[str]]  # (action, or None and why not)


# The reclaim's decision and report are parts of the profile's result (``reclaim``): their keys are
# the result table's (results.py), and the maintenance steps add to them.
Reclaim = dict[str, Any]


def wal_budget(
    conn: sqlite3.Connection, db_path: str, replica: Sequence[str] | None = None
) -> HolderCheckpoints | None:
    """The work loops' ``stop()`` and frame pacing (prune.HolderCheckpoints) when this run may not
    checkpoint and the holder copies our frames, else None."""
    policy, _why = checkpoint_policy(db_path, replica)
    if policy is not None or replica or not is_wal_file(db_path):
        return None  # we checkpoint at the end (or Litestream does, or there is no WAL)
    return HolderCheckpoints(db_path, pragma(conn, "page_size"), WAL_BUDGET)


def fts_give_back(
    conn: sqlite3.Connection, fts: FtsIndexes, pause: float, stop: Stop | None = None, bound: float | None = None
) -> int:
    """After a prune: FTS5's optimize in steps (``fts_optimize_live``), which leaves each index one
    segment without the deleted rows' entries and delete markers, with or without a holder. FTS5's
    ordinary merge alone leaves them to where the prune's transactions ended (on one release-built
    file an index grew by a quarter in one run and shrank to a third in the next), so the estimate of
    what a vacuum gives back could not be planned on. Returns the steps."""
    steps, _stopped = fts_optimize_live(conn, fts, turn_after_commit(conn, pause), stop, bound)
    return steps


def fts_optimize_live(
    conn: sqlite3.Connection, fts: FtsIndexes, wait: Wait, stop: Stop | None = None, bound: float | None = None
) -> tuple[int, list[str]]:
    """FTS5's optimize of each index in short write transactions, safe beside a writer. Returns
    (steps, [why an index's optimize was not finished]).

    One negative ``merge`` starts it: FTS5 moves every segment to one new top level and merges them
    into one. The steps after it are positive ``merge``s, which go on with a merge under way: a
    negative one after another connection's commit (a new segment) would start over one level higher
    each time (see ``apply.elision.fts_optimize``), while a positive one leaves the new segments to
    FTS5. The index so gains the two levels an optimize without a holder gives it, once per run. A
    positive step that finds nothing to do while the merge is under way waits behind a level of the
    writer's newer segments (as many as the merge's inputs, fewer than ``usermerge``): the gateway's
    turn, and again, until they are merged. Beside a holder FTS5's automerge is paused for the
    other connections meanwhile (``sqlite.db.fts_automerge_paused``): the gateway's appends would
    otherwise carry our merge on inside their own transactions.

    ``bound`` (seconds; None: MERGE_PAGES a step, untimed): each step takes as many pages as fit in
    0.8 x the bound at the last step's rate, and a step still running at the hard bound is
    interrupted, rolled back, and retried with half the pages (as ``incremental_vacuum``)."""
    steps = 0
    problems: list[str] = []
    for table in fts:
        if table["error"] or (stop and stop()):
            continue
        taken, problem = _optimize_index_live(conn, table["name"], wait, stop, bound)
        steps += taken
        if problem:
            problems.append("%s: %s" % (table["name"], problem))
    return steps, problems


def _optimize_index_live(
    conn: sqlite3.Connection, table: str, wait: Wait, stop: Stop | None, bound: float | None
) -> tuple[int, str | None]:
    if bound is None:  # the file alone: nobody else's write goes on with our merge
        return _optimize_index_steps(conn, table, wait, stop, bound)
    # beside a holder, whose automerge would otherwise carry on our merge inside its own appends
    with fts_automerge_paused(conn, [table]):
        return _optimize_index_steps(conn, table, wait, stop, bound)


def _optimize_index_steps(
    conn: sqlite3.Connection, table: str, wait: Wait, stop: Stop | None, bound: float | None
) -> tuple[int, str | None]:
    name = quoted(table)
    merge = "INSERT INTO %s(%s, rank) VALUES('merge', " % (name, name)
    sizer = StepSizer(conn, OPTIMIZE_FIRST if bound else MERGE_PAGES, FTS_WAL_MOST, bound, stop)
    hard = sizer.hard
    # when the merge statement began, while it runs: never the BEGIN, COMMIT or ROLLBACK
    running: list[float | None] = [None]
    steps = stalls = cut = 0
    started = False
    if hard:
        conn.set_progress_handler(
            lambda: 1 if running[0] is not None and time.monotonic() - running[0] > hard else 0, INCREMENTAL_PROGRESS
        )
    try:
        while steps < OPTIMIZE_MAX_STEPS:
            stopped = stop() if stop else None
            if stopped:
                return steps, stopped
            before = conn.total_changes
            step = sizer.next()
            began = time.monotonic()
            try:
                with write_transaction(conn):
                    began = running[0] = time.monotonic()
                    try:
                        conn.execute(merge + "%d)" % (step if started else -step))
                    finally:
                        running[0] = None
            except sqlite3.OperationalError as exc:
                if not hard or "interrupt" not in str(exc):
                    return steps, str(exc)
                cut += 1
                if step == 1 and cut > OPTIMIZE_CUTS:
                    return steps, "a step of one page ran past the hard bound %d times: the next run goes on" % cut
                sizer.cut()
                wait(time.monotonic() - began)
                continue
            held = time.monotonic() - began
            steps, cut = steps + 1, 0
            sizer.done(held)
            wait(held)
            did = conn.total_changes - before >= 2  # FTS5's documented "work was done" signal
            if not started and not did:
                return steps, None  # one segment already: nothing to optimize
            started = True
            going_on, why = _optimize_goes_on(conn, table)
            if not going_on:
                return steps, why
            stalls = 0 if did else stalls + 1
            if stalls > OPTIMIZE_STALLS:
                return steps, "its merge waits behind the gateway's newer segments: the next run goes on"
    finally:
        if hard:
            conn.set_progress_handler(None, 0)
    return steps, "stopped after %d steps: the next run goes on" % steps


def _optimize_goes_on(conn: sqlite3.Connection, table: str) -> tuple[bool, str | None]:
    """Whether the optimize of ``table`` still has a merge under way; when not, why it stops (None: done)."""
    under_way = merge_under_way(conn, table)
    if under_way is None:
        return False, "its structure record is not one this collection reads: the next run goes on"
    return under_way, None


def merge_under_way(conn: sqlite3.Connection, table: str) -> bool | None:
    """Whether a level of the FTS5 index ``table`` has a merge under way (None: its record unreadable)."""
    try:
        return any(merging for merging, _leaves in read_index_levels(conn, table))
    except (IndexError, ValueError):  # truncated, or of another version
        return None


def pragma(conn: sqlite3.Connection, name: str) -> Any:  # a count, or a mode's name
    return conn.execute("PRAGMA %s" % name).fetchone()[0]


def decide(
    conn: sqlite3.Connection,
    db_path: str,
    mode: str,
    threshold_percent: float,
    auto_vacuum: int,
    replica: Sequence[str] | None = None,
    after_prune: Mapping[str, Any] | None = None,
    alone: bool = False,
) -> Decision:
    """Return (action, reason): action is 'full', 'incremental' or None with a reason.

    ``after_prune`` (a ``predict_free_pages`` answer): the rule is applied to the free pages the
    prune is expected to leave rather than to those the file has now. ``alone``: the decision for a
    service window, where no other process will hold the file (the disk must still have room).
    """
    free, pages = pragma(conn, "freelist_count"), pragma(conn, "page_count")
    if after_prune is not None:
        free = after_prune["free_pages"]
    if mode == "never":
        return None, "vacuum_mode is never"
    if auto_vacuum == AUTO_VACUUM_INCREMENTAL and mode in ("auto", "incremental"):
        return ("incremental", None) if free else (None, "no free pages")
    if replica:
        return None, (
            "Litestream replicates this file (%s): a full VACUUM rewrites every page under its WAL shadowing, "
            "so only row work is done (a file already in auto_vacuum=INCREMENTAL mode is reclaimed in steps)"
            % ", ".join(replica)
        )
    if mode == "incremental":
        return None, (
            "the file is not in auto_vacuum=INCREMENTAL mode; one full VACUUM (vacuum_mode=full, "
            "in a service window) switches it"
        )
    switch = auto_vacuum != AUTO_VACUUM_INCREMENTAL and mode == "full"
    if not free and not switch:
        return None, "no free pages"
    percent = 100.0 * free / pages if pages else 0.0
    if mode == "auto" and percent < float(threshold_percent):
        if after_prune is not None:
            return None, (
                "the prune deletes %.1f%% of the messages: an estimated %.1f%% after it, below vacuum_threshold %s%%; "
                "free pages are %.1f%% of the file now"
                % (100 * after_prune["share"], percent, threshold_percent, after_prune["percent_now"])
            )
        # The first clause is the summary line's; the threshold is in the result.
        return None, "%.1f%% of the file is free; below vacuum_threshold %s%%" % (percent, threshold_percent)
    blocked = _room_refusal(db_path) if alone else full_vacuum_blocked(db_path)
    if blocked:
        return None, blocked
    return "full", None


def _room_refusal(db_path: str) -> str | None:
    size = file_size(db_path) + file_size(db_path + "-wal")
    for where, need in ((db_path, 2 * size), (tempfile.gettempdir(), size)):
        have = free_bytes(where if where != db_path else _dir(db_path))
        if have < need:
            return "VACUUM needs about %d MB free near %s, %d MB are free" % (need // MB, where, have // MB)
    return None


def _dir(path: str) -> str:
    return os.path.dirname(os.path.abspath(path)) or "."


def incremental_vacuum(
    conn: sqlite3.Connection, pause: float, stop: Stop | None = None, bound: float | None = None
) -> tuple[int, int]:
    """Free pages in short steps, each its own write transaction with the gateway's turn after it;
    ``executescript`` runs the pragma to completion. Returns (steps, retries).

    ``bound`` (seconds, the prune's: ``batch_time`` plus the COMMIT's allowance in rollback-journal
    mode): each step takes as many pages as fit in 0.8 x the bound at the rate per page of the last
    one (INCREMENTAL_FIRST to start), and a step still running at the prune's hard bound is
    interrupted, rolled back by SQLite, and retried with half the pages: pages moved from the end
    of a file whose cache the gateway's commits keep emptying cost a read each, so a fixed count
    cannot keep a lock hold within a writer's polls. None: INCREMENTAL_PAGES a step, untimed.
    """
    steps = retries = 0
    sizer = StepSizer(conn, INCREMENTAL_FIRST if bound else INCREMENTAL_PAGES, INCREMENTAL_WAL_MOST, bound, stop)
    hard = sizer.hard
    began = [0.0]
    wait = turn_after_commit(conn, pause)
    if hard:
        conn.set_progress_handler(lambda: 1 if time.monotonic() - began[0] > hard else 0, INCREMENTAL_PROGRESS)
    try:
        while pragma(conn, "freelist_count") > 0 and steps < 100000 and not (stop and stop()):
            step = sizer.next()
            began[0] = time.monotonic()
            try:
                conn.executescript("PRAGMA incremental_vacuum(%d);" % step)
            except sqlite3.OperationalError as exc:
                if not hard or "interrupt" not in str(exc):
                    raise
                retries += 1
                sizer.cut()
                wait(time.monotonic() - began[0])
                continue
            held = time.monotonic() - began[0]
            steps += 1
            sizer.done(held)
            wait(held)
    finally:
        if hard:
            conn.set_progress_handler(None, 0)
    return steps, retries


def next_pages(pages: int, held: float, bound: float, most: int = INCREMENTAL_MOST, asked: int | None = None) -> int:
    """The next step's pages: 0.8 x the bound at the rate of the last step (``pages`` in ``held``
    seconds), at most 4 times as many as it or as the step before asked for (``asked``: more than
    it took when the holder's checkpoint cut it short), and ``most``."""
    per_page = held / float(pages)
    fit = int(0.8 * bound / per_page) if per_page > 0 else most
    return max(1, min(fit, 4 * max(pages, asked or 0), most))


class StepSizer:
    """The pages of each step of a loop of short write transactions (the FTS optimize, the
    incremental_vacuum): ``first``, then as many as fit in the bound at the last step's rate
    (``next_pages``), half as many after a step cut at the hard bound; at most ``wal_most`` in WAL
    mode (INCREMENTAL_MOST otherwise), and beside a holder that copies our frames (``stop`` is a
    HolderCheckpoints) no more than bring the -wal just past its checkpoint. ``bound`` None: ``first``
    a step (at most ``wal_most`` in WAL mode), untimed."""

    def __init__(self, conn: sqlite3.Connection, first: int, wal_most: int, bound: float | None,
                 stop: Stop | None) -> None:  # fmt: skip
        self.most = wal_most if pragma(conn, "journal_mode").lower() == "wal" else INCREMENTAL_MOST
        self.bound = bound
        self.pile = stop if isinstance(stop, HolderCheckpoints) else None
        # seconds after BEGIN past which a step is interrupted
        self.hard = hard_bound(bound, copied=self.pile is not None) if bound else None
        self.pages = first if bound else min(first, self.most)
        self.per_page = FramesPer()
        self.step = 0  # the pages of the step under way

    def next(self) -> int:
        """The next step's pages; with a holder, marks where the -wal stands for its ``frames_written``."""
        fit = self.per_page.most(self.pile.begin()) if self.pile else None
        self.step = min(self.pages, fit) if fit else self.pages
        return self.step

    def cut(self) -> None:
        """The step ran past the hard bound and was rolled back: the next takes half its pages."""
        self.pages = max(1, self.step // 2)

    def done(self, held: float) -> None:
        """The step committed after holding the lock ``held`` seconds."""
        if self.pile:
            self.per_page.measured(self.pile.frames_written(), self.step)
        if self.bound:
            self.pages = next_pages(self.step, held, self.bound, self.most, self.pages)


def step_bound(options: Options, db_path: str) -> float | None:
    """The incremental_vacuum's bound: the prune's (``batch_time``, plus the COMMIT's allowance in
    rollback-journal mode); None when batch_time is 0 (no bound asked for)."""
    batch_time = float(options.batch_time)
    if not batch_time:
        return None
    return batch_time + (0.0 if is_wal_file(db_path) else ROLLBACK_COMMIT_TIME)


def optimize_bound(options: Options, db_path: str) -> float | None:
    """The FTS optimize's bound: the prune's beside a holder (``step_bound``); None with the file alone,
    where nobody waits for the lock (a step of one page, a long doclist, can take longer than it)."""
    return step_bound(options, db_path) if holders(db_path) else None


def full_vacuum(conn: sqlite3.Connection, switch_to_incremental: bool) -> None:
    """In place (the inode stays), optionally leaving the file in incremental mode."""
    if switch_to_incremental:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("VACUUM")


def checkpoint_policy(
    db_path: str, replica: Sequence[str] | None = None, others: list[dict[str, Any]] | None = None
) -> Decision:
    """(kind, reason): which checkpoint this run may take, or None and why not.

    Litestream owns a replica's checkpoints. An SQLite with the WAL-reset bug never
    checkpoints a WAL file another process holds (the race is a checkpoint against a commit
    that resets the WAL elsewhere). TRUNCATE blocks writers while it waits, so it is only
    taken when nobody else holds the file, or may.
    """
    if replica:
        return None, "Litestream replicates this file (%s): it does the checkpoints" % ", ".join(replica)
    if not is_wal_file(db_path):
        return None, "not a WAL file: nothing to checkpoint"
    others = holders(db_path) if others is None else others
    if others and sqlite_wal_reset_affected():
        return None, (
            "this SQLite %s has the WAL-reset bug and %s holds the file: no checkpoint from us "
            "(the holder's own checkpoints move our frames)" % (sqlite3.sqlite_version, describe_holders(others))
        )
    return ("PASSIVE" if others else "TRUNCATE"), None


def checkpoint(conn: sqlite3.Connection, db_path: str, replica: Sequence[str] | None = None) -> Decision:
    """The checkpoint ``checkpoint_policy`` allows; returns (kind or None, reason)."""
    kind, reason = checkpoint_policy(db_path, replica)
    if kind is None:
        return None, reason
    try:
        conn.execute("PRAGMA wal_checkpoint(%s)" % kind).fetchall()
    except Exception:  # a busy checkpoint is harmless: SQLite retries at the next commit
        return None, "the checkpoint was busy"
    return kind, None


def plan_reclaim(
    conn: sqlite3.Connection,
    db_path: str,
    options: Options,
    schema: Schema,
    *,
    pruned: dict[str, int],
    messages_total: int,
    extra_bytes: int = 0,
    live_rollback: bool = False,
    window: bool = False,
) -> Reclaim:
    """The reclaim decision for one profile, taken before any write (check mode reports it, the run
    executes it): ``{"mode", "action", "skipped_reason", "free_pages_predicted", "in_window",
    "fts_automerge_restored"}`` (the indexes whose automerge a run killed during its prune or FTS
    optimize left paused: ``sqlite.db.fts_automerge_paused``). ``pruned``:
    session id -> message count of the sessions the prune deletes; ``extra_bytes``: what the run frees
    besides (the tool-payload elision); ``live_rollback``: the estimate's reads are short ones. The vacuum
    rule is applied to the free pages predicted after them.

    ``window`` (a service window is configured): a full VACUUM that only a holder of the file keeps
    out is planned for the window (``in_window``, and ``held``: the holder's reason, for when the
    window does not open)."""

    def rule(after_prune: Mapping[str, Any] | None, alone: bool = False) -> Decision:
        return decide(
            conn, db_path, options.vacuum_mode, options.vacuum_threshold, schema["auto_vacuum"],
            schema.get("litestream"), after_prune=after_prune, alone=alone,
        )  # fmt: skip

    held = bool(holders(db_path))
    indexes = [t["name"] for t in schema.get("fts", []) if not t["error"]]
    after_prune = None
    if pruned or extra_bytes:  # the FTS indexes optimized after them, as fts_give_back does, beside a holder too
        after_prune = predict_free_pages(
            conn, schema, pruned, messages_total,
            extra_bytes=extra_bytes, fts_optimized=True, live_rollback=live_rollback,
        )  # fmt: skip
    action, reason = rule(after_prune)
    free = after_prune["free_pages"] if after_prune else pragma(conn, "freelist_count")
    decision: Reclaim = {
        "mode": options.vacuum_mode, "action": action, "skipped_reason": reason, "free_pages_predicted": free,
        "in_window": False,
        "fts_automerge_restored": fts_automerge_paused_left(conn, indexes),
    }  # fmt: skip
    if action is None and window and held and rule(after_prune, alone=True)[0] == "full":
        # the window runs what a run with no holder runs: FTS5's optimize, then the VACUUM
        decision.update({"action": "full", "skipped_reason": None, "in_window": True, "held": reason})
    return decision


def window_declined(decision: Reclaim, why: str | None) -> None:
    """A full VACUUM planned for a window that does not open: skipped as without a window, and why."""
    if decision.get("in_window"):
        why = "%s; the service window: %s" % (decision.pop("held"), why)
        decision.update({"action": None, "in_window": False, "skipped_reason": why})


def full_vacuum_blocked(db_path: str) -> str | None:
    """Why a planned full VACUUM may not start now (a process opened the file since the plan, or the
    disk filled), else None: these are re-checked right before it runs."""
    others = holders(db_path)
    if others:
        return (
            "held open by %s; a full VACUUM would stall or break it: allow a window (gateway_service) or run "
            "maintain.yml's" % describe_holders(others)
        )
    return _room_refusal(db_path)


def reclaim(
    conn: sqlite3.Connection,
    db_path: str,
    options: Options,
    schema: Schema,
    decision: Reclaim,
    *,
    pruned: bool,
    stop: Stop | None = None,
) -> Reclaim:
    """Merge, then the planned vacuum (``plan_reclaim``); report what was done and why."""
    report: Reclaim = {
        "mode": decision["mode"], "action": decision["action"], "bytes_freed": 0,
        "skipped_reason": decision["skipped_reason"], "fts_merge_steps": 0,
        "free_pages_predicted": decision["free_pages_predicted"],
        "fts_automerge_restored": decision["fts_automerge_restored"],  # put back first (execution.apply_decision)
    }  # fmt: skip
    if pruned:
        report["fts_merge_steps"] = fts_give_back(
            conn, schema["fts"], options.batch_pause, stop, bound=optimize_bound(options, db_path)
        )
    report["free_pages_before_vacuum"] = pragma(conn, "freelist_count")
    replica = schema.get("litestream")
    action = decision["action"]
    if decision.get("in_window"):  # the gateway holds the file now: the VACUUM waits for the window
        action, report["action"], report["skipped_reason"] = None, None, "left for the service window"
    if action == "full":
        blocked = full_vacuum_blocked(db_path)
        if blocked:  # the world changed since the plan: never VACUUM under a holder or on a full disk
            action, report["action"], report["skipped_reason"] = None, None, blocked
    if action == "incremental":
        report["incremental_steps"], report["incremental_retries"] = incremental_vacuum(
            conn, options.batch_pause, stop, bound=step_bound(options, db_path)
        )
    elif action == "full":
        full_vacuum(conn, options.vacuum_switch_incremental)
    report["stopped_early"] = stop() if stop else None
    if pruned or action:
        report["checkpoint"], report["checkpoint_skipped_reason"] = checkpoint(conn, db_path, replica)
    return report
