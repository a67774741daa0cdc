# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Low-level access to a Hermes ``state.db``: safe opening, who holds it, disk space.

Standard library only, Python 3.8+, no Ansible imports: the module, the scheduled
runner and the tests all use this file as it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import tempfile
from urllib.parse import quote

from ._hermes_options import BY_NAME

BUSY_TIMEOUT = BY_NAME["busy_timeout"].default  # for callers that pass no options

SQLITE_HEADER = b"SQLite format 3\x00"
SIDECAR_SUFFIXES = ("-wal", "-shm")
MB = 1024 * 1024


class MaintenanceError(Exception):
    """A failure fit for an operator: the message names the thing and what to do."""


class ProfileSkipped(Exception):
    """The profile is fine but cannot be worked on now (lock held, database busy)."""


def check_db_file(path):
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
        with open(path, "rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
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


def sqlite_uri(path, **params):
    query = "&".join("%s=%s" % item for item in params.items())
    return "file:%s?%s" % (quote(os.path.abspath(path)), query)


def _wal_header(path):
    """Whether the file's header says WAL (read/write versions 2), not a rollback journal (1)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
    except OSError:
        return True
    return len(header) < 20 or header[18:20] == b"\x02\x02"


class ReadOnlyDB:
    """A read-only connection that creates no file next to the database.

    SQLite's ``mode=ro`` still creates ``-wal``/``-shm`` when they are missing, which
    check mode must never do. So: with both sidecars present (a live or unclean
    database) ``mode=ro`` uses them as they are; with neither (fully checkpointed) the
    main file is complete and is read as ``immutable``; with a ``-wal`` but no ``-shm``
    the pair is copied to a private temporary directory and read there.
    """

    def __init__(self, path, busy_timeout=BUSY_TIMEOUT):
        self.path = path
        self._tmpdir = None
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
            shutil.copyfile(path, copy)
            if has[0]:
                shutil.copyfile(path + "-wal", copy + "-wal")
            uri = sqlite_uri(copy, mode="ro")
        self.conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None)

    def close(self):
        try:
            self.conn.close()
        finally:
            if self._tmpdir:
                shutil.rmtree(self._tmpdir, ignore_errors=True)


def open_rw(path, busy_timeout=BUSY_TIMEOUT):
    """Open for maintenance the way Hermes does: autocommit, foreign keys on.

    ``synchronous=NORMAL`` (this connection only) skips the WAL fsync at each of our many
    small commits. What it risks on power loss is that the last deletes or zombie closes
    roll back, and the next run simply does them again; the backup is fsynced on its own.
    """
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


@contextlib.contextmanager
def read_snapshot(conn):
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
def write_transaction(conn):
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: take the write lock up front, as Hermes's writers do.

    On error, roll back unless SQLite already did (it does after e.g. SQLITE_FULL, and a
    second ROLLBACK would hide the real error).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def file_size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def free_bytes(directory):
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return 0


def holders(db_path, exclude_pids=None):
    """Other processes that have state.db or a sidecar open, from /proc/*/fd.

    Only processes this user may inspect are seen; Hermes runs as the owner of its
    home, and the engine runs as that owner too.
    """
    exclude = set(exclude_pids or ()) | {os.getpid()}
    real = os.path.realpath(db_path)
    targets = {real} | {real + s for s in SIDECAR_SUFFIXES}
    found = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if int(pid) in exclude:
            continue
        fd_dir = "/proc/%s/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in targets:
                    found.append({"pid": int(pid), "command": _comm(pid)})
                    break
            except OSError:
                continue
    return found


def _comm(pid):
    try:
        with open("/proc/%s/comm" % pid) as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
