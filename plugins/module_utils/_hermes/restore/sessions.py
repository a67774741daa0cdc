"""Put pruned sessions back next to a live gateway, from an archive or a whole-file backup.

An archive (``hermes-ops-archive_<profile>_<time>.db``, written by ``take_archive``) holds
the sessions a prune deleted, with their messages and the rows tied to them; a whole-file
backup (``hermes-ops_<profile>_<time>.db[.gz]``, ``take_backup``) holds the whole file as it
was before a prune. Here:

* ``check_archive`` refuses anything but a finished, verified archive: a hidden ``.partial``,
  another name, a file others can write, a failing quick_check, or one whose
  ``archive_sessions`` list is not fully there (an archive is renamed into place only after
  that list is written and verified, so a file that lacks it is not one); ``opened_source``
  does the same checks for a backup of the same profile (a ``.gz`` is decompressed into a
  private directory in the backup directory, removed afterwards);
* ``plan_session_restore`` says exactly what a restore would do, reading state.db in short
  read transactions (each session and each 500 message ids on their own), and refuses a
  source of a newer schema than the file, a table or column the file needs that the source
  lacks, and a session id the source does not hold. The sessions are chosen by id, time
  window, source and a title/text match (the backup's own FTS), combined with AND; the
  sessions the prune took together with a chosen one (delegates, compression lineage:
  ``plan.selection.taken_along``) come with it. From a backup, only sessions state.db lacks
  come back; what it has is never touched;
* ``restore_from_archive`` / ``restore_selected`` hold the profile's maintenance lock (shared
  with Hermes's own auto-maintenance), refuse while Hermes repairs, quarantines or rebuilds the
  file, and restore through ``backup.archive.restore_sessions`` (one session per write
  transaction, messages 500 per transaction, ``INSERT OR IGNORE``): restoring what is already
  there changes nothing. A restore from a backup interrupted at any point is completed by
  running it again: the sessions it is putting back are listed in a private ``.pending`` file
  in the backup directory until they are complete;
* ``list_missing`` says, for every backup and archive of a profile, what it holds that the
  live file no longer has (sessions and messages per day and source).

As root on a user's file, the work is done in a child switched to that user (as maintenance
does), so a -journal or -wal it creates, and a decompressed copy, are the user's. Standard
library only, Python 3.8+.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import stat
import tempfile
import time
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, Callable, TypedDict, cast

from ..apply.elision import (
    PAYLOAD_PREFIX,
    is_payload_archive_name,
    list_payload_archives,
    live_tombstones,
    match_backup,
    plan_restore,
    restore_payloads,
)
from ..backup.archive import (
    is_archive_name,
    list_archives,
    recorded_closes,
    related_tables,
    reopen_closed,
    reopenable,
    restore_sessions,
)
from ..backup.whole_file import list_backups, parse_backup_name
from ..host.hazards import refuse_during_hermes_operation
from ..host.profiles import LOCK_SUFFIX, ProfileLock, backups_of, profile_path, run_as_owner
from ..options import iso_seconds
from ..plan.selection import Session, load_sessions, parents_first, taken_along
from ..sqlite.db import (
    BATCH_PAUSE,
    BUSY_TIMEOUT,
    MB,
    MaintenanceError,
    ProfileSkipped,
    ReadOnlyDB,
    commits_durable,
    free_bytes,
    fsync_path,
    is_wal_file,
    open_rw,
    quoted,
    refuse_wal_on_shared_filesystem,
    sqlite_uri,
)
from ..store.fence import RETIRED_PREFIX, retired
from ..store.schema import REQUIRED_COLUMNS, SessionTables, columns, quick_check_rows
from .whole_file import db_counts, unpack_backup

ID_CHUNK = 500  # message ids looked up per read transaction of state.db
NEWEST = "newest"  # backup: the profile's newest whole-file backup
# A decompressed backup (a private directory) and the list of an unfinished restore, in the backup directory.
WORK_PREFIX = ".hermes-ops-restore_"

# A payload body to put back: (archive or backup path, message id, session id, bytes, tombstone).
PayloadItem = tuple[str, int, str, int, str]


class Selection(TypedDict):
    """The sessions asked for (``selection``): each criterion None when not asked."""

    sessions: list[str] | None
    active_after: float | None
    active_before: float | None
    sources: list[str] | None
    match: str | None


class SourceInfo(TypedDict, total=False):
    """What an archive (``check_archive``) or a whole-file backup (``opened_source``) holds."""

    path: str
    kind: str  # archive or file
    profile: str | None
    source: str | None
    compressed: bool
    created_at: float | None
    schema_version: int | None
    sessions: int
    messages: int
    sessions_closed: int


class Source(TypedDict, total=False):
    """Where a session restore reads from: ``kind`` (archive or file), ``path``, ``profile``,
    ``backup_dir``, and ``fd``: root's descriptor on a backup the owner's process cannot open."""

    kind: str
    path: str
    profile: str
    backup_dir: str
    fd: int | None


class SessionPlan(TypedDict):
    """One session of a restore plan (``_plan_one``)."""

    id: str
    present: bool
    messages_archived: int
    messages_missing: int
    rows_missing: int
    orphaned: bool


class Totals(TypedDict):
    """A restore plan's figures, summed over its sessions."""

    sessions_restored: int
    sessions_present: int
    messages_restored: int
    rows_restored: int
    orphaned: int
    changed: bool


class SessionRestorePlan(Totals, total=False):
    """``plan_session_restore``'s plan (see there); a run adds ``done`` and ``after``, the caller ``db``."""

    archive: SourceInfo
    backup: SourceInfo
    db_schema_version: int | None
    sessions: list[SessionPlan]
    notes: list[str]
    reopen: list[str]
    sessions_reopened: int
    done: dict[str, int]
    after: list[SessionPlan]
    db: str


class MissingGroup(TypedDict):
    """What a file holds that state.db lacks, of one UTC day and source (``_missing``)."""

    day: str
    source: str | None
    sessions: int
    messages: int
    ids: list[dict[str, Any]]  # {"id", "title", "messages"}: a title is whatever Hermes stored


class Missing(TypedDict):
    missing: list[MissingGroup]
    sessions_missing: int
    messages_missing: int


class ListedFile(TypedDict, total=False):
    """One file ``list_missing`` lists: what it holds and what of that state.db lacks, or its ``error``."""

    path: str
    kind: str
    created_at: float | None
    schema_version: int | None
    sessions: int
    messages: int
    missing: list[MissingGroup]
    sessions_missing: int
    messages_missing: int
    error: str


class Unmatched(TypedDict):
    """A tombstone a payload restore leaves alone, and why."""

    id: int
    session_id: str
    reason: str


class PayloadResult(TypedDict, total=False):
    """What ``restore_tool_payloads`` returns (see there)."""

    archives: list[str]
    backups: list[str]
    planned: int
    bytes: int
    sessions: list[str]
    unmatched: int
    unmatched_messages: list[Unmatched]
    notes: list[str]
    changed: bool
    done: dict[str, Any]  # restore_payloads' {"restored", "bytes", "sessions"}


class Outcome(TypedDict, total=False):
    """What work done in the file owner's process returns (as JSON when it ran in a child):
    its ``result``, or the ``error`` that stopped it."""

    result: Mapping[str, Any]
    error: str


def resolve_archive(archive: str, backup_dir: str) -> str:
    """The archive's path: as given when absolute, else a file name in ``backup_dir``."""
    path = archive if os.path.isabs(archive) else os.path.join(backup_dir, archive)
    name = os.path.basename(path)
    if name.startswith(".") or ".partial" in name:
        raise MaintenanceError("%s is an unfinished archive (a hidden .partial file): refused" % path)
    if not is_archive_name(name):
        raise MaintenanceError(
            "%s is not an archive of this collection (hermes-ops-archive_<profile>_<time>.db): refused; "
            "a whole-file backup (hermes-ops_<profile>_<time>.db[.gz]) is given as backup" % path
        )
    if not os.path.lexists(path):
        raise MaintenanceError("archive %s does not exist: check the name and backup_dir" % path)
    return path


def _check_private(path: str, what: str) -> None:
    """A regular file of ours (the file owner's or root's) that nobody else can write."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise MaintenanceError("%s %s is not a regular file (a link or a directory): refused" % (what, path))
    if st.st_mode & 0o022 or st.st_uid not in (os.geteuid(), 0):
        raise MaintenanceError(
            "%s %s is writable by others or owned by uid %d (mode %o): refused; %ss are the owner's, 0600"
            % (what, path, st.st_uid, stat.S_IMODE(st.st_mode), what)
        )


def _open_archive(path: str) -> sqlite3.Connection:
    _check_private(path, "archive")
    return sqlite3.connect(sqlite_uri(path, mode="ro", immutable="1"), uri=True, isolation_level=None)


def resolve_backup(backup: str, backup_dir: str, profile: str) -> str:
    """A whole-file backup's path: V(newest) (the profile's newest), an absolute path, or a file name in
    ``backup_dir``; only a finished backup of this same profile."""
    if backup == NEWEST:
        found = list_backups(backup_dir, profile)
        if not found:
            raise MaintenanceError(
                "no whole-file backup (hermes-ops_%s_<time>.db[.gz]) and no archive (hermes-ops-archive_%s_<time>.db) "
                "of profile %s in %s: nothing was restored" % (profile, profile, profile, backup_dir)
            )
        newest: str = found[0][0]
        return newest
    path = backup if os.path.isabs(backup) else os.path.join(backup_dir, backup)
    name = os.path.basename(path)
    if name.startswith(".") or ".partial" in name:
        raise MaintenanceError("%s is an unfinished backup (a hidden .partial file): refused" % path)
    parsed = parse_backup_name(name)
    if parsed is None:
        raise MaintenanceError(
            "%s is not a whole-file backup of this collection (hermes-ops_<profile>_<time>.db[.gz]): refused; "
            "an archive (hermes-ops-archive_*.db) is given as archive" % path
        )
    if parsed[0] != profile:
        raise MaintenanceError(
            "%s is a backup of profile %s, not of %s: refused; sessions go back only into the profile they came from"
            % (path, parsed[0], profile)
        )
    if not os.path.lexists(path):
        raise MaintenanceError("backup %s does not exist: check the name and backup_dir" % path)
    return os.path.abspath(path)


def _gz_size(path: str) -> int:
    """What a .gz decompresses to, at least (gzip's trailer holds it modulo 4 GiB)."""
    with open(path, "rb") as handle:
        handle.seek(-4, os.SEEK_END)
        return max(int.from_bytes(handle.read(4), "little"), os.path.getsize(path))


def _decompress(path: str, profile: str) -> tuple[str, str]:
    """``path`` (.gz) decompressed into a private directory (0700, its file 0600) beside it."""
    backup_dir = os.path.dirname(path)
    needed, available = _gz_size(path) + MB, free_bytes(backup_dir)
    if available < needed:
        raise MaintenanceError(
            "not enough space in %s to decompress %s: it needs about %d MB, %d MB are free; nothing was restored"
            % (backup_dir, path, needed // MB, available // MB)
        )
    workdir = tempfile.mkdtemp(prefix=WORK_PREFIX + profile + ".", dir=backup_dir)
    plain = os.path.join(workdir, "backup.db")
    try:
        unpack_backup(path, plain)
    except (OSError, EOFError, zlib.error) as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise MaintenanceError("cannot decompress backup %s: %s; nothing was restored" % (path, exc)) from None
    return workdir, plain


def _stage(fd: int, name: str, backup_dir: str, profile: str) -> tuple[str, str]:
    """A copy, in a private directory of ``backup_dir`` (0700, its file 0600), of the backup root
    opened as ``fd``: a backup root fetched into its own directory (the off-site copy) is not
    readable by the file owner's process, which restores it. The directory carries the name of a
    decompressed copy, so a killed restore's is removed by the next run of the profile."""
    os.makedirs(backup_dir, mode=0o700, exist_ok=True)
    try:
        size = os.fstat(fd).st_size
        if free_bytes(backup_dir) < size + MB:
            raise MaintenanceError(
                "not enough space in %s for a copy of %s (%d MB): nothing was restored" % (backup_dir, name, size // MB)
            )
        workdir = tempfile.mkdtemp(prefix=WORK_PREFIX + profile + ".", dir=backup_dir)
        copy = os.path.join(workdir, name)
        try:
            out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(out, "wb") as handle:
                os.lseek(fd, 0, os.SEEK_SET)
                while True:
                    chunk = os.read(fd, MB)
                    if not chunk:
                        break
                    handle.write(chunk)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
    except OSError as exc:
        raise MaintenanceError(
            "cannot copy backup %s into %s: %s; nothing was restored" % (name, backup_dir, exc)
        ) from None
    return workdir, copy


def _remove_leftovers(backup_dir: str, profile: str) -> None:
    """Decompressed copies a killed restore of this profile left (we hold its lock)."""
    pattern = re.compile(r"^%s%s\.[A-Za-z0-9_]{8}$" % (re.escape(WORK_PREFIX), re.escape(profile)))
    try:
        names = os.listdir(backup_dir)
    except OSError:
        return
    for name in names:
        path = os.path.join(backup_dir, name)
        if pattern.match(name) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def opened_source(kind: str, path: str, profile: str) -> Iterator[tuple[str, SourceInfo]]:
    """(readable plain file, info) of a verified archive (``kind`` archive) or whole-file backup
    (``file``) of ``profile``; a decompressed copy is removed on leaving. Raises MaintenanceError."""
    if kind == "archive":
        info = check_archive(path)
        info["kind"] = "archive"
        if info["profile"] not in (None, profile):
            raise MaintenanceError(
                "archive %s holds sessions of profile %s, not of %s: refused" % (path, info["profile"], profile)
            )
        yield path, info
        return
    _check_private(path, "backup")
    workdir, plain = _decompress(path, profile) if path.endswith(".gz") else ("", path)
    try:
        try:
            counts = db_counts(plain)
        except MaintenanceError as exc:
            raise MaintenanceError("backup %s is damaged or not a state.db (%s): refused" % (path, exc)) from None
        info = {
            "path": path,
            "kind": "file",
            "profile": profile,
            "compressed": path.endswith(".gz"),
            "created_at": float(cast("tuple[str, int]", parse_backup_name(os.path.basename(path)))[1]),
            "schema_version": counts["schema_version"],
            "sessions": counts["sessions"],
            "messages": counts["messages"],
        }
        yield plain, info
    finally:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def check_archive(path: str) -> SourceInfo:
    """What a finished archive holds; raises MaintenanceError naming what is wrong with it."""
    conn = _open_archive(path)
    try:
        try:
            check = quick_check_rows(conn)
        except sqlite3.DatabaseError as exc:
            check = [str(exc)]
        if check != ["ok"]:
            raise MaintenanceError("archive %s is damaged (quick_check: %s): refused" % (path, "; ".join(check[:3])))
        try:
            meta = dict(conn.execute("SELECT key, value FROM archive_meta").fetchall())
            listed = conn.execute("SELECT id, messages FROM archive_sessions ORDER BY seq").fetchall()
            present = {r[0] for r in conn.execute("SELECT id FROM sessions")}
            held = dict(conn.execute("SELECT session_id, COUNT(*) FROM messages GROUP BY session_id").fetchall())
            closes = len(recorded_closes(conn))
        except sqlite3.DatabaseError as exc:
            raise MaintenanceError("%s is not a readable archive: %s" % (path, exc)) from None
    finally:
        conn.close()
    incomplete = [sid for sid, count in listed if sid not in present or held.get(sid, 0) < count]
    if meta.get("kind") != "prune archive" or not (listed or closes) or incomplete:
        raise MaintenanceError(
            "archive %s is not a complete, verified archive (%s): refused"
            % (
                path,
                "%d of its sessions lack rows" % len(incomplete) if incomplete else "no list of the sessions it holds",
            )
        )
    version = meta.get("schema_version")
    info: SourceInfo = {
        "path": path,
        "profile": meta.get("profile"),
        "source": meta.get("source"),
        "created_at": float(meta["created_at"]) if meta.get("created_at") else None,
        "schema_version": int(version) if version and version.isdigit() else None,
        "sessions": len(listed),
        "messages": sum(held.get(sid, 0) for sid, _count in listed),
        "sessions_closed": closes,
    }
    return info


def _live_schema_version(dst: sqlite3.Connection) -> int | None:
    try:
        row = dst.execute("SELECT MAX(version) FROM schema_version").fetchone()
    except sqlite3.Error:
        return None
    version: int | None = row[0] if row else None
    return version


def parse_time(value: object, name: str) -> float | None:
    """Unix seconds, or an ISO 8601 date or date and time (UTC unless it names a zone); None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    seconds = iso_seconds(text)
    if seconds is None:
        raise MaintenanceError(
            "%s: %r is neither unix seconds nor an ISO 8601 date or time (2026-11-24, 2026-11-24T13:00:00Z)"
            % (name, value)
        )
    return seconds


def selection(
    sessions: Iterable[str] | None = None,
    active_after: object = None,
    active_before: object = None,
    sources: Iterable[str] | None = None,
    match: str | None = None,
) -> Selection:
    """The sessions asked for, every criterion given combined with AND (None: not asked)."""
    sel: Selection = {
        "sessions": list(sessions) if sessions is not None else None,
        "active_after": parse_time(active_after, "active_after"),
        "active_before": parse_time(active_before, "active_before"),
        "sources": list(sources) if sources else None,
        "match": match or None,
    }
    after, before = sel["active_after"], sel["active_before"]
    if after is not None and before is not None and after >= before:
        raise MaintenanceError(
            "active_after (%s) is not before active_before (%s): no session can be in that window"
            % (active_after, active_before)
        )
    return sel


def _active_in(s: Session, after: float | None, before: float | None) -> bool:
    """The session's span (started .. last activity) touches [after, before)."""
    if not isinstance(s.started, (int, float)):
        return False
    last = s.last if isinstance(s.last, (int, float)) else s.started
    return (after is None or last >= after) and (before is None or s.started < before)


def _matching(src: sqlite3.Connection, text: str) -> tuple[set[str], str | None]:
    """Sessions whose title contains ``text``, or a message of which the file's own FTS index
    finds as a phrase; the note says when there is no usable index (titles only)."""
    found: set[str] = set()
    if "title" in columns(src, "sessions"):
        like = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        found |= {r[0] for r in src.execute("SELECT id FROM sessions WHERE title LIKE ? ESCAPE '\\'", (like,))}
    try:
        rows = src.execute(
            "SELECT DISTINCT session_id FROM messages WHERE id IN "
            "(SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?)",
            ('"%s"' % text.replace('"', '""'),),  # one FTS5 phrase: the words as they are
        ).fetchall()
    except sqlite3.Error as exc:
        return found, "no usable full-text index in the source (messages_fts: %s): match looked at titles only" % exc
    return found | {r[0] for r in rows}, None


def _select(
    src: sqlite3.Connection, held: Mapping[str, Session], scope: Iterable[str], sel: Selection
) -> tuple[set[str], str | None]:
    chosen = set(scope)
    if sel["sessions"] is not None:
        chosen &= set(sel["sessions"])
    if sel["active_after"] is not None or sel["active_before"] is not None:
        chosen = {sid for sid in chosen if _active_in(held[sid], sel["active_after"], sel["active_before"])}
    if sel["sources"]:
        chosen = {sid for sid in chosen if held[sid].source in sel["sources"]}
    note = None
    if sel["match"]:
        matched, note = _matching(src, sel["match"])
        chosen &= matched
    return chosen, note


def _present(dst: sqlite3.Connection, ids: Iterable[str]) -> set[str]:
    """Which of ``ids`` state.db has, a statement (a short read) per ID_CHUNK."""
    ordered = sorted(ids)
    found: set[str] = set()
    for start in range(0, len(ordered), ID_CHUNK):
        chunk = ordered[start : start + ID_CHUNK]
        found |= {
            r[0] for r in dst.execute("SELECT id FROM sessions WHERE id IN (%s)" % ",".join("?" * len(chunk)), chunk)
        }
    return found


def _held_sessions(src: sqlite3.Connection, what: str, path: str) -> dict[str, Session]:
    lacking = [c for c in REQUIRED_COLUMNS["sessions"] if c not in columns(src, "sessions")]
    if lacking:
        raise MaintenanceError(
            "%s %s has no sessions.%s: not a Hermes state.db this collection knows; nothing was restored"
            % (what, path, ", ".join(lacking))
        )
    schema: SessionTables = {
        "session_columns": set(columns(src, "sessions")),
        "tables": {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")},
    }
    held: dict[str, Session] = load_sessions(src, schema, time.time())
    return held


def plan_session_restore(
    db_path: str,
    archive_path: str,
    session_ids: Iterable[str] | None = None,
    busy_timeout: float = BUSY_TIMEOUT,
    select: Selection | None = None,
    info: SourceInfo | None = None,
    pending: Collection[str] = (),
) -> SessionRestorePlan:
    """What restoring the sessions chosen from an archive or backup would do; reads only.

    ``archive_path``: the archive, or a whole-file backup's plain file with its ``info``
    (``opened_source``). ``session_ids`` / ``select`` (``selection``): which sessions (none
    given: every session of an archive); with each chosen session, the sessions the prune took
    with it. From a backup only sessions state.db lacks are listed, and those of ``pending`` (an
    unfinished restore from the same backup). Returns {"archive" or "backup", "db_schema_version",
    "sessions": [{"id", "present", "messages_archived", "messages_missing", "rows_missing" (of
    the other tables tied to it), "orphaned"}] (parents first, as they are restored),
    "sessions_restored", "sessions_present", "messages_restored", "rows_restored", "orphaned",
    "changed", "notes"}.
    """
    if not info:
        info = check_archive(archive_path)
        info["kind"] = "archive"
    sel = _asked(info, select, session_ids)
    src = sqlite3.connect(sqlite_uri(archive_path, mode="ro", immutable="1"), uri=True, isolation_level=None)
    live = ReadOnlyDB(db_path, busy_timeout)  # creates no file beside state.db, takes no lock between statements
    try:
        return _read_plan(src, live.conn, db_path, info, sel, pending)
    except sqlite3.OperationalError as exc:
        raise MaintenanceError("%s could not be read: %s; nothing was restored" % (db_path, exc)) from None
    finally:
        src.close()
        live.close()


def _asked(info: SourceInfo, select: Selection | None, session_ids: Iterable[str] | None) -> Selection:
    """The selection: ``select`` with ``session_ids`` as its sessions; from a backup, never everything."""
    sel = Selection(**(select or selection()))
    if session_ids is not None:
        sel["sessions"] = list(session_ids)
    if info["kind"] != "archive" and sel == selection():
        raise MaintenanceError(
            "name what to bring back from backup %s (sessions, active_after/active_before, sources, match): "
            "a whole-file backup also holds sessions deleted on purpose; list_missing shows what it holds; "
            "nothing was restored" % info["path"]
        )
    return sel


def _read_plan(
    src: sqlite3.Connection,
    dst: sqlite3.Connection,
    db_path: str,
    info: SourceInfo,
    sel: Selection,
    pending: Collection[str],
) -> SessionRestorePlan:
    """``plan_session_restore`` on the open source ``src`` and state.db ``dst``."""
    archive = info["kind"] == "archive"
    what = "archive" if archive else "backup"
    if archive:
        scope = [r[0] for r in src.execute("SELECT id FROM archive_sessions ORDER BY seq DESC")]
    else:
        scope = [r[0] for r in src.execute("SELECT id FROM sessions")]
    closes = recorded_closes(src) if archive else []
    _refuse_unknown(sel, scope, {r[0] for r in closes}, what, info["path"])
    live_version = _live_schema_version(dst)
    _refuse_newer(info, live_version, what)
    referencing, _referenced = related_tables(src)
    problems = _schema_problems(src, dst, ["sessions"] + [t for t, _c in referencing[:1]], what)
    if problems:
        raise MaintenanceError(
            "%s %s does not fit %s: %s; nothing was restored" % (what, info["path"], db_path, "; ".join(problems))
        )
    held = _held_sessions(src, what, info["path"])
    chosen, note = _select(src, held, scope, sel)
    taken = taken_along(chosen, held) & set(scope)
    present = _present(dst, taken)
    _refuse_fenced(dst, taken - present, what, info["path"])
    if archive:
        wanted = [sid for sid in scope if sid in taken]
        untouched = 0
    else:  # what state.db has is never touched, but what an unfinished restore is putting back
        wanted = parents_first((taken - present) | (taken & set(pending)), held)
        untouched = len(taken & present - set(pending))
    # Rows of the other tables tied to a session (session_model_usage): a restore cut short
    # after a session's messages went back may still lack them.
    others = [(t, c) for t, c in referencing[1:] if _schema_problems(src, dst, [t], what) == []]
    sessions = [_plan_one(src, dst, sid, set(wanted), others) for sid in wanted]
    reopen = _closes_asked(closes, sel)
    reopened = reopenable(dst, reopen)
    plan = _totals(sessions, live_version, [note] if note else [])
    if archive:
        plan["archive"] = info
    else:
        plan["backup"] = info
    plan["sessions_present"] += untouched
    plan["reopen"], plan["sessions_reopened"] = [r[0] for r in reopen], reopened
    plan["changed"] = plan["changed"] or bool(reopened)
    return plan


def _refuse_unknown(sel: Selection, scope: list[str], closed: set[str], what: str, path: str) -> None:
    """Every session named must be one the source holds (or one whose close it recorded)."""
    unknown = sorted(set(sel["sessions"] or ()) - set(scope) - closed)
    if unknown:
        raise MaintenanceError(
            "%s %s does not hold session(s) %s (it holds %d sessions; %s); nothing was restored"
            % (
                what,
                path,
                ", ".join(unknown[:5]),
                len(scope),
                "list them with check mode and no sessions given" if what == "archive" else "list_missing shows them",
            )
        )


def _refuse_newer(info: SourceInfo, live_version: int | None, what: str) -> None:
    """A source of a newer schema than state.db's would bring columns an older Hermes does not know."""
    version = info["schema_version"]
    if version and live_version and version > live_version:
        raise MaintenanceError(
            "%s %s was taken from schema_version %d, state.db is at %d (an older Hermes): refused; "
            "upgrade Hermes (it migrates state.db) first" % (what, info["path"], version, live_version)
        )


def _refuse_fenced(dst: sqlite3.Connection, absent: set[str], what: str, path: str) -> None:
    """Hermes refuses to recreate a session deleted under its deletion fence: so does the restore."""
    fenced = sorted(retired(dst, sorted(absent)))
    if fenced:
        raise MaintenanceError(
            "session(s) %s were deleted under Hermes's deletion fence (state_meta %s<id>): Hermes refuses to "
            "recreate a retired id (its local create returns not_found; a retry must not resurrect the row and "
            "re-admit its requests), so no faithful restore exists; nothing was restored. Read them from %s %s"
            % (", ".join(fenced[:5]), RETIRED_PREFIX, what, path)
        )


def _closes_asked(closes: list[Any], sel: Selection) -> list[Any]:
    """The recorded zombie closes to undo: those named in ``sessions``, or all with no selection
    (a close records no source, time or text, so the other criteria choose none)."""
    if sel == selection():
        return closes
    asked = sel["sessions"]
    if asked is None or any((sel["active_after"], sel["active_before"], sel["sources"], sel["match"])):
        return []
    return [r for r in closes if r[0] in set(asked)]


def _schema_problems(
    src: sqlite3.Connection, dst: sqlite3.Connection, tables: Iterable[str], what: str = "archive"
) -> list[str]:
    """What keeps the source's rows from fitting state.db's tables (columns matched by name)."""
    problems = []
    for table in tables:
        live = dst.execute('SELECT name, "notnull", dflt_value, pk FROM pragma_table_info(?)', (table,)).fetchall()
        if not live:
            problems.append("state.db has no table %s" % table)
            continue
        archived = {r[0] for r in src.execute("SELECT name FROM pragma_table_info(?)", (table,))}
        needed = [name for name, notnull, default, pk in live if notnull and default is None and not pk]
        lacking = [name for name in needed if name not in archived]
        if lacking:
            problems.append("%s.%s (NOT NULL, no default) is not in the %s" % (table, ", ".join(lacking), what))
    return problems


def _missing_rows(src: sqlite3.Connection, dst: sqlite3.Connection, sid: str, others: Iterable[tuple[str, str]]) -> int:
    missing = 0
    for table, column in others:
        sql = "SELECT COUNT(*) FROM %s WHERE %s = ?" % (quoted(table), quoted(column))
        missing += max(0, src.execute(sql, (sid,)).fetchone()[0] - dst.execute(sql, (sid,)).fetchone()[0])
    return missing


def _plan_one(
    src: sqlite3.Connection, dst: sqlite3.Connection, sid: str, wanted: set[str], others: Iterable[tuple[str, str]]
) -> SessionPlan:
    parent = src.execute("SELECT parent_session_id FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
    ids = [r[0] for r in src.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY id", (sid,))]
    present = dst.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None
    there = 0
    for start in range(0, len(ids), ID_CHUNK):  # each statement its own short read
        chunk = ids[start : start + ID_CHUNK]
        there += dst.execute(  # by id and session: an id another session holds is not this one's message
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND id IN (%s)" % ",".join("?" * len(chunk)),
            [sid] + chunk,
        ).fetchone()[0]
    orphaned = (
        not present
        and parent is not None
        and parent not in wanted
        and dst.execute("SELECT 1 FROM sessions WHERE id = ?", (parent,)).fetchone() is None
    )
    return {
        "id": sid,
        "present": present,
        "messages_archived": len(ids),
        "messages_missing": len(ids) - there,
        "rows_missing": _missing_rows(src, dst, sid, others),
        "orphaned": orphaned,
    }


def _totals(sessions: list[SessionPlan], live_version: int | None, notes: list[str]) -> SessionRestorePlan:
    """A plan of these ``sessions``, with their totals."""
    totals: SessionRestorePlan = {
        "db_schema_version": live_version,
        "sessions": sessions,
        "notes": notes,
        "sessions_restored": sum(1 for s in sessions if not s["present"]),
        "sessions_present": sum(1 for s in sessions if s["present"]),
        "messages_restored": sum(s["messages_missing"] for s in sessions),
        "rows_restored": sum(s["rows_missing"] for s in sessions),
        "orphaned": sum(1 for s in sessions if s["orphaned"]),
        "changed": False,
    }
    totals["changed"] = bool(totals["sessions_restored"] or totals["messages_restored"] or totals["rows_restored"])
    return totals


def _pending_path(backup_dir: str, profile: str) -> str:
    return os.path.join(backup_dir, WORK_PREFIX + profile + ".pending")


def _read_pending(path: str, source: str) -> set[str]:
    """Sessions an unfinished restore from ``source`` was putting back (nothing for another source)."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return set()
    return set(data.get("sessions") or ()) if isinstance(data, dict) and data.get("source") == source else set()


def _write_pending(path: str, source: str, ids: Iterable[str]) -> None:
    """Written (0600, fsynced) before the first write; removed once every session is complete."""
    partial = path + ".partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"source": source, "sessions": sorted(ids)}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(partial, path)
    fsync_path(os.path.dirname(path))


def _settle_pending(path: str, source: str, pending: set[str], planned: list[SessionPlan], db_path: str) -> None:
    """Take the sessions ``planned`` shows complete off the list (an older killed run's others stay).

    Only once the commits that completed them are durable: else a power loss brings back a
    partly restored session, now off the list, and a later run takes it as present."""
    left = pending - {s["id"] for s in planned if s["present"] and not (s["messages_missing"] or s["rows_missing"])}
    commits_durable(db_path)
    if left:
        _write_pending(path, source, left)
    else:
        os.unlink(path)


def _locked(db_path: str, check_mode: bool) -> ProfileLock:
    try:
        lock = ProfileLock(db_path, check_mode=check_mode)
    except ProfileSkipped:
        raise MaintenanceError(
            "%s is held by a maintenance run (ours or Hermes's auto-maintenance): try again when it is done; "
            "nothing was restored" % (db_path + LOCK_SUFFIX)
        ) from None
    try:
        refuse_during_hermes_operation(db_path)
    except ProfileSkipped as exc:
        lock.release()
        raise MaintenanceError(str(exc).replace("skipped, nothing changed", "nothing was restored")) from None
    return lock


def _work(
    db_path: str, source: Source, select: Selection | None, check_mode: bool, busy_timeout: float, pause: float
) -> Outcome:
    """The restore itself, in the file owner's process; returns {"result"} or {"error"}."""
    lock = None
    staged = None
    try:
        lock = _locked(db_path, check_mode)
        if not check_mode:
            _remove_leftovers(source["backup_dir"], source["profile"])
        readable = source["path"]
        fd = source.get("fd")
        if fd is not None:
            staged = _stage(fd, os.path.basename(source["path"]), source["backup_dir"], source["profile"])
            readable = staged[1]
        with opened_source(source["kind"], readable, source["profile"]) as (plain, info):
            info["path"] = source["path"]  # the backup as named: the pending list and the result name it
            run = _SessionRun(db_path, plain, info, select, busy_timeout, pause)
            return {"result": _restore_from(run, source, check_mode)}
    except MaintenanceError as exc:
        return {"error": str(exc)}
    finally:
        if staged is not None:
            shutil.rmtree(staged[0], ignore_errors=True)
        if lock is not None:
            lock.release()


class _SessionRun:
    """What one session restore reads and writes: state.db, the source's plain file and its info,
    the selection and the pacing."""

    def __init__(
        self, db_path: str, plain: str, info: SourceInfo, select: Selection | None, busy_timeout: float, pause: float
    ) -> None:
        self.db_path, self.plain, self.info, self.select = db_path, plain, info, select
        self.busy_timeout, self.pause = busy_timeout, pause

    def plan(self, pending: Collection[str]) -> SessionRestorePlan:
        return plan_session_restore(self.db_path, self.plain, None, self.busy_timeout, self.select, self.info, pending)


def _restore_from(run: _SessionRun, source: Source, check_mode: bool) -> SessionRestorePlan:
    """Plan, then (not in check mode) restore what the plan lacks; a backup's sessions are listed
    in the pending file until they are complete."""
    backup = source["kind"] == "file"
    pending_path = _pending_path(source["backup_dir"], source["profile"])
    pending = _read_pending(pending_path, source["path"]) if backup else set()
    plan = run.plan(pending)
    if pending & {s["id"] for s in plan["sessions"]}:
        plan["notes"].append("completes the unfinished restore listed in %s" % pending_path)
    if check_mode or not plan["changed"]:
        if backup and pending and not check_mode:  # killed after its last commit: nothing left to do
            _settle_pending(pending_path, source["path"], pending, plan["sessions"], run.db_path)
        return plan
    wanted = [s["id"] for s in plan["sessions"] if not s["present"] or s["messages_missing"] or s["rows_missing"]]
    refuse_wal_on_shared_filesystem(run.db_path, "wal" if is_wal_file(run.db_path) else "delete")
    if backup:
        pending |= set(wanted)
        _write_pending(pending_path, source["path"], pending)
    done = _put_sessions_back(run, plan, wanted, backup)
    after = run.plan(pending)["sessions"]
    _record_done(plan, done, [s for s in after if s["id"] in set(wanted)] if backup else after)
    if backup:
        _settle_pending(pending_path, source["path"], pending, after, run.db_path)
    return plan


def _put_sessions_back(run: _SessionRun, plan: SessionRestorePlan, wanted: list[str], backup: bool) -> dict[str, int]:
    """The sessions ``wanted`` written back (in that order from a backup), then the closes undone."""
    try:
        done: dict[str, int] = restore_sessions(
            run.db_path,
            run.plain,
            wanted,
            busy_timeout=run.busy_timeout,
            pause=run.pause,
            order=wanted if backup else None,
        )
    except sqlite3.OperationalError as exc:
        raise MaintenanceError(
            "%s: %s (held by another writer for longer than busy_timeout, %ss); what was restored stays, "
            "run the restore again to complete it" % (run.db_path, exc, run.busy_timeout)
        ) from None
    if plan["reopen"]:
        done.update(reopen_closed(run.db_path, run.plain, plan["reopen"], busy_timeout=run.busy_timeout))
    return done


def _record_done(plan: SessionRestorePlan, done: dict[str, int], after: list[SessionPlan]) -> None:
    """The plan's figures replaced by what the run did; ``after``: the sessions restored, as they are now."""
    plan["sessions_reopened"] = done.get("sessions_reopened", 0)
    plan["done"] = done
    plan["sessions_restored"] = done["sessions_restored"]
    plan["messages_restored"] = done["messages_restored"]
    plan["orphaned"] = done["orphaned"]
    plan["after"] = after
    plan["rows_restored"] -= sum(s["rows_missing"] for s in after)
    restored = done["sessions_restored"] or done["messages_restored"] or plan["rows_restored"]
    plan["changed"] = bool(restored or plan["sessions_reopened"])


def _open_roots(path: str, owner: int) -> int | None:
    """A descriptor on ``path`` when it is root's and the work is done as ``owner`` (else None):
    opened here, as root, and read by the owner's process, which cannot open it itself."""
    if os.geteuid() != 0 or owner == 0:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None  # resolve_backup named it; opened_source says what is wrong
    if st.st_uid != 0:
        return None
    _check_private(path, "backup")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise MaintenanceError("cannot open backup %s: %s" % (path, exc)) from None
    if not os.path.samestat(os.fstat(fd), st):
        os.close(fd)
        raise MaintenanceError("backup %s changed while it was opened: refused" % path)
    return fd


def _in_owner(db_path: str, fn: Callable[..., Outcome], *args: object) -> dict[str, Any]:
    """``fn(*args)`` as the owner of state.db (a child switched to that user, as root), umask 077."""
    owner = os.lstat(db_path).st_uid
    old_umask = os.umask(0o077)
    outcome: Outcome
    try:
        if os.geteuid() == 0 and owner != 0:
            outcome = run_as_owner(owner, fn, *args)
        else:
            outcome = fn(*args)
    finally:
        os.umask(old_umask)
    if "error" in outcome:
        raise MaintenanceError(outcome["error"])
    return dict(outcome["result"])  # a copy the caller adds its keys to (a child's came as JSON anyway)


def _profile_db(home: str, profile: str) -> str:
    db_path: str = profile_path(home, profile)
    if not os.path.isfile(db_path) or os.path.islink(db_path):
        raise MaintenanceError("%s is not a state.db file: check hermes_home and profile" % db_path)
    return db_path


def restore_selected(
    home: str, profile: str, archive: str | None = None, backup: str | None = None, select: Selection | None = None,
    backup_dir: str | None = None, check_mode: bool = False, busy_timeout: float = BUSY_TIMEOUT,
    pause: float = BATCH_PAUSE,
) -> dict[str, Any]:  # fmt: skip
    """Restore the sessions ``select`` (``selection``) names from an archive or a whole-file backup.

    ``archive``: a path, or a file name in ``backup_dir`` (default HOME/backups); ``backup``: the
    same for a whole-file backup, or V(newest). Exactly one of them. Returns the plan (see
    ``plan_session_restore``) with ``db``; after a real run also ``done`` (what
    ``restore_sessions`` did) and ``after`` (each session as it is now). Raises MaintenanceError.
    """
    if (archive is None) == (backup is None):
        raise MaintenanceError("name exactly one of archive and backup to restore sessions from")
    home = os.path.abspath(os.path.expanduser(home))
    db_path = _profile_db(home, profile)
    backups: str = backups_of(home, backup_dir)
    source, fallback = _session_source(archive, backup, backups, profile, select)
    fd = _open_roots(source["path"], os.lstat(db_path).st_uid) if source["kind"] == "file" else None
    source["fd"] = fd
    try:
        result = _in_owner(db_path, _work, db_path, source, select, check_mode, busy_timeout, pause)
    finally:
        if fd is not None:
            os.close(fd)
    result["db"] = db_path
    if fallback:
        result["notes"].insert(0, fallback)
    return result


def _session_source(
    archive: str | None, backup: str | None, backup_dir: str, profile: str, select: Selection | None
) -> tuple[Source, str | None]:
    """The archive or whole-file backup to restore from, and the note when V(newest) takes an archive."""
    fallback = None
    if archive is not None:
        source: Source = {"kind": "archive", "path": resolve_archive(archive, backup_dir)}
    elif backup == NEWEST and not list_backups(backup_dir, profile) and list_archives(backup_dir, profile):
        source, fallback = _newest_archive_instead(backup_dir, profile, select)
    else:
        source = {"kind": "file", "path": resolve_backup(cast(str, backup), backup_dir, profile)}
    source["profile"], source["backup_dir"] = profile, backup_dir
    return source, fallback


def _newest_archive_instead(backup_dir: str, profile: str, select: Selection | None) -> tuple[Source, str]:
    """For V(newest) where the profile has no whole-file backup: its newest archive (the rows a prune
    deleted, kept when a whole-file backup could not be taken beside the gateway), with the note that
    says so. A selection stays required, as from a backup: newest never means every session."""
    path: str = list_archives(backup_dir, profile)[0][0]
    if not select or select == selection():
        raise MaintenanceError(
            "no whole-file backup of profile %s in %s; its newest archive is %s: name what to bring back from it "
            "(sessions, active_after/active_before, sources, match; list_missing shows what it holds); "
            "nothing was restored" % (profile, backup_dir, os.path.basename(path))
        )
    note = (
        "no whole-file backup of profile %s in %s: the sessions come from its newest archive, %s (the rows a prune "
        "deleted, kept instead of a whole-file backup)" % (profile, backup_dir, os.path.basename(path))
    )
    return {"kind": "archive", "path": path}, note


def restore_from_archive(
    home: str, profile: str, archive: str, session_ids: Iterable[str] | None = None, backup_dir: str | None = None,
    check_mode: bool = False, busy_timeout: float = BUSY_TIMEOUT, pause: float = BATCH_PAUSE,
) -> dict[str, Any]:  # fmt: skip
    """Restore ``session_ids`` (None: every session) of an archive into a profile's state.db."""
    return restore_selected(
        home, profile, archive=archive, select=selection(sessions=session_ids), backup_dir=backup_dir,
        check_mode=check_mode, busy_timeout=busy_timeout, pause=pause,
    )  # fmt: skip


def _missing(src: sqlite3.Connection, dst: sqlite3.Connection, scope: Collection[str]) -> Missing:
    """What ``src`` holds of ``scope`` that state.db lacks, per (UTC day it started, source), each
    group naming its sessions (``ids``: id, title, messages; oldest first)."""
    absent = set(scope) - _present(dst, scope)
    counts = dict(src.execute("SELECT session_id, COUNT(*) FROM messages GROUP BY session_id").fetchall())
    title = "title" if "title" in columns(src, "sessions") else "NULL"
    groups: dict[tuple[str, str | None], MissingGroup] = {}
    rows = src.execute("SELECT id, source, started_at, %s FROM sessions ORDER BY started_at, id" % title)
    for sid, source, started, name in rows:
        if sid not in absent:
            continue
        day = time.strftime("%Y-%m-%d", time.gmtime(started)) if isinstance(started, (int, float)) else "unknown"
        entry = groups.setdefault(
            (day, source), {"day": day, "source": source, "sessions": 0, "messages": 0, "ids": []}
        )
        entry["sessions"] += 1
        entry["messages"] += counts.get(sid, 0)
        entry["ids"].append({"id": sid, "title": name, "messages": counts.get(sid, 0)})
    missing = [groups[key] for key in sorted(groups, key=lambda k: (k[0], str(k[1])))]
    return {
        "missing": missing,
        "sessions_missing": sum(e["sessions"] for e in missing),
        "messages_missing": sum(e["messages"] for e in missing),
    }


def _list_work(db_path: str, backup_dir: str, profile: str, busy_timeout: float) -> Outcome:
    lock = None
    try:
        lock = _locked(db_path, True)
        files = [("file", p, t) for p, t in list_backups(backup_dir, profile)]
        files += [("archive", p, t) for p, t in list_archives(backup_dir, profile)]
        files.sort(key=lambda item: item[2], reverse=True)
        found: list[ListedFile] = []
        live = ReadOnlyDB(db_path, busy_timeout)
        try:
            for kind, path, _stamp in files:
                entry: ListedFile = {"path": path, "kind": kind}
                try:
                    _describe_file(entry, profile, live.conn)
                except (MaintenanceError, sqlite3.Error, OSError) as exc:
                    entry["error"] = str(exc)  # one bad file does not hide the others
                found.append(entry)
        finally:
            live.close()
        return {"result": {"backup_dir": backup_dir, "backups": found}}
    except MaintenanceError as exc:
        return {"error": str(exc)}
    finally:
        if lock is not None:
            lock.release()


def _describe_file(entry: ListedFile, profile: str, dst: sqlite3.Connection) -> None:
    """``entry`` filled in: what its file holds, and what of that state.db ``dst`` lacks."""
    kind = entry["kind"]
    with opened_source(kind, entry["path"], profile) as (plain, info):
        entry["created_at"], entry["schema_version"] = info["created_at"], info["schema_version"]
        entry["sessions"], entry["messages"] = info["sessions"], info["messages"]
        with contextlib.closing(sqlite3.connect(sqlite_uri(plain, mode="ro", immutable="1"), uri=True)) as src:
            scope = (
                [r[0] for r in src.execute("SELECT id FROM archive_sessions")]
                if kind == "archive"
                else [r[0] for r in src.execute("SELECT id FROM sessions")]
            )
            missing = _missing(src, dst, scope)
            entry["missing"] = missing["missing"]
            entry["sessions_missing"] = missing["sessions_missing"]
            entry["messages_missing"] = missing["messages_missing"]


def list_missing(
    home: str, profile: str, backup_dir: str | None = None, busy_timeout: float = BUSY_TIMEOUT
) -> dict[str, Any]:
    """For every whole-file backup and archive of the profile (newest first): what it holds that
    state.db no longer has, as {"path", "kind", "created_at", "schema_version", "sessions",
    "messages", "missing": [{"day", "source", "sessions", "messages", "ids": [{"id", "title",
    "messages"}]}], "sessions_missing",
    "messages_missing"} (or "error" for a file that fails the checks). Reads only."""
    home = os.path.abspath(os.path.expanduser(home))
    db_path = _profile_db(home, profile)
    result = _in_owner(db_path, _list_work, db_path, backups_of(home, backup_dir), profile, busy_timeout)
    result["db"] = db_path
    return result


def _payload_sources(
    archive: str | None, backup: str | None, backup_dir: str, profile: str
) -> tuple[list[str], list[str]]:
    """(payload archives, whole-file backups) to restore tool payloads from: the archive named (a path
    or a name in ``backup_dir``), or the backup named (as ``resolve_backup`` takes it), else every
    payload archive of the profile and then every backup, each newest first."""
    if backup is not None:
        return [], [resolve_backup(backup, backup_dir, profile)]
    if archive is None:
        return (
            [path for path, _stamp in list_payload_archives(backup_dir, profile)],
            [path for path, _stamp in list_backups(backup_dir, profile)],
        )
    path = archive if os.path.isabs(archive) else os.path.join(backup_dir, archive)
    name = os.path.basename(path)
    if not is_payload_archive_name(name):
        raise MaintenanceError(
            "%s is not a payload archive of this collection (hermes-ops-payloads_<profile>_<time>.db): refused; "
            "a whole-file backup (hermes-ops_<profile>_<time>.db[.gz]) is given as backup" % path
        )
    match = name[len(PAYLOAD_PREFIX) :].rsplit("_", 1)[0]
    if match != profile:
        raise MaintenanceError("%s holds tool payloads of profile %s, not of %s: refused" % (path, match, profile))
    if not os.path.lexists(path):
        raise MaintenanceError("payload archive %s does not exist: check the name and backup_dir" % path)
    return [path], []


UNMATCHED_LISTED = 100  # tombstones left alone that the result names one by one (all are counted)


def _payload_backups(
    stack: contextlib.ExitStack,
    backups: list[str],
    fds: Mapping[str, int | None],
    stones: dict[int, dict[str, Any]],
    profile: str,
    backup_dir: str,
    named: bool,
) -> tuple[list[PayloadItem], set[str], dict[int, str], list[str], list[str]]:
    """Match the tombstones ``stones`` no archive gives back against the whole-file ``backups``, newest
    first, until none is left: (todo, plain paths to read the bodies from, {message id: why no backup
    gave it}, the backups read, notes).
    A backup that gives something stays open (decompressed or staged) in ``stack`` for the run. A
    backup that fails its checks is an error when it was ``named``, else a note and the next one."""
    todo: list[PayloadItem] = []
    plain_paths: set[str] = set()
    refused: dict[int, str] = {}
    read: list[str] = []
    notes: list[str] = []
    for path in backups:
        if not stones:
            break
        read.append(path)
        try:
            with contextlib.ExitStack() as inner:
                readable = path
                fd = fds.get(path)
                if fd is not None:
                    workdir, readable = _stage(fd, os.path.basename(path), backup_dir, profile)
                    inner.callback(shutil.rmtree, workdir, True)
                plain, _info = inner.enter_context(opened_source("file", readable, profile))
                src = inner.enter_context(
                    contextlib.closing(sqlite3.connect(sqlite_uri(plain, mode="ro", immutable="1"), uri=True))
                )
                found, why = match_backup(src, plain, stones)
                if found:
                    stack.push(inner.pop_all())
        except (MaintenanceError, sqlite3.Error, OSError) as exc:
            if named:
                raise MaintenanceError(str(exc)) from None
            notes.append("backup %s skipped: %s" % (path, exc))
            continue
        for entry in found:
            stones.pop(entry[1])
            refused.pop(entry[1], None)
        for mid, reason in why.items():
            refused.setdefault(mid, "%s: %s" % (os.path.basename(path), reason))
        todo += found
        if found:
            plain_paths.add(found[0][0])
    return todo, plain_paths, refused, read, notes


class PayloadSources:
    """Where a payload restore reads the elided bodies from: the payload ``archives``, then the
    whole-file ``backups`` (newest first) of ``profile`` in ``backup_dir``, with ``fds``: root's
    descriptor of each backup it opened (None: the owner's process opens it). ``archive_named`` /
    ``backup_named``: the operator named that one source."""

    def __init__(
        self,
        archives: list[str],
        backups: list[str],
        backup_dir: str,
        profile: str,
        archive_named: bool,
        backup_named: bool,
    ) -> None:
        self.archives, self.backups = archives, backups
        self.fds: dict[str, int | None] = {}
        self.backup_dir, self.profile = backup_dir, profile
        self.archive_named, self.backup_named = archive_named, backup_named


def _payload_work(
    db_path: str,
    sources: PayloadSources,
    session_ids: list[str] | None,
    check_mode: bool,
    busy_timeout: float,
    pause: float,
) -> Outcome:
    """``sources``: a PayloadSources. Unless an archive was named, every tombstone of the chosen
    sessions that no source gives back is reported (``unmatched``)."""
    lock = None
    stack = contextlib.ExitStack()
    try:
        lock = _locked(db_path, check_mode)
        if sources.backups and not check_mode:
            _remove_leftovers(sources.backup_dir, sources.profile)
        live = ReadOnlyDB(db_path, busy_timeout)
        try:
            todo, plain_paths, left, read, notes = _payload_plan(live.conn, sources, session_ids, stack)
        finally:
            live.close()
        result: PayloadResult = {
            "archives": sources.archives,
            "backups": read,
            "planned": len(todo),
            "bytes": sum(item[3] for item in todo),
            "sessions": sorted({item[2] for item in todo}),
            "unmatched": len(left),
            "unmatched_messages": left[:UNMATCHED_LISTED],
            "notes": notes,
            "changed": bool(todo),
        }
        if check_mode or not todo:
            return {"result": result}
        refuse_wal_on_shared_filesystem(db_path, "wal" if is_wal_file(db_path) else "delete")
        conn = open_rw(db_path, busy_timeout)
        try:
            result["done"] = restore_payloads(conn, todo, pause=pause, backups=plain_paths)
        finally:
            conn.close()
        commits_durable(db_path)
        return {"result": result}
    except (MaintenanceError, sqlite3.Error, OSError) as exc:
        return {"error": "%s: %s; tool payloads restored so far stay" % (db_path, exc)}
    finally:
        stack.close()
        if lock is not None:
            lock.release()


def _payload_plan(
    live: sqlite3.Connection, sources: PayloadSources, session_ids: list[str] | None, stack: contextlib.ExitStack
) -> tuple[list[PayloadItem], set[str], list[Unmatched], list[str], list[str]]:
    """(bodies to put back, the backups' plain files they come from, the tombstones no source gives
    back, ordered by message id, the backups read, notes): the payload archives first, then, unless an
    archive was named, the whole-file backups for the tombstones left."""
    todo: list[PayloadItem] = plan_restore(live, sources.archives, session_ids)
    if sources.archive_named:
        return todo, set(), [], [], []
    stones = live_tombstones(live, session_ids)
    for entry in todo:
        stones.pop(entry[1], None)
    found, plain_paths, reasons, read, notes = _payload_backups(
        stack, sources.backups, sources.fds, stones, sources.profile, sources.backup_dir, sources.backup_named
    )
    unmatched: dict[int, Unmatched] = {
        mid: {
            "id": mid,
            "session_id": entry["session"],
            "reason": reasons.get(mid, "no payload archive or backup holds it"),
        }
        for mid, entry in stones.items()
    }
    return todo + found, plain_paths, [unmatched[mid] for mid in sorted(unmatched)], read, notes


def restore_tool_payloads(
    home: str, profile: str, archive: str | None = None, session_ids: Iterable[str] | None = None,
    backup_dir: str | None = None, check_mode: bool = False, busy_timeout: float = BUSY_TIMEOUT,
    pause: float = BATCH_PAUSE, backup: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Put the tool payloads that ``tool_payload_days`` elided back, byte for byte: those of
    ``session_ids`` (None: of every session) whose message still holds the tombstone written in its
    place. From the payload archive ``archive`` names, or from the whole-file backup ``backup`` names
    (a row only where ``match_backup`` accepts it), else from every payload archive of the profile
    and then, for the tombstones none of them holds, from its backups, newest first.

    Returns {"db", "archives", "backups", "planned", "bytes", "sessions", "unmatched" (tombstones
    left alone: no backup row matches, or no source holds them; not counted when ``archive`` is named),
    "unmatched_messages" (the first UNMATCHED_LISTED: {"id", "session_id", "reason"}), "notes",
    "changed"} and, after a real run, "done" ({"restored", "bytes", "sessions"}). Raises
    MaintenanceError."""
    if archive is not None and backup is not None:
        raise MaintenanceError("name at most one of archive and backup to restore tool payloads from")
    home = os.path.abspath(os.path.expanduser(home))
    db_path = _profile_db(home, profile)
    backup_dir = backups_of(home, backup_dir)
    archives, backups = _payload_sources(archive, backup, backup_dir, profile)
    if not archives and not backups:
        raise MaintenanceError(
            "no payload archive (%s%s_<time>.db) and no whole-file backup (hermes-ops_%s_<time>.db[.gz]) of profile "
            "%s in %s: nothing was restored" % (PAYLOAD_PREFIX, profile, profile, profile, backup_dir)
        )
    ids = list(session_ids) if session_ids is not None else None
    owner = os.lstat(db_path).st_uid
    sources = PayloadSources(archives, backups, backup_dir, profile, archive is not None, backup is not None)
    try:
        for path in backups:
            try:
                sources.fds[path] = _open_roots(path, owner)
            except MaintenanceError:
                if backup is not None:
                    raise
                # not named: the owner's process finds the same fault and notes it, reading the others
        result = _in_owner(db_path, _payload_work, db_path, sources, ids, check_mode, busy_timeout, pause)
    finally:
        for fd in sources.fds.values():
            if fd is not None:
                os.close(fd)
    result["db"] = db_path
    return result
