# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Low-level access to a Hermes ``state.db``: safe opening, who holds it, disk space.

Standard library only, Python 3.8+, no Ansible imports: the module, the scheduled
runner and the tests all use this file as it is.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import sqlite3
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Callable, TypedDict
from urllib.parse import quote

from ..options import BY_NAME

BUSY_TIMEOUT: float = BY_NAME["busy_timeout"].default  # for callers that pass no options
BATCH_PAUSE: float = BY_NAME["batch_pause"].default

SQLITE_HEADER = b"SQLite format 3\x00"
SIDECAR_SUFFIXES = ("-wal", "-shm")
ROLLBACK_SYNCHRONOUS = "EXTRA"  # open_rw's synchronous for a rollback-journal file
MB = 1024 * 1024


class MaintenanceError(Exception):
    """A failure fit for an operator: the message names the thing and what to do."""


class ProfileSkipped(Exception):
    """The profile is fine but cannot be worked on now (lock held, database busy)."""


def check_db_file(path: str) -> os.stat_result:
    """Refuse anything that is not a plain, readable SQLite file; return its lstat."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise MaintenanceError("%s does not exist" % path) from None
    except PermissionError:
        raise MaintenanceError(
            "%s cannot be read (permission denied): run as the owner of the Hermes home" % path
        ) from None
    if stat.S_ISLNK(st.st_mode):
        raise MaintenanceError(
            "%s is a symbolic link (to %s); Hermes keeps state.db as a plain file, so this is refused: "
            "point hermes_home at the real home instead" % (path, os.readlink(path))
        )
    if stat.S_ISDIR(st.st_mode):
        raise MaintenanceError("%s is a directory, not a SQLite database: remove or rename it" % path)
    if not stat.S_ISREG(st.st_mode):
        raise MaintenanceError("%s is not a regular file" % path)
    if st.st_size == 0:
        raise MaintenanceError("%s is empty (0 bytes), not a SQLite database: restore it from a backup" % path)
    try:
        header = read_db_bytes(path, len(SQLITE_HEADER))
    except PermissionError:
        raise MaintenanceError(
            "%s cannot be read (permission denied, mode %o): run as its owner (uid %d)"
            % (path, stat.S_IMODE(st.st_mode), st.st_uid)
        ) from None
    if header != SQLITE_HEADER:
        raise MaintenanceError(
            "%s is not a SQLite database (its header is %r): restore it from a backup" % (path, header[:16])
        )
    if st.st_size < 512 or st.st_size % 512:
        raise MaintenanceError(
            "%s is truncated (%d bytes is not a whole number of pages): restore it from a backup" % (path, st.st_size)
        )
    return st


# Reading a database file's bytes. Closing ANY descriptor of a file drops every POSIX lock this
# process holds on it, SQLite's own included (sqlite.org/howtocorrupt.html, 2.2): one
# open()/close() of state.db beside a connection of ours gives away its SHARED lock (WAL mode:
# held as long as the connection is open; it is what stops another process's close from
# checkpointing and unlinking the -wal we still write). So every read of the bytes of
# state.db, its -wal or -shm goes through db_file_fd; the connection itself (PRAGMAs,
# sqlite_master) is the other way.


@contextlib.contextmanager
def db_file_fd(path: str) -> Iterator[int]:
    """A descriptor to read ``path`` (state.db, -wal, -shm) with ``os.pread``/``os.sendfile``.

    SQLite's own descriptor when this process has the file open (positional reads and
    sendfile with an offset leave its file offset alone), never closed here. Else one opened
    for the read and closed after it: a process with no descriptor of a file holds no lock
    on it, so that close drops nothing. Keep the body to reads: a connection opened inside it
    would take its locks while ours is still open.
    """
    fd = _own_fd(path)
    if fd is not None:
        yield fd
        return
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        yield fd
    finally:
        os.close(fd)


def read_db_bytes(path: str, count: int, offset: int = 0) -> bytes:
    """Up to ``count`` bytes of a database file from ``offset``, through ``db_file_fd``."""
    with db_file_fd(path) as fd:
        return os.pread(fd, count, offset)


def copy_db_bytes(src_path: str, dst_path: str, step: int = 16 * MB, flush: bool = False) -> None:
    """Copy a database file into the existing ``dst_path`` through ``db_file_fd``, in steps of
    ``step`` bytes, each fdatasync'ed when ``flush`` (one big write-back at the end delayed
    the gateway's own commits). A file that shrinks under the copy ends it there."""
    with db_file_fd(src_path) as src:
        dst = os.open(dst_path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            size, offset = os.fstat(src).st_size, 0
            while offset < size:
                sent = _copy_range(src, dst, offset, min(step, size - offset))
                if sent == 0:
                    break
                offset += sent
                if flush:
                    os.fdatasync(dst)
        finally:
            os.close(dst)


def _copy_range(src: int, dst: int, offset: int, count: int) -> int:
    """Up to ``count`` bytes of descriptor ``src`` from ``offset`` written at the same offset of
    ``dst``: in the kernel where it can (Linux sendfile between files), else through a buffer
    (macOS sendfile wants a socket)."""
    try:
        os.lseek(dst, offset, os.SEEK_SET)
        return os.sendfile(dst, src, offset, count)
    except (AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP):
            raise
    data = os.pread(src, count, offset)
    os.pwrite(dst, data, offset)
    return len(data)


def sqlite_uri(path: str, **params: str) -> str:
    query = "&".join("%s=%s" % item for item in params.items())
    return "file:%s?%s" % (quote(os.path.abspath(path)), query)


_WAL_VERSIONS = b"\x02\x02"  # header bytes 18-19 (read/write versions): 2 is WAL, 1 a rollback journal


def _header_versions(path: str) -> bytes | None:
    """The header's read/write versions (bytes 18-19), or None when unreadable or too short."""
    try:
        header = read_db_bytes(path, 20)
    except OSError:
        return None
    return header[18:20] if len(header) == 20 else None


def journal_mode(conn: sqlite3.Connection, path: str) -> str:
    """The file's journal mode. A WAL file read ``immutable`` (check mode, no sidecars beside it)
    answers ``delete`` to the PRAGMA: WAL is a property of the file, so its header says it there."""
    if _header_versions(path) == _WAL_VERSIONS:
        return "wal"
    mode: str = conn.execute("PRAGMA journal_mode").fetchone()[0]  # a query: changes nothing
    return mode.lower()


def _wal_header(path: str) -> bool:
    """Whether the file's header says WAL, not a rollback journal; one it cannot tell counts as WAL."""
    versions = _header_versions(path)
    return versions is None or versions == _WAL_VERSIONS


class ReadOnlyDB:
    """A read-only connection that creates no file next to the database.

    SQLite's ``mode=ro`` still creates ``-wal``/``-shm`` when they are missing, which
    check mode must never do. So: with both sidecars present (a live or unclean
    database) ``mode=ro`` uses them as they are; with neither (fully checkpointed) the
    main file is complete and is read as ``immutable``; with a ``-wal`` but no ``-shm``
    the pair is copied to a private temporary directory and read there.
    """

    def __init__(self, path: str, busy_timeout: float = BUSY_TIMEOUT) -> None:
        self.path = path
        self._tmpdir: str | None = None
        has = [os.path.exists(path + s) for s in SIDECAR_SUFFIXES]
        if all(has) or not _wal_header(path):
            # A rollback-journal file: mode=ro creates nothing beside it and takes SHARED locks,
            # so it never reads a page a live writer is halfway through rewriting (immutable would).
            uri = sqlite_uri(path, mode="ro")
        elif not any(has):
            uri = sqlite_uri(path, mode="ro", immutable="1")
        else:
            self._tmpdir = tempfile.mkdtemp(prefix="hermes-ops-ro-")
            copy = os.path.join(self._tmpdir, "state.db")
            for suffix in ("", "-wal") if has[0] else ("",):
                os.close(os.open(copy + suffix, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                copy_db_bytes(path + suffix, copy + suffix)
            uri = sqlite_uri(copy, mode="ro")
        self.conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None)

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            if self._tmpdir:
                shutil.rmtree(self._tmpdir, ignore_errors=True)


def open_rw(path: str, busy_timeout: float = BUSY_TIMEOUT) -> sqlite3.Connection:
    """Open for maintenance the way Hermes does: autocommit, foreign keys on.

    In WAL mode ``synchronous=NORMAL`` (this connection only) skips the WAL fsync at each of
    our many small commits. What it risks on power loss is that the last deletes or zombie
    closes roll back, and the next run simply does them again; the backup is fsynced on its
    own, and a step that relies on a commit (a transcript removed because its session is gone)
    calls ``commits_durable`` first. A rollback-journal file gets EXTRA: there NORMAL can
    corrupt the file on a power loss (sqlite.org/pragma.html#pragma_synchronous), and under FULL
    a full VACUUM's truncate can reach the disk before its journal's deletion, which then rolls
    back into a truncated file ("database disk image is malformed"); EXTRA fsyncs the directory
    once the journal is deleted. The prune keeps its journal (PERSIST), so it pays nothing more.
    """
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    wal = is_wal_file(path)
    conn.execute("PRAGMA synchronous=%s" % ("NORMAL" if wal else ROLLBACK_SYNCHRONOUS))
    if sqlite_wal_reset_affected() and wal:
        # No checkpoint at our commits from an SQLite with the WAL-reset bug: the one
        # checkpoint we may take is decided at the end (apply.reclaim.checkpoint_policy).
        # Closing does not checkpoint either while another process holds the file: SQLite
        # checkpoints at close only when it gets the EXCLUSIVE lock, which a holder's SHARED
        # lock refuses.
        conn.execute("PRAGMA wal_autocheckpoint=0")
    if wal:
        # A commit of ours that restarts the -wal (the first after a complete checkpoint, the
        # holder's) cuts the file to that commit's frames. Without a limit the -wal keeps the size
        # of the most frames written between two restarts; Hermes's own, 64 MiB, cuts only above it.
        conn.execute("PRAGMA journal_size_limit=%d" % WAL_KEEP)
    return conn


# A ranged read statement beside a live rollback-journal gateway takes about this long (ranged_rows)...
RANGE_READ_TIME = 0.04
# ... and one still running this long after it began is interrupted, its range read again in halves.
RANGE_READ_BOUND = 0.1


def quoted(name: str) -> str:
    """``name`` as an SQL identifier in double quotes: table and index names come from the file."""
    return '"%s"' % name.replace('"', '""')


def rowid_span(conn: sqlite3.Connection, table: str) -> tuple[int | None, int | None]:
    """(lowest, highest) rowid of ``table``, None for both when it is empty. Two statements: SQLite
    reads one end of the b-tree for a lone MIN() or MAX(), but scans the whole table for both in one
    (863 ms on a 5 GB file, beside a rollback-journal gateway whose commits wait for that read)."""
    name = quoted(table)
    low = conn.execute("SELECT MIN(rowid) FROM %s" % name).fetchone()[0]
    top = conn.execute("SELECT MAX(rowid) FROM %s" % name).fetchone()[0]
    return low, top


class StatementBound:
    """Interrupt the statements run inside once ``seconds`` have passed (None: no bound); ``cut``
    says whether it did. An OperationalError raised by that interrupt is swallowed."""

    def __init__(self, conn: sqlite3.Connection, seconds: float | None) -> None:
        self.conn, self.seconds, self.cut = conn, seconds, False

    def __enter__(self) -> StatementBound:
        if self.seconds is not None:
            deadline = time.monotonic() + self.seconds

            def check() -> int:
                self.cut = time.monotonic() > deadline
                return 1 if self.cut else 0

            self.conn.set_progress_handler(check, 100)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if self.seconds is not None:
            self.conn.set_progress_handler(None, 0)
        return kind is not None and self.cut and issubclass(kind, sqlite3.OperationalError)


def ranged_rows(
    conn: sqlite3.Connection,
    sql: str,
    low: int,
    top: int,
    *,
    first: int,
    most: int,
    target: float | None = RANGE_READ_TIME,
    bound: float | None = RANGE_READ_BOUND,
    args: Sequence[object] = (),
) -> Iterator[list[Any]]:
    """The rows of ``sql`` over rowid ranges from ``low`` to ``top``, a list per range: its first two
    parameters are a range's ``start <= rowid < end``, then ``args``. Each statement is its own read.

    The first range holds ``first`` rowids; each next one is sized from the last statement's time
    to about ``target`` (at most four times the last, at most ``most``; None: always ``first``).
    A statement still running at ``bound`` seconds (None: never) is interrupted and its range read
    again in halves, down to one row, so no row is read twice or missed.

    Beside a rollback-journal gateway each read holds a SHARED lock that blocks its commits while it
    runs, and the same 50,000 rowids took 40 to 380 ms on a 5 GB file whose pages had left the OS
    cache, a few ms on one whose pages had not: a fixed range is slow on a small file and a stall on
    a large one. A writer that wants to commit takes the PENDING lock (sqlite.org/lockingv3.html),
    which keeps the next statement out until it has committed: its wait is one statement at most."""
    start, span = low, max(1, int(first))
    while start <= top:
        began = time.monotonic()
        with StatementBound(conn, bound if span > 1 else None) as cut:
            rows = conn.execute(sql, (start, start + span) + tuple(args)).fetchall()
        if cut.cut:
            span = max(1, span // 2)
            continue
        took = max(time.monotonic() - began, 0.001)
        yield rows
        start += span
        if target is not None:
            span = int(min(most, max(1, span * min(4.0, target / took))))


@contextlib.contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One read transaction: all reads inside see one snapshot, and while it is open no
    checkpoint can restart the -wal or write into the file a frame newer than it."""
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # BEGIN is deferred: this reads
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: take the write lock up front, as Hermes's writers do.

    On error, roll back unless SQLite already did (it does after e.g. SQLITE_FULL, and a
    second ROLLBACK would hide the real error).
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
    except BaseException:
        if conn.in_transaction:  # interrupted (a progress handler) after it had begun
            conn.execute("ROLLBACK")
        raise
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        else:
            end_read_left_by_rollback(conn)
        raise


def end_read_left_by_rollback(conn: sqlite3.Connection) -> None:
    """After SQLite rolled a transaction back by itself (an interrupt, SQLITE_FULL), this connection
    may keep its read lock: SQLite 3.40.1, interrupted at some steps of 0.22.2's deletes (inside its
    FTS5 triggers), leaves the connection holding SHARED until its next statement that reads the
    file ends (3.46.1 and 3.53.4 did not). In rollback-journal mode a gateway's COMMIT waits for
    every reader, so it waited through the whole turn given to it (a 0.22.2 writer's append: 364 ms
    behind a 245 ms transaction). One read that ends at once drops that lock ("SELECT 1", which
    reads no page, does not); an error from it is not the one to report."""
    try:
        conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error:
        pass


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def free_bytes(directory: str) -> int:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return 0


def sqlite_wal_reset_affected(version_info: Sequence[int] | None = None) -> bool:
    """True when this SQLite has the WAL-reset bug (sqlite.org/wal.html#walresetbug).

    3.7.0 (the first with WAL) up to 3.51.2; fixed in 3.51.3, and in the 3.50.7 and
    3.44.6 backports. The same test as Hermes's own gate (hermes_cli/sqlite_runtime.py).
    """
    v = tuple(version_info or sqlite3.sqlite_version_info)[:3]
    fixed = v < (3, 7, 0) or v >= (3, 51, 3) or (3, 50, 7) <= v < (3, 51, 0) or (3, 44, 6) <= v < (3, 45, 0)
    return not fixed


def engine_sqlite() -> dict[str, Any]:
    """Which SQLite does the work here: reported with every result."""
    return {
        "version": sqlite3.sqlite_version,
        "wal_reset_affected": sqlite_wal_reset_affected(),
        "python": sys.executable,
    }


# What our connection leaves of the -wal when its commit restarts it (journal_size_limit).
WAL_KEEP = 0

# While the engine may not checkpoint, the WAL frames nobody has checkpointed yet stay below
# this (Hermes bounds its own WAL to the same 64 MiB with journal_size_limit): the work stops
# between transactions there and the next run goes on.
WAL_BUDGET = 64 * MB


def wal_pending_bytes(db_path: str) -> int:
    """Bytes of WAL frames not yet checkpointed into the file: (mxFrame - nBackfill) frames.

    Read from the -shm's WAL-index header through the descriptor our own SQLite holds
    (opening and closing another one would drop SQLite's locks on it); without one, the
    size of the -wal.
    """
    head = _shm_head(db_path)
    if head is None:
        return file_size(db_path + "-wal")
    if len(head) < 104:
        return 0
    page: int = struct.unpack_from("=H", head, 14)[0]
    frames, copied, _salt = _index_head(head)
    return max(0, frames - copied) * frame_bytes(65536 if page == 1 else page)


def wal_index_head(db_path: str) -> tuple[int, int, bytes] | None:
    """The -shm's WAL-index header, read as ``wal_pending_bytes`` reads it: (mxFrame, nBackfill, the
    salt a restart of the -wal changes), or None without a descriptor or a header to read."""
    head = _shm_head(db_path)
    if head is None or len(head) < 104:
        return None
    return _index_head(head)


def _index_head(head: bytes) -> tuple[int, int, bytes]:
    """(mxFrame, nBackfill, salt) of a WAL-index header of 104 bytes or more."""
    return struct.unpack_from("=I", head, 16)[0], struct.unpack_from("=I", head, 96)[0], head[32:40]


def _shm_head(db_path: str) -> bytes | None:
    """The first 104 bytes of the -shm (the WAL-index header, then nBackfill) through our own descriptor."""
    fd = _own_fd(db_path + "-shm")
    if fd is None:
        return None
    try:
        return os.pread(fd, 104, 0)
    except OSError:
        return None


def frame_bytes(page_size: int) -> int:
    """A WAL frame's size: the page and its 24-byte frame header."""
    return page_size + 24


def is_wal_file(path: str) -> bool:
    """The header says WAL (bytes 18 and 19 are 2): SQLite opens it in WAL mode."""
    return _header_versions(path) == _WAL_VERSIONS


# SQLite's unix VFS lock geometry (os_unix.c). Every connection to a WAL database holds a
# shared lock on the -shm's DMS byte (128) for as long as it is open, next to the eight WAL
# locks (120-127). On the main file, PENDING, RESERVED and the SHARED range are only held by
# a connection inside a transaction (in rollback-journal mode an idle connection holds none).
PENDING_BYTE = 0x40000000
DB_LOCK_RANGE = (PENDING_BYTE, 512)
SHM_LOCK_RANGE = (120, 9)
_FLOCK = "hhqqi"  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid


def lock_owner(path: str, start: int, length: int) -> int | None:
    """A lock another process holds on ``path``'s byte range: its pid (0 when not visible
    from here, -1 for an open-file-description lock), or None when nobody holds one.

    ``F_GETLK`` needs no access to ``/proc``. It ignores this process's own (POSIX) locks,
    and it asks through ``db_file_fd``: a descriptor our SQLite already has on the file
    when there is one (closing another would drop SQLite's locks).
    """
    try:
        with db_file_fd(path) as fd:
            query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
            answer = fcntl.fcntl(fd, fcntl.F_GETLK, query + b"\0" * 16)
    except OSError:
        return None
    l_type: int
    l_pid: int
    l_type, _whence, _start, _len, l_pid = struct.unpack(_FLOCK, answer[: struct.calcsize(_FLOCK)])
    return None if l_type == fcntl.F_UNLCK else l_pid


# The -shm's WAL_WRITE_LOCK byte (WALINDEX_LOCK_OFFSET 120 + 0): in WAL mode a writer holds it
# from its BEGIN IMMEDIATE to the end of its COMMIT, as a rollback-journal writer holds RESERVED.
# The next byte is WAL_CKPT_LOCK, held by a checkpoint while it runs: Hermes checkpoints right
# after its commit, once the write lock is free again.
WAL_WRITE_LOCK_BYTE = SHM_LOCK_RANGE[0]


def writer_probe(path: str, wal: bool = False) -> Callable[[], bool] | None:
    """A function that says whether another process is inside a write transaction on ``path``
    (holds SQLite's RESERVED byte in rollback-journal mode, the -shm's WAL_WRITE_LOCK byte with
    ``wal``: from its ``BEGIN IMMEDIATE`` to the end of its COMMIT), or None when this process has
    no descriptor on that file to ask with.

    With ``wal`` the checkpoint the writer runs after its commit (WAL_CKPT_LOCK) counts as part of
    its turn: a transaction of ours that begins while that checkpoint still copies frames reads
    from the -wal, and a writer reading from it may not restart it, so beside a gateway that
    commits between each of our steps nobody ever restarted the -wal and it grew by every frame
    written (131 MB in one run on a 212 MB file). Begun after the checkpoint, our first commit
    restarts it, as the gateway's own would.

    Call it only while the connection that opened ``path`` stays open: it asks through that
    connection's own descriptor (closing any descriptor of the file would drop SQLite's locks).
    """
    fd = _own_fd(path + "-shm" if wal else path)
    if fd is None:
        return None
    byte, length = (WAL_WRITE_LOCK_BYTE, 2) if wal else (PENDING_BYTE + 1, 1)
    query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, byte, length, 0) + b"\0" * 16
    size = struct.calcsize(_FLOCK)

    def writing() -> bool:
        try:
            answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        except OSError:
            return False
        l_type: int = struct.unpack(_FLOCK, answer[:size])[0]
        return l_type != fcntl.F_UNLCK

    return writing


_OWN_FDS: dict[str, int] = {}  # path: the descriptor _own_fd found last (checked again at each use)


def _own_fd(path: str) -> int | None:
    """A readable descriptor this process already has on ``path``'s file (SQLite's), or None.

    The one found last for ``path`` is asked first: the -shm's header is read several times per
    transaction beside a gateway, and a scan of /proc/self/fd costs a call per descriptor open."""
    try:
        want = os.stat(path)
    except OSError:
        return None
    known = _OWN_FDS.get(path)
    if known is not None and _reads_file(known, want):
        return known
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        fd = int(name) if name.isdigit() else -1
        if fd >= 0 and _reads_file(fd, want):
            _OWN_FDS[path] = fd
            return fd
    _OWN_FDS.pop(path, None)
    return None


def _reads_file(fd: int, want: os.stat_result) -> bool:
    """``fd`` is open, readable, on the regular file ``want`` describes."""
    try:
        st = os.fstat(fd)
        readable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_WRONLY
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino) and stat.S_ISREG(st.st_mode) and readable


def holders(db_path: str, exclude_pids: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """Processes that have state.db or a sidecar open, or may have: never fewer than there are.

    Each is ``{"pid", "command", "evidence"}``: ``descriptor`` (its /proc/PID/fd points at
    the file), ``lock`` (it holds one of SQLite's locks on the file, seen with F_GETLK) or
    ``unreadable`` (a possible holder: its descriptors cannot be read from here, by /proc
    permissions, hidepid or a missing CAP_SYS_PTRACE, and no lock probe rules it out) or
    ``filesystem`` (the file is on a network or VM-shared filesystem: other hosts may hold it).
    In WAL mode the lock probe rules out every SQLite connection, however hidden; in
    rollback-journal mode an idle connection holds no lock, so nothing does.
    """
    exclude = set(exclude_pids or ()) | {os.getpid()}
    found, hidden = _scan_proc(db_path, exclude)
    seen = {h["pid"] for h in found}
    wal = is_wal_file(db_path)
    probes = [(db_path, DB_LOCK_RANGE)] + ([(db_path + "-shm", SHM_LOCK_RANGE)] if wal else [])
    for path, (start, length) in probes:
        pid = lock_owner(path, start, length)
        if pid is None or pid in exclude or pid in seen:
            continue
        seen.add(pid)
        command = _comm(pid) if pid > 0 else "a process this host cannot name (another pid namespace?)"
        found.append({"pid": pid if pid > 0 else None, "command": command, "evidence": "lock"})
    if not wal and not found and os.path.lexists(db_path):
        # An idle rollback-journal connection holds no lock: cannot rule them out. Where no file
        # is at the path (a lost disk, before a restore) no connection can be to it.
        found.extend(hidden)
    shared = shared_filesystem(db_path)
    if shared:
        found.append({"pid": None, "command": "processes on other hosts (%s)" % shared, "evidence": "filesystem"})
    return found


# Filesystems whose locks or shared memory another host (or the VM host) takes part in:
# POSIX locks may be missing, broken or local to one client (sqlite.org/howtocorrupt.html,
# 2.1), and the WAL index is shared memory that processes elsewhere do not share
# (sqlite.org/wal.html). Hermes refuses WAL on them (its issues #110847, #111433).
SHARED_FILESYSTEMS = frozenset(
    ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "ceph", "glusterfs", "lustre", "afs", "gfs2", "ocfs2",
     "davfs", "vboxsf", "vmhgfs", "prl_fs", "fuse.sshfs", "fuse.s3fs", "fuse.rclone", "fuse.gcsfuse", "fuse.glusterfs",
     "fuse.cephfs", "fuse.ceph-fuse", "fuse.davfs2", "fuse.vmhgfs-fuse", "fuse.juicefs")
)  # fmt: skip
MOUNTINFO = "/proc/self/mountinfo"


class Filesystem(TypedDict):
    """The mount a file is on, as ``filesystem_of`` tells it."""

    type: str
    mount_point: str
    source: str


class Mount(Filesystem):
    """One line of mountinfo: a ``Filesystem`` and its device number (``major:minor``)."""

    dev: str


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Each mount of mountinfo text as {"dev", "mount_point", "type", "source"}, in its order."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mounts.append(
            {
                "dev": fields[2],
                "mount_point": _unescape(fields[4]),
                "type": tail[0],
                "source": _unescape(tail[1]) if len(tail) > 1 else "",
            }
        )
    return mounts


def filesystem_of(path: str, mountinfo_text: str | None = None) -> Filesystem | None:
    """The mount ``path`` is on: {"type", "mount_point", "source"}, or None when unknown.

    The mount with the file's own device number (``st_dev`` as major:minor) whose mount point
    is the longest prefix of the real path; the longest prefix alone where no device matches
    (btrfs subvolumes report their own). The last of equals wins: it is mounted over the others.
    """
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        if mountinfo_text is None:
            with open(MOUNTINFO) as handle:
                mountinfo_text = handle.read()
    except OSError:
        return None
    dev = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))

    def under(mount: Mount) -> bool:
        point = mount["mount_point"].rstrip("/") + "/"
        return real == mount["mount_point"] or real.startswith(point) or point == "/"

    mounts = [m for m in parse_mountinfo(mountinfo_text) if under(m)]
    same = [m for m in mounts if m["dev"] == dev] or mounts
    best: Mount | None = None
    for mount in same:
        if best is None or len(mount["mount_point"]) >= len(best["mount_point"]):
            best = mount
    if not best:
        return None
    return {"type": best["type"], "mount_point": best["mount_point"], "source": best["source"]}


def shared_filesystem(path: str, mountinfo_text: str | None = None) -> str | None:
    """Why ``path``'s filesystem is shared with other hosts (network or VM share), or None.

    There no process holding the file can be ruled out (other hosts are not in /proc, and
    their locks may not reach us), so the engine treats such a file as held: see docs/safety.md.
    """
    fs = filesystem_of(path, mountinfo_text)
    if not fs or fs["type"] not in SHARED_FILESYSTEMS:
        return None
    return (
        "%s is on a %s filesystem (%s at %s): processes on other hosts may hold it unseen, and its locks and "
        "shared memory may not reach them" % (path, fs["type"], fs["source"], fs["mount_point"])
    )


def refuse_wal_on_shared_filesystem(db_path: str, journal_mode: str) -> str | None:
    """No write into a WAL file on a network or VM-shared filesystem: raise, naming why."""
    shared = shared_filesystem(db_path)
    if shared and journal_mode.lower() == "wal":
        raise MaintenanceError(
            "%s, and state.db is in WAL mode: its WAL index is shared memory that processes on other hosts do not "
            "share (sqlite.org/wal.html), so no maintenance writes into it; nothing was changed. Move the Hermes "
            "home to a local disk, or let Hermes run journal_mode=DELETE there (0.20+ does on such filesystems)"
            % shared
        )
    return shared


def _scan_proc(db_path: str, exclude: set[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(holders seen in /proc/*/fd, processes that could hold it but whose descriptors are unreadable)."""
    real = os.path.realpath(db_path)
    targets = {real} | {real + s for s in SIDECAR_SUFFIXES} | {real + "-journal"}
    try:
        st = os.stat(real)
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return [], [{"pid": None, "command": "every process (/proc cannot be read)", "evidence": "unreadable"}]
    found: list[dict[str, Any]] = []
    hidden: list[dict[str, Any]] = []
    ancestors = _ancestors()
    for pid in pids:
        if int(pid) in exclude:
            continue
        fd_dir = "/proc/%s/fd" % pid
        readable = True
        fds: list[str]
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # it just exited
        except OSError:
            fds, readable = [], False
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in targets:
                    found.append({"pid": int(pid), "command": _comm(pid), "evidence": "descriptor"})
                    break
            except FileNotFoundError:
                continue  # that descriptor was just closed
            except OSError:
                readable = False
                break
        if (
            not readable
            and int(pid) not in ancestors
            and not _exited(pid)
            and not _session_closer(pid)
            and _could_open(pid, st)
        ):
            hidden.append({"pid": int(pid), "command": _comm(pid), "evidence": "unreadable"})
    if _proc_hides_others() and os.geteuid() != 0 and st.st_mode & 0o066:
        hidden.append({"pid": None, "command": "other users' processes (/proc is hidepid)", "evidence": "unreadable"})
    return found, hidden


def _exited(pid: int | str) -> bool:
    """Whether ``pid`` is a zombie (it holds no file; its parent has not reaped it yet): a gateway a
    service window just stopped, whose descriptor table its owner could not read while it ran."""
    try:
        with open("/proc/%s/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def _session_closer(pid: int | str) -> bool:
    """Whether ``pid`` is ``(sd-pam)``: the helper that a user's own systemd manager forks (and that
    lives as long as it) to close the PAM session at its end. The manager of a Hermes user runs for
    good once linger is on, which `hermes gateway install` turns on for the gateway's user unit. The
    helper is not dumpable, so its owner cannot read its descriptors, but it opens no file of the
    user's: not a possible holder. Known by its name and its parent, the manager's systemd."""
    if _comm(pid) != "(sd-pam)":
        return False
    parent = _parent(pid)
    if parent is None:
        return False

    try:
        return os.path.basename(os.readlink("/proc/%d/exe" % parent)) == "systemd"
    except OSError:
        return False


def _parent(pid: int | str) -> int | None:
    """The parent's pid from /proc/PID/stat (the field after "(comm) state"), or None."""
    try:
        with open("/proc/%s/stat" % pid) as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _ancestors() -> set[int]:
    """The processes that started this one (init, cron, sshd, sudo, the Ansible connection).

    Their descriptors are often unreadable (another uid, more capabilities than ours), but
    they are not a gateway holding the file beside us: a Hermes gateway that starts this run
    (Hermes's own cron) runs as the file's owner, so its descriptors are readable and it is
    found by them. Their open files are still checked when they can be read.
    """
    chain: set[int] = set()
    pid: int | None = os.getppid()
    while pid and pid > 0 and pid not in chain:
        chain.add(pid)
        pid = _parent(pid)
    return chain


def _could_open(pid: int | str, st: os.stat_result) -> bool:
    """Whether a process whose descriptors we cannot read could have the file open at all.

    Its owner's processes, anyone's when the mode lets group or others in, and root's when
    root owns the file. Root's processes next to a Hermes user's 0600 file are left out: the
    Hermes gateway runs as the owner of its home, and a root process holding the file would
    have made root-owned sidecars the gateway cannot open.
    """
    uids = _status_ids(pid, "Uid:")
    if uids is None:
        return True  # its status cannot be read either: assume the worst
    if st.st_uid in uids or st.st_mode & 0o066:
        return True
    return st.st_uid == 0 and 0 in uids


def _status_ids(pid: int | str, field: str) -> set[int] | None:
    try:
        with open("/proc/%s/status" % pid) as handle:
            for line in handle:
                if line.startswith(field):
                    return {int(x) for x in line.split()[1:]}
    except (OSError, ValueError):
        return None
    return None


def _proc_hides_others() -> bool:
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 4 and fields[4] == "/proc":
                    options = line.split(" - ")[-1].split()[-1].split(",")
                    return any(o.startswith("hidepid=") and o not in ("hidepid=0", "hidepid=off") for o in options)
    except OSError:
        return False
    return False


def describe_holders(found: Sequence[dict[str, Any]], limit: int = 5) -> str:
    """``python3 (pid 12)``, ``hermes (pid 40, a possible holder: its descriptors cannot be read)``."""
    words = []
    for h in found[:limit]:
        pid = "pid %d" % h["pid"] if h.get("pid") else "pid unknown"
        if h.get("evidence") == "unreadable":
            why = "a possible holder: its descriptors cannot be read and no lock rules it out"
            words.append("%s (%s, %s)" % (h["command"], pid, why))
        elif h.get("evidence") == "lock":
            words.append("%s (%s, holds a SQLite lock on it)" % (h["command"], pid))
        elif h.get("evidence") == "filesystem":
            words.append(h["command"])
        else:
            words.append("%s (%s)" % (h["command"], pid))
    if len(found) > limit:
        words.append("%d more" % (len(found) - limit))
    return ", ".join(words)


def _comm(pid: int | str) -> str:
    try:
        with open("/proc/%s/comm" % pid) as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def fsync_path(path: str) -> None:
    """fsync a file (its data) or a directory (its entries: names created, renamed, removed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: str, mode: int = 0o777) -> None:
    """os.makedirs, each directory it creates made durable: itself and its entry in its parent.

    Without the parent's fsync a power loss can take a new directory away with all it holds,
    a backup fsynced inside it included."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        makedirs_durable(parent, mode)
    os.mkdir(path, mode)
    fsync_path(path)
    try:
        fsync_path(parent)
    except PermissionError:  # a parent we may only traverse (0711) cannot be opened to fsync
        pass


def fsync_tree(path: str) -> None:
    """fsync a file, or a directory with everything under it, then its parent's entry."""
    if os.path.isdir(path) and not os.path.islink(path):
        for base, _dirs, files in os.walk(path, topdown=False):
            for name in files:
                if stat.S_ISREG(os.lstat(os.path.join(base, name)).st_mode):
                    fsync_path(os.path.join(base, name))
            fsync_path(base)
    elif os.path.isfile(path) and not os.path.islink(path):
        fsync_path(path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def commits_durable(db_path: str) -> None:
    """Make every transaction committed so far to db_path durable, whatever ``synchronous`` was.

    In WAL mode with synchronous=NORMAL a COMMIT only wrote its frames to the -wal: fsync it.
    A rollback journal's COMMIT deletes or zeroes the journal: the directory's fsync makes a
    deletion durable. Then the database file, and the directory (a -wal created by this run).
    Costs two or three fsyncs, once, where a later step relies on the commits (a file removed
    because its row is gone): synchronous=FULL would pay one at every commit."""
    for path in (db_path + "-wal", db_path):
        try:
            # db_file_fd: SQLite's own descriptor where our connection has the file open (closing
            # another descriptor of it would drop the locks SQLite holds through its own).
            with db_file_fd(path) as fd:
                os.fsync(fd)
        except FileNotFoundError:
            continue
    fsync_path(os.path.dirname(os.path.abspath(db_path)))


# FTS5's automatic merging held back for the length of one write transaction (fts_automerge_held_back).
#
# Every write transaction that changes an FTS5 index writes its pending changes out as a new
# segment, and FTS5 then does merge work in that same transaction on any level of the index that
# has ``automerge`` segments (4 unless the file says otherwise: sqlite.org/fts5.html). A prune cut
# into short transactions paid that in each of them, also on the large old levels its new segments
# tipped to 4, and the optimize after the prune merges every level again anyway: on a 0.22.2 file of
# 200,000 messages, 100,000 deleted in 25 transactions took 2.0-2.5 s, against 1.6-1.9 s with
# merging held back and 1.6 s for the release's own prune in one transaction.
#
# Held back, not off: inside our transaction ``automerge`` is HELD_AUTOMERGE (8). With it off, our
# segments piled up on level 0 to 15 between commits, one short of FTS5's ``crisismerge`` (16), whose
# merge takes the whole level at once, in whichever transaction writes the 16th segment: beside a
# prune of 800,000 messages one of the gateway's appends took 727 ms. With ``crisismerge`` held at 8
# as well, one of our own transactions held the lock 704 ms. At 8 the merge stays FTS5's bounded,
# incremental one (worst append 248 ms there).
#
# The setting is Hermes's, stored in the index's ``_config`` table: it is changed after BEGIN and
# put back, as it was, in the same transaction before COMMIT, so that no other connection ever
# reads it changed and a transaction rolled back (an interrupt, a crash) rolls it back too.
# Putting it back is itself a write to the index, so FTS5 writes the pending segment out just
# before it, with the held value; the COMMIT then has nothing left to write.
AUTOMERGE = "automerge"
HELD_AUTOMERGE = 8  # a level's segments before FTS5 merges it, inside our transaction
FTS5_DEFAULT_AUTOMERGE = 4  # where _config has no automerge row (0: the index never merges by itself)


def _fts_stored(conn: sqlite3.Connection, table: str, key: str) -> Any:
    """The index's stored value of ``key`` as the file has it (its type too), None where it keeps FTS5's default."""
    row = conn.execute("SELECT v FROM %s WHERE k = ?" % quoted(table + "_config"), (key,)).fetchone()
    return None if row is None else row[0]


def _fts_integer(value: Any) -> int | None:
    """A stored setting FTS5 reads as an integer (an integer, or text of digits), else None."""
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]{1,9}", value):
        return int(value)
    return None


def _fts_set(conn: sqlite3.Connection, table: str, key: str, value: Any) -> None:
    name = quoted(table)
    conn.execute("INSERT INTO %s(%s, rank) VALUES(?, ?)" % (name, name), (key, value))


@contextlib.contextmanager
def fts_automerge_held_back(conn: sqlite3.Connection, tables: Sequence[str]) -> Iterator[None]:
    """Inside a write transaction: ``tables`` (FTS5 indexes this connection can open) merge only
    levels of at least HELD_AUTOMERGE segments until the block ends, then have their setting back
    as it was. On an error the block leaves it to the transaction's rollback."""
    if not conn.in_transaction:
        raise RuntimeError("fts_automerge_held_back needs a write transaction already begun")
    changed: list[tuple[str, Any]] = []  # (table, its stored value)
    for table in tables:
        stored = _fts_stored(conn, table, AUTOMERGE)
        # paused for the other connections by this run (fts_automerge_paused): FTS5's default is the index's own
        effect = FTS5_DEFAULT_AUTOMERGE if stored is None or stored == PAUSED_AUTOMERGE else _fts_integer(stored)
        # An index that merges less already is left as it is, and so is one whose value is not an
        # integer (a hand edit: FTS5 ignores it), which FTS5's own command could not write back.
        if effect is not None and 0 < effect < HELD_AUTOMERGE:
            changed.append((table, stored))
            _fts_set(conn, table, AUTOMERGE, HELD_AUTOMERGE)
    yield
    for table, stored in changed:
        _fts_set(conn, table, AUTOMERGE, FTS5_DEFAULT_AUTOMERGE if stored is None else stored)
        config = quoted(table + "_config")
        if stored is None:  # FTS5's default again, as a missing row says it: the file as Hermes left it
            conn.execute("DELETE FROM %s WHERE k = ?" % config, (AUTOMERGE,))
        elif not isinstance(stored, int):  # FTS5 stores the text "3" as 3: the row back as it was written
            conn.execute("UPDATE %s SET v = ? WHERE k = ?" % config, (stored, AUTOMERGE))


# FTS5's automerge paused in the other connections while our prune or optimize runs beside them
# (fts_automerge_paused).
#
# Between two steps of the live optimize (apply.reclaim.fts_optimize_live) the index has a merge
# under way at its top level, and after a prune transaction often at another. FTS5's automerge, in
# whichever connection writes next, goes on with a merge under way before any other level
# (fts5IndexMerge): every 64 leaf pages the gateway writes, one of its appends merged 64 pages per
# level of the index of our merge, more where a term's doclist is longer (a merge step ends only
# between two terms). On a file of 800,000 messages one append in 64 took 80-145 ms instead of
# 2-7, on top of any wait for our lock; in WAL mode that append then also checkpointed the frames
# it wrote. Paused, the gateway's appends only add segments to level 0, which FTS5's crisismerge
# keeps at 16 at most, and our transactions merge the rest: the appends took 3-12 ms on that file,
# and the bench's worst append beside our whole run went from 349-489 ms to 166-197 ms.
#
# This is the one change of Hermes's settings another connection sees, so it is made only where
# the index keeps FTS5's default (no automerge row) and undone by removing the row again. The pause
# is stored as the text '00', which FTS5 reads as 0 and its own command never writes (it stores
# the number): a run killed during its prune or optimize leaves a mark the next run recognises and
# puts back (plan_reclaim: ``fts_automerge_restored``), and an index someone set to 0 is never
# taken for it.
PAUSED_AUTOMERGE = "00"


def fts_automerge_paused_left(conn: sqlite3.Connection, tables: Sequence[str]) -> list[str]:
    """The indexes among ``tables`` whose automerge a run killed during its prune or optimize left paused."""
    left = []
    for table in tables:
        try:
            if _fts_stored(conn, table, AUTOMERGE) == PAUSED_AUTOMERGE:
                left.append(table)
        except sqlite3.DatabaseError:  # no _config table this connection can read: nothing of ours in it
            continue
    return left


def resume_fts_automerge(conn: sqlite3.Connection, tables: Sequence[str]) -> None:
    """FTS5's default automerge back in ``tables`` (paused by ``fts_automerge_paused``), the file
    as Hermes left it: one write transaction."""
    if not tables:
        return
    with write_transaction(conn):
        for table in tables:
            if _fts_stored(conn, table, AUTOMERGE) != PAUSED_AUTOMERGE:
                continue  # changed by someone else since: theirs now
            # FTS5's own command first: it tells the other connections to read the setting again
            _fts_set(conn, table, AUTOMERGE, FTS5_DEFAULT_AUTOMERGE)
            conn.execute("DELETE FROM %s WHERE k = ?" % quoted(table + "_config"), (AUTOMERGE,))


@contextlib.contextmanager
def fts_automerge_paused(conn: sqlite3.Connection, tables: Sequence[str]) -> Iterator[list[str]]:
    """FTS5's automerge of the indexes ``tables`` off for every connection until the block ends,
    then as it was; yields those paused (not one with a setting of its own, nor one paused already:
    the pause around it puts that back). Each change is a write transaction of its own, outside any
    other; inside the block our own transactions still merge (fts_automerge_held_back)."""
    if not tables:
        yield []
        return
    with write_transaction(conn):
        paused = [table for table in tables if _fts_stored(conn, table, AUTOMERGE) is None]
        for table in paused:
            _fts_set(conn, table, AUTOMERGE, 0)
            conn.execute("UPDATE %s SET v = ? WHERE k = ?" % quoted(table + "_config"), (PAUSED_AUTOMERGE, AUTOMERGE))
    try:
        yield paused
    finally:
        resume_fts_automerge(conn, paused)
