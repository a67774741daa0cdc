# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Put pruned sessions back from an archive, next to a live gateway (the operator's way).

An archive (``hermes-ops-archive_<profile>_<time>.db``, written by ``take_archive``) holds
the sessions a prune deleted, with their messages and the rows tied to them. Here:

* ``check_archive`` refuses anything but a finished, verified archive: a hidden ``.partial``,
  another name, a file others can write, a failing quick_check, or one whose
  ``archive_sessions`` list is not fully there (an archive is renamed into place only after
  that list is written and verified, so a file that lacks it is not one);
* ``plan_session_restore`` says exactly what a restore would do, reading state.db in short
  read transactions (each session and each 500 message ids on their own), and refuses an
  archive of a newer schema than the file, a table or column the file needs that the archive
  lacks, and a session id the archive does not hold;
* ``restore_from_archive`` holds the profile's maintenance lock (shared with Hermes's own
  auto-maintenance), refuses while Hermes repairs, quarantines or rebuilds the file, and
  restores through ``_hermes_archive.restore_sessions`` (one session per write transaction,
  messages 500 per transaction, ``INSERT OR IGNORE``): restoring what is already there changes
  nothing, and a restore interrupted at any point is completed by running it again.

As root on a user's file, the work is done in a child switched to that user (as maintenance
does), so a -journal or -wal it creates is the user's. Standard library only, Python 3.8+.
"""

from __future__ import annotations

import os
import sqlite3
import stat

from ._hermes_archive import is_archive_name, related_tables, restore_sessions
from ._hermes_db import (
    BATCH_PAUSE,
    BUSY_TIMEOUT,
    MaintenanceError,
    ProfileSkipped,
    ReadOnlyDB,
    is_wal_file,
    refuse_wal_on_shared_filesystem,
    sqlite_uri,
)
from ._hermes_engine import LOCK_SUFFIX, ProfileLock, backups_of, profile_path, run_as_owner
from ._hermes_hazards import refuse_during_hermes_operation
from ._hermes_inspect import quick_check_rows

ID_CHUNK = 500  # message ids looked up per read transaction of state.db


def resolve_archive(archive, backup_dir):
    """The archive's path: as given when absolute, else a file name in ``backup_dir``."""
    path = archive if os.path.isabs(archive) else os.path.join(backup_dir, archive)
    name = os.path.basename(path)
    if name.startswith(".") or ".partial" in name:
        raise MaintenanceError("%s is an unfinished archive (a hidden .partial file): refused" % path)
    if not is_archive_name(name):
        raise MaintenanceError(
            "%s is not an archive of this collection (hermes-ops-archive_<profile>_<time>.db): refused; "
            "a whole-file backup (hermes-ops_*.db) is restored with state_db_restore / playbooks/restore.yml" % path
        )
    if not os.path.lexists(path):
        raise MaintenanceError("archive %s does not exist: check the name and backup_dir" % path)
    return path


def _open_archive(path):
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise MaintenanceError("archive %s is not a regular file (a link or a directory): refused" % path)
    if st.st_mode & 0o022 or st.st_uid not in (os.geteuid(), 0):
        raise MaintenanceError(
            "archive %s is writable by others or owned by uid %d (mode %o): refused; archives are the owner's, 0600"
            % (path, st.st_uid, stat.S_IMODE(st.st_mode))
        )
    return sqlite3.connect(sqlite_uri(path, mode="ro", immutable="1"), uri=True, isolation_level=None)


def check_archive(path):
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
        except sqlite3.DatabaseError as exc:
            raise MaintenanceError("%s is not a readable archive: %s" % (path, exc)) from None
    finally:
        conn.close()
    incomplete = [sid for sid, count in listed if sid not in present or held.get(sid, 0) < count]
    if meta.get("kind") != "prune archive" or not listed or incomplete:
        raise MaintenanceError(
            "archive %s is not a complete, verified archive (%s): refused"
            % (
                path,
                "%d of its sessions lack rows" % len(incomplete) if incomplete else "no list of the sessions it holds",
            )
        )
    version = meta.get("schema_version")
    return {
        "path": path,
        "profile": meta.get("profile"),
        "source": meta.get("source"),
        "created_at": float(meta["created_at"]) if meta.get("created_at") else None,
        "schema_version": int(version) if version and version.isdigit() else None,
        "sessions": len(listed),
        "messages": sum(held.get(sid, 0) for sid, _count in listed),
    }


def _schema_problems(src, dst, tables):
    """What keeps the archive's rows from fitting state.db's tables (columns matched by name)."""
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
            problems.append("%s.%s (NOT NULL, no default) is not in the archive" % (table, ", ".join(lacking)))
    return problems


def _live_schema_version(dst):
    try:
        row = dst.execute("SELECT MAX(version) FROM schema_version").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def plan_session_restore(db_path, archive_path, session_ids=None, busy_timeout=BUSY_TIMEOUT):
    """What restoring ``session_ids`` (None: all) from the archive would do; reads only.

    Returns {"archive", "db_schema_version", "sessions": [{"id", "present", "messages_archived",
    "messages_missing", "rows_missing" (of the other tables tied to it), "orphaned"}] (parents
    first, as they are restored), "sessions_restored", "sessions_present", "messages_restored",
    "rows_restored", "orphaned", "changed"}.
    """
    info = check_archive(archive_path)
    src = sqlite3.connect(sqlite_uri(archive_path, mode="ro", immutable="1"), uri=True, isolation_level=None)
    live = ReadOnlyDB(db_path, busy_timeout)  # creates no file beside state.db, takes no lock between statements
    dst = live.conn
    try:
        known = [r[0] for r in src.execute("SELECT id FROM archive_sessions ORDER BY seq DESC")]
        unknown = sorted(set(session_ids or ()) - set(known))
        if unknown:
            raise MaintenanceError(
                "archive %s does not hold session(s) %s (it holds %d sessions; list them with check mode and no "
                "sessions given); nothing was restored" % (archive_path, ", ".join(unknown[:5]), len(known))
            )
        live_version = _live_schema_version(dst)
        if info["schema_version"] and live_version and info["schema_version"] > live_version:
            raise MaintenanceError(
                "archive %s was taken from schema_version %d, state.db is at %d (an older Hermes): refused; "
                "upgrade Hermes (it migrates state.db) first" % (archive_path, info["schema_version"], live_version)
            )
        referencing, _referenced = related_tables(src)
        problems = _schema_problems(src, dst, ["sessions"] + [t for t, _c in referencing[:1]])
        if problems:
            raise MaintenanceError(
                "archive %s does not fit %s: %s; nothing was restored" % (archive_path, db_path, "; ".join(problems))
            )
        asked = None if session_ids is None else set(session_ids)
        wanted = [sid for sid in known if asked is None or sid in asked]
        # Rows of the other tables tied to a session (session_model_usage): a restore cut short
        # after a session's messages went back may still lack them.
        others = [(t, c) for t, c in referencing[1:] if _schema_problems(src, dst, [t]) == []]
        sessions = [_plan_one(src, dst, sid, set(wanted), others) for sid in wanted]
    except sqlite3.OperationalError as exc:
        raise MaintenanceError("%s could not be read: %s; nothing was restored" % (db_path, exc)) from None
    finally:
        src.close()
        live.close()
    plan = {"archive": info, "db_schema_version": live_version, "sessions": sessions}
    plan.update(_totals(sessions))
    return plan


def _quote(name):
    return '"%s"' % name.replace('"', '""')


def _missing_rows(src, dst, sid, others):
    missing = 0
    for table, column in others:
        sql = "SELECT COUNT(*) FROM %s WHERE %s = ?" % (_quote(table), _quote(column))
        missing += max(0, src.execute(sql, (sid,)).fetchone()[0] - dst.execute(sql, (sid,)).fetchone()[0])
    return missing


def _plan_one(src, dst, sid, wanted, others):
    parent = src.execute("SELECT parent_session_id FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
    ids = [r[0] for r in src.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY id", (sid,))]
    present = dst.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None
    there = 0
    for start in range(0, len(ids), ID_CHUNK):  # each statement its own short read
        chunk = ids[start : start + ID_CHUNK]
        there += dst.execute(
            "SELECT COUNT(*) FROM messages WHERE id IN (%s)" % ",".join("?" * len(chunk)), chunk
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


def _totals(sessions):
    totals = {
        "sessions_restored": sum(1 for s in sessions if not s["present"]),
        "sessions_present": sum(1 for s in sessions if s["present"]),
        "messages_restored": sum(s["messages_missing"] for s in sessions),
        "rows_restored": sum(s["rows_missing"] for s in sessions),
        "orphaned": sum(1 for s in sessions if s["orphaned"]),
    }
    totals["changed"] = bool(totals["sessions_restored"] or totals["messages_restored"] or totals["rows_restored"])
    return totals


def _work(db_path, archive_path, session_ids, check_mode, busy_timeout, pause):
    """The restore itself, in the file owner's process; returns {"result"} or {"error"}."""
    lock = None
    try:
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
            raise MaintenanceError(str(exc).replace("skipped, nothing changed", "nothing was restored")) from None
        plan = plan_session_restore(db_path, archive_path, session_ids, busy_timeout)
        if check_mode or not plan["changed"]:
            return {"result": plan}
        wanted = [s["id"] for s in plan["sessions"] if not s["present"] or s["messages_missing"] or s["rows_missing"]]
        refuse_wal_on_shared_filesystem(db_path, "wal" if is_wal_file(db_path) else "delete")
        try:
            done = restore_sessions(db_path, archive_path, wanted, busy_timeout=busy_timeout, pause=pause)
        except sqlite3.OperationalError as exc:
            raise MaintenanceError(
                "%s: %s (held by another writer for longer than busy_timeout, %ss); what was restored stays, "
                "run the restore again to complete it" % (db_path, exc, busy_timeout)
            ) from None
        plan["done"] = done
        plan.update({key: done[key] for key in ("sessions_restored", "messages_restored", "orphaned")})
        plan["after"] = plan_session_restore(db_path, archive_path, session_ids, busy_timeout)["sessions"]
        plan["rows_restored"] -= sum(s["rows_missing"] for s in plan["after"])
        plan["changed"] = bool(done["sessions_restored"] or done["messages_restored"] or plan["rows_restored"])
        return {"result": plan}
    except MaintenanceError as exc:
        return {"error": str(exc)}
    finally:
        if lock is not None:
            lock.release()


def restore_from_archive(
    home,
    profile,
    archive,
    session_ids=None,
    backup_dir=None,
    check_mode=False,
    busy_timeout=BUSY_TIMEOUT,
    pause=BATCH_PAUSE,
):
    """Restore ``session_ids`` (None: every session) of an archive into a profile's state.db.

    ``archive``: a path, or a file name in ``backup_dir`` (default HOME/backups). Returns the
    plan (see ``plan_session_restore``) with ``db``; after a real run also ``done`` (what
    ``restore_sessions`` did) and ``after`` (each session as it is now). Raises MaintenanceError.
    """
    home = os.path.abspath(os.path.expanduser(home))
    db_path = profile_path(home, profile)
    if not os.path.isfile(db_path) or os.path.islink(db_path):
        raise MaintenanceError("%s is not a state.db file: check hermes_home and profile" % db_path)
    path = resolve_archive(archive, backups_of(home, backup_dir))
    args = (db_path, path, list(session_ids) if session_ids is not None else None, check_mode, busy_timeout, pause)
    owner = os.lstat(db_path).st_uid
    old_umask = os.umask(0o077)
    try:
        if os.geteuid() == 0 and owner != 0:
            outcome = run_as_owner(owner, _work, *args)
        else:
            outcome = _work(*args)
    finally:
        os.umask(old_umask)
    if "error" in outcome:
        raise MaintenanceError(outcome["error"])
    outcome["result"]["db"] = db_path
    return outcome["result"]
