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

from ..backup.whole_file import StampedFiles, open_partial, remove_partials
from ..plan.selection import DAY, ROUTED, SANE_MIN, leased_conversation, live_leases
from ..sqlite.db import MaintenanceError, fsync_path, ranged_rows, read_snapshot, sqlite_uri, write_transaction
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


def _days(days):
    return "%gd" % float(days)


def tombstone(days, nbytes, tool, when):
    """The body an elided tool message gets: upstream's words, then size, tool and UTC day."""
    day = time.strftime("%Y-%m-%d", time.gmtime(when))
    return "[elided: tool output older than %s - retention policy] %d bytes of %s output from %s" % (
        _days(days),
        nbytes,
        tool or "tool",
        day,
    )


class PayloadPlan:
    """The tool messages a run elides: ``items`` [(message id, session id, bytes, tombstone)]."""

    def __init__(self, days=None, cutoff=None):
        self.days = days
        self.cutoff = cutoff
        self.items = []
        self.skipped_reason = None  # why nothing is elided although tool_payload_days is set

    @property
    def bytes(self):
        return sum(item[2] for item in self.items)

    @property
    def sessions(self):
        return len({item[1] for item in self.items})

    def report(self, archive=None):
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


def unknown_content_triggers(conn):
    """Triggers on messages that an UPDATE of its content fires and the collection does not know:
    the catalogue's rules cover the prune's writes (DELETE), the elision writes an UPDATE."""
    found = []
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


def _in_halves(index, group, per_unit):
    """A group rolled back at the hard bound: none of it happened. Back to its first body, at most half
    as many per transaction, each costed twice as high."""
    return index - len(group), max(1, len(group) // 2), None if per_unit is None else per_unit * 2


def _learned(per_unit, began, committing, units):
    """The cost per unit that sizes the next group, after a transaction whose statements ran from
    ``began`` to ``committing``: a cheap transaction (no FTS5 segment flushed in it) lets the next one
    grow only halfway."""
    rate = max(committing - began, 1e-6) / units
    return rate if per_unit is None else max(rate, (per_unit + rate) / 2)


def plan_payloads(conn, schema, plan, days, now, refusal=None):
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
                payloads.items.append((mid, sid, nbytes, stone))
    return payloads


def take_payload_archive(conn, db_path, backup_dir, profile, payloads, schema_version=None):
    """The original bytes of every body ``payloads`` elides, in an owner-only file in ``backup_dir``,
    quick_checked, counted and fsynced (file, then directory) before any body changes. Returns its path."""
    remove_partials(backup_dir, profile, prefix=PAYLOAD_PREFIX, between="")
    now = time.time()
    seq = 0
    while os.path.exists(os.path.join(backup_dir, payload_archive_name(profile, now, seq))):
        seq += 1
    final = os.path.join(backup_dir, payload_archive_name(profile, now, seq))
    partial = os.path.join(backup_dir, "." + os.path.basename(final) + ".partial")
    items = payloads.items
    try:
        write_back, dst = open_partial(partial)
        try:
            dst.execute(
                "CREATE TABLE payloads (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, kind TEXT NOT NULL, "
                "body BLOB NOT NULL, bytes INTEGER NOT NULL, tombstone TEXT NOT NULL)"
            )
            dst.execute("CREATE TABLE archive_meta (key TEXT PRIMARY KEY, value TEXT)")
            start = 0
            while start < len(items):
                chunk, weight = [], 0
                while start < len(items) and len(chunk) < READ_CHUNK and (not chunk or weight < READ_BYTES):
                    chunk.append(items[start])
                    weight += items[start][2]
                    start += 1
                wanted = {item[0]: item for item in chunk}
                marks = ",".join("?" * len(chunk))
                with read_snapshot(conn):  # a few ms of read lock: a gateway commit waits for no more
                    rows = conn.execute(
                        "SELECT id, session_id, typeof(content), CAST(content AS BLOB) FROM messages "
                        "WHERE id IN (%s)" % marks,
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
            meta = {
                "kind": PAYLOAD_KIND,
                "source": os.path.abspath(db_path),
                "profile": profile,
                "created_at": repr(now),
                "schema_version": str(schema_version),
                "days": repr(payloads.days),
            }
            dst.executemany("INSERT INTO archive_meta (key, value) VALUES (?, ?)", sorted(meta.items()))
            dst.commit()
            check = [r[0] for r in dst.execute("PRAGMA quick_check").fetchall()]
            if check != ["ok"]:
                raise MaintenanceError("payload archive %s failed quick_check (%s)" % (partial, "; ".join(check[:3])))
        finally:
            dst.close()
            write_back.close()
        os.chmod(partial, 0o600)
        fsync_path(partial)
        os.rename(partial, final)
        fsync_path(backup_dir)
    except BaseException as exc:
        for leftover in (partial, partial + "-journal"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
        if isinstance(exc, (sqlite3.Error, OSError)):
            raise MaintenanceError(
                "archive of the tool payloads of %s into %s failed: %s; nothing was elided" % (db_path, final, exc)
            ) from None
        raise
    return final


class ElideResult:
    def __init__(self):
        self.elided = 0
        self.bytes = 0
        self.bytes_after = 0
        self.sessions = set()
        self.left_alone = 0  # bodies that changed since the archive, or whose session is now protected
        self.stopped = None
        self.retries = 0  # transactions interrupted at the hard bound, rolled back and retried in halves


def _protected_now(conn, sid, leased, has_pinned):
    """Inside the write transaction: the session went away, was pinned, or Hermes leased it."""
    row = conn.execute("SELECT %s FROM sessions WHERE id = ?" % ("pinned" if has_pinned else "0"), (sid,)).fetchone()
    return row is None or bool(row[0]) or leased_conversation(conn, sid, leased)


def elide(
    conn,
    schema,
    archive,
    *,
    batch_size,
    batch_time,
    pause,
    wait,
    live_rollback=False,
    stop=None,
    result=None,
    hard=None,
):
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
    pacing = IdlePacing(conn, bound, pause)
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS hermes_ops_elide "
        "(id INTEGER PRIMARY KEY, kind TEXT, body BLOB, bytes INTEGER, tombstone TEXT)"
    )
    try:
        ids = [r[0] for r in src.execute("SELECT id FROM payloads ORDER BY id")]
        sizes = dict(src.execute("SELECT id, bytes FROM payloads"))
        index, per_unit, commit, cap = 0, None, 0.0, int(batch_size)
        deadline = _Deadline()
        conn.set_progress_handler(deadline, PROGRESS_STEPS)
        with persistent_journal(conn):
            while index < len(ids):
                result.stopped = stop() if stop else None
                if result.stopped:
                    break
                held_for = pacing.bound()
                room = max(held_for - commit, held_for * MIN_ROOM) * FIRST_GROUP_SHARE
                group, weight, units = [], 0, 0
                while index < len(ids) and len(group) < cap:
                    nbytes = sizes[ids[index]]
                    if group and weight + nbytes > GROUP_BYTES:
                        break
                    if group and held_for and (per_unit is None and len(group) >= FIRST_GROUP):
                        break
                    if group and held_for and per_unit is not None and (units + nbytes + ROW_UNITS) * per_unit > room:
                        break
                    group.append(ids[index])
                    weight += nbytes
                    units += nbytes + ROW_UNITS
                    index += 1
                deadline.hard = _hard(hard, held_for, commit) if len(group) > 1 else None
                try:
                    began, committing = _elide_group(conn, schema, src, group, has_pinned, result, deadline)
                except sqlite3.OperationalError:
                    if not deadline.tripped:
                        raise
                    # Held past the hard bound (an FTS5 merge inside the UPDATE, a preempted process):
                    # SQLite rolled the transaction back, none of it happened. Its bodies again, in halves.
                    result.retries += 1
                    index, cap, per_unit = _in_halves(index, group, per_unit)
                    held = time.monotonic() - deadline.began
                    wait(held, pacing.pause(held))
                    pacing.observe()
                    continue
                cap = int(batch_size)
                held = time.monotonic() - began
                commit = time.monotonic() - committing
                per_unit = _learned(per_unit, began, committing, units)
                wait(held, pacing.pause(held))
                pacing.observe()  # did the gateway commit during that transaction's turn?
    finally:
        conn.set_progress_handler(None, 0)
        src.close()
    return result


class _Deadline:
    """SQLite's progress handler for the elision: stops the running statement once ``hard`` seconds
    have passed since ``began`` (None: never), and says so (``tripped``); never during the COMMIT."""

    def __init__(self):
        self.hard, self.began, self.tripped, self.armed = None, 0.0, False, False

    def start(self):
        """Called once the transaction holds the lock: the time waited for it held no one up, and a
        BEGIN interrupted after it took the lock would leave the transaction open."""
        self.began, self.tripped, self.armed = time.monotonic(), False, self.hard is not None
        return self.began

    def __call__(self):
        if self.armed and time.monotonic() - self.began > self.hard:
            self.tripped, self.armed = True, False
            return 1
        return 0


def _hard(hard, held_for, commit):
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
    limit = hard_bound(held_for)
    return limit - min(commit, limit / 3.0)


def _elide_group(conn, schema, src, group, has_pinned, result, deadline):
    """One write transaction: the bodies of ``group`` (archived message ids) still as archived become
    their tombstones. Returns (when it began, when its COMMIT began), monotonic."""
    marks = ",".join("?" * len(group))
    rows = src.execute(
        "SELECT id, session_id, kind, body, bytes, tombstone FROM payloads WHERE id IN (%s)" % marks, group
    ).fetchall()
    deadline.tripped = deadline.armed = False
    with write_transaction(conn):
        began = deadline.start()
        try:
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
            conn.execute(
                "UPDATE main.messages SET content = "
                "(SELECT t.tombstone FROM temp.hermes_ops_elide t WHERE t.id = messages.id) "
                "WHERE id IN (SELECT id FROM temp.hermes_ops_elide)"
            )
            conn.execute("DELETE FROM temp.hermes_ops_elide")
        finally:
            # the COMMIT runs whole, and so does write_transaction's ROLLBACK after an interrupt
            deadline.armed = False
        committing = time.monotonic()
    result.elided += len(done)
    result.bytes += sum(r[2] for r in done)
    result.bytes_after += sum(len(r[3].encode()) for r in done)
    result.sessions.update(r[1] for r in done)
    result.left_alone += len(rows) - len(done)
    return began, committing


OPTIMIZE_PAGES = 256  # FTS5 pages one step of the incremental optimize writes (as the reclaim's merge step)
OPTIMIZE_MAX_STEPS = 4000


def fts_optimize(conn, fts, wait, stop=None):
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
    steps, problems = 0, []
    version = conn.execute("PRAGMA data_version").fetchone()[0]
    for table in fts:
        if table["error"] or (stop and stop()):
            continue
        name = '"%s"' % table["name"].replace('"', '""')
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


def open_payload_archive(path):
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


def plan_restore(conn, archives, session_ids=None):
    """What a payload restore puts back: [(archive path, message id, session id, bytes, tombstone)] of
    the archived bodies whose message still holds the tombstone written in their place (a body elided
    twice is taken from the newest archive that has it). Reads state.db a message at a time."""
    found, seen = [], set()
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


def live_tombstones(conn, session_ids=None):
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
    found = {}
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


def match_backup(backup, path, stones):
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
    found, refused = [], {}
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


def _mismatch(live, row, cols):
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


def _archive_rows(src, group):
    marks = ",".join("?" * len(group))
    return src.execute(
        "SELECT id, session_id, kind, body, bytes, tombstone FROM payloads WHERE id IN (%s)" % marks,
        [g[0] for g in group],
    ).fetchall()


def _backup_rows(src, group):
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


def restore_payloads(conn, todo, *, pause, chunk_bytes=GROUP_BYTES, backups=(), bound=RESTORE_BOUND, wait=None):
    """Put the bodies ``plan_restore`` or ``match_backup`` listed back, byte for byte (a text body as
    text), where the tombstone still is. A path in ``backups`` is a whole-file backup (its
    ``messages``), any other a payload archive. Returns {"restored", "bytes", "sessions"}.

    Paced as the elision is: a transaction takes as many bodies as fit in ``bound`` (plus
    ROLLBACK_COMMIT_TIME in rollback-journal mode) at the rate per byte measured in the last one
    (the first FIRST_GROUP bodies), at most ``chunk_bytes``; one still running past the hard bound
    is rolled back and retried in halves; after each COMMIT the gateway's turn (``wait(held)``,
    by default ``turn_after_commit`` with ``pause``). Re-indexing a body costs as much as elision
    saved: in transactions of a fixed 8 MB a 0.22.2 writer appending every 20 ms waited 1.7 s."""
    done = {"restored": 0, "bytes": 0, "sessions": set()}
    by_source = {}
    for path, mid, sid, nbytes, stone in todo:
        by_source.setdefault(path, []).append((mid, sid, nbytes, stone))
    wait = wait or turn_after_commit(conn, pause)
    rollback = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal"
    held_for = float(bound) + (ROLLBACK_COMMIT_TIME if rollback and bound else 0.0)
    per_unit, commit = None, 0.0
    deadline = _Deadline()
    conn.set_progress_handler(deadline, PROGRESS_STEPS)
    try:
        with persistent_journal(conn):
            for path, entries in by_source.items():
                if path in backups:
                    src, fetch = sqlite3.connect(sqlite_uri(path, mode="ro", immutable="1"), uri=True), _backup_rows
                else:
                    src, fetch = open_payload_archive(path)[0], _archive_rows
                try:
                    index, cap = 0, len(entries)
                    while index < len(entries):
                        room = max(held_for - commit, held_for * MIN_ROOM) * FIRST_GROUP_SHARE
                        group, weight, units = [], 0, 0
                        while index < len(entries) and len(group) < cap:
                            nbytes = entries[index][2]
                            if group and weight + nbytes > chunk_bytes:
                                break
                            if group and held_for and per_unit is None and len(group) >= FIRST_GROUP:
                                break
                            if (
                                group
                                and held_for
                                and per_unit is not None
                                and ((units + nbytes + ROW_UNITS) * per_unit > room)
                            ):
                                break
                            group.append(entries[index])
                            weight += nbytes
                            units += nbytes + ROW_UNITS
                            index += 1
                        rows = fetch(src, group)
                        deadline.hard = _hard(None, held_for, commit) if len(group) > 1 else None
                        try:
                            began, committing = _restore_group(conn, rows, deadline, done)
                        except sqlite3.OperationalError:
                            if not deadline.tripped:
                                raise
                            # past the hard bound: rolled back whole (write_transaction), nothing of it counted;
                            # again, in halves
                            index, cap, per_unit = _in_halves(index, group, per_unit)
                            wait(time.monotonic() - deadline.began)
                            continue
                        cap = len(entries)
                        held = time.monotonic() - began
                        commit = time.monotonic() - committing
                        per_unit = _learned(per_unit, began, committing, units)
                        wait(held)
                finally:
                    src.close()
    finally:
        conn.set_progress_handler(None, 0)
    done["sessions"] = sorted(done["sessions"])
    return done


def _restore_group(conn, rows, deadline, done):
    """One write transaction: ``rows`` (as ``_archive_rows`` gives them) back where their tombstone
    still is, by one UPDATE (FTS5 writes a segment per statement that changed it: one per body
    fragmented both indexes, and their merges held the lock for up to 2 s); ``done`` counts them
    once it has committed. Returns (when it began, when its COMMIT began), monotonic."""
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS hermes_ops_restore "
        "(id INTEGER PRIMARY KEY, session_id TEXT, kind TEXT, body BLOB, bytes INTEGER, tombstone TEXT)"
    )
    deadline.tripped = deadline.armed = False
    with write_transaction(conn):
        began = deadline.start()
        try:
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
            conn.execute(
                "UPDATE main.messages SET content = (SELECT CASE WHEN t.kind = 'text' THEN CAST(t.body AS TEXT) "
                "ELSE t.body END FROM temp.hermes_ops_restore t WHERE t.id = messages.id) "
                "WHERE id IN (SELECT id FROM temp.hermes_ops_restore)"
            )
            conn.execute("DELETE FROM temp.hermes_ops_restore")
        finally:
            # the COMMIT runs whole, and so does the ROLLBACK after an error: interrupted, it left the
            # transaction open and the next group's BEGIN failed ("within a transaction")
            deadline.armed = False
        committing = time.monotonic()
    done["restored"] += len(changed)
    done["bytes"] += sum(n for _sid, n in changed)
    done["sessions"].update(sid for sid, _n in changed)
    return began, committing
