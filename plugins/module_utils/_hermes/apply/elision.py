# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tool-payload retention: old ``role='tool'`` message bodies of kept sessions become tombstones.

Most of a long-lived state.db is tool output (web extracts, terminal dumps, browser trees) and
the two FTS indexes over it. ``tool_payload_days`` keeps every conversation and replaces the
content of tool messages older than that with a short tombstone saying what was there:

    [elided: tool output older than 30d - retention policy] 48213 bytes of terminal output from 2026-08-01

Its first part is the tombstone of Hermes's own proposed ``SessionDB.elide_old_tool_payloads``
(NousResearch/hermes-agent PR #110543, read in its test ``_TOMBSTONE``), so a release that
merges it sees ours as its own (it skips a body that already starts with ``[elided:``); the
size, the tool and the day follow, so a reader knows what was there.

``plan_payloads`` selects (reads only; check mode reports it, the run executes it): tool
messages older than the cutoff, larger than their tombstone, not yet elided, in sessions the
prune keeps and no rule protects (pinned, leased, the runtime ledger's fence, rows of objects
the collection does not know); nothing at all when the catalogue holds objects it does not
know or an FTS index cannot run its triggers. ``take_payload_archive`` writes the original
bytes of every selected body to an owner-only ``hermes-ops-payloads_<profile>_<time>.db``
in the backup directory, reading in short read transactions, verified and fsynced (file and
directory) before the first body changes. ``elide`` then updates the bodies in short paced
write transactions, each one comparing the body with its archived bytes first (a body that
changed since is left alone); Hermes's own ``UPDATE`` triggers keep both FTS indexes in step.
``restore_payloads`` puts archived bodies back, byte for byte, where the tombstone still is; from a
whole-file backup, ``match_backup`` first accepts only the rows the tombstones describe.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, TypeVar

from ..backup.archive import ArchivePaths, new_archive_paths, write_archive, write_archive_meta
from ..backup.whole_file import StampedFiles, WriteBack, remove_partials
from ..plan.selection import DAY, ROUTED, SANE_MIN, Plan, leased_conversation, live_leases
from ..sqlite.db import MaintenanceError, quoted, ranged_rows, read_snapshot, sqlite_uri, write_transaction
from ..store.schema import Schema
from .prune import (
    FIRST_GROUP_SHARE,
    PROGRESS_STEPS,
    ROLLBACK_COMMIT_TIME,
    IdlePacing,
    hard_bound,
    persistent_journal,
    turn_after_commit,
)

PAYLOAD_PREFIX = "hermes-ops-payloads_"
PAYLOAD_KIND = "tool payloads"
# Upstream's tombstone starts so; a body that does is never elided again (a second run is a no-op).
TOMBSTONE_HEAD = "[elided: tool output"
ID_WINDOW = 5000  # most message ids per read statement of the selection: each its own short read
ID_FIRST = 1000  # ... in the first one (then ranged_rows sizes them)
READ_CHUNK = 200  # bodies per read transaction of the archive
READ_BYTES = 4 * 1024 * 1024  # ... and at most about this many bytes
FIRST_GROUP = 8  # bodies in the first write transaction, before a rate is measured
# What one body costs beyond its bytes (its row's lookups, the triggers' statements), in bytes.
ROW_UNITS = 2048
MIN_ROOM = 0.5  # share of a transaction's bound its bodies get however long the last COMMIT took
GROUP_BYTES = 8 * 1024 * 1024  # most original bytes compared in one write transaction


PAYLOAD_ARCHIVES = StampedFiles(PAYLOAD_PREFIX)
payload_archive_name = PAYLOAD_ARCHIVES.name
is_payload_archive_name = PAYLOAD_ARCHIVES.is_name
list_payload_archives = PAYLOAD_ARCHIVES.list

# What a payload restore puts back: (archive or backup path, message id, session id, bytes, tombstone)
PayloadRestore = tuple[str, int, str, int, str]
# A body as an archive holds it: (message id, session id, typeof(content), body, bytes, tombstone)
ArchivedBody = tuple[int, str, str, bytes, int, str]
Changed = TypeVar("Changed")
Wait = Callable[[float], None]  # the gateway's turn after a transaction that held the lock that long


def _days(days: float) -> str:
    return "%gd" % float(days)


def tombstone(days: float, nbytes: int, tool: str | None, when: float) -> str:
    """The body an elided tool message gets: upstream's words, then size, tool and UTC day."""
    day = time.strftime("%Y-%m-%d", time.gmtime(when))
    return "[elided: tool output older than %s - retention policy] %d bytes of %s output from %s" % (
        _days(days),
        nbytes,
        tool or "tool",
        day,
    )


class PayloadItem(NamedTuple):
    """One tool message a run elides."""

    message_id: int
    session_id: str
    bytes: int
    tombstone: str


class PayloadPlan:
    """The tool messages a run elides: ``items`` [PayloadItem]."""

    def __init__(self, days: float | None = None, cutoff: float | None = None) -> None:
        self.days = days
        self.cutoff = cutoff
        self.items: list[PayloadItem] = []
        self.skipped_reason: str | None = None  # why nothing is elided although tool_payload_days is set

    @property
    def bytes(self) -> int:
        return sum(item[2] for item in self.items)

    @property
    def sessions(self) -> int:
        return len({item[1] for item in self.items})

    def report(self, archive: str | None = None) -> dict[str, Any]:
        """The result's ``tool_payloads`` as planned (its keys are the result table's; the run adds what it did)."""
        return {
            "days": self.days,
            "elided": len(self.items),
            "bytes": self.bytes,
            "bytes_after": sum(len(item[3].encode()) for item in self.items),
            "sessions": self.sessions,
            "archive": archive,
            "skipped_reason": self.skipped_reason,
        }


# Hermes's own triggers that an UPDATE of messages.content fires (0.20+; older layouts have only
# the FTS pair): they keep the full-text indexes and the display bookkeeping in step.
KNOWN_UPDATE_TRIGGERS = ("messages_fts_update", "messages_fts_trigram_update", "messages_display_identity_update")
_UPDATE_HEAD = re.compile(
    r"\bUPDATE\s+(?:OF\s+(?P<columns>[^;]*?)\s+)?ON\s+[\"`\[]?messages[\"`\]]?\s", re.IGNORECASE | re.DOTALL
)
_TRIGGER_EVENT = re.compile(r"\b(?:BEFORE|AFTER|INSTEAD\s+OF)\s+(INSERT|DELETE|UPDATE)\b", re.IGNORECASE)


def unknown_content_triggers(conn: sqlite3.Connection) -> list[str]:
    """Triggers on messages that an UPDATE of its content fires and the collection does not know:
    the catalogue's rules cover the prune's writes (DELETE), the elision writes an UPDATE."""
    found: list[str] = []
    rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'")
    for name, sql in rows:
        if name in KNOWN_UPDATE_TRIGGERS:
            continue
        event = _TRIGGER_EVENT.search(sql or "")
        if event and event.group(1).upper() != "UPDATE":
            continue
        head = _UPDATE_HEAD.search(sql or "")
        columns = head.group("columns") if head else None
        if head and columns is not None:
            names = {c.strip().strip('"`[]').lower() for c in columns.split(",")}
            if "content" not in names:
                continue
        found.append(name)
    return sorted(found)


def plan_payloads(
    conn: sqlite3.Connection,
    schema: Schema,
    plan: Plan,
    days: float | None,
    now: float,
    refusal: str | None = None,
) -> PayloadPlan | None:
    """The tool bodies to elide in one profile (reads only, in short statements over id ranges).

    ``plan``: the profile's row plan (its deleted sessions are not touched here, and neither are
    the ones it keeps for a reason: ``plan.protected``). ``refusal``: why nothing may change
    (unknown catalogue objects, an FTS index this SQLite cannot update), or None.
    """
    if days is None:
        return None
    payloads = PayloadPlan(float(days), now - float(days) * DAY)
    if "messages" not in schema["tables"]:
        return payloads
    unknown = unknown_content_triggers(conn)
    if unknown and not refusal:
        refusal = "trigger(s) %s on messages (unknown to this collection) fire on an update of its content" % (
            ", ".join(unknown)
        )
    if refusal:
        payloads.skipped_reason = refusal + ": no tool payload is elided"
        return payloads
    cols = {r[1] for r in conn.execute("SELECT * FROM pragma_table_info('messages')")}
    if not {"role", "content", "timestamp", "session_id"} <= cols:
        payloads.skipped_reason = "messages lacks role, content, timestamp or session_id"
        return payloads
    tool = "tool_name" if "tool_name" in cols else "NULL"
    doomed = set(plan.delete_order)
    untouched = {sid for sid, why in plan.protected.items() if why != ROUTED} | doomed
    top = conn.execute("SELECT MAX(id) FROM messages").fetchone()[0] or 0
    sql = (
        "SELECT id, session_id, length(CAST(content AS BLOB)), %s, timestamp FROM messages "
        "WHERE id >= ? AND id < ? AND role = 'tool' AND content IS NOT NULL "
        "AND typeof(timestamp) IN ('integer', 'real') AND timestamp >= ? AND timestamp < ? "
        "AND substr(content, 1, %d) IS NOT ? ORDER BY id" % (tool, len(TOMBSTONE_HEAD))
    )
    args = (SANE_MIN, payloads.cutoff, TOMBSTONE_HEAD)
    for rows in ranged_rows(conn, sql, 0, top, first=ID_FIRST, most=ID_WINDOW, args=args):
        for mid, sid, nbytes, tool_name, stamp in rows:
            if sid in untouched:
                continue
            stone = tombstone(days, nbytes, tool_name, stamp)
            if nbytes > len(stone.encode()):  # only where the tombstone is smaller than the body
                payloads.items.append(PayloadItem(mid, sid, nbytes, stone))
    return payloads


def take_payload_archive(
    conn: sqlite3.Connection,
    db_path: str,
    backup_dir: str,
    profile: str,
    payloads: PayloadPlan,
    schema_version: object = None,
) -> str:
    """The original bytes of every body ``payloads`` elides, in an owner-only file in ``backup_dir``,
    quick_checked, counted and fsynced (file, then directory) before any body changes. Returns its path."""
    remove_partials(backup_dir, profile, prefix=PAYLOAD_PREFIX, between="")
    now = time.time()
    paths = new_archive_paths(backup_dir, PAYLOAD_ARCHIVES, profile, now)

    def fill(dst: sqlite3.Connection, write_back: WriteBack) -> None:
        dst.execute(
            "CREATE TABLE payloads (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, kind TEXT NOT NULL, "
            "body BLOB NOT NULL, bytes INTEGER NOT NULL, tombstone TEXT NOT NULL)"
        )
        dst.execute("CREATE TABLE archive_meta (key TEXT PRIMARY KEY, value TEXT)")
        _copy_bodies(conn, dst, write_back, payloads.items)
        meta = {
            "kind": PAYLOAD_KIND,
            "source": os.path.abspath(db_path),
            "profile": profile,
            "created_at": repr(now),
            "schema_version": str(schema_version),
            "days": repr(payloads.days),
        }
        write_archive_meta(dst, meta)
        _check_payload_archive(dst, paths)

    write_archive(backup_dir, paths, fill, "archive of the tool payloads of %s" % db_path, "nothing was elided")
    return paths.final


def _read_groups(items: list[PayloadItem]) -> Iterable[list[PayloadItem]]:
    """``items`` in the archive's read groups: READ_CHUNK bodies, or fewer adding up to READ_BYTES."""
    start = 0
    while start < len(items):
        chunk: list[PayloadItem] = []
        weight = 0
        while start < len(items) and len(chunk) < READ_CHUNK and (not chunk or weight < READ_BYTES):
            chunk.append(items[start])
            weight += items[start][2]
            start += 1
        yield chunk


def _copy_bodies(
    conn: sqlite3.Connection, dst: sqlite3.Connection, write_back: WriteBack, items: list[PayloadItem]
) -> None:
    """The bodies of ``items`` as state.db holds them now, each read group its own short read."""
    for chunk in _read_groups(items):
        wanted = {item[0]: item for item in chunk}
        marks = ",".join("?" * len(chunk))
        with read_snapshot(conn):  # a few ms of read lock: a gateway commit waits for no more
            rows = conn.execute(
                "SELECT id, session_id, typeof(content), CAST(content AS BLOB) FROM messages WHERE id IN (%s)" % marks,
                list(wanted),
            ).fetchall()
        dst.executemany(
            "INSERT INTO payloads (id, session_id, kind, body, bytes, tombstone) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (mid, sid, kind, body, len(body), wanted[mid][3])
                for mid, sid, kind, body in rows
                if body is not None and sid == wanted[mid][1]
            ],
        )
        dst.commit()
        write_back()


def _check_payload_archive(dst: sqlite3.Connection, paths: ArchivePaths) -> None:
    check = [r[0] for r in dst.execute("PRAGMA quick_check").fetchall()]
    if check != ["ok"]:
        raise MaintenanceError("payload archive %s failed quick_check (%s)" % (paths.partial, "; ".join(check[:3])))


class ElideResult:
    def __init__(self) -> None:
        self.elided = 0
        self.bytes = 0
        self.bytes_after = 0
        self.sessions: set[str] = set()
        self.left_alone = 0  # bodies that changed since the archive, or whose session is now protected
        self.stopped: str | None = None
        self.retries = 0  # transactions interrupted at the hard bound, rolled back and retried in halves


def _protected_now(conn: sqlite3.Connection, sid: str, leased: set[str], has_pinned: bool) -> bool:
    """Inside the write transaction: the session went away, was pinned, or Hermes leased it."""
    row = conn.execute("SELECT %s FROM sessions WHERE id = ?" % ("pinned" if has_pinned else "0"), (sid,)).fetchone()
    return row is None or bool(row[0]) or bool(leased_conversation(conn, sid, leased))


@dataclass
class _Pace:
    """What sizes the next write transaction of the elision or a payload restore: the cost per unit
    (a body's bytes and ROW_UNITS) measured in the last one, how long its COMMIT took, and the most
    bodies the next one may take (``cap``: fewer after a rollback at the hard bound)."""

    cap: int
    per_unit: float | None = None
    commit: float = 0.0

    def group_end(self, sizes: Sequence[int], index: int, held_for: float, most_bytes: int) -> tuple[int, int]:
        """The next group, from ``index``: (the index after its last body, its units). As many bodies as
        fit in ``held_for`` at the rate measured, less the last COMMIT's time (FIRST_GROUP before a rate
        is known), at most ``cap`` of them and ``most_bytes``; always one."""
        room = max(held_for - self.commit, held_for * MIN_ROOM) * FIRST_GROUP_SHARE
        end, weight, units = index, 0, 0
        while end < len(sizes) and end - index < self.cap:
            nbytes, taken = sizes[end], end - index
            if taken and weight + nbytes > most_bytes:
                break
            if taken and held_for and self.per_unit is None and taken >= FIRST_GROUP:
                break
            if taken and held_for and self.per_unit is not None and (units + nbytes + ROW_UNITS) * self.per_unit > room:
                break
            weight += nbytes
            units += nbytes + ROW_UNITS
            end += 1
        return end, units

    def halved(self, index: int, taken: int) -> int:
        """A group rolled back at the hard bound: none of it happened. Back to its first body (the index
        returned), at most half as many per transaction, each costed twice as high."""
        self.cap = max(1, taken // 2)
        self.per_unit = None if self.per_unit is None else self.per_unit * 2
        return index - taken

    def learn(self, began: float, committing: float, units: int, cap: int) -> float:
        """After a transaction whose statements ran from ``began`` to ``committing``: the cost per unit
        that sizes the next group (a cheap transaction, no FTS5 segment flushed in it, lets the next one
        grow only halfway), the COMMIT's time, ``cap`` again. Returns how long it held the lock."""
        ended = time.monotonic()
        rate = max(committing - began, 1e-6) / units
        self.per_unit = rate if self.per_unit is None else max(rate, (self.per_unit + rate) / 2)
        self.commit, self.cap = ended - committing, cap
        return ended - began


def elide(
    conn: sqlite3.Connection,
    schema: Schema,
    archive: str,
    *,
    batch_size: int,
    batch_time: float,
    pause: float,
    wait: Callable[[float, float], object],
    live_rollback: bool = False,
    stop: Callable[[], str | None] | None = None,
    result: ElideResult | None = None,
    hard: float | None = None,
) -> ElideResult:
    """Replace the archived bodies with their tombstones, in write transactions of at most
    ``batch_size`` bodies, each holding the lock about as long as one of the prune's: ``batch_time``,
    plus ROLLBACK_COMMIT_TIME for the COMMIT with ``live_rollback`` (rollback-journal mode beside a
    live gateway), grown while no other connection commits (IdlePacing). After each commit the
    gateway's turn (``wait(held, pause)``, apply.prune.turn_after_commit), its pause IdlePacing's.

    A transaction takes as many bodies as fit in the bound at the rate measured in the last one,
    less the last COMMIT's time (the first transaction FIRST_GROUP bodies); the rate is per byte
    (each body's bytes and ROW_UNITS for its row): tool output runs from a few hundred bytes to
    megabytes, and a count sized on small bodies held the lock for twice the bound on large ones. The COMMIT's cost is
    fixed per transaction (10-25 ms in rollback-journal mode, several times that while the disk
    is busy): when it alone eats the bound, the bodies still get MIN_ROOM of it, or the
    transactions shrink to one body each and the elision crawls (7-10 bodies/s) while the
    gateway waits no less.

    A transaction's bodies are changed by one UPDATE (FTS5 writes a segment per statement that
    changed it, so one per body would fragment both indexes); only those whose live bytes still
    equal the archived ones, in sessions still there, unpinned and unleased. ``result`` (an
    ElideResult) is updated as each transaction commits. ``hard``: seconds after a transaction's BEGIN
    past which its running statement is interrupted (default: ``_hard``'s)."""
    result = result or ElideResult()
    src = sqlite3.connect("file:%s?mode=ro" % os.path.abspath(archive), uri=True)
    has_pinned = "pinned" in schema["session_columns"]
    bound = float(batch_time) + (ROLLBACK_COMMIT_TIME if live_rollback and batch_time else 0.0)
    elision = _Elision(conn, schema, src, has_pinned, result, IdlePacing(conn, bound, pause), wait, hard)
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS hermes_ops_elide "
        "(id INTEGER PRIMARY KEY, kind TEXT, body BLOB, bytes INTEGER, tombstone TEXT)"
    )
    try:
        ids = [r[0] for r in src.execute("SELECT id FROM payloads ORDER BY id")]
        sizes = dict(src.execute("SELECT id, bytes FROM payloads"))
        conn.set_progress_handler(elision.deadline, PROGRESS_STEPS)
        with persistent_journal(conn):
            elision.run(ids, [sizes[mid] for mid in ids], int(batch_size), stop)
    finally:
        conn.set_progress_handler(None, 0)
        src.close()
    return result


class _Deadline:
    """SQLite's progress handler for the elision: stops the running statement once ``hard`` seconds
    have passed since ``began`` (None: never), and says so (``tripped``); never during the COMMIT."""

    def __init__(self) -> None:
        self.hard: float | None = None
        self.began, self.tripped, self.armed = 0.0, False, False

    def start(self) -> float:
        """Called once the transaction holds the lock: the time waited for it held no one up, and a
        BEGIN interrupted after it took the lock would leave the transaction open."""
        self.began, self.tripped, self.armed = time.monotonic(), False, self.hard is not None
        return self.began

    def __call__(self) -> int:
        if self.armed and self.hard is not None and time.monotonic() - self.began > self.hard:
            self.tripped, self.armed = True, False
            return 1
        return 0


@dataclass
class _Elision:
    """One elision's write transactions (``elide``), paced and retried in halves at the hard bound."""

    conn: sqlite3.Connection
    schema: Schema
    src: sqlite3.Connection  # the payload archive
    has_pinned: bool
    result: ElideResult
    pacing: IdlePacing
    wait: Callable[[float, float], object]
    hard: float | None
    deadline: _Deadline = field(default_factory=_Deadline)

    def run(self, ids: list[int], sizes: list[int], batch_size: int, stop: Callable[[], str | None] | None) -> None:
        """The archived bodies ``ids`` (``sizes``: their bytes), a group per transaction."""
        pace, index = _Pace(batch_size), 0
        while index < len(ids):
            self.result.stopped = stop() if stop else None
            if self.result.stopped:
                break
            held_for = self.pacing.bound()
            end, units = pace.group_end(sizes, index, held_for, GROUP_BYTES)
            group = ids[index:end]
            self.deadline.hard = _hard(self.hard, held_for, pace.commit) if len(group) > 1 else None
            try:
                began, committing = _elide_group(
                    self.conn, self.schema, self.src, group, self.has_pinned, self.result, self.deadline
                )
            except sqlite3.OperationalError:
                if not self.deadline.tripped:
                    raise
                # Held past the hard bound (an FTS5 merge inside the UPDATE, a preempted process):
                # SQLite rolled the transaction back, none of it happened. Its bodies again, in halves.
                self.result.retries += 1
                index = pace.halved(end, len(group))
                self.turn(time.monotonic() - self.deadline.began)
                continue
            index = end
            self.turn(pace.learn(began, committing, units, batch_size))

    def turn(self, held: float) -> None:
        """The gateway's turn after a transaction that held the lock ``held`` seconds."""
        self.wait(held, self.pacing.pause(held))
        self.pacing.observe()  # did the gateway commit during that transaction's turn?


def _hard(hard: float | None, held_for: float, commit: float) -> float | None:
    """When a transaction's statements are interrupted, in seconds after its BEGIN: ``hard`` when
    given, else ``hard_bound`` of its time bound less the COMMIT still to come (taken as long as the
    last one), by at most a third (a slow disk must not make every transaction a retry). The COMMIT
    cannot be cut short: counted in, the whole hold ends before the 178 ms poll of a writer that has
    waited since our BEGIN more often (a 5 GB file, 3,072 transactions: 133 ms of statements and a
    95 ms COMMIT held the lock 227 ms, and that writer waited 252 ms)."""
    if not held_for:
        return None
    if hard is not None:
        return hard
    limit: float = hard_bound(held_for)
    return limit - min(commit, limit / 3.0)


def _elide_group(
    conn: sqlite3.Connection,
    schema: Schema,
    src: sqlite3.Connection,
    group: list[int],
    has_pinned: bool,
    result: ElideResult,
    deadline: _Deadline,
) -> tuple[float, float]:
    """One write transaction: the bodies of ``group`` (archived message ids) still as archived become
    their tombstones. Returns (when it began, when its COMMIT began), monotonic."""
    marks = ",".join("?" * len(group))
    rows = src.execute(
        "SELECT id, session_id, kind, body, bytes, tombstone FROM payloads WHERE id IN (%s)" % marks, group
    ).fetchall()

    def replace() -> list[tuple[int, str, int, str]]:
        leased = live_leases(conn, schema, time.time())
        blocked = {sid for sid in {r[1] for r in rows} if _protected_now(conn, sid, leased, has_pinned)}
        keep = [r for r in rows if r[1] not in blocked]
        conn.execute("DELETE FROM temp.hermes_ops_elide")
        conn.executemany(
            "INSERT INTO temp.hermes_ops_elide (id, kind, body, bytes, tombstone) VALUES (?, ?, ?, ?, ?)",
            [(r[0], r[2], r[3], r[4], r[5]) for r in keep],
        )
        # A body that changed since it was archived is not ours to replace. CROSS JOIN keeps the
        # group's few rows as the outer loop: with a plain JOIN the planner (no statistics on the
        # temp table) scanned every row of messages once per transaction, and beside a live
        # rollback-journal writer, whose commits empty our page cache, that re-read the whole
        # table each time (30,000 page reads a transaction on a 585 MB file, strace).
        conn.execute(
            "DELETE FROM temp.hermes_ops_elide WHERE id NOT IN (SELECT t.id FROM temp.hermes_ops_elide t "
            "CROSS JOIN main.messages m ON m.id = t.id WHERE m.role = 'tool' AND typeof(m.content) = t.kind "
            "AND CAST(m.content AS BLOB) = t.body)"
        )
        done = conn.execute(
            "SELECT t.id, m.session_id, t.bytes, t.tombstone FROM temp.hermes_ops_elide t "
            "CROSS JOIN main.messages m ON m.id = t.id"
        ).fetchall()
        _set_contents(conn, "hermes_ops_elide", "t.tombstone")
        return done

    done, began, committing = _bounded_write(conn, deadline, replace)
    result.elided += len(done)
    result.bytes += sum(r[2] for r in done)
    result.bytes_after += sum(len(r[3].encode()) for r in done)
    result.sessions.update(r[1] for r in done)
    result.left_alone += len(rows) - len(done)
    return began, committing


def _bounded_write(
    conn: sqlite3.Connection, deadline: _Deadline, statements: Callable[[], Changed]
) -> tuple[Changed, float, float]:
    """``statements`` in one write transaction, interrupted once ``deadline`` passes (never its BEGIN
    or COMMIT). Returns (what they returned, when it began, when its COMMIT began), monotonic."""
    deadline.tripped = deadline.armed = False
    with write_transaction(conn):
        began = deadline.start()
        try:
            changed = statements()
        finally:
            # the COMMIT runs whole, and so does write_transaction's ROLLBACK after an interrupt:
            # interrupted, it left the transaction open and the next group's BEGIN failed ("within a
            # transaction")
            deadline.armed = False
        committing = time.monotonic()
    return changed, began, committing


def _set_contents(conn: sqlite3.Connection, temp: str, value: str) -> None:
    """Every message listed in the temporary table ``temp`` gets ``value`` (an expression of its row
    ``t``) by one UPDATE: FTS5 writes a segment per statement that changed it, so one per body would
    fragment both indexes. Then ``temp`` is emptied."""
    conn.execute(
        "UPDATE main.messages SET content = (SELECT %s FROM temp.%s t WHERE t.id = messages.id) "
        "WHERE id IN (SELECT id FROM temp.%s)" % (value, temp, temp)
    )
    conn.execute("DELETE FROM temp.%s" % temp)


OPTIMIZE_PAGES = 256  # FTS5 pages one step of the incremental optimize writes (as the reclaim's merge step)
OPTIMIZE_MAX_STEPS = 4000


def fts_optimize(
    conn: sqlite3.Connection,
    fts: Sequence[Mapping[str, Any]],
    wait: Wait,
    stop: Callable[[], object] | None = None,
) -> tuple[int, list[str]]:
    """Give the elided bodies' index entries back: FTS5 keeps a replaced document's old entries, and the
    delete markers the update adds, until the segments holding them are merged, and its ordinary
    ``merge`` leaves fewer than ``usermerge`` segments of a level alone (on a 0.22.2 file the index
    grew by half after an elision of most of its bytes). ``merge`` with a negative page count is
    FTS5's incremental ``optimize``: every segment is merged into one, that many pages per step,
    each step its own short write transaction with the gateway's turn after it; it ends when a step
    changes nothing. Returns (steps taken, [what stopped a table's optimize]).

    It stops as soon as another connection has committed since its last step (``PRAGMA
    data_version``): each such commit adds an FTS5 segment, and the next negative ``merge`` then
    starts a new optimize one level higher. Beside a 0.22.2 writer appending every 20 ms a run of
    1,001 steps took ``messages_fts`` to 2,002 levels, past FTS5's limit of 2,000: from then on
    every connection, Hermes's too, failed to open the index ("vtable constructor failed")."""
    steps = 0
    problems: list[str] = []
    version = conn.execute("PRAGMA data_version").fetchone()[0]
    for table in fts:
        if table["error"] or (stop and stop()):
            continue
        name = quoted(table["name"])
        sql = "INSERT INTO %s(%s, rank) VALUES('merge', %d)" % (name, name, -OPTIMIZE_PAGES)
        failures = 0
        for _step in range(OPTIMIZE_MAX_STEPS):
            if stop and stop():
                break
            now = conn.execute("PRAGMA data_version").fetchone()[0]
            if now != version:
                problems.append(
                    "%s: another connection wrote during the optimize; left for a run without one" % table["name"]
                )
                return steps, problems
            before = conn.total_changes
            began = time.monotonic()
            try:
                with write_transaction(conn):
                    conn.execute(sql)
            except sqlite3.DatabaseError as exc:
                # A step that fails (the file busy past the timeout, an index this connection cannot
                # open) rolled back whole; retried once, then left for the next run: the elision
                # itself has committed.
                failures += 1
                wait(time.monotonic() - began)
                if failures > 1:
                    problems.append("%s: %s" % (table["name"], exc))
                    break
                continue
            failures = 0
            steps += 1
            wait(time.monotonic() - began)
            if conn.total_changes - before < 2:  # FTS5's "no more work" signal
                break
    return steps, problems


def open_payload_archive(path: str) -> tuple[sqlite3.Connection, dict[str, str]]:
    """A finished payload archive of ours (owner-only, quick_check ok, of this kind), read-only."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise MaintenanceError("payload archive %s is not a regular file: refused" % path)
    if st.st_mode & 0o022 or st.st_uid not in (os.geteuid(), 0):
        raise MaintenanceError(
            "payload archive %s is writable by others or owned by uid %d (mode %o): refused"
            % (path, st.st_uid, stat.S_IMODE(st.st_mode))
        )
    src = sqlite3.connect("file:%s?mode=ro&immutable=1" % os.path.abspath(path), uri=True)
    try:
        check = [r[0] for r in src.execute("PRAGMA quick_check").fetchall()]
        meta = dict(src.execute("SELECT key, value FROM archive_meta").fetchall()) if check == ["ok"] else {}
    except sqlite3.DatabaseError as exc:
        check, meta = [str(exc)], {}
    if check != ["ok"] or meta.get("kind") != PAYLOAD_KIND:
        src.close()
        raise MaintenanceError(
            "%s is not a complete payload archive of this collection (%s): refused"
            % (path, "quick_check: " + "; ".join(check[:3]) if check != ["ok"] else "no archive_meta of its kind")
        )
    return src, meta


def plan_restore(
    conn: sqlite3.Connection, archives: Iterable[str], session_ids: Iterable[str] | None = None
) -> list[PayloadRestore]:
    """What a payload restore puts back: [(archive path, message id, session id, bytes, tombstone)] of
    the archived bodies whose message still holds the tombstone written in their place (a body elided
    twice is taken from the newest archive that has it). Reads state.db a message at a time."""
    found: list[PayloadRestore] = []
    seen: set[int] = set()
    wanted = set(session_ids) if session_ids is not None else None
    for path in archives:
        src, _meta = open_payload_archive(path)
        try:
            listed = src.execute("SELECT id, session_id, bytes, tombstone FROM payloads ORDER BY id").fetchall()
            for mid, sid, nbytes, stone in listed:
                if mid in seen or (wanted is not None and sid not in wanted):
                    continue
                row = conn.execute(
                    "SELECT 1 FROM messages WHERE id = ? AND session_id = ? AND content IS ?", (mid, sid, stone)
                ).fetchone()
                if row:
                    seen.add(mid)
                    found.append((path, mid, sid, nbytes, stone))
        finally:
            src.close()
    return found


# Our tombstone: upstream's words, then what ``tombstone`` appends (size, tool, UTC day). Upstream's
# own tombstone (its words alone) records no size: no backup row can be checked against it.
_OURS = re.compile(
    r"^\[elided: tool output older than (?P<days>[0-9.e+-]+)d - retention policy\] (?P<bytes>[0-9]+) bytes of "
    r"(?P<tool>.+) output from (?P<day>[0-9]{4}-[0-9]{2}-[0-9]{2})$",
    re.DOTALL,
)
# Columns an elision leaves alone that tie a backup's row to the live one, when both files have them.
IDENTITY_COLUMNS = ("tool_name", "tool_call_id")


def live_tombstones(conn: sqlite3.Connection, session_ids: Iterable[str] | None = None) -> dict[int, dict[str, Any]]:
    """The tool messages of ``session_ids`` (None: of every session) that hold a tombstone of ours:
    {message id: {"session", "tombstone", "days", "bytes", "timestamp", <IDENTITY_COLUMNS>}}.
    Reads state.db in short statements over id ranges (ranged_rows)."""
    cols = {r[1] for r in conn.execute("SELECT * FROM pragma_table_info('messages')")}
    extra = ", ".join(c if c in cols else "NULL" for c in IDENTITY_COLUMNS)
    wanted = set(session_ids) if session_ids is not None else None
    top = conn.execute("SELECT MAX(id) FROM messages").fetchone()[0] or 0
    sql = (
        "SELECT id, session_id, content, timestamp, %s FROM messages WHERE id >= ? AND id < ? AND role = 'tool' "
        "AND typeof(content) = 'text' AND substr(content, 1, %d) = ? ORDER BY id" % (extra, len(TOMBSTONE_HEAD))
    )
    found: dict[int, dict[str, Any]] = {}
    for rows in ranged_rows(conn, sql, 0, top, first=ID_FIRST, most=ID_WINDOW, args=(TOMBSTONE_HEAD,)):
        for row in rows:
            mid, sid, stone, stamp = row[:4]
            ours = _OURS.match(stone)
            if not ours or (wanted is not None and sid not in wanted):
                continue
            entry = {"session": sid, "tombstone": stone, "days": float(ours.group("days")), "timestamp": stamp}
            entry["bytes"] = int(ours.group("bytes"))
            entry.update(zip(IDENTITY_COLUMNS, row[4:]))
            found[mid] = entry
    return found


def match_backup(
    backup: sqlite3.Connection, path: str, stones: Mapping[int, Mapping[str, Any]]
) -> tuple[list[PayloadRestore], dict[int, str]]:
    """Which of ``stones`` (``live_tombstones``) the whole-file backup ``backup`` (a read-only
    connection; ``path`` names it in the plan) gives back: ([(path, message id, session id, bytes,
    tombstone)], {message id: why its row is refused}).

    The tombstone carries no hash of the body, so a row is accepted only as the same message with
    the same size: the same id (Hermes's ids are AUTOINCREMENT, never reused), session, role,
    timestamp and, where both files have them, tool name and tool call id; its body the size the
    tombstone records and not itself a tombstone; and the tombstone rebuilt from it (retention,
    size, tool, day) exactly the one in state.db."""
    try:
        cols = {r[1] for r in backup.execute("SELECT * FROM pragma_table_info('messages')")}
    except sqlite3.DatabaseError as exc:
        raise MaintenanceError("backup %s: cannot read its messages: %s" % (path, exc)) from None
    if not {"id", "session_id", "role", "content", "timestamp"} <= cols:
        raise MaintenanceError("backup %s: its messages lack id, session_id, role, content or timestamp" % path)
    extra = ", ".join(c if c in cols else "NULL" for c in IDENTITY_COLUMNS)
    sql = (
        "SELECT id, session_id, role, typeof(content), length(CAST(content AS BLOB)), substr(content, 1, %d), "
        "timestamp, %s FROM messages WHERE id IN (%%s)" % (len(TOMBSTONE_HEAD), extra)
    )
    found: list[PayloadRestore] = []
    refused: dict[int, str] = {}
    ids = sorted(stones)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        rows = {r[0]: r for r in backup.execute(sql % ",".join("?" * len(chunk)), chunk).fetchall()}
        for mid in chunk:
            live, row = stones[mid], rows.get(mid)
            why = _mismatch(live, row, cols)
            if why:
                refused[mid] = why
            else:
                found.append((path, mid, live["session"], live["bytes"], live["tombstone"]))
    return found, refused


def _mismatch(live: Mapping[str, Any], row: sqlite3.Row | tuple[Any, ...] | None, cols: set[str]) -> str | None:
    """Why the backup's ``row`` is not the body ``live`` (a ``live_tombstones`` entry) replaced, or None."""
    if row is None:
        return "not in the backup"
    _mid, sid, role, kind, nbytes, head, stamp = row[:7]
    if sid != live["session"]:
        return "the backup's row belongs to session %s" % sid
    if role != "tool" or stamp != live["timestamp"]:
        return "the backup's row is another message (role %s, timestamp %r)" % (role, stamp)
    for name, value in zip(IDENTITY_COLUMNS, row[7:]):
        if name in cols and value != live[name]:
            return "the backup's row has another %s (%r, state.db %r)" % (name, value, live[name])
    if kind not in ("text", "blob") or head == TOMBSTONE_HEAD:
        return "the backup holds no original body (%s)" % ("a tombstone" if kind in ("text", "blob") else kind)
    if nbytes != live["bytes"]:
        return "the backup's body is %d bytes, the tombstone records %d" % (nbytes, live["bytes"])
    if tombstone(live["days"], nbytes, live["tool_name"], stamp) != live["tombstone"]:
        return "the tombstone was not written for the backup's row (its tool or day differ)"
    return None


def _archive_rows(src: sqlite3.Connection, group: list[RestoreEntry]) -> list[ArchivedBody]:
    marks = ",".join("?" * len(group))
    return src.execute(
        "SELECT id, session_id, kind, body, bytes, tombstone FROM payloads WHERE id IN (%s)" % marks,
        [g[0] for g in group],
    ).fetchall()


def _backup_rows(src: sqlite3.Connection, group: list[RestoreEntry]) -> list[ArchivedBody]:
    """A backup's bodies of ``group``, as the archive gives them, only where they still have the
    size and session the plan accepted (the file is read immutable, so they do)."""
    wanted = {g[0]: g for g in group}
    rows = src.execute(
        "SELECT id, session_id, typeof(content), CAST(content AS BLOB) FROM messages WHERE id IN (%s)"
        % ",".join("?" * len(group)),
        list(wanted),
    ).fetchall()
    return [
        (mid, sid, kind, body, len(body), wanted[mid][3])
        for mid, sid, kind, body in rows
        if body is not None and sid == wanted[mid][1] and len(body) == wanted[mid][2]
    ]


# Seconds one restore transaction may hold the write lock (the prune's default batch_time), plus
# ROLLBACK_COMMIT_TIME for the COMMIT in rollback-journal mode, as the elision's.
RESTORE_BOUND = 0.06


@dataclass
class _Restored:
    """What a payload restore has put back so far (counted as each transaction commits)."""

    restored: int = 0
    bytes: int = 0
    sessions: set[str] = field(default_factory=set)


# A body to put back, grouped by its source: (message id, session id, bytes, tombstone)
RestoreEntry = tuple[int, str, int, str]
Fetch = Callable[[sqlite3.Connection, list[RestoreEntry]], list[ArchivedBody]]


def restore_payloads(
    conn: sqlite3.Connection,
    todo: Iterable[PayloadRestore],
    *,
    pause: float,
    chunk_bytes: int = GROUP_BYTES,
    backups: Iterable[str] = (),
    bound: float = RESTORE_BOUND,
    wait: Wait | None = None,
) -> dict[str, Any]:
    """Put the bodies ``plan_restore`` or ``match_backup`` listed back, byte for byte (a text body as
    text), where the tombstone still is. A path in ``backups`` is a whole-file backup (its
    ``messages``), any other a payload archive. Returns {"restored", "bytes", "sessions"}.

    Paced as the elision is: a transaction takes as many bodies as fit in ``bound`` (plus
    ROLLBACK_COMMIT_TIME in rollback-journal mode) at the rate per byte measured in the last one
    (the first FIRST_GROUP bodies), at most ``chunk_bytes``; one still running past the hard bound
    is rolled back and retried in halves; after each COMMIT the gateway's turn (``wait(held)``,
    by default ``turn_after_commit`` with ``pause``). Re-indexing a body costs as much as elision
    saved: in transactions of a fixed 8 MB a 0.22.2 writer appending every 20 ms waited 1.7 s."""
    done = _Restored()
    by_source: dict[str, list[RestoreEntry]] = {}
    for path, mid, sid, nbytes, stone in todo:
        by_source.setdefault(path, []).append((mid, sid, nbytes, stone))
    turn = wait or turn_after_commit(conn, pause)
    rollback = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal"
    held_for = float(bound) + (ROLLBACK_COMMIT_TIME if rollback and bound else 0.0)
    restoring = _Restoring(conn, turn, held_for, chunk_bytes, done)
    conn.set_progress_handler(restoring.deadline, PROGRESS_STEPS)
    try:
        with persistent_journal(conn):
            for path, entries in by_source.items():
                src, fetch = _open_source(path, backups)
                try:
                    restoring.source(src, fetch, entries)
                finally:
                    src.close()
    finally:
        conn.set_progress_handler(None, 0)
    return {"restored": done.restored, "bytes": done.bytes, "sessions": sorted(done.sessions)}


def _open_source(path: str, backups: Iterable[str]) -> tuple[sqlite3.Connection, Fetch]:
    """A path in ``backups`` is a whole-file backup (its ``messages``), any other a payload archive."""
    if path in backups:
        return sqlite3.connect(sqlite_uri(path, mode="ro", immutable="1"), uri=True), _backup_rows
    return open_payload_archive(path)[0], _archive_rows


@dataclass
class _Restoring:
    """A payload restore's write transactions (``restore_payloads``): the rate learned carries from
    one source to the next."""

    conn: sqlite3.Connection
    wait: Wait
    held_for: float
    chunk_bytes: int
    done: _Restored
    deadline: _Deadline = field(default_factory=_Deadline)
    pace: _Pace = field(default_factory=lambda: _Pace(0))

    def source(self, src: sqlite3.Connection, fetch: Fetch, entries: list[RestoreEntry]) -> None:
        """The bodies ``entries`` of one source, a group per transaction."""
        index, self.pace.cap = 0, len(entries)
        sizes = [entry[2] for entry in entries]
        while index < len(entries):
            end, units = self.pace.group_end(sizes, index, self.held_for, self.chunk_bytes)
            group = entries[index:end]
            rows = fetch(src, group)
            self.deadline.hard = _hard(None, self.held_for, self.pace.commit) if len(group) > 1 else None
            try:
                began, committing = _restore_group(self.conn, rows, self.deadline, self.done)
            except sqlite3.OperationalError:
                if not self.deadline.tripped:
                    raise
                # past the hard bound: rolled back whole (write_transaction), nothing of it counted;
                # again, in halves
                index = self.pace.halved(end, len(group))
                self.wait(time.monotonic() - self.deadline.began)
                continue
            index = end
            self.wait(self.pace.learn(began, committing, units, len(entries)))


def _restore_group(
    conn: sqlite3.Connection, rows: list[ArchivedBody], deadline: _Deadline, done: _Restored
) -> tuple[float, float]:
    """One write transaction: ``rows`` (as ``_archive_rows`` gives them) back where their tombstone
    still is, by one UPDATE (FTS5 writes a segment per statement that changed it: one per body
    fragmented both indexes, and their merges held the lock for up to 2 s); ``done`` counts them
    once it has committed. Returns (when it began, when its COMMIT began), monotonic."""
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS hermes_ops_restore "
        "(id INTEGER PRIMARY KEY, session_id TEXT, kind TEXT, body BLOB, bytes INTEGER, tombstone TEXT)"
    )

    def put_back() -> list[tuple[str, int]]:
        conn.execute("DELETE FROM temp.hermes_ops_restore")
        conn.executemany(
            "INSERT INTO temp.hermes_ops_restore (id, session_id, kind, body, bytes, tombstone) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        # Only where the tombstone still is; CROSS JOIN keeps the group's rows the outer loop (see _elide_group).
        conn.execute(
            "DELETE FROM temp.hermes_ops_restore WHERE id NOT IN (SELECT t.id FROM temp.hermes_ops_restore t "
            "CROSS JOIN main.messages m ON m.id = t.id WHERE m.session_id = t.session_id "
            "AND m.content IS t.tombstone)"
        )
        changed = conn.execute("SELECT session_id, bytes FROM temp.hermes_ops_restore").fetchall()
        # a text body as text: CAST of its bytes gives them back as they were (state.db is UTF-8)
        _set_contents(conn, "hermes_ops_restore", "CASE WHEN t.kind = 'text' THEN CAST(t.body AS TEXT) ELSE t.body END")
        return changed

    changed, began, committing = _bounded_write(conn, deadline, put_back)
    done.restored += len(changed)
    done.bytes += sum(n for _sid, n in changed)
    done.sessions.update(sid for sid, _n in changed)
    return began, committing
