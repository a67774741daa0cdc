# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verified online backups of a live state.db, and their retention.

A plain copy of a live WAL database can miss committed data or catch a checkpoint half
done; the copy here is pinned by a read snapshot and takes the -wal under the write lock
(``_copy_files``), or goes through SQLite's backup API when the -wal is big. Either way the
gateway keeps writing. The copy is written under a hidden ``.partial`` name, verified,
fsynced, then renamed: retention and restore only ever see complete, verified files, and
only this collection's own files (``hermes-ops_*``).
"""

from __future__ import annotations

import builtins
import calendar
import contextlib
import errno
import gzip
import os
import re
import shutil
import sqlite3
import stat
import time
from collections.abc import Iterable, Mapping
from re import Pattern
from typing import Any, Callable, TypedDict

from ..sqlite.db import (
    BUSY_TIMEOUT,
    MB,
    MaintenanceError,
    copy_db_bytes,
    file_size,
    free_bytes,
    fsync_path,
    fsync_tree,
    makedirs_durable,
    read_snapshot,
)

PREFIX = "hermes-ops_"
BACKUP_STEP_BYTES = 16 * 1024 * 1024  # copied per step, then flushed (see _copy_files)
# The -wal is copied while we hold the write lock (the gateway waits about 1 ms per MB):
# past this size the slower backup API copies instead, without blocking writers.
RAW_WAL_LIMIT = 32 * 1024 * 1024

Stamped = tuple[str, int]  # a finished file's path and the unix time its name carries


class Counts(TypedDict):
    """What a verified copy holds."""

    sessions: int
    messages: int


def stamped_name(prefix: str, profile: str, when: float, seq: int = 0) -> str:
    """``<prefix><profile>_<UTC stamp>[-<seq>].db``: the name backups and archives share."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return "%s%s_%s%s.db" % (prefix, profile, stamp, "-%d" % seq if seq else "")


def stamped_pattern(prefix: str, suffix: str = r"\.db") -> Pattern[str]:
    """The names stamped_name gives with ``prefix`` (and ``suffix``): groups ``profile``, ``stamp``, ``seq``."""
    return re.compile(r"^%s(?P<profile>.+)_(?P<stamp>\d{8}T\d{6}Z)(?:-(?P<seq>\d+))?%s$" % (re.escape(prefix), suffix))


class StampedFiles:
    """The finished files of one kind in a backup directory, named ``<prefix><profile>_<UTC stamp>[-<seq>].db``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.pattern = stamped_pattern(prefix)

    def name(self, profile: str, when: float, seq: int = 0) -> str:
        return stamped_name(self.prefix, profile, when, seq)

    def is_name(self, name: str) -> bool:
        """Whether ``name`` is a finished file's name (never a hidden ``.partial``)."""
        return self.pattern.match(name) is not None

    def list(self, backup_dir: str, profile: str) -> builtins.list[Stamped]:  # "list" here is this method
        """This profile's finished files, newest first, as (path, unix time)."""
        return list_stamped(backup_dir, profile, self.pattern)


def list_stamped(backup_dir: str, profile: str, pattern: Pattern[str]) -> list[Stamped]:
    """This profile's finished files whose names match ``pattern`` (groups ``profile``,
    ``stamp``, ``seq``), newest first, as (path, unix time)."""
    try:
        names = os.listdir(backup_dir)
    except OSError:
        return []
    found: list[tuple[str, int, int]] = []
    for name in names:
        match = pattern.match(name)
        if match and match.group("profile") == profile:
            stamp = stamp_time(match.group("stamp"))
            found.append((os.path.join(backup_dir, name), stamp, int(match.group("seq") or 0)))
    found.sort(key=lambda item: (item[1], item[2]), reverse=True)
    return [(path, stamp) for path, stamp, _seq in found]


BACKUP_NAME = stamped_pattern(PREFIX, r"\.db(?P<gz>\.gz)?")


def backup_name(profile: str, when: float, seq: int = 0) -> str:
    return stamped_name(PREFIX, profile, when, seq)


def list_backups(backup_dir: str, profile: str) -> list[Stamped]:
    """This profile's finished backups, newest first, as (path, unix time)."""
    return list_stamped(backup_dir, profile, BACKUP_NAME)


def parse_backup_name(name: str) -> tuple[str, int] | None:
    """(profile, unix time) of a finished backup's file name, else None."""
    match = BACKUP_NAME.match(name)
    return (match.group("profile"), stamp_time(match.group("stamp"))) if match else None


def stamp_time(stamp: str) -> int:
    """YYYYmmddTHHMMSSZ as unix time. Not time.strptime: it imports ``_strptime`` lazily, and
    as root the work runs in a child switched to the Hermes user, who may not be able to
    read this interpreter's library (a Python under /root): that import then fails."""
    fields = (stamp[0:4], stamp[4:6], stamp[6:8], stamp[9:11], stamp[11:13], stamp[13:15])
    return calendar.timegm(tuple(int(f) for f in fields) + (0, 0, 0))


def check_backup_dir(backup_dir: str, owner_uid: int, create: bool) -> None:
    """The directory must be the owner's own: not a link, not writable by others."""
    if os.path.islink(backup_dir):
        raise MaintenanceError(
            "backup directory %s is a symbolic link: refused (backups hold private chat history); "
            "use a real directory owned by uid %d" % (backup_dir, owner_uid)
        )
    if not os.path.exists(backup_dir):
        if not create:
            return
        try:
            makedirs_durable(backup_dir, 0o700)  # a backup fsynced in it relies on its name
        except OSError as exc:
            raise MaintenanceError("cannot create backup directory %s: %s" % (backup_dir, exc.strerror)) from None
    st = os.stat(backup_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise MaintenanceError("backup directory %s is not a directory" % backup_dir)
    if st.st_uid != owner_uid:
        raise MaintenanceError(
            "backup directory %s is owned by uid %d, not by the owner of state.db (uid %d): refused; "
            "chown it to the Hermes user or choose another backup_dir" % (backup_dir, st.st_uid, owner_uid)
        )
    if st.st_mode & 0o022:
        raise MaintenanceError(
            "backup directory %s is writable by group or others (mode %o): refused; chmod 700 it"
            % (backup_dir, stat.S_IMODE(st.st_mode))
        )


def remove_partials(backup_dir: str, profile: str, prefix: str = PREFIX, between: str = ".*") -> None:
    """Leftovers of an interrupted backup (or, with the archives' ``prefix``, archive) of this
    profile (we hold its lock). ``between``: what may stand between ``.db`` and ``.partial``
    (a backup's work files are ``.db.gz.partial`` and ``.db.gz.partial.db``)."""
    partial = re.compile(
        r"^\.%s%s_\d{8}T\d{6}Z(?:-\d+)?\.db%s\.partial" % (re.escape(prefix), re.escape(profile), between)
    )
    try:
        names = os.listdir(backup_dir)
    except OSError:
        return
    for name in names:
        # The time stamp right after the name: profile "work" must not take "work_bot"'s partials.
        if partial.match(name):
            try:
                os.unlink(os.path.join(backup_dir, name))
            except OSError:
                pass


class WriteBack:
    """fdatasync a partial archive (the prune's, the tool payloads') each time it has grown by
    BACKUP_STEP_BYTES.

    Written with synchronous=OFF, a large archive otherwise leaves hundreds of MB of dirty pages
    that the kernel writes back all at once: a gateway commit's own fsync then waits behind them
    (the prune's archive at 5 GB: stalls of 520-640 ms; the 2.2 GB payload archive's final fsync:
    970 ms, and a writer on another file of the same disk waited as long).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd  # the descriptor that created the partial file: no second open by its path
        self.flushed = 0

    def __call__(self) -> None:
        size = os.fstat(self.fd).st_size
        if size - self.flushed >= BACKUP_STEP_BYTES:
            os.fdatasync(self.fd)
            self.flushed = size

    def close(self) -> None:
        os.close(self.fd)


def open_partial(partial: str) -> tuple[WriteBack, sqlite3.Connection]:
    """A new private partial archive: (its WriteBack, on the descriptor that created it; a SQLite
    connection to it, no journal and no syncs: it is verified and fsynced before it counts)."""
    write_back = WriteBack(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    dst: sqlite3.Connection | None = None
    try:
        dst = sqlite3.connect(partial)
        dst.execute("PRAGMA journal_mode=OFF")
        dst.execute("PRAGMA synchronous=OFF")
    except BaseException:
        if dst is not None:
            dst.close()
        write_back.close()
        raise
    return write_back, dst


def take_backup(
    conn: sqlite3.Connection,
    db_path: str,
    backup_dir: str,
    profile: str,
    compress: bool,
    must_contain: Mapping[str, int],
    busy_timeout: float = BUSY_TIMEOUT,
) -> dict[str, Any]:
    """Back up through ``conn``'s snapshot; verify; return {path, bytes, verified, ...}.

    A dict, not a TypedDict: the callers add their own keys (``removed``) to it."""
    remove_partials(backup_dir, profile)
    needed = _space_needed(db_path, backup_dir, compress)
    final = _unused_backup_path(backup_dir, profile, compress, time.time())
    partial = os.path.join(backup_dir, "." + os.path.basename(final) + ".partial")
    work = partial + ".db" if compress else partial
    try:
        by_files, counts = _verified_copy(conn, db_path, work, must_contain, busy_timeout)
        if compress:
            with open(work, "rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 4 * MB)
            os.unlink(work)
        os.chmod(partial, 0o600)
        fsync_path(partial)
        os.rename(partial, final)
        fsync_path(backup_dir)
    except BaseException as exc:
        _remove_work_files(work, partial)
        _raise_backup_failed(exc, backup_dir, needed, db_path, final)
        raise
    result: dict[str, Any] = {
        "kind": "file",
        "path": final,
        "bytes": file_size(final),
        "verified": True,
        "compressed": bool(compress),
        "copied_by": "files" if by_files else "backup_api",
    }
    result.update(counts)
    return result


def _space_needed(db_path: str, backup_dir: str, compress: bool) -> int:
    """Bytes the backup needs in ``backup_dir``; refused when they are not free."""
    needed = int((file_size(db_path) + file_size(db_path + "-wal")) * 1.1) + MB
    if compress:  # the plain copy stays until its .gz is complete, and gzip can't promise to shrink it
        needed = 2 * needed
    available = free_bytes(backup_dir)
    if available < needed:
        raise MaintenanceError(
            "not enough space for the backup in %s: it needs about %d MB, %d MB are free; nothing was changed. "
            "Free space there or set backup_dir elsewhere" % (backup_dir, needed // MB, available // MB)
        )
    return needed


def _unused_backup_path(backup_dir: str, profile: str, compress: bool, now: float) -> str:
    """The backup's final path: the first sequence number no finished file of this second holds."""
    seq = 0
    while True:
        final = os.path.join(backup_dir, backup_name(profile, now, seq) + (".gz" if compress else ""))
        if not os.path.exists(final):
            return final
        seq += 1


def _verified_copy(
    conn: sqlite3.Connection, db_path: str, work: str, must_contain: Mapping[str, int], busy_timeout: float
) -> tuple[bool, Counts]:
    """Copy the database into the new private file ``work`` and verify it: (copied by files, its counts)."""
    os.close(os.open(work, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    wal_mode = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    by_files = not wal_mode or file_size(db_path + "-wal") <= RAW_WAL_LIMIT
    if by_files:
        by_files = _copy_files(conn, db_path, work, wal_mode, busy_timeout)
    target = sqlite3.connect(work, isolation_level=None)
    try:
        if not by_files:
            _copy_snapshot(conn, target, work)
        # A standalone file: no -wal beside a backup, whatever the source used. From a
        # copied -wal, this replays its committed frames (checksummed) into the copy first.
        target.execute("PRAGMA journal_mode=DELETE")
        return by_files, verify(target, work, must_contain)
    finally:
        target.close()


def _remove_work_files(work: str, partial: str) -> None:
    """What a failed backup leaves: its copy, the partial .gz and SQLite's files beside the copy."""
    for leftover in (work, partial, work + "-journal", work + "-wal", work + "-shm"):
        try:
            os.unlink(leftover)
        except OSError:
            pass


def _raise_backup_failed(exc: BaseException, backup_dir: str, needed: int, db_path: str, final: str) -> None:
    """A full disk or a failed copy as a MaintenanceError naming it; anything else is left to propagate."""
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or _disk_full(exc):
        raise MaintenanceError(
            "the backup ran out of space in %s (it needs about %d MB): the partial file was removed, "
            "nothing was changed" % (backup_dir, needed // MB)
        ) from None
    if isinstance(exc, (sqlite3.Error, OSError)):  # OSError names the file
        raise MaintenanceError("backup of %s to %s failed: %s; nothing was changed" % (db_path, final, exc)) from None


def _copy_files(conn: sqlite3.Connection, db_path: str, work: str, wal_mode: bool, busy_timeout: float) -> bool:
    """Copy state.db byte for byte under a read snapshot on ``conn``, then its -wal under the write lock.

    While ``conn`` reads, no checkpoint can restart the -wal, nor copy into state.db a frame
    newer than ``conn``'s snapshot (SQLite's read marks; a reader of the bare file blocks
    checkpoints altogether), so every page of state.db that changes during the copy has its
    frame in the -wal. The -wal is copied holding the write lock: nothing appends to it or
    restarts it then. Opening the copy replays that -wal's committed frames, exactly as SQLite
    recovers after a crash. Without WAL, the read snapshot alone keeps writers out.

    False when the write lock stayed taken for ``busy_timeout`` (say a RESTART checkpoint
    waiting for our own reader): ``work`` is emptied and the backup API copies instead.
    """
    with read_snapshot(conn):
        _paced_copy(db_path, work)
        if not (wal_mode and os.path.exists(db_path + "-wal")):
            return True
        # Closing the locker rolls back: that releases the write lock.
        with contextlib.closing(sqlite3.connect(db_path, timeout=busy_timeout, isolation_level=None)) as locker:
            try:
                locker.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                os.truncate(work, 0)
                return False
            os.close(os.open(work + "-wal", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            _paced_copy(db_path + "-wal", work + "-wal", flush=False)
    return True


def _paced_copy(src_path: str, dst_path: str, flush: bool = True) -> None:
    """``cp`` through SQLite's own descriptor (``copy_db_bytes``: closing another would drop the
    read snapshot's locks) in steps of BACKUP_STEP_BYTES, each flushed to disk unless ``flush`` is
    False. A file that shrinks under the copy (a checkpoint truncated it) is covered by the -wal replay."""
    copy_db_bytes(src_path, dst_path, step=BACKUP_STEP_BYTES, flush=flush)


def _copy_snapshot(conn: sqlite3.Connection, target: sqlite3.Connection, work: str) -> None:
    """Copy ``conn``'s database into ``target`` from ONE read snapshot, in paced steps (backup API).

    The backup API restarts a stepped copy whenever another connection writes, which
    with a live gateway means never finishing; but it only notices that when it opens
    a new read transaction on the source. Holding one open on ``conn`` for the whole
    copy keeps every step on the same snapshot (WAL writers are not blocked by it).
    The destination is a private ``.partial`` file verified and fsynced before it is
    renamed, so it needs no rollback journal and no syncs of its own; instead it is
    flushed after every step of BACKUP_STEP_BYTES, which keeps the dirty data the kernel has to write
    back at once small: one big flush at the end delayed the gateway's own commits.
    """
    target.execute("PRAGMA journal_mode=OFF")
    target.execute("PRAGMA synchronous=OFF")
    page_size: int = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = max(1, BACKUP_STEP_BYTES // page_size)
    fd = os.open(work, os.O_RDONLY)
    try:
        with read_snapshot(conn):
            conn.backup(target, pages=pages, progress=lambda status, remaining, total: os.fdatasync(fd))
    finally:
        os.close(fd)


def _disk_full(exc: BaseException) -> bool:
    """SQLite's SQLITE_FULL (13): its page copy hit ENOSPC."""
    if not isinstance(exc, sqlite3.Error):
        return False
    return getattr(exc, "sqlite_errorcode", None) == 13 or "disk is full" in str(exc)


def verify(target: sqlite3.Connection, path: str, must_contain: Mapping[str, int]) -> Counts:
    """The copy opens, and holds every session about to be pruned with at least its messages.

    ``must_contain``: session id -> message count (the plan's). No full quick_check here: the
    copy is state.db's own pages, which passed quick_check at the start of this run, plus
    -wal frames SQLite accepts only by their checksums; restore quick_checks a backup again
    before it uses it (docs/safety.md). This check is what the prune relies on.
    """
    sessions: int = target.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    messages: int = target.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    ids = list(must_contain)
    present = held = 0
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        present += target.execute("SELECT COUNT(*) FROM sessions WHERE id IN (%s)" % marks, chunk).fetchone()[0]
        held += target.execute("SELECT COUNT(*) FROM messages WHERE session_id IN (%s)" % marks, chunk).fetchone()[0]
    wanted = sum(must_contain.values())
    if present != len(ids) or held < wanted:
        raise MaintenanceError(
            "backup %s lacks %d of the %d sessions and %d of the %d messages about to be pruned; nothing was changed"
            % (path, len(ids) - present, len(ids), max(0, wanted - held), wanted)
        )
    return {"sessions": sessions, "messages": messages}


def newest_durable(paths: Iterable[str]) -> None:
    """fsync the copies retention keeps and their directory (a run killed between a backup's
    rename and its directory's fsync left a complete copy whose name is not yet durable)."""
    for path in paths:
        fsync_tree(path)


def apply_retention(
    backup_dir: str,
    profile: str,
    keep_days: float | None,
    keep_count: int | None,
    now: float,
    keep_path: str | None,
    lister: Callable[[str, str], list[Stamped]] | None = None,
) -> list[str]:
    """Remove this profile's backups older than keep_days or beyond keep_count; never the newest.

    ``lister``: which files (default ``list_backups``; the prune archives have their own).
    """
    backups = (lister or list_backups)(backup_dir, profile)
    removed: list[str] = []
    for index, (path, stamp) in enumerate(backups):
        if index == 0 or path == keep_path:
            continue
        too_old = keep_days is not None and now - stamp > float(keep_days) * 86400
        too_many = keep_count is not None and index >= int(keep_count)
        if too_old or too_many:
            if not removed:  # the copies kept, and their names, before any older one goes
                newest_durable([backups[0][0]] + ([keep_path] if keep_path else []))
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed
