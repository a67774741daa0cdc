# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the bytes of a state.db are, read-only: by table and index, and by message role,
session source and session.

Every read is one statement, so one short read transaction of its own. Beside a live gateway in
rollback-journal mode (``live_rollback``) a read holds a SHARED lock that blocks every commit, so
there each statement is bounded in time: the message scan goes by rowid ranges sized to
STATEMENT_TARGET, and a statement still running at STATEMENT_BOUND is interrupted (its range is
split and read again; an object whose page walk is cut short is named as not measured).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .db import RANGE_READ_BOUND, RANGE_READ_TIME, StatementBound, quoted, ranged_rows, rowid_span

# The FTS5 shadow tables of a virtual table <vt> (sqlite.org/fts5.html): counted under <vt>.
FTS5_SHADOWS = ("_data", "_idx", "_content", "_docsize", "_config")
# Columns of messages that hold what a message says or did (the rest is ids, times, flags).
PAYLOAD_COLUMNS = (
    "content",
    "api_content",
    "tool_calls",
    "reasoning",
    "reasoning_content",
    "reasoning_details",
    "codex_reasoning_items",
    "codex_message_items",
)
TOP_SESSIONS = 10  # the largest sessions listed
SCAN_RANGE = 50000  # rowids per statement of the message scan without a live rollback-journal gateway
FIRST_LIVE_RANGE = 500  # ... and its first range beside one, then sized to STATEMENT_TARGET
STATEMENT_TARGET = RANGE_READ_TIME  # seconds a statement should take beside a live rollback-journal gateway
STATEMENT_BOUND = RANGE_READ_BOUND  # seconds after which such a statement is interrupted
NO_DBSTAT = "this SQLite (%s) was built without the dbstat virtual table (SQLITE_ENABLE_DBSTAT_VTAB)"


def has_dbstat(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1 FROM dbstat LIMIT 0").fetchall()
    except sqlite3.OperationalError:
        return False
    return True


def _owners(conn: sqlite3.Connection) -> tuple[dict[str, tuple[str, str]], set[str]]:
    """btree name -> (kind, the object it counts under), from sqlite_master."""
    rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    virtual = {
        name for kind, name, _t, sql in rows if kind == "table" and (sql or "").upper().startswith("CREATE VIRTUAL")
    }
    shadow = {vt + suffix: vt for vt in virtual for suffix in FTS5_SHADOWS}
    # Page 1's btree: dbstat names it sqlite_schema from SQLite 3.33, sqlite_master before.
    owners: dict[str, tuple[str, str]] = {
        "sqlite_schema": ("table", "sqlite_schema"),
        "sqlite_master": ("table", "sqlite_schema"),
    }
    for kind, name, table, _sql in rows:
        if kind == "table" and name in shadow:
            owners[name] = ("fts", shadow[name])
        elif kind == "index" and table in shadow:
            owners[name] = ("fts", shadow[table])
        elif kind in ("table", "index") and name not in virtual:
            owners[name] = (kind, name)
    return owners, virtual


def _object_pages(conn: sqlite3.Connection, name: str, bound: float | None) -> tuple[int, int] | None:
    """(pages, bytes) of one btree, overflow pages included; None when the bound cut it short."""
    row: tuple[int, int] | None = None
    with StatementBound(conn, bound) as cut:
        row = conn.execute("SELECT COUNT(*), COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name = ?", (name,)).fetchone()
    return None if cut.cut else row


def by_object(conn: sqlite3.Connection, live_rollback: bool) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """{object: {kind, table, pages, bytes}} by dbstat, one read per btree; and what was not measured."""
    owners, virtual = _owners(conn)
    objects: dict[str, dict[str, Any]] = {}
    unmeasured: list[str] = []
    for btree in sorted(owners):
        kind, owner = owners[btree]
        figures = _object_pages(conn, btree, STATEMENT_BOUND if live_rollback else None)
        if figures is None:
            unmeasured.append(btree)
            continue
        entry = objects.setdefault(owner, {"kind": "fts" if owner in virtual else kind, "pages": 0, "bytes": 0})
        if kind == "index":
            entry["table"] = conn.execute("SELECT tbl_name FROM sqlite_master WHERE name = ?", (btree,)).fetchone()[0]
        entry["pages"] += figures[0]
        entry["bytes"] += figures[1]
    return objects, unmeasured


def byte_length(column: str) -> str:
    """SQL for the bytes a column's value takes: octet_length (3.43+) reads only the record
    header; before it the value is cast to a blob, which reads it."""
    if sqlite3.sqlite_version_info >= (3, 43, 0):
        return "COALESCE(octet_length(%s), 0)" % quoted(column)
    return "COALESCE(length(CAST(%s AS BLOB)), 0)" % quoted(column)


def _scan_messages(
    conn: sqlite3.Connection, columns: set[str], live_rollback: bool
) -> tuple[dict[tuple[str, str | None], list[int]], list[str]]:
    """{(session_id, role): [messages, content_bytes, payload_bytes]} over every message, by rowid ranges."""
    payload = [c for c in PAYLOAD_COLUMNS if c in columns]
    content = byte_length("content") if "content" in columns else "0"
    total = " + ".join(byte_length(c) for c in payload) or "0"
    sql = (
        "SELECT session_id, role, COUNT(*), SUM(%s), SUM(%s) FROM messages WHERE id >= ? AND id < ? "
        "GROUP BY session_id, role" % (content, total)
    )
    low, top = rowid_span(conn, "messages")
    figures: dict[tuple[str, str | None], list[int]] = {}
    if low is None or top is None:
        return figures, payload
    target, bound = (STATEMENT_TARGET, STATEMENT_BOUND) if live_rollback else (None, None)
    first = FIRST_LIVE_RANGE if live_rollback else SCAN_RANGE
    for rows in ranged_rows(conn, sql, low, top, first=first, most=SCAN_RANGE, target=target, bound=bound):
        for sid, role, count, content_bytes, payload_bytes in rows:
            entry = figures.setdefault((sid, role), [0, 0, 0])
            entry[0] += count
            entry[1] += content_bytes or 0
            entry[2] += payload_bytes or 0
    return figures, payload


def _add(totals: dict[str, dict[str, int]], key: str, count: int, content_bytes: int, payload_bytes: int) -> None:
    entry = totals.setdefault(key, {"messages": 0, "content_bytes": 0, "payload_bytes": 0})
    entry["messages"] += count
    entry["content_bytes"] += content_bytes
    entry["payload_bytes"] += payload_bytes


def payload(conn: sqlite3.Connection, live_rollback: bool, top: int = TOP_SESSIONS) -> dict[str, Any]:
    """Message payload bytes by role, by session source, and the largest sessions."""
    columns = {row[1] for row in conn.execute("SELECT * FROM pragma_table_info('messages')")}
    figures, counted = _scan_messages(conn, columns, live_rollback)
    sessions: dict[str, tuple[Any, ...]] = {}
    for row in conn.execute("SELECT id, source, started_at, ended_at FROM sessions"):
        sessions[row[0]] = row[1:]
    by_role: dict[str, dict[str, int]] = {}
    by_source: dict[str, dict[str, int]] = {}
    by_session: dict[str, dict[str, Any]] = {}
    for (sid, role), (count, content_bytes, payload_bytes) in figures.items():
        source, started, ended = sessions.get(sid, (None, None, None))
        _add(by_role, role if role is not None else "(none)", count, content_bytes, payload_bytes)
        _add(by_source, source if source is not None else "(none)", count, content_bytes, payload_bytes)
        entry = by_session.setdefault(sid, {"id": sid, "source": source, "started_at": started, "ended_at": ended})
        for key, value in (("messages", count), ("content_bytes", content_bytes), ("payload_bytes", payload_bytes)):
            entry[key] = entry.get(key, 0) + value
        entry["tool_bytes"] = entry.get("tool_bytes", 0) + (payload_bytes if role == "tool" else 0)
    largest = sorted(by_session.values(), key=lambda e: (-e["payload_bytes"], str(e["id"])))[:top]
    return {"payload_columns": counted, "by_role": by_role, "by_source": by_source, "largest_sessions": largest}


def storage(conn: sqlite3.Connection, live_rollback: bool) -> dict[str, Any]:
    """The ``storage`` figures of state_db_info for one open (read-only) state.db.

    ``live_rollback``: the file is in rollback-journal mode and other processes hold it.
    """
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    free_pages = conn.execute("PRAGMA freelist_count").fetchone()[0]
    result: dict[str, Any] = {
        "page_size": page_size,
        "page_count": conn.execute("PRAGMA page_count").fetchone()[0],
        "free_pages": free_pages,
        "free_bytes": free_pages * page_size,
        "by_object": None,
        "by_object_unavailable": None,
        "live_rollback": live_rollback,
    }
    if not has_dbstat(conn):
        result["by_object_unavailable"] = NO_DBSTAT % sqlite3.sqlite_version
    else:
        objects, unmeasured = by_object(conn, live_rollback)
        result["by_object"] = objects
        if unmeasured:
            result["by_object_unavailable"] = (
                "not measured: %s; each is a read longer than %d ms, which beside a gateway in rollback-journal mode "
                "holds back its commits: run state_db_info while the gateway is stopped to measure them"
                % (", ".join(unmeasured), STATEMENT_BOUND * 1000)
            )
    result.update(payload(conn, live_rollback))
    return result
