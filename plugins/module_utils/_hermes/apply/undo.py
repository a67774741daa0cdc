# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a session's delete has changed while it spans several transactions, so that a refusal
appearing between two of them puts the session back exactly as it was.

A session with more messages than ``batch_size`` is deleted in slices, one transaction each, its
fence (on a store with the runtime ledger) in the first and its row in the last. Between two of
them the gateway may resume it, admit new work for it, lease it, or its store's guard may refuse
the final delete. The user's history must then be whole again: Hermes loads it as context.

Temporary triggers of the maintenance connection (no other connection sees them) copy each row
the delete removes or changes, and name each row it adds, into temporary tables, while the
switch row in ``hermes_ops_undo_session`` is on. Those tables take part in each transaction and
savepoint like the file's own, so an interrupted or refused transaction leaves no record of what
it never did. ``put_back`` applies the records in reverse, in the caller's transaction: the
messages return with their ids (Hermes's own triggers index them again), the ledger rows, the
``state_meta`` receipts and routes the fence moved or removed return, the tombstones and the
retired marker go. The archive is not needed for this (a run may take none), and nothing of it
is written to disk beyond SQLite's private temporary files.

A SIGKILL or a power cut between two slices loses those records with the connection. So before
the first slice's transaction, out of the write lock, the session is listed durably beside
state.db (``SLICED_SUFFIX``, 0600, file and directory fsynced) with a copy of its rows SQLite
reads as it is (the run's backup or archive, else a private archive of the session's own,
``owned``) and what its fence will change (``fence_preview``: the fence run
recorded in a transaction that is rolled back; the first slice is refused if its own fence then
differs). The next run, before its plan, puts every listed session still there back whole
(``settle``): its fence undone from the list, its rows from the archive (INSERT OR IGNORE); a
session that still qualifies is then pruned again as any other. The list and its own archives go
once no listed session is half deleted, after the commits that made it so are durable.

Standard library only, Python 3.8+, no Ansible imports.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

from ..sqlite.db import MaintenanceError, commits_durable, fsync_path, quoted, write_transaction

# The tables a session's delete changes before its own row goes (messages, then the fence's).
RECORDED = ("messages", "session_admissions", "worker_executions", "worker_receipts", "state_meta", "gateway_routing")
SWITCH = "temp.hermes_ops_undo_session"
# Beside state.db while a session is deleted in slices: the session, its archive and its fence's changes.
SLICED_SUFFIX = ".hermes-ops-sliced"
SETTLE_CHUNK = 500  # messages put back per transaction after a crash (as a restore does)

# A recorded change: (op: "insert", "update" or "delete"; the rowid; the row's values), a list of
# three once read back from the durable list (JSON). The values are SQLite's, whatever the column holds.
UndoRecord = Sequence[Any]
FenceRecords = dict[str, list[list[Any]]]  # table -> its recorded changes, oldest first


class SlicedEntry(TypedDict, total=False):
    """A session of the durable list (``list_sliced``): a copy of its rows and its fence's changes."""

    archive: str  # a file SQLite reads with the session's messages (the run's backup or archive, or its own)
    owned: bool  # the archive is the session's own: it goes with the list
    columns: dict[str, list[str]]  # each recorded table's columns
    fence: FenceRecords | None


SlicedList = dict[str, SlicedEntry]  # session id -> its entry


def _has_rowid(conn: sqlite3.Connection, table: str) -> bool:
    try:
        conn.execute("SELECT rowid FROM main.%s LIMIT 0" % quoted(table))
        return True
    except Exception:  # a WITHOUT ROWID table: no store of Hermes's has one among RECORDED
        return False


class SessionUndo:
    """The records of one session's delete in progress (at most one at a time: slices of a session
    follow each other in the prune's order)."""

    def __init__(self, conn: sqlite3.Connection, tables: Iterable[str]) -> None:
        self.conn = conn
        self.columns: dict[str, list[str]] = {}
        # the fence's changes the durable list names (fence_records), once listed
        self.expected: FenceRecords | None = None
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS hermes_ops_undo_session (session_id TEXT, active INTEGER)")
        for table in RECORDED:
            if table in tables and _has_rowid(conn, table):
                self.columns[table] = [r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))]
                self._record(table)

    def _record(self, table: str) -> None:
        log = "temp.%s" % quoted("hermes_ops_undo_" + table)
        cols = self.columns[table]
        names = ", ".join(quoted(c) for c in cols)
        self.conn.execute(
            "CREATE TEMP TABLE IF NOT EXISTS %s AS SELECT '' AS undo_op, rowid AS undo_rowid, %s FROM main.%s WHERE 0"
            % (log, names, quoted(table))
        )
        # A trigger's statements name tables unqualified: these temporary names are ours alone.
        on = "WHEN EXISTS (SELECT 1 FROM hermes_ops_undo_session WHERE active)"
        for event, op, row in (("INSERT", "insert", None), ("UPDATE", "update", "old"), ("DELETE", "delete", "old")):
            values = "'%s', %s.rowid" % (op, row or "new")
            targets = "undo_op, undo_rowid"
            if row:
                values += ", " + ", ".join("%s.%s" % (row, quoted(c)) for c in cols)
                targets += ", " + names
            self.conn.execute(
                "CREATE TEMP TRIGGER IF NOT EXISTS %s AFTER %s ON main.%s %s BEGIN INSERT INTO %s (%s) VALUES (%s); END"
                % (quoted("hermes_ops_undo_%s_%s" % (table, op)), event, quoted(table), on, log[5:], targets, values)
            )

    def close(self) -> None:
        """Drop the temporary triggers and tables (the steps after the prune write messages too)."""
        for table in self.columns:
            for op in ("insert", "update", "delete"):
                self.conn.execute("DROP TRIGGER IF EXISTS temp.%s" % quoted("hermes_ops_undo_%s_%s" % (table, op)))
            self.conn.execute("DROP TABLE IF EXISTS temp.%s" % quoted("hermes_ops_undo_" + table))
        self.conn.execute("DROP TABLE IF EXISTS %s" % SWITCH)

    def recording(self) -> str | None:
        """The session whose delete is in progress (its earlier transactions committed), or None."""
        row = self.conn.execute("SELECT session_id FROM %s" % SWITCH).fetchone()
        return row[0] if row else None

    def start(self, sid: str) -> None:
        self.conn.execute("INSERT INTO %s VALUES (?, 0)" % SWITCH, (sid,))

    def active(self, on: bool) -> None:
        """Record (``on``) the statements that follow, or not (another session's in the same transaction)."""
        self.conn.execute("UPDATE %s SET active = ?" % SWITCH, (1 if on else 0,))

    def finish(self) -> None:
        """The session is gone whole (or back whole): forget its records, in this transaction."""
        self.conn.execute("DELETE FROM %s" % SWITCH)
        for table in self.columns:
            self.conn.execute("DELETE FROM temp.%s" % quoted("hermes_ops_undo_" + table))

    def fence_records(self) -> FenceRecords:
        """{table: [[op, rowid, values]]}: the recorded changes to the fence's tables (not messages),
        an inserted row with its values (read back from the file), oldest first."""
        records: FenceRecords = {}
        for table in self.columns:
            if table == "messages":
                continue
            cols = self.columns[table]
            names = ", ".join(quoted(c) for c in cols)
            log = "temp.%s" % quoted("hermes_ops_undo_" + table)
            rows: list[list[Any]] = []
            for row in self.conn.execute("SELECT undo_op, undo_rowid, %s FROM %s ORDER BY rowid" % (names, log)):
                values = list(row[2:])
                if row[0] == "insert":
                    found = self.conn.execute(
                        "SELECT %s FROM main.%s WHERE rowid = ?" % (names, quoted(table)), (row[1],)
                    ).fetchone()
                    values = list(found) if found else values
                rows.append([row[0], row[1], values])
            if rows:
                records[table] = rows
        return records

    def put_back(self) -> int:
        """Undo every recorded change, newest first, in the caller's transaction; returns the
        number of messages put back."""
        self.active(False)
        back = 0
        for table in reversed(list(self.columns)):  # the fence's changes first, the messages last
            cols = self.columns[table]
            names = ", ".join(quoted(c) for c in cols)
            log = "temp.%s" % quoted("hermes_ops_undo_" + table)
            rows = self.conn.execute("SELECT undo_op, undo_rowid, %s FROM %s ORDER BY rowid DESC" % (names, log))
            back += _reverse(self.conn, table, cols, [(r[0], r[1], list(r[2:])) for r in rows.fetchall()])
        self.finish()
        return back


def _reverse(
    conn: sqlite3.Connection, table: str, cols: list[str], records: Iterable[UndoRecord], listed: bool = False
) -> int:
    """Apply ``records`` [(op, rowid, values)], newest first, in reverse; returns the rows put back.
    ``listed`` (from the durable list, after a crash): a row deleted is put back only where its
    rowid is free, and a row inserted goes only while it still holds the values it was given."""
    names = ", ".join(quoted(c) for c in cols)
    same = " AND ".join("%s IS ?" % quoted(c) for c in cols)
    # After a crash a rowid may since hold another row: an update goes back only onto its own row.
    keys = [c for c, pk in conn.execute("SELECT name, pk FROM pragma_table_info(?)", (table,)) if pk] if listed else []
    own = "".join(" AND %s IS ?" % quoted(c) for c in keys)
    back = 0
    for op, rowid, values in records:
        if op == "insert":
            if listed:
                conn.execute("DELETE FROM main.%s WHERE rowid = ? AND %s" % (quoted(table), same), [rowid] + values)
            else:
                conn.execute("DELETE FROM main.%s WHERE rowid = ?" % quoted(table), (rowid,))
            continue
        if op == "delete":
            added = conn.execute(
                "INSERT %sINTO main.%s (rowid, %s) VALUES (?, %s)"
                % ("OR IGNORE " if listed else "", quoted(table), names, ", ".join("?" * len(cols))),
                [rowid] + values,
            ).rowcount
            back += added
            if listed and not added:  # its rowid or its key is taken: that row is not ours to change
                continue
        # An update's old values, or what Hermes's insert triggers filled in (0.22.2 sets a
        # message's display_order and message_uid when NULL) set back as they were.
        conn.execute(
            "UPDATE main.%s SET %s WHERE rowid = ?%s AND NOT (%s)"
            % (quoted(table), ", ".join("%s = ?" % quoted(c) for c in cols), own, same),
            values + [rowid] + [values[cols.index(c)] for c in keys] + values,
        )
    return back if table == "messages" else 0


def sliced_path(db_path: str) -> str:
    return db_path + SLICED_SUFFIX


def read_sliced(db_path: str) -> SlicedList:
    """{session id: {"archive", "owned", "columns", "fence"}} of an earlier run's list (empty: none).

    A list cut short while it was written was never relied on: its first slice's transaction
    had not begun."""
    try:
        with open(sliced_path(db_path)) as handle:
            listed = json.load(handle)
    except FileNotFoundError:
        return {}
    except ValueError:
        return {}
    return listed if isinstance(listed, dict) else {}


def list_sliced(db_path: str, listed: SlicedList) -> None:
    """Write the list (0600) and make it durable, file and directory, before the transaction that relies on it."""
    path = sliced_path(db_path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(listed, handle)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(os.path.dirname(os.path.abspath(path)))


def unlist_sliced(db_path: str, listed: SlicedList) -> None:
    """No listed session is half deleted any more: once that is durable, the list and its archives go."""
    commits_durable(db_path)
    for entry in listed.values():
        if entry.get("owned"):  # never the run's own backup or archive
            _unlink(entry.get("archive"))
    _unlink(sliced_path(db_path))
    fsync_path(os.path.dirname(os.path.abspath(db_path)))


def _unlink(path: object) -> None:
    if not isinstance(path, str):  # none listed
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def undo_fence(conn: sqlite3.Connection, entry: SlicedEntry) -> None:
    """A listed session's fence undone from the list (the retired marker and tombstones go, the
    ledger rows, receipts and routes it moved come back), in the caller's transaction."""
    fence = entry.get("fence") or {}
    for table in reversed(list(fence)):
        cols = entry["columns"][table]
        _reverse(conn, table, cols, list(reversed(fence[table])), listed=True)


def settle(conn: sqlite3.Connection, db_path: str, pause: float) -> list[str]:
    """Before a run's plan: put back whole every session an earlier run was deleting in slices when
    it was cut short (SIGKILL, power cut), and take them off the list. Returns the ids put back."""
    listed = read_sliced(db_path)
    if not listed:
        return []
    # One whose last transaction committed is gone whole, with its fence: nothing to put back.
    half = [
        (sid, e)
        for sid, e in sorted(listed.items())
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone()
    ]
    for sid, entry in half:
        if not os.path.isfile(entry.get("archive") or ""):
            raise MaintenanceError(
                "%s lists session %s as half deleted, but its archive %s is gone: restore the session from a "
                "backup (session_restore), then remove %s; nothing was changed"
                % (sliced_path(db_path), sid, entry.get("archive"), sliced_path(db_path))
            )
    back: list[str] = []
    for sid, entry in half:
        with write_transaction(conn):
            undo_fence(conn, entry)
        _put_back_messages(conn, entry["archive"], sid, pause)
        back.append(sid)
    unlist_sliced(db_path, listed)
    return back


def _put_back_messages(conn: sqlite3.Connection, archive: str, sid: str, pause: float) -> None:
    """The archived messages of ``sid`` its slices deleted, with their ids and every column as
    they were (Hermes's insert triggers index them again), SETTLE_CHUNK per transaction."""
    src = sqlite3.connect("file:%s?mode=ro" % os.path.abspath(archive), uri=True)
    try:
        archived = {r[1] for r in src.execute("SELECT * FROM pragma_table_info('messages')")}
        cols = [r[1] for r in conn.execute("SELECT * FROM pragma_table_info('messages')") if r[1] in archived]
        last = None
        while True:
            chunk = src.execute(
                "SELECT rowid, %s FROM messages WHERE session_id = ? AND rowid > ? ORDER BY rowid LIMIT ?"
                % ", ".join(quoted(c) for c in cols),
                (sid, -1 if last is None else last, SETTLE_CHUNK),
            ).fetchall()
            if not chunk:
                return
            with write_transaction(conn):
                _reverse(conn, "messages", cols, [("delete", r[0], list(r[1:])) for r in chunk], listed=True)
            last = chunk[-1][0]
            time.sleep(pause)
    finally:
        src.close()
