# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An archive of the rows a prune is about to delete, taken without stalling a live gateway.

In rollback-journal mode (``journal_mode=DELETE``, what Hermes >= 0.20 runs on an SQLite
with the WAL-reset bug) a reader's SHARED lock blocks every commit of the gateway, so a
whole-file copy of a live database stalls it for as long as the copy takes. What a prune
must keep recoverable is only what it deletes: the ``sessions`` rows, their ``messages``,
the rows of other tables that reference them (``session_model_usage``, ...) and the rows
they reference (``system_prompts``). Those are read here in short read transactions (a few
thousand messages each, the gateway commits in between), written to a private SQLite file
(0600) in the backup directory under a hidden ``.partial`` name, checked (quick_check, and
every session about to be pruned is there with all its messages), fsynced and renamed
before the first delete. The sessions being archived are ended and older than the prune
window, so they do not change between two read transactions; one the gateway resumes
meanwhile is left alone by the prune's own re-check.

``restore_sessions`` puts archived sessions back into a state.db, one session per write
transaction, through Hermes's own triggers (FTS rows are rebuilt by them).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import (
    Any,
    Callable,
    NamedTuple,
    Optional,
    TypedDict,
    TypeVar,
)

from ..sqlite.db import (
    BATCH_PAUSE,
    BUSY_TIMEOUT,
    MaintenanceError,
    fsync_path,
    open_rw,
    quoted,
    read_snapshot,
    write_transaction,
)
from .whole_file import StampedFiles, WriteBack, open_partial, remove_partials

ARCHIVE_PREFIX = "hermes-ops-archive_"
# Messages read per read transaction: a few ms of SHARED lock, which a gateway commit waits for.
ARCHIVE_CHUNK = 500
RESTORE_CHUNK = 500  # messages inserted per write transaction when restoring


ARCHIVES = StampedFiles(ARCHIVE_PREFIX)
archive_name = ARCHIVES.name
is_archive_name = ARCHIVES.is_name
list_archives = ARCHIVES.list

Referencing = list[tuple[str, str]]  # (table, its column naming the session)
Referenced = list[tuple[str, str, str]]  # (table, its key column, the sessions column naming it)
# a cursor's description: each column's name, then six None
Description = tuple[tuple[str, None, None, None, None, None, None], ...]
Row = tuple[object, ...]
# A recorded close: (id, ended_at, end_reason, closed_ended_at, closed_end_reason)
CloseRecord = tuple[str, Optional[float], Optional[str], float, str]
Filled = TypeVar("Filled")
SessionIds = Optional[Collection[str]]  # the sessions asked for (None: all)


def related_tables(conn: sqlite3.Connection) -> tuple[Referencing, Referenced]:
    """(referencing, referenced): tables whose rows go with a session, by their foreign keys.

    referencing = [(table, column)] with a foreign key to sessions(id) (``messages`` first);
    referenced = [(table, column, sessions column)]: tables sessions rows point at, other than
    sessions itself (``system_prompts`` through ``system_prompt_hash``).
    """
    tables = [
        r[0]
        for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'")
    ]
    referencing: Referencing = []
    for table in tables:
        if table == "sessions" or table.startswith("sqlite_"):
            continue
        for row in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (table,)):
            if row[2] == "sessions" and (row[4] in (None, "id")):
                referencing.append((table, row[3]))
    referencing.sort(key=lambda item: item[0] != "messages")
    referenced = [
        (row[2], row[4], row[3])
        for row in conn.execute("SELECT * FROM pragma_foreign_key_list('sessions')")
        if row[2] != "sessions" and row[4]
    ]
    return referencing, referenced


def _create_tables(src: sqlite3.Connection, dst: sqlite3.Connection, tables: list[str]) -> None:
    for table in tables:
        sql = src.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()[0]
        dst.execute(sql)
    dst.execute("CREATE TABLE archive_meta (key TEXT PRIMARY KEY, value TEXT)")
    dst.execute("CREATE TABLE archive_sessions (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, messages INTEGER NOT NULL)")
    # The zombie close, recorded before it commits: each session's ended_at/end_reason before, and what it writes.
    dst.execute(
        "CREATE TABLE archive_closes (id TEXT PRIMARY KEY, ended_at REAL, end_reason TEXT, "
        "closed_ended_at REAL NOT NULL, closed_end_reason TEXT NOT NULL)"
    )


def _chunks(order: Iterable[str], counts: dict[str, int], limit: int) -> Iterator[list[str]]:
    """Lists of session ids whose messages add up to at most ``limit`` (a bigger one alone)."""
    chunk: list[str] = []
    weight = 0
    for sid in order:
        count = counts.get(sid, 0)
        if chunk and weight + count > limit:
            yield chunk
            chunk, weight = [], 0
        chunk.append(sid)
        weight += count
    if chunk:
        yield chunk


def _archive_chunk(
    conn: sqlite3.Connection,
    dst: sqlite3.Connection,
    chunk: list[str],
    referencing: Referencing,
    referenced: Referenced,
    with_messages: bool,
) -> None:
    """Read one chunk's rows in one short read transaction, then write them to the archive."""
    marks = ",".join("?" * len(chunk))
    with read_snapshot(conn):
        sessions = conn.execute("SELECT * FROM sessions WHERE id IN (%s)" % marks, chunk)
        names = [d[0] for d in sessions.description]
        session_rows = sessions.fetchall()
        parents: list[tuple[str, sqlite3.Cursor]] = []
        for table, column, own in referenced:
            index = names.index(own)
            keys = sorted({row[index] for row in session_rows if row[index] is not None})
            if keys:
                parents.append(
                    (
                        table,
                        conn.execute(
                            "SELECT * FROM %s WHERE %s IN (%s)"
                            % (quoted(table), quoted(column), ",".join("?" * len(keys))),
                            keys,
                        ),
                    )
                )
        parent_rows = [(table, cur.description, cur.fetchall()) for table, cur in parents]
        children: list[tuple[str, Description, list[Row]]] = []
        for table, column in referencing if with_messages else referencing[1:]:
            cur = conn.execute("SELECT * FROM %s WHERE %s IN (%s)" % (quoted(table), quoted(column), marks), chunk)
            children.append((table, cur.description, cur.fetchall()))
    for table, description, rows in parent_rows + children:
        _insert(dst, table, description, rows)
    _insert(dst, "sessions", sessions.description, session_rows)


def _insert(dst: sqlite3.Connection, table: str, description: Description, rows: Sequence[Row]) -> None:
    if not rows:
        return
    names = [d[0] for d in description]
    dst.executemany(
        "INSERT OR IGNORE INTO %s (%s) VALUES (%s)"
        % (quoted(table), ", ".join(quoted(n) for n in names), ", ".join("?" * len(names))),
        rows,
    )


def _archive_messages(
    conn: sqlite3.Connection, dst: sqlite3.Connection, sid: str, table: str, column: str, write_back: WriteBack
) -> int:
    """A session's messages by id ranges, ARCHIVE_CHUNK per read transaction."""
    last, copied = -1, 0
    sql = "SELECT * FROM %s WHERE %s = ? AND id > ? ORDER BY id LIMIT %d" % (
        quoted(table),
        quoted(column),
        ARCHIVE_CHUNK,
    )
    while True:
        with read_snapshot(conn):
            cur = conn.execute(sql, (sid, last))
            description, rows = cur.description, cur.fetchall()
        if not rows:
            return copied
        _insert(dst, table, description, rows)
        dst.commit()
        write_back()
        copied += len(rows)
        last = rows[-1][[d[0] for d in description].index("id")]
        if len(rows) < ARCHIVE_CHUNK:
            return copied


def _archive_closes(conn: sqlite3.Connection, dst: sqlite3.Connection, closes: list[tuple[str, float, str]]) -> None:
    """Each session the close is about to change, with its ended_at/end_reason now (short reads)."""
    for start in range(0, len(closes), ARCHIVE_CHUNK):
        chunk = closes[start : start + ARCHIVE_CHUNK]
        with read_snapshot(conn):
            now = dict(
                (r[0], r[1:])
                for r in conn.execute(
                    "SELECT id, ended_at, end_reason FROM sessions WHERE id IN (%s)" % ",".join("?" * len(chunk)),
                    [sid for sid, _at, _reason in chunk],
                )
            )
        dst.executemany(
            "INSERT INTO archive_closes (id, ended_at, end_reason, closed_ended_at, closed_end_reason) "
            "VALUES (?, ?, ?, ?, ?)",
            [(sid,) + now[sid] + (at, reason) for sid, at, reason in chunk if sid in now],
        )


class ArchiveCounts(TypedDict):
    """What ``verify_archive`` found in a finished archive."""

    sessions: int
    messages: int
    sessions_closed: int


class ArchivePaths(NamedTuple):
    final: str  # the finished archive's name
    partial: str  # the hidden name it is written under until it counts


def new_archive_paths(backup_dir: str, files: StampedFiles, profile: str, now: float) -> ArchivePaths:
    """The first free name of ``files``' kind for ``profile`` at ``now``, and its hidden partial name."""
    seq = 0
    while os.path.exists(os.path.join(backup_dir, files.name(profile, now, seq))):
        seq += 1
    final = os.path.join(backup_dir, files.name(profile, now, seq))
    return ArchivePaths(final, os.path.join(backup_dir, "." + os.path.basename(final) + ".partial"))


def write_archive(
    backup_dir: str,
    paths: ArchivePaths,
    fill: Callable[[sqlite3.Connection, WriteBack], Filled],
    what: str,
    untouched: str,
) -> Filled:
    """Write an archive under its partial name (``fill(dst, write_back)``, which also verifies it),
    then make it count: owner-only, fsynced, renamed to its final name, the directory fsynced. On any
    failure the partial goes; an SQLite or OS error is reported as "``what`` into <final> failed:
    <error>; ``untouched``". Returns what ``fill`` returned."""
    partial = paths.partial
    try:
        write_back, dst = open_partial(partial)
        try:
            filled = fill(dst, write_back)
        finally:
            dst.close()
            write_back.close()
        os.chmod(partial, 0o600)
        fsync_path(partial)
        os.rename(partial, paths.final)
        fsync_path(backup_dir)
    except BaseException as exc:
        for leftover in (partial, partial + "-journal"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
        if isinstance(exc, (sqlite3.Error, OSError)):
            raise MaintenanceError("%s into %s failed: %s; %s" % (what, paths.final, exc, untouched)) from None
        raise
    return filled


def write_archive_meta(dst: sqlite3.Connection, meta: dict[str, str]) -> None:
    """The archive's ``archive_meta`` rows (what it is, of which file, when), committed."""
    dst.executemany("INSERT INTO archive_meta (key, value) VALUES (?, ?)", sorted(meta.items()))
    dst.commit()


def take_archive(
    conn: sqlite3.Connection,
    db_path: str,
    backup_dir: str,
    profile: str,
    order: list[str],
    must_contain: dict[str, int],
    schema_version: object = None,
    closes: Iterable[tuple[str, float, str]] = (),
) -> dict[str, Any]:
    """Archive the sessions in ``order`` (the prune's delete order) with their rows, and the
    zombie close about to run; verify; fsync.

    ``must_contain``: session id -> message count the plan will delete. ``closes``: (session id,
    ended_at, end_reason) the close will write. Returns the result's ``backup`` dict (kind
    ``archive``; ``sessions_closed``: the closes recorded; its keys are the result table's).
    """
    remove_partials(backup_dir, profile)
    remove_partials(backup_dir, profile, prefix=ARCHIVE_PREFIX, between="")
    now = time.time()
    paths = new_archive_paths(backup_dir, ARCHIVES, profile, now)
    referencing, referenced = related_tables(conn)
    if not referencing or referencing[0][0] != "messages":
        raise MaintenanceError(
            "%s: messages has no foreign key to sessions; cannot archive what the prune deletes" % db_path
        )

    def fill(dst: sqlite3.Connection, write_back: WriteBack) -> ArchiveCounts:
        _copy_sessions(conn, dst, write_back, order, must_contain, (referencing, referenced))
        _archive_closes(conn, dst, list(closes))
        dst.executemany(
            "INSERT INTO archive_sessions (id, seq, messages) VALUES (?, ?, ?)",
            [(sid, index, must_contain.get(sid, 0)) for index, sid in enumerate(order)],
        )
        meta = {
            "source": os.path.abspath(db_path),
            "profile": profile,
            "created_at": repr(now),
            "schema_version": str(schema_version),
            "kind": "prune archive",
        }
        write_archive_meta(dst, meta)
        return verify_archive(dst, paths.partial, must_contain)

    what = "archive of the sessions to prune from %s" % db_path
    counts = write_archive(backup_dir, paths, fill, what, "nothing was deleted")
    final = paths.final
    return {
        "kind": "archive",
        "path": final,
        "bytes": os.path.getsize(final),
        "verified": True,
        "compressed": False,
        "copied_by": "archive",
        **counts,
    }


def _copy_sessions(
    conn: sqlite3.Connection,
    dst: sqlite3.Connection,
    write_back: WriteBack,
    order: list[str],
    must_contain: dict[str, int],
    related: tuple[Referencing, Referenced],
) -> None:
    """The sessions' tables, then their rows chunk by chunk, each chunk committed and written back."""
    referencing, referenced = related
    tables = ["sessions"] + [t for t, _c, _o in referenced] + [t for t, _c in referencing]
    with read_snapshot(conn):
        _create_tables(conn, dst, list(dict.fromkeys(tables)))
    msg_table, msg_column = referencing[0]
    for chunk in _chunks(order, must_contain, ARCHIVE_CHUNK):
        # A session bigger than a chunk is alone in it; its messages go by id ranges.
        paged = must_contain.get(chunk[0], 0) > ARCHIVE_CHUNK
        _archive_chunk(conn, dst, chunk, referencing, referenced, with_messages=not paged)
        if paged:
            _archive_messages(conn, dst, chunk[0], msg_table, msg_column, write_back)
        dst.commit()
        write_back()


def verify_archive(conn: sqlite3.Connection, path: str, must_contain: dict[str, int]) -> ArchiveCounts:
    """quick_check of the whole archive, and every session to prune in it with all its messages."""
    rows = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
    if rows != ["ok"]:
        raise MaintenanceError("archive %s failed quick_check (%s); nothing was deleted" % (path, "; ".join(rows[:3])))
    held = dict(conn.execute("SELECT session_id, COUNT(*) FROM messages GROUP BY session_id").fetchall())
    present = {r[0] for r in conn.execute("SELECT id FROM sessions")}
    missing = [sid for sid in must_contain if sid not in present]
    short = [sid for sid, n in must_contain.items() if held.get(sid, 0) < n]
    if missing or short:
        raise MaintenanceError(
            "archive %s lacks %d of the %d sessions, and messages of %d, about to be pruned; nothing was deleted"
            % (path, len(missing), len(must_contain), len(short))
        )
    closes = conn.execute("SELECT COUNT(*) FROM archive_closes").fetchone()[0]
    return {"sessions": len(present), "messages": sum(held.values()), "sessions_closed": closes}


def archived_sessions(archive_path: str) -> list[str]:
    """The session ids an archive holds, in the order they were pruned."""
    conn = sqlite3.connect("file:%s?mode=ro" % archive_path, uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM archive_sessions ORDER BY seq")]
    finally:
        conn.close()


def restore_sessions(
    db_path: str,
    archive_path: str,
    session_ids: SessionIds = None,
    busy_timeout: float = BUSY_TIMEOUT,
    pause: float = BATCH_PAUSE,
    order: SessionIds = None,
) -> dict[str, int]:
    """Put sessions from an archive back into ``db_path`` (None: every session it holds).

    ``order``: instead of the archive's list, these session ids in this order (parents first),
    from any file of Hermes's schema (a whole-file backup).

    Parents go before their children (the reverse of the prune's order). Rows that are
    already there are left as they are (restoring twice changes nothing); a parent that is
    neither in the database nor restored now is dropped from the row (``parent_session_id``
    NULL, as Hermes's own prune orphans children). Messages go in transactions of
    RESTORE_CHUNK with a pause between, so a live gateway keeps writing. Returns
    {"sessions_restored", "sessions_present", "messages_restored", "orphaned"} (a dict the caller
    adds the close's undo to, ``reopen_closed``).
    """
    src = sqlite3.connect("file:%s?mode=ro" % os.path.abspath(archive_path), uri=True)
    dst = open_rw(db_path, busy_timeout)
    report: dict[str, int] = {"sessions_restored": 0, "sessions_present": 0, "messages_restored": 0, "orphaned": 0}
    try:
        if order is not None:
            known = session_ids = list(order)
        else:
            known = [r[0] for r in src.execute("SELECT id FROM archive_sessions ORDER BY seq DESC")]
        wanted = known if session_ids is None else [sid for sid in known if sid in set(session_ids)]
        unknown = sorted(set(session_ids or ()) - set(known))
        if unknown:
            raise MaintenanceError(
                "archive %s does not hold session(s) %s; nothing was restored" % (archive_path, ", ".join(unknown[:5]))
            )
        referencing, referenced = related_tables(src)
        live_cols = {
            t: _columns(dst, t) for t in ["sessions"] + [t for t, _c in referencing] + [t for t, _c, _o in referenced]
        }
        for sid in wanted:
            _restore_one(src, dst, sid, referencing, referenced, live_cols, report, pause)
    finally:
        src.close()
        dst.close()
    return report


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))]


def _rows(
    src: sqlite3.Connection, table: str, where: str, params: Sequence[object], live_cols: list[str]
) -> tuple[list[str], list[Row]]:
    cols = [c for c in _columns(src, table) if c in live_cols]
    cur = src.execute("SELECT %s FROM %s WHERE %s" % (", ".join(quoted(c) for c in cols), quoted(table), where), params)
    return cols, cur.fetchall()


def _put(dst: sqlite3.Connection, table: str, cols: list[str], rows: Sequence[Row]) -> int:
    if not rows:
        return 0
    # rowcount, not total_changes: Hermes's triggers (FTS, display order) change rows too.
    return dst.executemany(
        "INSERT OR IGNORE INTO %s (%s) VALUES (%s)"
        % (quoted(table), ", ".join(quoted(c) for c in cols), ", ".join("?" * len(cols))),
        rows,
    ).rowcount


def _restore_one(
    src: sqlite3.Connection,
    dst: sqlite3.Connection,
    sid: str,
    referencing: Referencing,
    referenced: Referenced,
    live_cols: dict[str, list[str]],
    report: dict[str, int],
    pause: float,
) -> None:
    cols, rows = _rows(src, "sessions", "id = ?", (sid,), live_cols["sessions"])
    row = dict(zip(cols, rows[0]))
    with write_transaction(dst):
        if dst.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
            report["sessions_present"] += 1
        else:
            for table, column, own in referenced:
                if row.get(own) is not None and live_cols[table]:  # a table this schema dropped: nothing to put
                    pcols, prows = _rows(src, table, "%s = ?" % quoted(column), (row[own],), live_cols[table])
                    _put(dst, table, pcols, prows)
            parent = row.get("parent_session_id")
            if parent is not None and not dst.execute("SELECT 1 FROM sessions WHERE id = ?", (parent,)).fetchone():
                row["parent_session_id"] = None
                report["orphaned"] += 1
            _put(dst, "sessions", list(row), [tuple(row.values())])
            report["sessions_restored"] += 1
    msg_table, msg_column = referencing[0]
    mcols, mrows = _rows(src, msg_table, "%s = ? ORDER BY id" % quoted(msg_column), (sid,), live_cols[msg_table])
    for start in range(0, len(mrows), RESTORE_CHUNK):
        with write_transaction(dst):
            report["messages_restored"] += _put(dst, msg_table, mcols, mrows[start : start + RESTORE_CHUNK])
        time.sleep(pause)
    with write_transaction(dst):
        for table, column in referencing[1:]:
            if not live_cols[table]:
                continue
            ccols, crows = _rows(src, table, "%s = ?" % quoted(column), (sid,), live_cols[table])
            _put(dst, table, ccols, crows)


def recorded_closes(src: sqlite3.Connection, session_ids: Collection[str] | None = None) -> list[CloseRecord]:
    """The closes an archive records, [(id, ended_at, end_reason, closed_ended_at, closed_end_reason)]
    (none in an archive older than the record); ``session_ids``: only these (None: all)."""
    if not src.execute("SELECT 1 FROM sqlite_master WHERE name = 'archive_closes'").fetchone():
        return []
    records = src.execute("SELECT * FROM archive_closes ORDER BY id").fetchall()
    return records if session_ids is None else [r for r in records if r[0] in set(session_ids)]


# Where a session still holds exactly what the close wrote: nothing changed it since.
_AS_CLOSED = "WHERE id = ? AND ended_at IS ? AND end_reason IS ?"


def reopenable(dst: sqlite3.Connection, records: list[CloseRecord]) -> int:
    """How many of ``records`` undoing the close would change now (reads only)."""
    return sum(
        dst.execute("SELECT 1 FROM sessions " + _AS_CLOSED, (sid, at, reason)).fetchone() is not None
        for sid, _ended_at, _end_reason, at, reason in records
    )


def reopen_closed(
    db_path: str,
    archive_path: str,
    session_ids: Collection[str] | None = None,
    check_mode: bool = False,
    busy_timeout: float = BUSY_TIMEOUT,
) -> dict[str, int]:
    """Undo the zombie close an archive recorded: put back each session's ended_at/end_reason.

    Only where the session still holds exactly what the close wrote, so an end Hermes wrote
    since (or a session the prune took, or one reopened already) is left alone; a second run
    changes nothing. ``session_ids``: None for every close recorded. Check mode counts the rows
    the run changes. Returns {"sessions_reopened", "sessions_left_alone"}.
    """
    src = sqlite3.connect("file:%s?mode=ro" % os.path.abspath(archive_path), uri=True)
    try:
        records = recorded_closes(src)
    finally:
        src.close()
    if session_ids is not None:
        unknown = sorted(set(session_ids) - {r[0] for r in records})
        if unknown:
            raise MaintenanceError(
                "archive %s records no close of session(s) %s; nothing was reopened"
                % (archive_path, ", ".join(unknown[:5]))
            )
        records = [r for r in records if r[0] in set(session_ids)]
    dst = open_rw(db_path, busy_timeout)
    reopened = 0
    try:
        for start in range(0, len(records), RESTORE_CHUNK):
            chunk = records[start : start + RESTORE_CHUNK]
            if check_mode:
                with read_snapshot(dst):
                    reopened += reopenable(dst, chunk)
                continue
            with write_transaction(dst):
                for sid, ended_at, end_reason, at, reason in chunk:
                    reopened += dst.execute(
                        "UPDATE sessions SET ended_at = ?, end_reason = ? " + _AS_CLOSED,
                        (ended_at, end_reason, sid, at, reason),
                    ).rowcount
    finally:
        dst.close()
    return {"sessions_reopened": reopened, "sessions_left_alone": len(records) - reopened}
