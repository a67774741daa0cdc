# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restore one profile's state.db from a backup of this collection.

``plan_restore`` picks the backup (the one asked for, or the newest that verifies) and
checks it without writing anything near the database; ``restore`` then does it:

1. the backup is copied (or decompressed) to a hidden ``.state.db.restore.partial``
   beside state.db, fsynced, verified (``quick_check`` and the counts of the plan), and
   given the owner and mode 0600 of the file it replaces;
2. state.db (hard-linked) and copies of its sidecars (``-wal``, ``-shm``, ``-journal``) go,
   together, into a new directory ``state.db.pre-restore-<UTC time>`` beside them: kept,
   never deleted;
3. the old file is settled: its ``-wal`` checkpointed into it (TRUNCATE) or its hot
   journal rolled back, and that made durable, so that state.db alone holds every
   committed row; then its sidecars leave the home;
4. the verified copy is renamed over state.db (atomically: the name never goes missing,
   so a gateway started after a crash can never create an empty database) and checked again.

So at every instant, a power loss included, state.db is the old database with every
committed row or the restored one. A sidecar must leave before the new file comes (SQLite
would replay an old ``-wal`` or journal into it), and only a settled file can be alone.
Where the old file cannot be settled (SQLite cannot checkpoint a damaged file) or may be
held (``force``), its sidecars are moved, not copied, into the directory, and a crash
between that and the rename leaves the old file without them at its name: the directory
then holds the whole old database (docs/safety.md says how to put it back).

Anything failing after step 2 puts the original files back. A database held open by
another process (a running gateway) is refused unless ``force``: Hermes remembers the
inode of its file and would refuse all writes after the swap until restarted.
Standard library only, Python 3.8+.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import stat
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import TypedDict

from ..backup.whole_file import list_backups
from ..host.profiles import LOCK_SUFFIX, ProfileLock, backups_of, profile_path
from ..sqlite.db import (
    BUSY_TIMEOUT,
    MB,
    SIDECAR_SUFFIXES,
    MaintenanceError,
    ProfileSkipped,
    commits_durable,
    describe_holders,
    file_size,
    free_bytes,
    fsync_path,
    holders,
    sqlite_uri,
)
from ..store.schema import quick_check_rows

PARTIAL = ".state.db.restore.partial"
ASIDE_PREFIX = "state.db.pre-restore-"
MOVED_SUFFIXES = ("",) + SIDECAR_SUFFIXES + ("-journal",)


class DbCounts(TypedDict):
    """What a database file holds (``db_counts``)."""

    sessions: int
    messages: int
    schema_version: int | None


class BackupCounts(DbCounts, total=False):
    """A backup that verified: its counts, its size decompressed, and (in a plan) where it is."""

    db_bytes: int
    path: str
    bytes: int
    compressed: bool


class Rejected(TypedDict):
    path: str
    error: str


class Current(TypedDict, total=False):
    """The state.db a restore replaces (or, where there is none, its directory's owner)."""

    exists: bool
    uid: int
    gid: int
    mode: str | None
    error: str
    files: list[str]
    sessions: int
    messages: int
    schema_version: int | None


class Owner(TypedDict):
    uid: int
    gid: int
    mode: str


class MovedAside(TypedDict):
    dir: str
    files: list[str]


class RestorePlan(TypedDict, total=False):
    """``plan_restore``'s plan; ``restore`` adds ``restored``, ``moved_aside`` and ``owner``."""

    db: str
    backup_dir: str
    backup: BackupCounts
    rejected: list[Rejected]
    current: Current
    holders: Sequence[Mapping[str, object]]
    aside: str
    restored: DbCounts
    moved_aside: MovedAside | None
    owner: Owner


def profile_db(home: str, profile: str) -> str:
    path: str = profile_path(os.path.abspath(os.path.expanduser(home)), profile)
    return path


def db_counts(path: str) -> DbCounts:
    """quick_check and counts of a database file, read without creating any file beside it."""
    conn = sqlite3.connect(sqlite_uri(path, mode="ro", immutable="1"), uri=True, isolation_level=None)
    try:
        check = quick_check_rows(conn)
        if check != ["ok"]:
            raise MaintenanceError("quick_check failed: %s" % "; ".join(check[:3]))
        counts: DbCounts = {
            "sessions": conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0],
            "messages": conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0],
            "schema_version": None,
        }
        try:
            counts["schema_version"] = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        except sqlite3.Error:
            pass
        return counts
    except sqlite3.Error as exc:
        raise MaintenanceError("not a readable Hermes database: %s" % exc) from None
    finally:
        conn.close()


def unpack_backup(backup: str, target: str, owner: tuple[int, int] | None = None) -> None:
    """Copy or decompress ``backup`` into the new file ``target`` (0600; ``owner``'s, a (uid, gid)
    pair, when given), fsynced."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as dst:
        with gzip.open(backup, "rb") if backup.endswith(".gz") else open(backup, "rb") as src:
            shutil.copyfileobj(src, dst, 4 * MB)
        dst.flush()
        if owner:
            os.fchown(dst.fileno(), *owner)
        os.fsync(dst.fileno())


def verify_backup(path: str) -> BackupCounts:
    """Counts of a backup (a .gz is decompressed into a private temporary directory)."""
    if not path.endswith(".gz"):
        return _with_size(db_counts(path), path)
    tmpdir = tempfile.mkdtemp(prefix="hermes-ops-restore-")
    try:
        plain = os.path.join(tmpdir, "backup.db")
        try:
            unpack_backup(path, plain)
        except (OSError, EOFError) as exc:
            raise MaintenanceError("cannot decompress: %s" % exc) from None
        return _with_size(db_counts(plain), plain)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _with_size(counts: DbCounts, plain: str) -> BackupCounts:
    return {
        "sessions": counts["sessions"],
        "messages": counts["messages"],
        "schema_version": counts["schema_version"],
        "db_bytes": file_size(plain),
    }


def _resolve_backup(backup: str, backup_dir: str) -> str:
    path = backup if os.path.isabs(backup) else os.path.join(backup_dir, backup)
    if not os.path.isfile(path):
        raise MaintenanceError("backup %s does not exist" % path)
    if os.path.basename(path).startswith(".") or ".partial" in os.path.basename(path):
        raise MaintenanceError("%s is an unfinished backup (a hidden .partial file): refused" % path)
    return path


def plan_restore(home: str, profile: str, backup_dir: str | None = None, backup: str | None = None) -> RestorePlan:
    """What a restore would do; reads only. Raises MaintenanceError with the reason."""
    db = profile_db(home, profile)
    backup_dir = backups_of(os.path.abspath(os.path.expanduser(home)), backup_dir)
    rejected: list[Rejected] = []
    if backup:
        candidates = [_resolve_backup(backup, backup_dir)]
    else:
        candidates = [path for path, _stamp in list_backups(backup_dir, profile)]
        if not candidates:
            raise MaintenanceError(
                "no backup of profile %s in %s (hermes-ops_%s_*.db[.gz])" % (profile, backup_dir, profile)
            )
    verified = _first_verified(candidates, rejected)
    if verified is None:
        raise MaintenanceError(
            "no backup of profile %s verifies: %s"
            % (profile, "; ".join("%s: %s" % (r["path"], r["error"]) for r in rejected))
        )
    current, held_by = _current_file(db), holders(db)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return {
        "db": db,
        "backup_dir": backup_dir,
        "backup": verified,
        "rejected": rejected,
        "current": current,
        "holders": held_by,
        "aside": os.path.join(os.path.dirname(db), ASIDE_PREFIX + stamp),
    }


def _first_verified(candidates: list[str], rejected: list[Rejected]) -> BackupCounts | None:
    """The first of ``candidates`` that verifies; each one before it is added to ``rejected``."""
    for path in candidates:
        try:
            counts = verify_backup(path)
        except MaintenanceError as exc:
            rejected.append({"path": path, "error": str(exc)})
            continue
        counts["path"], counts["bytes"], counts["compressed"] = path, file_size(path), path.endswith(".gz")
        return counts
    return None


def _current_file(db: str) -> Current:
    """The file the restore replaces: owner, mode, counts and files; where there is none, its directory's owner."""
    current: Current
    if os.path.lexists(db):
        st = os.lstat(db)
        if not stat.S_ISREG(st.st_mode):
            raise MaintenanceError("%s is not a regular file (a link or a directory): restore refused" % db)
        current = {"exists": True, "uid": st.st_uid, "gid": st.st_gid, "mode": "%o" % stat.S_IMODE(st.st_mode)}
        try:
            if not os.path.exists(db + "-wal"):
                counts = db_counts(db)
                current["sessions"], current["messages"] = counts["sessions"], counts["messages"]
                current["schema_version"] = counts["schema_version"]
        except MaintenanceError as exc:
            current["error"] = str(exc)  # a damaged file is a reason to restore, not to refuse
    else:
        parent = os.path.dirname(db)
        if not os.path.isdir(parent):
            raise MaintenanceError("%s does not exist: check hermes_home and profile" % parent)
        st = os.stat(parent)
        current = {"exists": False, "uid": st.st_uid, "gid": st.st_gid, "mode": None}
    # A -journal too: left beside the restored file, a hot journal would be rolled back into it.
    current["files"] = [os.path.basename(db) + s for s in MOVED_SUFFIXES if os.path.lexists(db + s)]
    return current


def restore(plan: RestorePlan, force: bool = False) -> RestorePlan:
    """Carry out ``plan`` under the profile's maintenance lock; returns it with ``restored``."""
    with _maintenance_lock(plan["db"], plan["current"]):
        return _restore(plan, force)


def _maintenance_lock(db: str, current: Current) -> ProfileLock:
    """The lock maintenance runs take: no scheduled run works on the file meanwhile."""
    try:
        return ProfileLock(db, check_mode=False, owner=(current["uid"], current["gid"]))
    except ProfileSkipped:
        raise MaintenanceError(
            "%s is locked by a maintenance run (ours or Hermes's auto-maintenance): try again when it is done"
            % (db + LOCK_SUFFIX)
        ) from None


def _restore(plan: RestorePlan, force: bool) -> RestorePlan:
    db, backup, current = plan["db"], plan["backup"], plan["current"]
    others = holders(db)
    if others and not force:
        raise MaintenanceError(
            "%s is held open by %s: stop the Hermes gateway first (hermes_gateway_service), or force the restore "
            "and restart every process that had it open" % (db, describe_holders(others))
        )
    directory = os.path.dirname(db)
    _check_room(db, backup)
    partial = os.path.join(directory, PARTIAL)
    _verified_partial(backup, partial, (current["uid"], current["gid"]))
    aside = _unused(plan["aside"])
    present = [name for name in _names(db) if os.path.lexists(os.path.join(directory, name))]
    plan["restored"] = _swap(db, partial, aside, present, (current["uid"], current["gid"]), force, backup)
    plan["moved_aside"] = {"dir": aside, "files": present} if present else None
    st = os.stat(db)
    plan["owner"] = {"uid": st.st_uid, "gid": st.st_gid, "mode": "%o" % stat.S_IMODE(st.st_mode)}
    return plan


def _check_room(db: str, backup: BackupCounts) -> None:
    """Room beside state.db for the restored file and the copies of the old file's sidecars kept aside."""
    directory = os.path.dirname(db)
    need = int(backup["db_bytes"] * 1.05) + MB + sum(file_size(db + suffix) for suffix in MOVED_SUFFIXES[1:])
    if free_bytes(directory) < need:
        raise MaintenanceError(
            "not enough space in %s for the restored file: about %d MB needed, %d MB free; nothing was changed"
            % (directory, need // MB, free_bytes(directory) // MB)
        )


def _verified_partial(backup: BackupCounts, partial: str, owner: tuple[int, int]) -> None:
    """Step 1: the backup's copy at ``partial``, checked against its verified counts, the owner's, 0600, durable."""
    if os.path.lexists(partial):
        os.unlink(partial)  # left by an interrupted restore
    try:
        unpack_backup(backup["path"], partial)
        got = db_counts(partial)
        if (got["sessions"], got["messages"]) != (backup["sessions"], backup["messages"]):
            raise MaintenanceError("the copy of %s does not match its verified counts" % backup["path"])
        os.chown(partial, *owner)
        os.chmod(partial, 0o600)
        fsync_path(partial)  # its owner too: a root-owned state.db after a power loss locks Hermes out
    except BaseException:
        _remove(partial)
        raise


def _swap(
    db: str, partial: str, aside: str, present: list[str], owner: tuple[int, int], force: bool, backup: BackupCounts
) -> DbCounts:
    """Steps 2 to 4: the old files aside, the verified copy renamed over state.db and checked again;
    on any failure the old files are put back. Returns the restored file's counts."""
    directory = os.path.dirname(db)
    has_db = "state.db" in present
    copied: list[str] = []
    moved: list[str] = []
    renamed = False
    try:
        if present:
            os.mkdir(aside, 0o700)
            os.chown(aside, *owner)
            if has_db:  # a second name for the old file: state.db itself never goes missing
                os.link(db, os.path.join(aside, "state.db"))
            _sidecars_aside(
                db, aside, [n for n in present if n != "state.db"], owner, has_db and not force, copied, moved
            )
        os.rename(partial, db)  # atomic: at every moment state.db is the old file or the new one
        renamed = True
        fsync_path(directory)  # the rename
        restored = db_counts(db)
        if (restored["sessions"], restored["messages"]) != (backup["sessions"], backup["messages"]):
            raise MaintenanceError("%s does not match the backup after the rename" % db)
    except BaseException:
        _put_back(db, aside, has_db, renamed, copied, moved)
        _remove(partial)
        raise
    return restored


def _sidecars_aside(
    db: str,
    aside: str,
    sidecars: list[str],
    owner: tuple[int, int],
    settling: bool,
    copied: list[str],
    moved: list[str],
) -> None:
    """The sidecars out of the home and into ``aside``, state.db's second name being there already.

    ``settling`` (nobody holds the file): copied first, then the old file settled, then they go;
    where it cannot be settled, and when forced, moved. ``copied`` and ``moved`` say how far it got."""
    directory = os.path.dirname(db)
    settled = False
    if settling:
        for name in sidecars:
            copied.append(name)  # before: a copy cut short is removed too
            # a plain copy (a sidecar's name never ends in .gz), the old file's owner's
            unpack_backup(os.path.join(directory, name), os.path.join(aside, name), owner)
        aside_durable(aside, directory)
        settled = settle(db) is None
    # The sidecars go before the new file comes: a -wal must never sit beside a
    # state.db it does not belong to (SQLite would replay it into that file).
    for name in sidecars:
        if settled:  # state.db holds all they held; their copies are kept
            _remove(os.path.join(directory, name))
        else:  # over its copy, if one was made
            os.rename(os.path.join(directory, name), os.path.join(aside, name))
            moved.append(name)
    aside_durable(aside, directory)


def _names(db: str) -> list[str]:
    return [os.path.basename(db) + suffix for suffix in MOVED_SUFFIXES]


def _unused(aside: str) -> str:
    """``aside``, or with ``-1``, ``-2``... when a restore in the same second made it."""
    name, seq = aside, 1
    while os.path.lexists(name):
        name, seq = "%s-%d" % (aside, seq), seq + 1
    return name


def settle(db: str) -> str | None:
    """Make state.db hold on its own every row committed to it, durably: SQLite opens it as Hermes
    would (rolling a hot journal back), checkpoints its -wal into it (TRUNCATE), then it is fsynced.
    Only while nobody else holds the file (a checkpoint beside a holder meets SQLite's WAL-reset bug).

    Returns None, or why not (a damaged file SQLite cannot open, a checkpoint left unfinished)."""
    if not (file_size(db + "-wal") or file_size(db + "-journal")):
        return None  # nothing beside it holds a committed row or a rollback
    try:
        conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=FULL")  # the file fsynced before the -wal is truncated
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            busy: int = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return "SQLite cannot settle it: %s" % exc
    if busy or file_size(db + "-wal"):
        return "its checkpoint did not finish"
    commits_durable(db)  # the file, and the directory's entries (SQLite removes the emptied -wal at close)
    return None


def _put_back(db: str, aside: str, has_db: bool, renamed: bool, copied: list[str], moved: list[str]) -> None:
    """After a failure: the old file at its name again (over the new one), then its sidecars;
    a copy goes back only where SQLite's settling removed the sidecar (its rows are in state.db)."""
    directory = os.path.dirname(db)
    if has_db:
        if renamed:
            os.rename(os.path.join(aside, "state.db"), db)
        else:
            _remove(os.path.join(aside, "state.db"))
    elif renamed:
        _remove(db)
    for name in moved + [name for name in copied if name not in moved]:
        target = os.path.join(directory, name)
        if name in moved or not os.path.lexists(target):
            os.rename(os.path.join(aside, name), target)
        else:
            _remove(os.path.join(aside, name))
    if os.path.isdir(aside):
        os.rmdir(aside)


def aside_durable(aside: str, directory: str) -> None:
    """The aside directory, the old file's second name and the sidecars' copies or moves, durable
    before the settling and the rename over state.db: else a power loss can leave the old -wal
    beside the restored file (SQLite replays it into it: "row missing from index") or the old
    file with no name at all."""
    fsync_path(aside)
    fsync_path(directory)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
