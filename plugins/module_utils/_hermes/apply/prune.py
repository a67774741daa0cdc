# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The writes: close zombies, prune in short transactions, remove transcripts.

A live gateway writes to the same file, so every transaction is short (bounded in
messages, the rows that fire FTS triggers), followed by a pause that lets the gateway's
busy handler in, and re-checks inside the transaction that its rows still qualify.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..plan.selection import ORPHAN_REAP, leased_conversation, live_leases, routed_sessions, scheduled_sessions
from ..sqlite.db import (
    MB,
    commits_durable,
    frame_bytes,
    fsync_path,
    fsync_tree,
    fts_automerge_held_back,
    wal_index_head,
    wal_pending_bytes,
    write_transaction,
    writer_probe,
)
from ..store.catalogue import LEDGER_GUARD, retire_ledger
from ..store.fence import FenceRefused, local_conversations
from ..store.fence import check as fence_check
from ..store.fence import retire as fence_retire
from .undo import SessionUndo, SlicedEntry, list_sliced, unlist_sliced

if TYPE_CHECKING:
    from ..plan.selection import Plan
    from ..store.schema import Schema

Batch = list[tuple[str, int]]  # (session id, chunk): chunk > 0 deletes only that many of its oldest messages
Stop = Callable[[], Optional[str]]  # asked before each transaction: a reason ends the work there
KeepCopy = Callable[[list[str], dict[str, int]], tuple[str, bool]]  # prune's ``keep_copy``

ZOMBIE_CHUNK = 200
# What a transaction's time bound allows on top of batch_time for its COMMIT in rollback-journal
# mode beside a live gateway: the journal and the pages are written and both synced (10-25 ms here).
ROLLBACK_COMMIT_TIME = 0.04
# A statement still running this many times the bound after BEGIN, and at least HARD_BOUND_FLOOR,
# is interrupted (SQLite rolls the transaction back) and the batch retried in two, in either journal
# mode: a process preempted while it holds the lock, a group whose pages went cold when the gateway
# committed, or one whose FTS5 flush ran a merge step, would otherwise keep the gateway out past its
# 178 ms poll, then its 228 and 328 ms ones (in WAL mode, before: 0.19.0's writer waited 290-409 ms
# on 195-321 ms transactions under a 60 ms bound). A writer that has waited since our BEGIN gets in
# at its 178 ms poll; at 1.5 x 60 ms, WAL's bound, work was thrown away so often that the prune lost
# a quarter of its rows/s.
# Beside a holder whose commits copy our frames into the file (HolderCheckpoints), that writer's
# append also copies our last transaction's frames: the floor is COPIED_HARD_BOUND_FLOOR, and the
# writer gets in at its 128 ms poll. On 0.19.0's WAL file of 800,000 messages the cuts (2-3 % of
# the prune's transactions) had set the writer's p99 at 188-207 ms; at 120 ms it was 133-139 ms,
# the prune's rows/s the same within the noise (bench/notes/wal-0.19.md). Where our frames are
# checkpointed by us, the cut at 120 ms cost 0.22.2's WAL prune about 5 % of its rows/s for nothing.
HARD_BOUND_FACTOR = 1.5
HARD_BOUND_FLOOR = 0.15
COPIED_HARD_BOUND_FLOOR = 0.12
# In rollback-journal mode beside a gateway that writes, the bound holds the COMMIT's allowance
# already (ROLLBACK_COMMIT_TIME): the statements are cut at ROLLBACK_HARD_FACTOR x the bound, 110 ms
# at the default batch_time, so that the hold, its 10-20 ms COMMIT included, ends before the 128 ms
# poll of a writer that has waited since our BEGIN. At 1.5 x, transactions held the lock 140-163 ms
# and that writer got in at its 178 ms poll: on 0.22.2's file of 800,000 messages its p99 was 184 ms,
# at 1.1 x 133-135 ms, the prune's rows/s the same within the noise (bench/notes/delete-0.22.md).
# While the gateway is idle (IdlePacing) nobody waits, and the grown bound keeps 1.5 x. A smaller
# batch_time is not cut sooner than ROLLBACK_HARD_FLOOR: that would throw work away for no writer.
ROLLBACK_HARD_FACTOR = 1.1
ROLLBACK_HARD_FLOOR = 0.11
PROGRESS_STEPS = 1000  # SQLite VM steps between two looks at the clock while a statement runs
# SQLite's busy handler sleeps these many ms between polls, then 100 ms each (sqliteDefaultBusyCallback).
BUSY_POLL_MS = (1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100)
# Beside state.db while a batch commits: the transcripts of its sessions, removed right after.
PENDING_SUFFIX = ".hermes-ops-transcripts"
# A gateway that has not committed for IDLE_STREAK of our transactions in a row is idle: the time
# bound doubles per further quiet transaction up to IDLE_HOLD_CAP, which a writer that turns up
# meanwhile waits out within 250 ms (it gets in at its 128 ms poll; IdlePacing).
IDLE_STREAK = 3
IDLE_HOLD_CAP = 0.12
# A gateway that has also committed nothing for IDLE_SECONDS (the file's last change before the prune
# counts) lets a transaction take up to IDLE_SIZE_FACTOR x batch_size messages: the time bound still
# ends it, so a writer that turns up waits no longer, but there are fewer commits and fewer pauses
# for a poll that nobody makes (bench/notes/delete-0.22-idle.md).
IDLE_SECONDS = 0.5
IDLE_SIZE_FACTOR = 8
# Beside a holder that checkpoints our frames (this run may not: reclaim.wal_budget). SQLite's
# wal_autocheckpoint, which Hermes keeps, copies the -wal into the file in the commit of whoever
# leaves PILE_FRAMES or more in it; a transaction of ours aims PILE_OVER past that, at least
# PILE_LEAST. With PILE_FRAMES pending, the next transaction waits up to PILE_WAIT for that copy.
PILE_FRAMES = 1000
PILE_OVER = 100
PILE_LEAST = 32
PILE_WAIT = 1.0
# Session ids per IN list (SQLite before 3.32 allows 999 bound parameters; one statement binds a list twice).
IN_LIST = 400
# A transaction's first group is sized at this share of the room the previous transaction's rate gives
# (after the gateway's commit our page cache starts cold); the groups after it use this one's own rate.
FIRST_GROUP_SHARE = 0.8


def close_zombies(
    conn: sqlite3.Connection, plan: Plan, schema: Schema, end_reason: str, pause: float, closed: list[str]
) -> None:
    """Set ended_at to each zombie's last activity, unless it woke up since the plan.

    ``closed`` collects the ids as each transaction commits, so a run that fails halfway
    still reports what it did.
    """
    cols = schema["session_columns"]
    still_idle = "AND NOT EXISTS (SELECT 1 FROM messages WHERE session_id = ? AND timestamp >= ?)"
    if "last_activity_at" in cols:
        still_idle += " AND (last_activity_at IS NULL OR last_activity_at < ?)"
    if "pinned" in cols:
        still_idle += " AND NOT pinned"
    sql = "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL " + still_idle
    for start in range(0, len(plan.zombies), ZOMBIE_CHUNK):
        chunk = plan.zombies[start : start + ZOMBIE_CHUNK]
        with write_transaction(conn):
            leased = live_leases(conn, schema, time.time())
            done = []
            for sid, last in chunk:
                if leased_conversation(conn, sid, leased):
                    continue
                params = [last, end_reason, sid, sid, plan.zombie_cutoff]
                if "last_activity_at" in cols:
                    params.append(plan.zombie_cutoff)
                if conn.execute(sql, params).rowcount:
                    done.append(sid)
        closed.extend(done)
        time.sleep(pause)


class PruneResult:
    def __init__(self) -> None:
        self.sessions = 0
        self.messages = 0
        self.orphaned = 0
        self.transcripts = 0
        self.prompts = 0
        self.left_alone: set[str] = set()  # sessions that stopped qualifying while we worked
        self.stopped: str | None = None  # why the prune stopped before the end of its plan (the next run goes on)
        self.refused: list[
            dict[str, str]
        ] = []  # {"session", "by", "message"}: deletes Hermes's own store refused (trigger, RESTRICT)
        self.kept: list[
            dict[str, str]
        ] = []  # {"session", "reason"}: sessions put back whole when they stopped qualifying mid-delete

    def add(self, other: PruneResult) -> None:
        for name in ("sessions", "messages", "orphaned", "transcripts", "prompts"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.refused += other.refused
        self.kept += other.kept


def poll_gap(waited: float) -> float:
    """The sleep before a waiting writer's next poll once it has waited ``waited`` seconds."""
    elapsed = 0.0
    for ms in BUSY_POLL_MS:
        elapsed += ms / 1000.0
        if elapsed > waited:
            return ms / 1000.0
    return BUSY_POLL_MS[-1] / 1000.0


class LockBudget:
    """How long one transaction may hold the write lock: ``seconds`` from BEGIN to the end of
    its COMMIT (0: no bound).

    Before each group of sessions it deletes, the transaction asks whether the time so far, the
    group's messages at the rate measured so far (``fits``), and the last COMMIT's duration still
    fit; so the bound holds for the whole transaction, commit included, rather than being checked
    once it has already passed. A busy machine slows the measured rate, and the transactions get
    smaller.
    """

    def __init__(self, seconds: float, hard: float | None = None) -> None:
        self.seconds = seconds
        self.hard = hard  # seconds after BEGIN past which a running statement is interrupted (None: never)
        self.commit = 0.0  # how long the last COMMIT took
        self.per_row: float | None = None  # seconds per message deleted in the last transaction (None: not known)
        self.armed = self.tripped = False
        self.most = 0  # messages this transaction may take in all (0: no bound beyond its batch's)
        self.started = 0.0  # when this transaction began (begin)
        self.unit = 0  # the entry of the batch an interrupt retries from (_prune_batch)

    def begin(self) -> None:
        self.started = time.monotonic()
        self.armed = self.tripped = False

    def interrupt(self) -> bool:
        """SQLite's progress handler: True stops the running statement, once per transaction
        and only while ``armed`` (so never the first session, the COMMIT or the ROLLBACK)."""
        if self.armed and self.hard is not None and time.monotonic() - self.started > self.hard:
            self.tripped, self.armed = True, False
            return True
        return False

    def fits(self, rows_done: int, next_rows: int) -> bool:
        """Whether ``next_rows`` more messages still fit, at the rate measured so far in this transaction
        (before any: the previous transaction's, taken FIRST_GROUP_SHARE slower; none known: always)."""
        if not self.seconds:
            return True
        elapsed = time.monotonic() - self.started
        if rows_done:
            per_row = elapsed / rows_done
        else:
            per_row = self.per_row / FIRST_GROUP_SHARE if self.per_row else 0.0
        return elapsed + per_row * next_rows + self.commit <= self.seconds

    def room(self, batch: Batch, index: int, rows_done: int, plan: Plan) -> int:
        """How many entries of ``batch[index:]`` the next group of this transaction takes (``fits``);
        the first group takes at least one, and with no rate known yet only one, whose time gives the
        rate. 0: the transaction ends here."""
        if not self.seconds:
            return len(batch) - index
        if not rows_done and not self.per_row:
            return 1 if index == 0 or self.fits(0, 0) else 0
        take = rows = 0
        for sid, chunk in batch[index:]:
            rows += chunk or plan.messages.get(sid, 0)
            too_many = self.most and rows_done + rows > self.most
            if (take or index) and (too_many or not self.fits(rows_done, rows)):
                break
            take += 1
        return take

    def measured(self, rows: int) -> None:
        """The rate of this transaction's deletes (seconds per message), for the next one's first group."""
        if rows:
            self.per_row = (time.monotonic() - self.started) / rows


class HolderCheckpoints:
    """Beside a gateway whose commits copy our frames into the file: the work's ``stop()``, and how
    many frames its next transaction may write (``begin``).

    The -wal restarts once everything in it is copied, and the gateway's commit copies when it
    leaves PILE_FRAMES or more there: every frame written since the restart, inside the gateway's
    own append. Transactions of ours of about 900 frames left the -wal just short of that after one
    of them, so the gateway copied two at a time (1,800 to 1,900 frames, 200 ms of one append on a
    loaded host). Each transaction takes what brings the -wal just past PILE_FRAMES, at the rate
    of frames per unit the last one measured, and the gateway copies about one interval at a time
    (its median copy 44 ms of its append instead of 69: bench/notes/wal-0.19.md).

    The stop: every frame we write stays in the -wal until the holder copies it, so the work stops
    between transactions once ``budget`` bytes of them are pending. Before that, with PILE_FRAMES pending,
    the next transaction waits up to PILE_WAIT for the holder's copy, which it makes after its next
    commit (steps of ours in a row with no commit of the gateway between them pile up: 19.8 MB left
    after one run on a loaded host). A holder that does not copy in that time is not waited for
    again in this run.
    """

    def __init__(self, db_path: str, page_size: int, budget: int) -> None:
        self.db_path = db_path
        self.budget = budget  # bytes of frames pending at which the work stops (sqlite.db.WAL_BUDGET)
        self.pile = PILE_FRAMES * frame_bytes(page_size)
        self.patient = True
        self.head: tuple[int, int, bytes] | None = None  # the WAL index's header at ``begin()``

    def __call__(self) -> str | None:
        pending = wal_pending_bytes(self.db_path)
        if self.patient and pending >= self.pile:
            self.patient = self._wait_for_copy(pending)
            pending = wal_pending_bytes(self.db_path)
        if pending >= self.budget:
            return (
                "stopped at %d MB of WAL nobody has checkpointed yet (this SQLite %s may not checkpoint while "
                "another process holds the file): the next run goes on" % (pending // MB, sqlite3.sqlite_version)
            )
        return None

    def _wait_for_copy(self, pending: int) -> bool:
        deadline = time.monotonic() + PILE_WAIT
        while time.monotonic() < deadline:
            time.sleep(0.005)
            if wal_pending_bytes(self.db_path) < pending:
                return True
        return False

    def begin(self) -> int:
        """Before a transaction: where the -wal stands (for ``frames_written``), and the frames that
        bring it PILE_OVER past PILE_FRAMES, at least PILE_LEAST."""
        self.head = head = wal_index_head(self.db_path)
        if head is None:
            return PILE_FRAMES + PILE_OVER
        frames, copied, _salt = head
        if copied >= frames:
            piled = 0  # all copied: our next transaction restarts the -wal
        elif frames < PILE_FRAMES:
            piled = frames  # the gateway's next commit copies nothing yet
        else:
            piled = frames - copied
        return max(PILE_FRAMES + PILE_OVER - piled, PILE_LEAST)

    def frames_written(self) -> int | None:
        """Frames added to the -wal since ``begin()`` (None: not known)."""
        before, after = self.head, wal_index_head(self.db_path)
        if before is None or after is None:
            return None
        if after[2] == before[2] and after[0] >= before[0]:
            return after[0] - before[0]
        return after[0]  # the -wal restarted: everything in it is new


class FramesPer:
    """Frames a transaction writes per unit of its work (a message deleted, a page merged or freed),
    as the last one measured; ``most(allowed)`` the units that fit."""

    def __init__(self) -> None:
        self.rate: float | None = None

    def measured(self, frames: int | None, units: int) -> None:
        if frames and units > 0:
            self.rate = frames / float(units)

    def most(self, allowed: int) -> int | None:
        return max(1, int(allowed / self.rate)) if self.rate else None


class WriterTurn:
    """After each of our commits beside a live gateway: wait until a writer that waited for us has
    had its turn, rather than for a fixed pause.

    ``writing`` (sqlite.db.writer_probe) says whether another process is inside a write
    transaction. Once one was seen and the lock then stayed free for GRACE, the gateway has
    committed and the next transaction may start: most pauses end after the gateway's own
    commit, well before a fixed pause would. When none shows up, the wait lasts until just past
    the next poll of a writer that may have been waiting since the gateway's last commit we saw
    (``poll_gap``), at least ``pause``: a writer that missed one window is let in at the next
    instead of waiting through another transaction with ever longer polls (in both journal modes:
    a WAL writer's busy handler backs off alike). With ``cover_poll`` false the wait is never
    longer than ``pause``: the turn only ends it early, once the gateway has committed.
    """

    GRACE = 0.002  # free this long after a writer's commit: no other writer was queued behind it
    STEP = 0.001
    IDLE = 1.0  # no writer seen for this long: an idle gateway, waiting only as long as our transaction

    def __init__(self, writing: Callable[[], bool], pause: float, cover_poll: bool = True) -> None:
        self.writing = writing
        self.pause = pause
        self.cover_poll = cover_poll
        self.last_commit: float | None = None  # when we last saw a writer of the gateway finish

    def wait(self, held: float) -> None:
        start = time.monotonic()
        waited = held
        if self.last_commit is not None and start - self.last_commit < self.IDLE:
            waited = max(held, start - self.last_commit)
        limit = max(self.pause, poll_gap(waited) + 0.005) if self.cover_poll else self.pause
        seen = False
        free_since: float | None = start
        while True:
            now = time.monotonic()
            if self.writing():
                seen, free_since = True, None
            else:
                if free_since is None:  # the writer we saw has just committed
                    free_since = self.last_commit = now
                if seen and now - free_since >= self.GRACE:
                    return
            if now - start >= limit:
                return
            time.sleep(self.STEP)


def turn_after_commit(conn: sqlite3.Connection, pause: float) -> Callable[..., None]:
    """``wait(held)`` for the steps after the prune (the FTS merge, incremental_vacuum): after each
    commit, the gateway's turn as the prune waits for it (WriterTurn through SQLite's own descriptor)
    or, with nothing to ask with, ``pause`` stretched to just past a waiting writer's next poll.

    A bare ``pause`` let a writer that had backed off to 50-100 ms polls miss window after window:
    beside 150-216 ms merge steps on a 5 GB file, appends waited 534-834 ms (bench/notes/delete-0.22-large.md).
    """
    db_path = conn.execute("PRAGMA database_list").fetchone()[2]
    wal = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    writing = writer_probe(db_path, wal=wal) if db_path else None
    turn = WriterTurn(writing, pause) if writing else None

    def wait(held: float, paused: float | None = None) -> None:
        """``paused``: this turn's pause instead of ``pause`` (IdlePacing shortens it while the gateway is idle)."""
        paused = pause if paused is None else paused
        if turn:
            turn.pause = paused
            turn.wait(held)
        else:
            time.sleep(max(paused, poll_gap(held) + 0.005))

    return wait


@contextlib.contextmanager
def persistent_journal(conn: sqlite3.Connection) -> Iterator[None]:
    """A rollback-journal file's many short commits keep one journal file (its header zeroed at each
    commit: no other connection takes it for a hot one) instead of creating and deleting one each
    time: 13% less time per COMMIT here. Back to DELETE at the end, which removes the file."""
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0].lower()
    if journal == "delete":
        conn.execute("PRAGMA journal_mode=PERSIST").fetchone()
    try:
        yield
    finally:
        if journal == "delete" and not conn.in_transaction:
            conn.execute("PRAGMA journal_mode=DELETE").fetchone()


class IdlePacing:
    """Pacing that follows the gateway, seen from SQLite's own state: ``PRAGMA data_version`` on our
    connection changes when, and only when, another connection has committed (either journal mode).
    ``quiet_since`` (wall clock): when another connection last wrote, as far as we know (the file's
    last change before the prune: ``last_written``).

    ``observe`` is called after each transaction and its pause: after IDLE_STREAK of ours in a row
    with no other commit (their pauses included, which is when a waiting writer gets in) the
    ``bound`` doubles per further quiet one, up to IDLE_HOLD_CAP (never below the configured bound),
    while the pause halves, down to just past the next poll of a writer that may have waited for the
    whole transaction (never above the configured pause). The first commit of another connection
    seen resets both to the configured values: beside a gateway that writes, nothing changes.
    Quiet for IDLE_SECONDS as well, a transaction may take more messages than ``batch_size`` (``size``).
    """

    def __init__(self, conn: sqlite3.Connection, bound: float, pause: float, quiet_since: float | None = None) -> None:
        self.conn = conn
        self.base_bound: float = bound
        self.base_pause: float = pause
        self.version = self._version()
        self.streak = 0  # our transactions since the last commit of another connection we saw
        self.quiet_since = time.time() if quiet_since is None else quiet_since

    def _version(self) -> int:
        version: int = self.conn.execute("PRAGMA data_version").fetchone()[0]
        return version

    def observe(self) -> None:
        version = self._version()
        self.streak = self.streak + 1 if version == self.version else 0
        if version != self.version:
            self.quiet_since = time.time()
        self.version = version

    def _doublings(self) -> int:
        return max(0, self.streak - IDLE_STREAK + 1)

    def idle(self) -> bool:
        """Nobody else has committed for IDLE_STREAK of our transactions: the bound may grow."""
        return bool(self._doublings())

    def bound(self) -> float:
        if not self.base_bound or not self._doublings():
            return self.base_bound
        grown: float = self.base_bound * 2 ** min(self._doublings(), 8)
        return max(self.base_bound, min(grown, IDLE_HOLD_CAP))

    def size(self, batch_size: int) -> int:
        """The most messages the next transaction may take: ``batch_size``, or more while the gateway is idle."""
        quiet = time.time() - self.quiet_since >= IDLE_SECONDS
        return batch_size * IDLE_SIZE_FACTOR if self.base_bound and self._doublings() and quiet else batch_size

    def pause(self, held: float) -> float:
        if not self._doublings():
            return self.base_pause
        floor = min(self.base_pause, poll_gap(held) + 0.005)
        shrunk: float = self.base_pause / 2 ** min(self._doublings(), 8)
        return max(floor, shrunk)


def hard_bound(bound: float, copied: bool = False, rollback_live: bool = False) -> float:
    """Seconds after BEGIN past which a running statement of the prune is interrupted (``copied``:
    beside a holder whose commits copy our frames into the file; ``rollback_live``: in rollback-journal
    mode beside a gateway that writes, where ``bound`` includes the COMMIT's allowance)."""
    if rollback_live:
        return max(bound * ROLLBACK_HARD_FACTOR, ROLLBACK_HARD_FLOOR)
    return max(bound * HARD_BOUND_FACTOR, COPIED_HARD_BOUND_FLOOR if copied else HARD_BOUND_FLOOR)


def prune(
    conn: sqlite3.Connection, plan: Plan, schema: Schema, batch_size: int, pause: float, result: PruneResult,
    batch_time: float | None = None, pause_after_commit: bool = False, stop: Stop | None = None,
    keep_copy: KeepCopy | None = None,
) -> PruneResult:  # fmt: skip
    """Delete plan.delete_order in transactions of at most batch_size messages.

    A transaction also holds the write lock for at most ``batch_time`` seconds, its commit
    included (LockBudget): the bound a waiting gateway sees is then wall time, whatever the
    machine's load.

    A statement still running past ``hard_bound`` of that bound is interrupted (SQLite rolls the
    transaction back; its sessions are retried in two smaller batches; a transaction's first
    session always completes, so the prune goes on).

    ``pause_after_commit`` (rollback-journal mode beside a live gateway): a commit there writes
    the journal and the pages and syncs both, so it gets ROLLBACK_COMMIT_TIME on top of
    ``batch_time``. After each commit the prune waits for the gateway's turn (WriterTurn) instead of
    a fixed pause: until a waiting writer has committed, or at most until just past its next poll.
    In WAL mode the same turn, seen through the -shm's write lock. While no other connection
    commits, the bound grows and the pause shrinks (IdlePacing).

    ``result`` (a PruneResult) is updated as each transaction commits, so a run that fails
    halfway still reports what it did. ``stop``, when given, is asked before each
    transaction; a reason from it ends the prune there (``result.stopped``).

    ``keep_copy(order, counts)``, when given, returns (path, owned): a durable copy of those
    sessions' rows SQLite reads as it is (the run's backup or archive, or one it writes for them:
    ``owned``, removed with the list): a session deleted in slices is then listed durably with it
    before its first slice (apply.undo), so that a run cut short between two slices loses none of it.
    """
    run = _start_prune(conn, plan, schema, batch_size, pause, result, batch_time, pause_after_commit, keep_copy)
    run.pile = stop if isinstance(stop, HolderCheckpoints) else None
    with persistent_journal(conn):
        try:
            while run.queue:
                result.stopped = stop() if stop else None
                if result.stopped:
                    _abandon(conn, schema, result, "the run stopped before its last slice: %s" % result.stopped)
                    break
                _prune_transaction(run)
        except BaseException:
            _abandon(conn, schema, result, "the run failed before its last slice")
            raise
        finally:
            _end_prune(run)
    return result


@dataclass
class _PruneRun:
    """One prune's state from one transaction to the next."""

    conn: sqlite3.Connection
    plan: Plan
    schema: Schema
    result: PruneResult
    queue: collections.deque[Batch]  # the batches still to delete, in order
    db_path: str
    pending: str  # the transcript list beside state.db (PENDING_SUFFIX)
    has_prompts: bool  # the store has system_prompts to collect
    keep_copy: KeepCopy | None
    batch_size: int
    turn: WriterTurn | None  # the gateway's turn after each commit, when there is a descriptor to ask with
    budget: LockBudget
    pacing: IdlePacing
    pause_after_commit: bool
    sliced_list: dict[str, SlicedEntry] = field(default_factory=dict)  # listed durably before their first slice
    pile: HolderCheckpoints | None = None  # the holder copies our frames: each transaction sized to its copies
    per_message: FramesPer = field(default_factory=FramesPer)


def _start_prune(
    conn: sqlite3.Connection, plan: Plan, schema: Schema, batch_size: int, pause: float, result: PruneResult,
    batch_time: float | None, pause_after_commit: bool, keep_copy: KeepCopy | None,
) -> _PruneRun:  # fmt: skip
    """The prune's pacing, its batches and its undo records; the transcripts an interrupted run
    listed removed first."""
    has_prompts = "system_prompts" in schema["tables"] and "system_prompt_hash" in schema["session_columns"]
    db_path = conn.execute("PRAGMA database_list").fetchone()[2]
    pending = db_path + PENDING_SUFFIX
    wal = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    writing = writer_probe(db_path, wal=wal) if pause_after_commit or wal else None
    # Both journal modes wait past a waiting writer's next poll: with the bare pause in WAL mode,
    # 0.19.0's writer missed window after window (worst stalls 966-1362 ms at 200k, against
    # 257-301 ms covering its poll, measured alternately side by side; bench/notes/wal-0.19.md).
    turn = WriterTurn(writing, pause) if writing else None
    result.transcripts += finish_pending(conn, pending)
    batch_size = max(1, int(batch_size))
    queue = collections.deque(_batches(plan, batch_size))
    # A session deleted in slices is recorded until its row goes, to be put back whole if refused.
    sliced = any(plan.messages.get(sid, 0) > batch_size for sid in plan.delete_order)
    schema["_undo"] = SessionUndo(conn, schema["tables"]) if sliced else None
    bound = (batch_time or 0.0) + (ROLLBACK_COMMIT_TIME if pause_after_commit and batch_time else 0.0)
    budget = LockBudget(bound, hard=hard_bound(bound) if bound else None)
    pacing = IdlePacing(conn, bound, pause, quiet_since=last_written(db_path))
    if budget.hard:
        conn.set_progress_handler(budget.interrupt, PROGRESS_STEPS)
    return _PruneRun(
        conn, plan, schema, result, queue, db_path, pending, has_prompts, keep_copy, batch_size, turn, budget,
        pacing, pause_after_commit,
    )  # fmt: skip


def _prune_transaction(run: _PruneRun) -> None:
    """The next batch: its transcripts listed, its transaction, its transcripts removed, the gateway's turn."""
    budget = run.budget
    budget.seconds = run.pacing.bound()
    if budget.hard:  # while the gateway is idle the bound grows, and the hard bound with it
        live = run.pause_after_commit and not run.pacing.idle()
        budget.hard = hard_bound(budget.seconds, copied=run.pile is not None, rollback_live=live)
    batch = run.queue.popleft()
    budget.most = run.pacing.size(run.batch_size)
    if run.pile:
        fit = run.per_message.most(run.pile.begin())
        budget.most = min(budget.most, fit) if fit else budget.most
    if budget.most > run.batch_size:
        batch = _joined(run.queue, batch, budget.most, run.plan)
    # Listed before BEGIN, durably (file and directory), out of the write lock's hold: a
    # COMMIT that reaches the disk finds the list there, or its transcripts stay for good.
    # The whole batch: the next run removes only the files of the sessions that are gone.
    listed = {sid: list(run.plan.transcripts[sid]) for sid, _chunk in batch if run.plan.transcripts.get(sid)}
    if listed:
        _write_pending(run.pending, listed)
        pending_durable(run.pending)
    if run.keep_copy is not None:
        _list_first_slice(run.conn, run.schema, run.plan, batch, run.keep_copy, run.sliced_list)
    began = time.monotonic()
    done, counts = _batch_or_retry(run, batch)
    if run.pile:
        run.per_message.measured(run.pile.frames_written(), counts.messages)
    counts.sessions = len(done)
    run.result.add(counts)
    files = [path for sid in done for path in listed.get(sid, ())]
    if files:  # a transcript goes only once its session's deletion is durable
        commits_durable(run.db_path)
    run.result.transcripts += remove_files(files)
    if files:
        removals_durable(files)  # before the list goes: else they may come back, unlisted
    if listed:
        remove_files([run.pending])
    _gateway_turn(run, time.monotonic() - began)


def last_written(db_path: str) -> float:
    """When the file or its WAL last changed, in wall-clock seconds; now where the file cannot be read.
    An empty WAL was only created, by whoever opened the file last (us, too)."""
    times = []
    for path in (db_path, db_path + "-wal"):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if info.st_size or path == db_path:
            times.append(info.st_mtime)
    return max(times) if times else time.time()


def _joined(queue: collections.deque[Batch], batch: Batch, most: int, plan: Plan) -> Batch:
    """``batch`` and the batches of whole sessions after it, up to ``most`` messages in all; a slice
    of a long session or a local conversation (``Whole``) stays on its own."""

    def plain(entries: Batch) -> bool:
        return not isinstance(entries, Whole) and not any(chunk for _sid, chunk in entries)

    if not plain(batch):
        return batch
    joined = list(batch)
    weight = sum(plan.messages.get(sid, 0) for sid, _chunk in joined)
    while queue and plain(queue[0]):
        more = sum(plan.messages.get(sid, 0) for sid, _chunk in queue[0])
        if weight + more > most:
            break
        joined += queue.popleft()
        weight += more
    return joined


def _batch_or_retry(run: _PruneRun, batch: Batch) -> tuple[list[str], PruneResult]:
    """``_prune_batch``; a transaction held past the hard bound is rolled back by SQLite and nothing
    of it happened: the sessions done before the interrupted one are retried on their own."""
    budget = run.budget
    try:
        return _prune_batch(run.conn, run.plan, run.schema, batch, budget, run.queue, run.result.left_alone,
                            run.has_prompts)  # fmt: skip
    except sqlite3.OperationalError:
        if not budget.tripped:
            raise
        run.queue.extendleft([batch[budget.unit :], batch[: budget.unit]])
        budget.per_row = None  # slower than measured: the next transaction measures again
        return [], PruneResult()


def _gateway_turn(run: _PruneRun, held: float) -> None:
    """After a transaction that held the lock ``held`` seconds: the gateway's turn, then whether it committed."""
    paused = run.pacing.pause(held)
    if run.turn:
        run.turn.pause = paused
        run.turn.wait(held)
    else:
        time.sleep(max(paused, poll_gap(held) + 0.005) if run.pause_after_commit else paused)
    run.pacing.observe()  # did the gateway commit during that transaction's turn?


def _end_prune(run: _PruneRun) -> None:
    """The progress handler off; the slice list and the undo records gone once no session is half deleted."""
    conn, schema = run.conn, run.schema
    if run.budget.hard:
        conn.set_progress_handler(None, 0)
    undo = schema.get("_undo")
    if run.sliced_list and undo is not None and not conn.in_transaction and undo.recording() is None:
        unlist_sliced(run.db_path, run.sliced_list)  # none of them half deleted: each gone or whole
    if undo is not None and not conn.in_transaction:
        schema.pop("_undo").close()


def _list_first_slice(
    conn: sqlite3.Connection, schema: Schema, plan: Plan, batch: Batch, keep_copy: KeepCopy,
    sliced_list: dict[str, SlicedEntry],
) -> None:  # fmt: skip
    """Before the transaction of a session's first slice: its rows archived (``keep_copy``) and,
    with what its fence will change, listed durably (apply.undo.SLICED_SUFFIX)."""
    undo = schema["_undo"]
    sid, chunk = batch[0]
    if len(batch) != 1 or not chunk or undo.recording() == sid:
        return
    undo.expected = _fence_preview(conn, schema, sid) if is_fenced(schema) else {}
    archive, owned = keep_copy([sid], {sid: plan.messages.get(sid, 0)})
    db_path = conn.execute("PRAGMA database_list").fetchone()[2]
    if sliced_list:  # the sessions listed before are gone or whole: durably so, before their list is rewritten
        commits_durable(db_path)
    sliced_list[sid] = {"archive": archive, "owned": owned, "columns": undo.columns, "fence": undo.expected}
    list_sliced(db_path, sliced_list)


def _fence_preview(conn: sqlite3.Connection, schema: Schema, sid: str) -> Any:
    """What the fence of ``sid`` changes, from a transaction that runs it recorded and rolls back."""
    undo = schema["_undo"]
    conn.execute("BEGIN IMMEDIATE")
    try:
        undo.start(sid)
        undo.active(True)
        fence_retire(conn, schema["tables"], [sid])
        return undo.fence_records()
    finally:
        conn.execute("ROLLBACK")


def _abandon(conn: sqlite3.Connection, schema: Schema, result: PruneResult, why: str) -> None:
    """The prune ends with a session half deleted: put it back whole, in a transaction of its own."""
    undo = schema.get("_undo")
    if undo is None or conn.in_transaction or undo.recording() is None:
        return
    counts = PruneResult()
    with write_transaction(conn):
        _put_back(conn, schema, undo.recording(), counts, why)
    result.add(counts)


def _put_back(conn: sqlite3.Connection, schema: Schema, sid: str, counts: PruneResult, why: str) -> str:
    """When ``sid``'s delete spans transactions and an earlier one committed: undo all of it in this
    transaction and name the session in ``counts.kept``. Returns the note for a refusal's message."""
    undo = schema.get("_undo")
    if undo is None or undo.recording() != sid:
        return ""
    back = undo.put_back()
    counts.messages -= back
    note = "the %d messages its earlier transactions deleted were put back, and its fence removed" % back
    counts.kept.append({"session": sid, "reason": "%s; %s" % (why, note)})
    return "; " + note


def _prune_batch(
    conn: sqlite3.Connection, plan: Plan, schema: Schema, batch: Batch, budget: LockBudget,
    queue: collections.deque[Batch], skipped: set[str], has_prompts: bool,
) -> tuple[list[str], PruneResult]:  # fmt: skip
    """One transaction of the prune: returns (sessions deleted, counts).

    The sessions that still qualify are deleted a group at a time, each group in one set of
    statements (``_delete_group``): FTS5 writes its pending changes out as a new segment at the
    start of every statement that follows one that changed it, so a statement per session made a
    segment per session in both indexes, and the merges that follow (100k messages of 0.22.2's
    schema in one transaction: 5.5-6.7 s a statement per session, 4.4-4.7 s grouped; the FTS merge
    after the prune 2.1-2.2 s, now 0.2-0.4 s).
    A group is as large as ``budget`` has room for at the rate measured so far; sessions that do
    not fit go back to the front of ``queue``. FTS5 merges only levels of 8 segments in the
    transaction, not its usual 4 (``fts_automerge_held_back``: the rest is left to the FTS optimize after
    the prune).
    """
    counts = PruneResult()  # joins the run's result only once its transaction commits
    indexes = [fts["name"] for fts in schema.get("fts", []) if not fts["error"]]
    with write_transaction(conn), fts_automerge_held_back(conn, indexes):
        budget.begin()
        leased = live_leases(conn, schema, time.time())
        fenced = is_fenced(schema)
        # with the runtime ledger the fence removes a deleted session's routes, as Hermes does
        routed = set() if fenced else routed_sessions(conn, schema)
        schema["_conversations"] = local_conversations(conn) if fenced else {}
        done, index = [], 0
        whole = isinstance(batch, Whole)  # never interrupted, never split: it completes
        while index < len(batch):
            take = len(batch) if whole else budget.room(batch, index, counts.messages, plan)
            if not take:
                queue.appendleft(batch[index:])  # the rest waits for the next transaction
                break
            group = []
            for offset in range(index, index + take):
                sid, chunk = batch[offset]
                budget.unit, budget.armed = offset, offset > 0 and not whole  # the first session always completes
                if sid in skipped or sid in routed or not still_prunable(conn, sid, plan, schema, leased):
                    skip_with_ancestors(sid, plan, skipped)
                    _put_back(conn, schema, sid, counts, "resumed, written to or leased during its delete")
                    continue
                group.append((sid, chunk))
            if whole and len(group) < len(batch):  # one segment stays: so do the others
                for sid, _chunk in group:
                    skip_with_ancestors(sid, plan, skipped)
                group = []
            # Interrupted inside the group's statements: what came before it is retried on its own
            # (a first group of several is split in two instead; a single first session completes).
            budget.unit = index if index else take // 2
            budget.armed = budget.unit > 0 and not whole
            index += take
            if group:
                done += _delete_group(conn, schema, group, has_prompts, counts, plan, skipped)
        budget.measured(counts.messages)
        budget.armed = False  # never inside COMMIT
        committing = time.monotonic()
    budget.commit = time.monotonic() - committing
    return done, counts


def _delete_group(
    conn: sqlite3.Connection, schema: Schema, group: Batch, has_prompts: bool, counts: PruneResult, plan: Plan,
    skipped: set[str],
) -> list[str]:  # fmt: skip
    """Delete ``group`` [(session id, chunk)]: whole sessions together, a slice of a large session on
    its own. A delete Hermes's store refuses (a trigger's RAISE, a RESTRICT foreign key) undoes the
    group's statements, and its sessions are then deleted one at a time, so that only the refused
    one stays (``counts.refused``), with what depends on it (``skipped``). Returns the ids of the
    sessions deleted whole."""
    undo = schema.get("_undo")
    started = undo.recording() if undo else None
    if len(group) > 1 and started in dict(group):  # its last transaction: on its own, recorded, first
        rest = [entry for entry in group if entry[0] != started]
        first = _delete_group(conn, schema, [(started, 0)], has_prompts, counts, plan, skipped)
        return first + _delete_group(conn, schema, rest, has_prompts, counts, plan, skipped)
    whole = [sid for sid, chunk in group if not chunk]
    if len(whole) < 2 or len(whole) < len(group):  # one session, or a slice (alone in its batch: _batches)
        return [
            sid for sid, chunk in group if _delete_one(conn, schema, sid, chunk, has_prompts, counts, plan, skipped)
        ]
    conn.execute("SAVEPOINT hermes_ops_group")
    one = PruneResult()
    try:
        _delete_sessions(conn, schema, whole, has_prompts, one)
    except (sqlite3.IntegrityError, FenceRefused) as exc:
        if not isinstance(exc, FenceRefused) and _refused_by(exc, schema) is None or not conn.in_transaction:
            raise
        conn.execute("ROLLBACK TO hermes_ops_group")
        conn.execute("RELEASE hermes_ops_group")
        return [
            sid
            for sid in whole
            if sid not in skipped and _delete_one(conn, schema, sid, 0, has_prompts, counts, plan, skipped)
        ]
    conn.execute("RELEASE hermes_ops_group")
    counts.add(one)
    return whole


def _delete_one(
    conn: sqlite3.Connection, schema: Schema, sid: str, chunk: int, has_prompts: bool, counts: PruneResult, plan: Plan,
    skipped: set[str],
) -> bool:  # fmt: skip
    """One session (or a slice of it) in a savepoint of its own: True when it was deleted whole, False
    when Hermes's store refused it (``counts.refused``; it and what depends on it join ``skipped``)
    or only a slice went."""
    one = PruneResult()
    conn.execute("SAVEPOINT hermes_ops_session")  # a refused delete is undone alone
    try:
        _delete_session(conn, schema, sid, chunk, has_prompts, one)
    except (sqlite3.IntegrityError, FenceRefused) as exc:
        refused_by = "the deletion fence" if isinstance(exc, FenceRefused) else _refused_by(exc, schema)
        if refused_by is None or not conn.in_transaction:
            raise
        conn.execute("ROLLBACK TO hermes_ops_session")
        conn.execute("RELEASE hermes_ops_session")
        note = _put_back(conn, schema, sid, counts, "refused by %s during its delete" % refused_by)
        counts.refused.append({"session": sid, "by": refused_by, "message": str(exc) + note})
        skip_with_ancestors(sid, plan, skipped)
        return False
    conn.execute("RELEASE hermes_ops_session")
    counts.add(one)
    return not chunk


def _delete_session(
    conn: sqlite3.Connection, schema: Schema, sid: str, chunk: int, has_prompts: bool, counts: PruneResult
) -> None:
    """One session's statements: ``chunk`` > 0 deletes only that many of its oldest messages.

    A session deleted in slices gets its fence in the first (upstream's gateway admits nothing to a
    retired session), is checked for new ledger work before each further one, and is recorded
    (apply.undo) until its row goes in the last."""
    if chunk:  # a slice of a session larger than batch_size, oldest messages first
        _delete_slice(conn, schema, sid, chunk, counts)
        return
    undo = schema.get("_undo")
    recorded = undo if undo is not None and undo.recording() == sid else None
    if recorded is not None:
        recorded.active(True)
    _delete_sessions(conn, schema, [sid], has_prompts, counts)
    if recorded is not None:
        recorded.finish()


def _delete_slice(conn: sqlite3.Connection, schema: Schema, sid: str, chunk: int, counts: PruneResult) -> None:
    """The ``chunk`` oldest messages of ``sid``, its delete recorded (a prune with slices has its undo)."""
    undo: SessionUndo = schema["_undo"]
    first = undo.recording() != sid
    if is_fenced(schema):
        _refuse_live_work(conn, schema, sid, first)
    if first:
        undo.start(sid)
    undo.active(True)
    if first and is_fenced(schema):
        fence_retire(conn, schema["tables"], [sid])
        if undo.expected is not None and undo.fence_records() != undo.expected:
            raise FenceRefused("its fence changed between its listing and its first slice (retried next run)")
    counts.messages += conn.execute(
        "DELETE FROM messages WHERE id IN "
        "(SELECT id FROM messages WHERE session_id = ? ORDER BY timestamp, id LIMIT ?)",
        (sid, chunk),
    ).rowcount
    undo.active(False)


def _refuse_live_work(conn: sqlite3.Connection, schema: Schema, sid: str, first: bool) -> None:
    """Before a slice: the ledger work the gateway admitted for ``sid`` since the plan refuses it
    (FenceRefused), as what the fence leaves to Hermes does."""
    guarded = LEDGER_GUARD in schema["catalogue"]["raises"].values()
    if fence_check(conn, sid, schema.get("_conversations") or {}, guarded):
        when = "since the plan" if first else "during its delete"
        raise FenceRefused("the gateway admitted work for it %s (session_busy)" % when)


def _delete_sessions(
    conn: sqlite3.Connection, schema: Schema, sids: list[str], has_prompts: bool, counts: PruneResult
) -> None:
    """Whole sessions, a statement per table for all of them (``IN`` lists of at most IN_LIST ids).

    Children come before parents in the plan's order, so a parent's children are either in
    ``sids`` (deleted with it, not counted as orphaned) or kept: those are orphaned, as Hermes does.
    """
    for start in range(0, len(sids), IN_LIST):
        part = sids[start : start + IN_LIST]
        marks = ",".join("?" * len(part))
        prompts = []
        if has_prompts:
            prompts = [
                row[0]
                for row in conn.execute(
                    "SELECT DISTINCT system_prompt_hash FROM sessions WHERE id IN (%s) "
                    "AND system_prompt_hash IS NOT NULL" % marks,
                    part,
                )
            ]
        if is_fenced(schema):  # upstream's deletion fence, in this transaction, before the rows go
            conversations = schema.get("_conversations") or {}
            guarded = LEDGER_GUARD in schema["catalogue"]["raises"].values()
            live = [sid for sid in part if fence_check(conn, sid, conversations, guarded, part)]
            fence_retire(conn, schema["tables"], [sid for sid in part if sid not in live])
        elif schema.get("catalogue", {}).get("ledger"):
            for sid in part:
                retire_ledger(conn, schema, sid)
        # A sweep orphans children as 0.22.2's prune_sessions does: no runtime_revision bump (upstream's
        # retire_prunable at 4f64356 has none; only its explicit delete_in_transaction bumps it).
        counts.orphaned += conn.execute(
            "UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id IN (%s) AND id NOT IN (%s)"
            % (marks, marks),
            part + part,
        ).rowcount
        counts.messages += conn.execute("DELETE FROM messages WHERE session_id IN (%s)" % marks, part).rowcount
        conn.execute("DELETE FROM sessions WHERE id IN (%s)" % marks, part)
        if prompts:
            counts.prompts += conn.execute(
                "DELETE FROM system_prompts WHERE hash IN (%s) AND NOT EXISTS "
                "(SELECT 1 FROM sessions WHERE system_prompt_hash = system_prompts.hash)"
                % ",".join("?" * len(prompts)),
                prompts,
            ).rowcount


def is_fenced(schema: Schema) -> bool:
    """A store with the gateway runtime ledger gets upstream's whole deletion fence."""
    return bool(schema.get("catalogue", {}).get("ledger")) and "state_meta" in schema["tables"]


def _refused_by(exc: BaseException, schema: Schema) -> str | None:
    """The trigger whose RAISE(ABORT|FAIL) refused a delete, or the ledger's RESTRICT foreign key;
    None for any other integrity error (a bug: the profile fails)."""
    catalogue = schema.get("catalogue")
    message = str(exc)
    trigger = catalogue["raises"].get(message) if catalogue else None
    if trigger:
        return "trigger %s" % trigger
    if getattr(exc, "sqlite_errorname", None) == "SQLITE_CONSTRAINT_TRIGGER":
        return "a trigger"
    if catalogue and catalogue["ledger"] and message == "FOREIGN KEY constraint failed":
        return "the runtime ledger's foreign key (ON DELETE RESTRICT)"
    return None


def _write_pending(path: str, files: dict[str, list[str]]) -> None:
    with open(path, "w") as handle:
        json.dump(files, handle)


def pending_durable(path: str) -> None:
    """The transcript list's data and its name, before the transaction whose commit relies on it."""
    fsync_tree(path)


def removals_durable(paths: list[str]) -> None:
    """The unlinks of ``paths`` durable (their directories' fsync), before the list naming them goes."""
    for directory in sorted({os.path.dirname(os.path.abspath(path)) for path in paths}):
        try:
            fsync_path(directory)
        except FileNotFoundError:
            continue


def finish_pending(conn: sqlite3.Connection, path: str) -> int:
    """Remove the transcripts an interrupted run listed, of the sessions whose deletion committed.

    A session still in the database (its transaction never committed) keeps its files.
    """
    try:
        with open(path) as handle:
            files = json.load(handle)
    except FileNotFoundError:
        return 0
    except ValueError:  # cut short while written: its transaction never committed
        files = {}
    removed = 0
    gone = [sid for sid in files if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is None]
    if gone:  # that commit may still be only in the page cache
        commits_durable(conn.execute("PRAGMA database_list").fetchone()[2])
    for sid in gone:
        removed += remove_files(files[sid])
    removals_durable([name for sid in gone for name in files[sid]])
    remove_files([path])
    return removed


class Whole(list[tuple[str, int]]):
    """A batch deleted in one group of one transaction, never split: a local conversation's segments."""


def _batches(plan: Plan, batch_size: int) -> Iterator[Batch]:
    """Yield lists of (session id, chunk): chunk>0 deletes that many of its messages first. A local
    conversation of several segments comes whole (``Whole``) where its first segment is."""
    batch: Batch = []
    weight = 0
    emitted: set[str] = set()
    for sid in plan.delete_order:
        if sid in emitted:
            continue
        whole = plan.conversations.get(sid)
        if whole:
            if batch:
                yield batch
                batch, weight = [], 0
            emitted.update(whole)
            yield Whole((member, 0) for member in plan.delete_order if member in set(whole))
            continue
        count = plan.messages.get(sid, 0)
        while count > batch_size:  # a session larger than a batch: delete it in slices
            if batch:
                yield batch
                batch, weight = [], 0
            yield [(sid, batch_size)]
            count -= batch_size
        if batch and weight + count > batch_size:
            yield batch
            batch, weight = [], 0
        batch.append((sid, 0))
        weight += count
    if batch:
        yield batch


def still_prunable(conn: sqlite3.Connection, sid: str, plan: Plan, schema: Schema, leased: set[str]) -> bool:
    """Re-check inside the transaction: a session resumed or leased since the plan stays."""
    cols = ["ended_at", "end_reason"] + [c for c in ("pinned", "last_activity_at") if c in schema["session_columns"]]
    row = conn.execute("SELECT %s FROM sessions WHERE id = ?" % ", ".join(cols), (sid,)).fetchone()
    if row is None or row[0] is None or leased_conversation(conn, sid, leased):
        return False
    if scheduled_sessions(conn, schema, sid):  # /heartbeat or /loop set on it since the plan
        return False
    values = dict(zip(cols, row))
    if values.get("pinned"):
        return False
    if sid in plan.delegate_root:  # goes with its parent, whatever its own age
        return True
    cutoff = plan.cutoffs.get(sid, plan.prune_cutoff)  # its source's retention (prune_days_by_source)
    if values.get("last_activity_at") is not None and values["last_activity_at"] >= cutoff:
        return False
    if values["end_reason"] == ORPHAN_REAP and values["ended_at"] >= cutoff:
        return False  # closed by Hermes's orphan sweep lately: resumable for a retention window
    newer = conn.execute(
        "SELECT 1 FROM messages WHERE session_id = ? AND timestamp >= ? LIMIT 1", (sid, cutoff)
    ).fetchone()
    return newer is None


def skip_with_ancestors(sid: str | None, plan: Plan, skipped: set[str]) -> None:
    """Keep a session and everything whose deletion depends on it going first."""
    while sid is not None and sid not in skipped and sid in plan.messages:
        skipped.add(sid)
        sid = plan.delegate_root.get(sid) or plan.parents.get(sid)


def remove_files(paths: list[str]) -> int:
    removed = 0
    for path in paths:
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            continue
    return removed
