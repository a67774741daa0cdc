# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Maintenance of every Hermes state.db of a host, one profile at a time.

Entry points: ``run_maintenance`` (modules, runner) and ``gather_info`` (read-only).
One profile's failure never stops the others; each result says what happened and why.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import sqlite3
import time
import traceback

from ._hermes_apply import PruneResult, close_zombies, prune
from ._hermes_backup import apply_retention, check_backup_dir, list_backups, take_backup
from ._hermes_db import (
    MB,
    MaintenanceError,
    ProfileSkipped,
    ReadOnlyDB,
    check_db_file,
    engine_sqlite,
    holders,
    open_rw,
)
from ._hermes_hazards import (
    auto_maintenance_meta,
    auto_prune_setting,
    held_hermes_locks,
    litestream_tables,
    no_checkpoint_on_close,
    refuse_during_hermes_operation,
)
from ._hermes_inspect import check_version, inspect_schema, quick_check, stats, unusable_fts
from ._hermes_plan import DAY, build_plan
from ._hermes_reclaim import reclaim, wal_budget

# Hermes's non-messaging sources: closing a messaging session (telegram, discord, ...)
# makes the gateway start a fresh conversation in a live chat, so those are never closed.
ZOMBIE_SOURCES = ("cli", "cron", "kanban", "acp", "api_server", "subagent", "tool", "recovered")
LOCK_SUFFIX = ".auto-maintenance.lock"  # the file Hermes's own auto-maintenance locks

DEFAULTS = {
    "hermes_home": None,  # list of homes; None: the current user's ~/.hermes
    "profiles": None,  # None: every profile
    "zombie_days": 1.0,
    "prune_days": 7.0,
    "zombie_sources": list(ZOMBIE_SOURCES),
    "end_reason": "startup_orphan_reap",
    "backup": True,
    "backup_dir": None,  # None: HOME/backups
    "backup_keep_days": 30,
    "backup_keep_count": None,
    "backup_interval_days": None,
    "backup_compress": False,
    "vacuum_mode": "auto",
    "vacuum_threshold": 25.0,
    "vacuum_switch_incremental": True,
    "batch_size": 2000,
    "batch_pause": 0.03,
    "batch_time": 0.06,
    "busy_timeout": 5.0,
    "allow_unknown_schema": False,
    "allow_foreign_owner": False,
}
VACUUM_MODES = ("auto", "full", "incremental", "never")


def normalize_options(options):
    """Fill defaults and refuse nonsense with a message that names the option."""
    opts = dict(DEFAULTS)
    opts.update({k: v for k, v in (options or {}).items() if v is not None or k in ("backup_interval_days",)})
    if not opts["hermes_home"]:
        opts["hermes_home"] = [os.path.join(os.path.expanduser("~"), ".hermes")]
    if isinstance(opts["hermes_home"], str):
        opts["hermes_home"] = [opts["hermes_home"]]
    for key in (
        "zombie_days",
        "prune_days",
        "backup_keep_days",
        "backup_interval_days",
        "batch_pause",
        "batch_time",
        "busy_timeout",
    ):
        if opts[key] is not None and float(opts[key]) < 0:
            raise MaintenanceError("%s must not be negative (got %s)" % (key, opts[key]))
    if float(opts["zombie_days"]) > float(opts["prune_days"]):
        raise MaintenanceError(
            "zombie_days (%s) is larger than prune_days (%s): a zombie would be pruned before it could be closed; "
            "use zombie_days <= prune_days" % (opts["zombie_days"], opts["prune_days"])
        )
    if opts["vacuum_mode"] not in VACUUM_MODES:
        raise MaintenanceError(
            "vacuum_mode must be one of %s (got %r)" % (", ".join(VACUUM_MODES), opts["vacuum_mode"])
        )
    if int(opts["batch_size"]) < 1:
        raise MaintenanceError("batch_size must be at least 1 (got %s)" % opts["batch_size"])
    if opts["backup_keep_count"] is not None and int(opts["backup_keep_count"]) < 1:
        raise MaintenanceError("backup_keep_count must be at least 1 (got %s)" % opts["backup_keep_count"])
    if not 0 <= float(opts["vacuum_threshold"]) <= 100:
        raise MaintenanceError("vacuum_threshold is a percentage from 0 to 100 (got %s)" % opts["vacuum_threshold"])
    return opts


def discover_profiles(home, wanted=None):
    """(name, state.db path) for HOME/state.db ('default') and HOME/profiles/*/state.db."""
    found = []
    if os.path.lexists(os.path.join(home, "state.db")):
        found.append(("default", os.path.join(home, "state.db")))
    profiles_dir = os.path.join(home, "profiles")
    if os.path.isdir(profiles_dir):
        for name in sorted(os.listdir(profiles_dir)):
            path = os.path.join(profiles_dir, name, "state.db")
            if os.path.lexists(path):
                found.append((name, path))
    if wanted:
        found = [item for item in found if item[0] in wanted]
    return found


def sessions_dir(db_path):
    """Hermes keeps transcripts in the profile's own home, beside its state.db."""
    return os.path.join(os.path.dirname(db_path), "sessions")


def _new_result(home, name, path):
    return {
        "name": name,
        "home": home,
        "path": path,
        "status": "ok",
        "error": None,
        "changed": False,
        "zombies_closed": 0,
        "sessions_pruned": 0,
        "messages_pruned": 0,
        "sessions_orphaned": 0,
        "transcripts_removed": 0,
        "prompts_collected": 0,
        "sessions_left_alone": 0,
        "bad_time_rows": 0,
        "backup": None,
        "backups_removed": [],
        "reclaim": None,
        "before": None,
        "after": None,
        "duration": 0.0,
        "sqlite": engine_sqlite(),
        "stopped_early": None,
    }


class ProfileLock:
    """A non-blocking flock on state.db.auto-maintenance.lock, shared with Hermes.

    Check mode only probes an existing lock file (it creates nothing).
    """

    def __init__(self, db_path, check_mode):
        self.path = db_path + LOCK_SUFFIX
        self.fd = None
        flags = os.O_NOFOLLOW | (os.O_RDONLY if check_mode else os.O_RDWR | os.O_CREAT)
        if check_mode and not os.path.exists(self.path):
            return
        try:
            self.fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise MaintenanceError("cannot open lock file %s: %s" % (self.path, exc.strerror)) from None
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_SH if check_mode else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ProfileSkipped(
                    "another maintenance run (ours or Hermes's auto-maintenance) holds %s" % self.path
                ) from None
            raise

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays for Hermes
            self.fd = None


def maintain_profile(home, name, db_path, opts, check_mode, now):
    """Lock, preflight, plan, back up, apply, reclaim: one profile, never raising."""
    result = _new_result(home, name, db_path)
    started = time.time()
    lock = db = conn = None
    try:
        st = check_db_file(db_path)
        _check_owner(db_path, st, opts)
        lock = ProfileLock(db_path, check_mode)
        refuse_during_hermes_operation(db_path)
        db = ReadOnlyDB(db_path, opts["busy_timeout"]) if check_mode else None
        conn = db.conn if db else open_rw(db_path, float(opts["busy_timeout"]))
        quick_check(conn, db_path)
        schema = inspect_schema(conn, home)
        check_version(schema, opts["allow_unknown_schema"])
        schema["litestream"] = result["litestream"] = litestream_tables(conn)
        if schema["litestream"] and not check_mode:
            no_checkpoint_on_close(conn)
        result["schema_version"] = schema["schema_version"]
        result["fts_layout"] = schema["fts_layout"]
        result["before"] = stats(conn, db_path)
        plan = build_plan(conn, schema, opts, now, sessions_dir(db_path))
        result["bad_time_rows"] = plan.bad_time_rows
        broken_fts = unusable_fts(schema)
        if broken_fts and plan.delete_order:
            # Deleting a message fires every FTS trigger; one missing tokenizer fails them all.
            result["error"] = (
                "pruning refused: %s; this SQLite %s cannot run Hermes's delete triggers. Zombies were still closed; "
                "run with a Python whose SQLite has the tokenizer (trigram needs 3.34+), or install Hermes's "
                "CJK extension" % ("; ".join(broken_fts), sqlite3.sqlite_version)
            )
            plan.delete_order, plan.messages, plan.transcripts, plan.prompts, plan.orphaned = [], {}, {}, 0, 0
        backup_dir = _backup_dir(opts, home, st.st_uid)
        backup_due = opts["backup"] and (plan.has_changes or _interval_due(opts, backup_dir, name, now))
        if backup_due:
            check_backup_dir(backup_dir, st.st_uid, create=not check_mode)
        if check_mode:
            _predict(result, plan, backup_due, backup_dir, name)
            result["reclaim"] = reclaim(conn, db_path, opts, schema, bool(plan.delete_order), True)
        else:
            _apply(result, conn, db_path, plan, schema, opts, backup_due, backup_dir, name, now)
            result["after"] = stats(conn, db_path)
            result["reclaim"]["bytes_freed"] = max(0, _bytes(result["before"]) - _bytes(result["after"]))
        if result["error"]:
            result["status"] = "failed"
    except ProfileSkipped as exc:
        result["status"], result["error"] = "skipped", str(exc)
    except MaintenanceError as exc:
        result["status"], result["error"] = "failed", str(exc)
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            result["status"] = "skipped"
            result["error"] = (
                "%s stayed locked by another writer for longer than busy_timeout (%ss): skipped, nothing lost; "
                "the next run retries" % (db_path, opts["busy_timeout"])
            )
        else:
            result["status"], result["error"] = "failed", "%s: %s" % (db_path, exc)
    except Exception as exc:  # one profile must never stop the others
        result["status"] = "failed"
        result["error"] = "%s: unexpected %s: %s" % (db_path, type(exc).__name__, exc)
        result["traceback"] = traceback.format_exc()
    finally:
        if db is not None:
            db.close()
        elif conn is not None:
            conn.close()
        if lock is not None:
            lock.release()
    result["duration"] = round(time.time() - started, 3)
    return result


def _bytes(stats_):
    return stats_["db_bytes"] + stats_["wal_bytes"]


def _check_owner(db_path, st, opts):
    uid = os.geteuid()
    if uid not in (0, st.st_uid) and not opts["allow_foreign_owner"]:
        raise MaintenanceError(
            "%s belongs to uid %d but this run is uid %d: files it creates (WAL, lock, backups) would belong to "
            "the wrong user; run as that user or as root (the engine then switches to the owner)"
            % (db_path, st.st_uid, uid)
        )


def _backup_dir(opts, home, uid):
    return os.path.abspath(opts["backup_dir"] or os.path.join(home, "backups"))


def _interval_due(opts, backup_dir, name, now):
    interval = opts["backup_interval_days"]
    if interval is None:
        return False
    newest = list_backups(backup_dir, name)
    return not newest or now - newest[0][1] >= float(interval) * DAY


def _predict(result, plan, backup_due, backup_dir, name):
    before = result["before"]
    result.update(
        zombies_closed=len(plan.zombies),
        sessions_pruned=len(plan.delete_order),
        messages_pruned=plan.messages_pruned,
        sessions_orphaned=plan.orphaned,
        transcripts_removed=plan.transcripts_count,
        prompts_collected=plan.prompts,
        changed=plan.has_changes or bool(backup_due),
    )
    if backup_due:
        result["backup"] = {
            "path": os.path.join(backup_dir, "hermes-ops_%s_<timestamp>.db" % name),
            "bytes": None,
            "verified": None,
        }
    after = dict(before)
    zombie_ids = {sid for sid, _last in plan.zombies}
    after["sessions"] = before["sessions"] - len(plan.delete_order)
    after["messages"] = before["messages"] - plan.messages_pruned
    after["open_sessions"] = before["open_sessions"] - len(zombie_ids)
    result["after"] = after


def _apply(result, conn, db_path, plan, schema, opts, backup_due, backup_dir, name, now):
    if backup_due:
        result["backup"] = take_backup(
            conn, db_path, backup_dir, name, opts["backup_compress"], plan.messages, float(opts["busy_timeout"])
        )
        result["backups_removed"] = apply_retention(
            backup_dir, name, opts["backup_keep_days"], opts["backup_keep_count"], now, result["backup"]["path"]
        )
        result["changed"] = True
    pause = float(opts["batch_pause"])
    closed, pruned = [], PruneResult()
    stop = wal_budget(conn, db_path, schema.get("litestream"))
    try:
        close_zombies(conn, plan, schema, opts["end_reason"], pause, closed)
        prune(conn, plan, schema, int(opts["batch_size"]), pause, pruned, float(opts["batch_time"]), stop)
    finally:  # also when a later transaction failed: report what was committed
        result.update(
            zombies_closed=len(closed),
            sessions_pruned=pruned.sessions,
            messages_pruned=pruned.messages,
            sessions_orphaned=pruned.orphaned,
            transcripts_removed=pruned.transcripts,
            prompts_collected=pruned.prompts,
            sessions_left_alone=len(pruned.left_alone),
            changed=result["changed"] or bool(closed or pruned.sessions),
        )
    result["stopped_early"] = pruned.stopped
    result["reclaim"] = reclaim(conn, db_path, opts, schema, pruned.sessions > 0, False, stop)
    if result["reclaim"]["action"]:
        result["changed"] = True


def _run_as_owner(uid, fn, *args):
    """As root, do a profile's work as the owner of its state.db, in a child process.

    Every file the engine creates (WAL, lock, backups) then belongs to the Hermes user,
    and a root-owned -shm can never lock the gateway out of its own database.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(read_fd)
            pw = pwd.getpwuid(uid)
            os.setgroups(os.getgrouplist(pw.pw_name, pw.pw_gid))
            os.setgid(pw.pw_gid)
            os.setuid(uid)
            os.environ["HOME"] = pw.pw_dir
            payload = json.dumps(fn(*args)).encode()
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    if not data:
        raise MaintenanceError("the worker process for uid %d died before reporting" % uid)
    return json.loads(data.decode())


def _owner_of(path):
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def _each_profile(opts, check_mode, work):
    now = time.time()
    results = []
    for home in opts["hermes_home"]:
        home = os.path.abspath(os.path.expanduser(home))
        profiles = discover_profiles(home, opts["profiles"])
        if not profiles:
            missing = _new_result(home, "default", os.path.join(home, "state.db"))
            missing["status"] = "failed" if not os.path.isdir(home) else "skipped"
            missing["error"] = (
                "Hermes home %s does not exist: check hermes_home" % home
                if not os.path.isdir(home)
                else "no state.db under %s (no profile matches %s)" % (home, opts["profiles"] or "any")
            )
            results.append(missing)
            continue
        for name, path in profiles:
            uid = _owner_of(path)
            if os.geteuid() == 0 and uid not in (None, 0):
                try:
                    results.append(_run_as_owner(uid, work, home, name, path, opts, check_mode, now))
                except MaintenanceError as exc:
                    failed = _new_result(home, name, path)
                    failed["status"], failed["error"] = "failed", str(exc)
                    results.append(failed)
            else:
                results.append(work(home, name, path, opts, check_mode, now))
    return results


def run_maintenance(options, check_mode=False):
    """Maintain every profile of every home; see docs/architecture.md for the result."""
    opts = normalize_options(options)
    old_umask = os.umask(0o077)  # backups, lock files: private chat history
    try:
        profiles = _each_profile(opts, check_mode, maintain_profile)
    finally:
        os.umask(old_umask)
    return {
        "changed": any(p["changed"] for p in profiles),
        "profiles": profiles,
        "summary": [format_summary_line(p, check_mode) for p in profiles],
        "failed": [p["name"] for p in profiles if p["status"] == "failed"],
        "check_mode": check_mode,
        "sqlite": engine_sqlite(),
    }


def format_summary_line(p, check_mode=False):
    """The seed script's line: ``default: zombies=3 pruned=12 freed=45MB remaining=...``."""
    if p["status"] == "skipped":
        return "%s: skipped: %s" % (p["name"], p["error"])
    if p["status"] == "failed" and not p["before"]:
        return "%s: FAILED: %s" % (p["name"], p["error"])
    before, after = p["before"], p["after"] or p["before"]
    freed = 0 if check_mode else max(0, _bytes(before) - _bytes(after))
    line = "%s: zombies=%d pruned=%d freed=%dMB remaining=%d sessions, %d messages" % (
        p["name"], p["zombies_closed"], p["sessions_pruned"], round(freed / MB), after["sessions"], after["messages"],
    )  # fmt: skip
    if p["status"] == "failed":
        line += " FAILED: %s" % p["error"]
    return line


def profile_info(home, name, db_path, opts, check_mode, now):
    """Read-only facts about one profile; reports what it can even when maintenance would refuse."""
    info = {"name": name, "home": home, "path": db_path, "status": "ok", "error": None, "sqlite": engine_sqlite()}
    db = None
    try:
        st = check_db_file(db_path)
        db = ReadOnlyDB(db_path, opts["busy_timeout"])
        schema = inspect_schema(db.conn, home)
        info.update(stats(db.conn, db_path))
        info.update(
            schema_version=schema["schema_version"],
            fts_layout=schema["fts_layout"],
            fts_unusable=unusable_fts(schema),
            auto_vacuum=schema["auto_vacuum"],
            holders=holders(db_path),
            mode="%o" % (st.st_mode & 0o777),
            hermes_locks_held=held_hermes_locks(db_path),
            litestream=litestream_tables(db.conn),
            hermes_auto_maintenance=dict(auto_maintenance_meta(db.conn), config=auto_prune_setting(home)),
        )
        backups = list_backups(_backup_dir(opts, home, st.st_uid), name)
        info["newest_backup"] = (
            {"path": backups[0][0], "age_days": round((now - backups[0][1]) / DAY, 2)} if backups else None
        )
        info["backups"] = len(backups)
        plan = build_plan(db.conn, schema, opts, now, sessions_dir(db_path))
        info.update(
            idle_open=len(plan.zombies),
            prunable_sessions=len(plan.delete_order),
            prunable_messages=plan.messages_pruned,
            bad_time_rows=plan.bad_time_rows,
        )
    except (MaintenanceError, sqlite3.Error, OSError) as exc:
        info["status"], info["error"] = "failed", str(exc)
    finally:
        if db is not None:
            db.close()
    return info


def gather_info(options):
    """Stats of every profile, for reports; opens read-only and writes nothing."""
    opts = normalize_options(options)
    return {"profiles": _each_profile(opts, True, profile_info), "sqlite": engine_sqlite()}
