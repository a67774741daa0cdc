"""Evidence from one fleet host, gathered AS the Hermes user (run by verify.yml).

    fleet_inspect.py [--home HERMES_HOME] [--checksums-only] [--watch PATH]...

Prints one JSON object:

- ``user``, ``uid``, ``home`` (the Hermes home), ``cron_pids`` (running cron daemons);
- ``crontab``: the user's crontab lines and ``job``: the lines that run the
  maintenance runner (``hermes_ops``), ``config_path``: its ``--config`` argument;
- ``config``: that JSON config (when readable), ``log``: the runner's log file
  (``log_file`` from the config) with its text;
- ``profiles``: per profile (``HOME/state.db`` = default, ``HOME/profiles/<n>/state.db``)
  sha256 of state.db and of its -wal (if any), size, mode, owner uid; unless
  ``--checksums-only``: the sqlite header check, counts of sessions / messages / open
  sessions and the session ids (the database is opened read-write as Hermes would,
  only SELECTs run; with --checksums-only it is never opened, and only HOME/backups
  is listed);
- ``backups``: the files in the backup directory (config ``backup_dir`` or HOME/backups);
- ``foreign``: paths under the home / install dir not owned by the user;
- ``time`` (unix seconds) and ``watch``: size and mtime of each ``--watch`` path (or null).

Standard library only (runs on the container's python3).
"""

import argparse
import hashlib
import json
import os
import pwd
import re
import sqlite3
import subprocess
import sys
import time

RUNNER_MARK = re.compile(r"hermes_ops|hermes-ops|hermes_runner|session.maintenance", re.I)
CONFIG_ARG = re.compile(r"--config[= ]+(\S+)")
SQLITE_MAGIC = b"SQLite format 3\x00"
LOG_TAIL = 20000


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_facts(path):
    st = os.stat(path)
    return {"size": st.st_size, "mode": "%04o" % (st.st_mode & 0o7777), "uid": st.st_uid, "sha256": sha256(path)}


def discover(home):
    found = {}
    if os.path.exists(os.path.join(home, "state.db")):
        found["default"] = os.path.join(home, "state.db")
    pdir = os.path.join(home, "profiles")
    if os.path.isdir(pdir):
        for name in sorted(os.listdir(pdir)):
            path = os.path.join(pdir, name, "state.db")
            if os.path.exists(path):
                found[name] = path
    return found


def db_counts(path):
    with open(path, "rb") as handle:
        if handle.read(16) != SQLITE_MAGIC:
            return {"sqlite": False, "error": "not an SQLite file (bad header)"}
    try:
        conn = sqlite3.connect(path, timeout=10)
        try:
            ids = [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY id")]
            return {
                "sqlite": True,
                "sessions": len(ids),
                "messages": conn.execute("SELECT count(*) FROM messages").fetchone()[0],
                "open": conn.execute("SELECT count(*) FROM sessions WHERE ended_at IS NULL").fetchone()[0],
                "ids": ids,
                "integrity": conn.execute("PRAGMA quick_check").fetchone()[0],
            }
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return {"sqlite": False, "error": "%s: %s" % (type(exc).__name__, exc)}


def crontab():
    try:
        proc = subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=False)
    except OSError as exc:
        return {"rc": None, "error": str(exc), "lines": []}
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return {"rc": proc.returncode, "error": proc.stderr.strip(), "lines": lines}


def cron_pids():
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/comm" % entry) as handle:
                    if handle.read().strip() == "cron":
                        pids.append(int(entry))
            except OSError:
                continue
    return sorted(pids)


def foreign_files(roots, uid):
    out = []
    for root in roots:
        if not root or not os.path.isdir(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                try:
                    if os.lstat(path).st_uid != uid:
                        out.append(path)
                except OSError:
                    continue
    return sorted(out)


def find_config(job_lines):
    """The runner's --config: on the cron line itself, or in the wrapper script it runs."""
    for line in job_lines:
        match = CONFIG_ARG.search(line)
        if match:
            return os.path.expanduser(match.group(1).strip("'\""))
        fields = line.split()
        command = fields[5] if len(fields) > 5 and not line.startswith("@") else (fields[1] if len(fields) > 1 else "")
        command = os.path.expanduser(command)
        if os.path.isfile(command):
            try:
                with open(command, errors="replace") as handle:
                    match = CONFIG_ARG.search(handle.read())
            except OSError:
                match = None
            if match:
                return os.path.expanduser(match.group(1).strip("'\""))
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--home", default="~/.hermes")
    parser.add_argument("--checksums-only", action="store_true")
    parser.add_argument("--watch", action="append", default=[], help="report size and mtime of this path")
    args = parser.parse_args(argv)

    uid = os.getuid()
    home = os.path.expanduser(args.home)
    out = {
        "user": pwd.getpwuid(uid).pw_name,
        "uid": uid,
        "home": home,
        "profiles": {},
        "time": time.time(),
        "watch": {},
    }
    for path in args.watch:
        try:
            st = os.stat(os.path.expanduser(path))
            out["watch"][path] = {"size": st.st_size, "mtime": st.st_mtime}
        except OSError:
            out["watch"][path] = None
    for name, path in discover(home).items():
        prof = {"path": path}
        prof.update(file_facts(path))
        for side in ("-wal", "-shm"):
            if os.path.exists(path + side):
                prof[side[1:]] = file_facts(path + side)
        if not args.checksums_only:
            prof.update(db_counts(path))
        out["profiles"][name] = prof
    if args.checksums_only:
        backup_dir = os.path.join(home, "backups")
        out["backups"] = sorted(os.listdir(backup_dir)) if os.path.isdir(backup_dir) else []
        print(json.dumps(out, sort_keys=True))
        return 0

    out["cron_pids"] = cron_pids()
    out["crontab"] = crontab()
    out["job"] = [ln for ln in out["crontab"]["lines"] if RUNNER_MARK.search(ln)]
    out["config_path"] = find_config(out["job"])
    out["config"] = None
    if out["config_path"] and os.path.exists(out["config_path"]):
        try:
            with open(out["config_path"]) as handle:
                out["config"] = json.load(handle)
        except (OSError, ValueError) as exc:
            out["config"] = {"_error": str(exc)}
    config = out["config"] if isinstance(out["config"], dict) else {}

    log_path = config.get("log_file")
    log_path = os.path.expanduser(log_path) if log_path else None
    out["log"] = {"path": log_path, "exists": bool(log_path and os.path.exists(log_path)), "text": ""}
    if out["log"]["exists"]:
        with open(log_path, errors="replace") as handle:
            out["log"]["text"] = handle.read()[-LOG_TAIL:]

    backup_dir = os.path.expanduser(config.get("backup_dir") or os.path.join(home, "backups"))
    out["backup_dir"] = backup_dir
    out["backups"] = sorted(os.listdir(backup_dir)) if os.path.isdir(backup_dir) else []

    # The user's own directory (its log's parent): the engine, wrapper and config may be
    # root's elsewhere, but what the runner writes there must be the user's.
    own_dir = os.path.dirname(os.path.dirname(log_path)) if log_path else None
    out["foreign"] = foreign_files([home, own_dir], uid)
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
