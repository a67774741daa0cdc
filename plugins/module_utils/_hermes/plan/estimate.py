# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a prune is expected to give back, measured before any write (read-only, short reads).

A message occupies its bytes, not a share of the count: the rows to prune are measured (their
bytes, read by session) against the bytes of all rows (evenly spaced rowid ranges), and the pages
in use are taken to go in that share. The FTS5 indexes are the exception. A delete writes a
marker per term of the row into a new segment, and FTS5 keeps the markers and the entries they
cancel until a merge reaches the segment that holds the entries. The reclaim's ordinary merge
leaves that to chance (where the prune's transactions ended): on the same release-built file the
indexes grew by a quarter in one run and shrank to a third in the next. The reclaim's optimize,
run when no other process holds the file, merges each index into one segment without them, and the
index then gives its share back too. Beside a holder the estimate counts the indexes (their size
is in their structure records, one row each) as keeping their size and growing by their markers.

Every read is one short statement (a few hundred rows, or ranges sized by ``ranged_rows``): safe
beside a live gateway in rollback-journal mode, where each read holds back its commits while it runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..sqlite.db import RANGE_READ_TIME, quoted, ranged_rows, rowid_span
from ..sqlite.storage import byte_length

if TYPE_CHECKING:
    from ..store.schema import FtsTable, SchemaFacts

SAMPLE_RANGES = 64  # evenly spaced rowid ranges read for the bytes of an average message
SAMPLE_WIDTH = 200  # rowids per range (a short read)
PRUNED_FIRST = 500  # messages of the rows to prune read by the first statement (whole sessions)
PRUNED_MOST = 50000  # ... and by any statement
# Beside a holder (the merge alone): the delete markers the prune adds, as a share of the pages the
# deleted rows held in an FTS5 index. Measured on release-built files after the prune and the merge:
# 0.44 (0.22.2, both indexes through views), 0.45 (0.19.0, inline); more when the merge happens to
# reach the segments holding the deleted rows, and the index then shrinks instead.
FTS_MARKER_SHARE = 0.45
STRUCTURE_ROWID = 10  # the FTS5 structure record's rowid in <index>_data
STRUCTURE_V2 = b"\xff\x00\x00\x01"


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    """An SQLite varint of ``buf`` at ``at``: (value, the offset after it)."""
    value = 0
    for step in range(9):
        byte = buf[at]
        at += 1
        if step == 8:
            return (value << 8) | byte, at
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, at
    return value, at


def index_levels(record: bytes) -> list[tuple[int, list[int]]]:
    """The levels of an FTS5 index, from its structure record (sqlite.org's fts5_index.c: a 4-byte
    cookie, the V2 marker or not, the number of levels, of segments and the write counter, then per
    level its merge state and segments, each with its first and last leaf page): a list of
    ``(inputs of the merge under way from that level, [leaves of each segment])``. A leaf is one row
    of <index>_data of at most ``pgsz`` bytes (4050 by default): about one page."""
    if record[4:8] == STRUCTURE_V2:  # contentless_delete tables only (Hermes has none): not read
        raise ValueError("an FTS5 structure record of version 2")
    at = 4
    count, at = _varint(record, at)
    _segments, at = _varint(record, at)
    _writes, at = _varint(record, at)
    levels: list[tuple[int, list[int]]] = []
    for _level in range(count):
        merging, at = _varint(record, at)
        segments, at = _varint(record, at)
        leaves: list[int] = []
        for _segment in range(segments):
            _segid, at = _varint(record, at)
            first, at = _varint(record, at)
            last, at = _varint(record, at)
            leaves.append(last - first + 1)
        levels.append((merging, leaves))
    return levels


def read_index_levels(conn: sqlite3.Connection, name: str) -> list[tuple[int, list[int]]]:
    """``index_levels`` of the FTS5 index ``name`` as ``conn`` sees it now ([] when it has no record)."""
    row = conn.execute("SELECT block FROM %s WHERE id = ?" % quoted(name + "_data"), (STRUCTURE_ROWID,)).fetchone()
    return index_levels(bytes(row[0])) if row and row[0] else []


def fts_index_pages(conn: sqlite3.Connection, fts: Iterable[FtsTable]) -> dict[str, int]:
    """Pages of each FTS5 index's segments: {name: pages}; an index whose record is unreadable counts 0."""
    pages: dict[str, int] = {}
    for table in fts:
        try:
            pages[table["name"]] = sum(sum(leaves) for _merging, leaves in read_index_levels(conn, table["name"]))
        except (sqlite3.Error, IndexError, ValueError):  # unreadable, truncated or of another version
            pages[table["name"]] = 0
    return pages


def _row_bytes_sql(conn: sqlite3.Connection) -> str:
    """SQL for the bytes of a message's values (every column of ``messages``)."""
    columns = [row[1] for row in conn.execute("SELECT * FROM pragma_table_info('messages')")]
    return " + ".join(byte_length(c) for c in columns)


def pruned_bytes(conn: sqlite3.Connection, pruned: dict[str, int], live_rollback: bool = False) -> int:
    """The bytes of the rows to prune. ``pruned``: session id -> its message count.

    The sessions go into a temporary table, each at the offset of its first message in the list, and
    are read by ranges of those offsets (ranged_rows): each statement reads about PRUNED_FIRST
    messages, then as many as its time allows; beside a live rollback-journal gateway one still
    running at the bound is interrupted and its range read again in halves."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS hermes_ops_pruned (at INTEGER PRIMARY KEY, session_id TEXT)")
    try:
        offsets: list[tuple[int, str]] = []
        at = 0
        for sid in sorted(pruned):
            offsets.append((at, sid))
            at += max(1, pruned[sid])
        conn.execute("BEGIN")  # one transaction of the temporary database alone: state.db is not read
        try:
            conn.execute("DELETE FROM temp.hermes_ops_pruned")
            conn.executemany("INSERT INTO temp.hermes_ops_pruned (at, session_id) VALUES (?, ?)", offsets)
        finally:
            conn.execute("COMMIT")
        sql = (
            "SELECT COALESCE(SUM(b), 0) FROM (SELECT %s AS b FROM messages WHERE session_id IN "
            "(SELECT session_id FROM temp.hermes_ops_pruned WHERE at >= ? AND at < ?))" % _row_bytes_sql(conn)
        )
        # Beside a live rollback-journal gateway ranges sized to RANGE_READ_TIME, else fixed; the bound is the default.
        target = RANGE_READ_TIME if live_rollback else None
        ranges = ranged_rows(conn, sql, 0, at - 1, first=PRUNED_FIRST, most=PRUNED_MOST, target=target)
        sizes: list[int] = [rows[0][0] for rows in ranges]
        return sum(sizes)
    finally:
        conn.execute("DROP TABLE IF EXISTS temp.hermes_ops_pruned")


def bytes_per_message(conn: sqlite3.Connection) -> float:
    """The bytes of an average message, from SAMPLE_RANGES evenly spaced rowid ranges (all of the
    table when it is that small)."""
    every = _row_bytes_sql(conn)
    low, top = rowid_span(conn, "messages")
    if low is None or top is None:
        return 0.0
    span = top - low + 1
    width = min(SAMPLE_WIDTH, -(-span // SAMPLE_RANGES))
    starts = sorted({low + (span - width) * i // max(1, SAMPLE_RANGES - 1) for i in range(SAMPLE_RANGES)})
    sql = "SELECT COUNT(*), COALESCE(SUM(%s), 0) FROM messages WHERE id >= ? AND id < ?" % every
    count = size = 0
    for start in starts:
        rows, total = conn.execute(sql, (start, start + width)).fetchone()
        count, size = count + rows, size + total
    return float(size) / count if count else 0.0


def predict_free_pages(
    conn: sqlite3.Connection,
    schema: SchemaFacts,
    pruned: dict[str, int],
    messages_total: int,
    *,
    extra_bytes: int = 0,
    fts_optimized: bool = False,
    live_rollback: bool = False,
) -> dict[str, Any]:
    """The free pages a prune of ``pruned`` (session id -> message count) is expected to leave, and so
    the pages a vacuum after it gives back: ``{"free_pages", "share", "percent_now", "byte_share",
    "fts_pages", "marker_pages"}``; ``share`` is the share of the messages deleted (the words of a
    skipped vacuum's reason).

    ``extra_bytes``: bytes the run takes out of the messages besides (the tool-payload elision);
    ``fts_optimized``: the reclaim optimizes the FTS5 indexes (as it does, beside a holder too), else
    they are counted as keeping their size and growing by their delete markers;
    ``live_rollback``: every read a short one."""
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    fts = [table for table in schema["fts"] if not table["error"]]
    fts_pages = 0 if fts_optimized else min(pages - free, sum(fts_index_pages(conn, fts).values()))
    everything = bytes_per_message(conn) * messages_total
    gone = (pruned_bytes(conn, pruned, live_rollback) if pruned else 0) + extra_bytes
    byte_share = min(1.0, float(gone) / everything) if everything else 0.0
    markers = int(round(FTS_MARKER_SHARE * fts_pages * byte_share))
    count = sum(pruned.values())
    return {
        "free_pages": max(0, free + int(round((pages - free - fts_pages) * byte_share)) - markers),
        "share": min(1.0, float(count) / messages_total) if messages_total else 0.0,
        "percent_now": 100.0 * free / pages if pages else 0.0,
        "byte_share": byte_share,
        "fts_pages": fts_pages,
        "marker_pages": markers,
    }
