"""Under ``strace``: no path of the engine closes a descriptor that drops SQLite's locks.

Closing any descriptor of state.db or its ``-shm`` drops every POSIX lock the process holds
on it, SQLite's own included (sqlite.org/howtocorrupt.html, 2.2; test_lock_keeping.py shows
what that costs). Here the real engine runs in a child under ``strace -f -y`` through each of
its paths, and ``lock_trace.check_trace`` (tests/lib/lock_trace.py, which explains the rule)
finds every close of a descriptor of state.db or state.db-shm made while the process held a
lock on that file taken through another descriptor. There must be none, in either journal
mode (Hermes 0.19.0's WAL file; 0.22.2's file, in rollback-journal mode on an SQLite with the
WAL-reset bug such as this host's, in WAL mode on a fixed one):

* ``quiet`` (nobody else has the file open), run as root on a home owned by a test user, so
  every entry point works in a child switched to the owner (strace follows it): state_db_info,
  check mode (preflight), a run with a backup by files, zombie close, prune, FTS merge, full
  VACUUM (switching to incremental) and checkpoint, a second run with the backup through the
  backup API (WAL) and incremental VACUUM, restore of the newest backup (as root), then the
  scheduled job's runner (``runner.main``);
* ``live`` (a real Hermes writer appends every 20 ms), in-process as the owner: the archive
  (in rollback-journal mode the run's own; in WAL mode ``take_archive`` called on the live
  file), the run beside the writer, session_restore of the archive, state_db_info and check
  mode.

The child's results are asserted too, so each path named was really taken. One traced run per
path set and mode; the homes are built once per module.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest
from hermes_reliability import COLLECTIONS_ROOT, chown_tree, ensure_user, query, world_traversable_dir
from hermes_writer import WriterProcess
from lock_trace import TRACED, check_trace

from hermes_fixtures import hermes_python, make_big_home, reopen_as_zombies

# 0.19.0 runs WAL everywhere; 0.22.2 a rollback journal on an SQLite with the WAL-reset bug (this
# host's 3.40), WAL on a fixed one (the sid leg of `make matrix-sqlite`): each mode where it runs.
RELEASES = ("0.19.0", "0.22.2.post1")
# A user of its own: an engine child another test runs as the same user (switched from
# root, so not dumpable) has descriptors this one cannot read, and would count as a holder.
TRACE_USER = "hermes-ops-trace"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.releases,
    pytest.mark.skipif(
        shutil.which("strace") is None and not os.environ.get("CI"), reason="no strace (apt-get install strace)"
    ),
]

# The child: each step is marked by an openat of a path that does not exist (see lock_trace),
# then run; what it returned is printed as one JSON line per step.
CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import archive
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import whole_file as backup
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite import db as db_
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import run as engine
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report import info
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import whole_file as restore
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import sessions as srestore
home, steps = sys.argv[2], json.loads(sys.argv[3])
db = os.path.join(home, "state.db")

def mark(name):
    try:
        os.open("/nonexistent-hermes-ops-mark/@@" + name, os.O_RDONLY)
    except OSError:
        pass

def take_archive(ids):
    conn = db_.open_rw(db)
    try:
        counts = {sid: conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (sid,)).fetchone()[0]
                  for sid in ids}
        version = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        backup.check_backup_dir(os.path.join(home, "backups"), os.getuid(), create=True)
        return archive.take_archive(conn, db, os.path.join(home, "backups"), "default", ids, counts, version)
    finally:
        conn.close()

def newest_archive():
    return archive.list_archives(os.path.join(home, "backups"), "default")[0][0]

for step in steps:
    mark(step["name"])
    kind, options = step["kind"], dict(step.get("options", {}), hermes_home=[home])
    if step.get("backup_api"):
        backup.RAW_WAL_LIMIT = -1
    if kind == "info":
        out = info.gather_info(options)["profiles"][0]
    elif kind == "maintain":
        out = engine.run_maintenance(options, check_mode=step.get("check_mode", False))["profiles"][0]
    elif kind == "restore":
        out = restore.restore(restore.plan_restore(home, "default"))["restored"]
    elif kind == "archive":
        out = take_archive(step["ids"])
    elif kind == "runner":  # the scheduled job's CLI, as the role installs it
        import contextlib, io
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes import runner
        config = os.path.join(os.path.dirname(home), "maintenance.json")
        with open(config, "w") as handle:
            json.dump(options, handle)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            rc = runner.main(["--config", config, "--json", "--allow-root"])
        out = {"rc": rc, "result": json.loads(printed.getvalue())}
    else:
        out = srestore.restore_from_archive(home, "default", newest_archive())
    print(json.dumps({"step": step["name"], "out": out}), flush=True)
mark("end")
"""

BASE = {"allow_unknown_schema": True, "batch_size": 40, "batch_pause": 0.002, "zombie_days": 1}
QUIET = [
    {"name": "state_db_info", "kind": "info"},
    {"name": "preflight (check mode)", "kind": "maintain", "check_mode": True},
    {
        "name": "backup by files, zombie close, prune, FTS merge, full VACUUM, checkpoint",
        "kind": "maintain",
        "options": dict(BASE, prune_days=45, vacuum_mode="full", vacuum_threshold=0),
    },
    {
        "name": "backup, prune, incremental VACUUM, checkpoint",
        "kind": "maintain",
        "backup_api": True,
        "options": dict(BASE, prune_days=7, vacuum_mode="incremental"),
    },
    {"name": "restore", "kind": "restore"},
    {"name": "runner (the scheduled job)", "kind": "runner", "options": dict(BASE, prune_days=7)},
]
LIVE = [
    {"name": "preflight beside a live writer (check mode)", "kind": "maintain", "check_mode": True},
    {"name": "archive", "kind": "archive"},
    {"name": "run beside a live writer", "kind": "maintain", "options": dict(BASE, prune_days=7)},
    {"name": "session_restore", "kind": "session_restore"},
    {"name": "state_db_info beside a live writer", "kind": "info"},
]


@pytest.fixture(scope="module")
def base_homes(tmp_path_factory):
    """One state.db per release, built by the release itself, with zombies: (home, journal mode)."""
    if shutil.which("strace") is None:
        pytest.fail("strace is missing (CI installs it: .ci/run)")
    homes, now = {}, time.time()
    for release in RELEASES:
        if hermes_python(release) is None:
            continue
        home = tmp_path_factory.mktemp("trace-%s" % release) / "home"
        db = make_big_home(home, "hermes-" + release, n_sessions=60, msgs_per_session=12, old_fraction=0.6, now=now)
        reopen_as_zombies(db, now, n_old=3, n_recent=2)
        homes[release] = (home, query(db, "PRAGMA journal_mode")[0][0])
    return homes


def traced(home, steps, tmp_path):
    """Run the child under strace through ``steps``; (results by step, check_trace's summary)."""
    trace = tmp_path / "trace.txt"
    cmd = ["strace", "-f", "-y", "--seccomp-bpf", "-o", str(trace), "-e", "trace=" + TRACED]
    cmd += [sys.executable, "-c", CHILD, str(COLLECTIONS_ROOT), str(home), json.dumps(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = {}
    for line in proc.stdout.splitlines():
        item = json.loads(line)
        results[item["step"]] = item["out"]
    assert list(results) == [s["name"] for s in steps], proc.stderr[-4000:]
    return results, check_trace(trace.read_text())


def summary_line(mode, steps):
    return "; ".join(
        "%s: %d closes checked (%d of a locked file, SQLite's own), %d dropping a lock"
        % (name, s["closes"], s["closes_while_locked"], len(s["dropping"]))
        for name, s in steps.items()
    )


def assert_no_dropping_close(mode, summary):
    steps = summary["steps"]
    print("lock trace %s: %s" % (mode, summary_line(mode, steps)))
    dropping = {name: s["dropping"] for name, s in steps.items() if s["dropping"]}
    assert not dropping, "closes that drop SQLite's locks (%s mode):\n%s" % (mode, json.dumps(dropping, indent=1))
    assert sum(s["closes"] for s in steps.values()) > 0  # the parser saw the engine's files at all


@pytest.mark.parametrize("release", RELEASES)
def test_quiet_paths_keep_sqlite_locks(release, base_homes, tmp_path):
    if release not in base_homes:
        pytest.skip("no hermes-%s venv" % release)
    source, mode = base_homes[release]
    base = world_traversable_dir("hermes-ops-trace-")
    try:
        home = base / "home"
        shutil.copytree(str(source), str(home))
        owner = None
        if os.geteuid() == 0:
            owner = ensure_user(TRACE_USER)
            chown_tree(home, *owner)
        steps = [dict(s, backup_api=s.get("backup_api") and mode == "wal") for s in QUIET]
        results, summary = traced(home, steps, tmp_path)
    finally:
        shutil.rmtree(str(base), ignore_errors=True)
    assert_no_dropping_close(mode, summary)
    info, check, first, second, restored, scheduled = (results[s["name"]] for s in QUIET)
    assert info["status"] == check["status"] == "ok" and check["preflight"]["check"] == "quick_check"
    assert first["status"] == "ok" and first["zombies_closed"] >= 1 and first["sessions_pruned"] > 0, first["error"]
    assert first["backup"]["copied_by"] == "files" and first["reclaim"]["action"] == "full"
    assert first["reclaim"]["fts_merge_steps"] > 0
    assert second["status"] == "ok" and second["sessions_pruned"] > 0, second["error"]
    assert second["backup"]["copied_by"] == ("backup_api" if mode == "wal" else "files")
    assert second["reclaim"]["action"] == "incremental"
    if mode == "wal":
        assert first["reclaim"]["checkpoint"] == second["reclaim"]["checkpoint"] == "TRUNCATE"
    assert restored["sessions"] > 0
    assert scheduled["rc"] == 0 and scheduled["result"]["profiles"][0]["sessions_pruned"] > 0  # the restored ones
    if owner:
        assert first["sqlite"] and results[QUIET[0]["name"]]["sqlite"]  # worked in the owner's child


@pytest.mark.parametrize("release", RELEASES)
def test_live_paths_keep_sqlite_locks(release, base_homes, tmp_path):
    if release not in base_homes:
        pytest.skip("no hermes-%s venv" % release)
    source, mode = base_homes[release]
    home = tmp_path / "home"
    shutil.copytree(str(source), str(home))
    db = str(home / "state.db")
    old = [
        sid
        for (sid,) in query(
            db, "SELECT id FROM sessions WHERE ended_at < ? ORDER BY id LIMIT 3", time.time() - 8 * 86400
        )
    ]
    steps = [dict(s, ids=old) for s in LIVE if mode == "wal" or s["kind"] != "archive"]
    writer = WriterProcess(hermes_python(release), db, str(tmp_path / "writer.jsonl"), prefix="trace-live")
    writer.start()
    try:
        results, summary = traced(home, steps, tmp_path)
    finally:
        written = writer.stop()
    assert_no_dropping_close(mode, summary)
    run = results["run beside a live writer"]
    assert run["status"] == "ok" and run["sessions_pruned"] > 0, run["error"]
    assert run["preflight"]["live_rollback"] == (mode == "delete")
    assert run["backup"]["kind"] == ("archive" if mode == "delete" else "file")
    restored = results["session_restore"]
    assert restored["sessions_restored"] > 0 and restored["messages_restored"] > 0
    assert results["state_db_info beside a live writer"]["holders"]
    assert results["preflight beside a live writer (check mode)"]["status"] == "ok"
    assert not written["failed"] and not written["file_problems"], written
    assert written["message_count_seen"] == written["appended"] > 0
    kept = {
        m
        for (m,) in query(
            db,
            "SELECT id FROM messages WHERE session_id IN (%s)" % ",".join("?" * len(written["sessions"])),
            *written["sessions"],
        )
    }
    assert set(written["ids"]) <= kept  # every message Hermes wrote is in the file
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


CANNED = """\
100 openat(AT_FDCWD</h>, "/h/state.db", O_RDWR|O_CREAT|O_NOFOLLOW|O_CLOEXEC, 0644) = 3</h/state.db>
100 fcntl(3</h/state.db>, F_SETLK, {l_type=F_RDLCK, l_whence=SEEK_SET, l_start=1073741826, l_len=510}) = 0
100 openat(AT_FDCWD</h>, "/h/state.db-shm", O_RDWR|O_CREAT|O_NOFOLLOW|O_CLOEXEC, 0644) = 4</h/state.db-shm>
100 fcntl(4</h/state.db-shm>, F_SETLKW, {l_type=F_RDLCK, l_whence=SEEK_SET, l_start=128, l_len=1} <unfinished ...>
100 <... fcntl resumed>) = 0
100 openat(AT_FDCWD</nonexistent>, "/nonexistent-hermes-ops-mark/@@fork", O_RDONLY|O_CLOEXEC) = -1 ENOENT
100 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f) = 101
101 close(3</h/state.db>) = 0
100 clone(child_stack=0x7f, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM) = 102
100 openat(AT_FDCWD</nonexistent>, "/nonexistent-hermes-ops-mark/@@header read", O_RDONLY|O_CLOEXEC) = -1 ENOENT
102 openat(AT_FDCWD</h>, "/h/state.db", O_RDONLY|O_CLOEXEC) = 5</h/state.db>
102 close(5</h/state.db>) = 0
100 openat(AT_FDCWD</nonexistent>, "/nonexistent-hermes-ops-mark/@@sqlite closes", O_RDONLY|O_CLOEXEC) = -1 ENOENT
100 close(4</h/state.db-shm>) = 0
100 fcntl(3</h/state.db>, F_SETLK, {l_type=F_UNLCK, l_whence=SEEK_SET, l_start=0, l_len=0}) = 0
100 close(3</h/state.db>) = 0
"""


def test_the_parser_tells_sqlites_own_closes_from_lock_dropping_ones():
    steps = check_trace(CANNED)["steps"]
    # a forked child holds none of its parent's locks: its close drops nothing
    assert steps["fork"] == {"closes": 1, "closes_while_locked": 0, "dropping": []}
    # a thread's open()/close() of state.db drops its process's SHARED lock taken through fd 3
    assert steps["header read"]["closes"] == 1 and len(steps["header read"]["dropping"]) == 1
    assert "1073741826-1073742336 (fd 3)" in steps["header read"]["dropping"][0]
    # SQLite's last -shm close (its lock taken through that descriptor), then state.db once unlocked
    assert steps["sqlite closes"] == {"closes": 2, "closes_while_locked": 1, "dropping": []}
