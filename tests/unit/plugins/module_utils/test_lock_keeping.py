"""Our run never drops SQLite's locks: the harm a dropped lock does, with the real engine.

Closing *any* descriptor of a file drops every POSIX lock the process holds on it, SQLite's
own included (sqlite.org/howtocorrupt.html, 2.2). In WAL mode SQLite keeps a SHARED lock on
state.db for as long as a connection is open; it is what tells another process closing its
own connection that it is not the last one. Once that lock is gone (before the fix: the
engine read the header with ``open()``/``close()`` after ``open_rw()``), this scenario
loses a write Hermes made:

1. our run (the real engine, in a child process) is paused between two prune transactions;
2. another process opens state.db, writes a session and closes (a Hermes CLI run while the
   gateway is stopped): with our lock gone it believes it is the last connection,
   checkpoints and unlinks ``state.db-wal`` and ``-shm``;
3. our run goes on, committing into the unlinked WAL, and pauses after the next transaction;
4. the release's ``SessionDB`` (the gateway starting again) writes a session into a new
   ``-wal`` and closes;
5. our run finishes: its last checkpoint writes its own frames over the gateway's.

Asserted, for Hermes 0.19.0 in WAL mode on this SQLite and for 0.22.2 in WAL mode on an
SQLite free of the WAL-reset bug (this process's, or Debian sid's built by
``scripts/build_sqlite.sh sid`` into .cache/sqlite/sid, put on every child's
LD_LIBRARY_PATH): the ``-wal`` our connection writes is at every pause the file at
``state.db-wal`` (same inode, not unlinked); after everyone has closed, every row written by
anyone is in the file and what our run pruned is gone; ``integrity_check`` is ok; the
release's writes raise nothing (0.22.2's identity guards included).
"""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest
from hermes_reliability import COLLECTIONS_ROOT, REPO_ROOT, db_problems, query

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import ReadOnlyDB
from hermes_fixtures import hermes_python, make_big_home

pytestmark = [pytest.mark.slow, pytest.mark.releases]

SID_LIB = REPO_ROOT / ".cache" / "sqlite" / "sid" / "lib"
OPTIONS = {"prune_days": 7, "batch_size": 20, "batch_pause": 0.002, "backup": True, "allow_unknown_schema": True}
PAUSES = (1, 2)  # after these prune transactions the run waits for the test


def wal_reset_fixed(version):
    return version >= (3, 51, 3) or (3, 50, 7) <= version < (3, 51, 0) or (3, 44, 6) <= version < (3, 45, 0)


# The real engine; after the prune transactions PAUSES it prints what its own -wal descriptor
# is (inode, links) beside what the path state.db-wal is, and waits for a line on stdin.
CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import prune as apply_
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import execution
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import run as engine
options = json.loads(sys.argv[2])
wal = os.path.realpath(os.path.join(options["hermes_home"][0], "state.db")) + "-wal"
pauses = json.loads(sys.argv[3])

def wal_identity():
    seen = {"fd": None, "path": os.stat(wal).st_ino if os.path.exists(wal) else None}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.startswith(wal):
            st = os.fstat(int(fd))
            seen["fd"], seen["links"] = st.st_ino, st.st_nlink
    return seen

real_batch, done = apply_._prune_batch, [0]

def paused_batch(*args, **kwargs):
    out = real_batch(*args, **kwargs)
    done[0] += 1
    if done[0] in pauses:
        print(json.dumps({"paused": done[0], "wal": wal_identity()}), flush=True)
        sys.stdin.readline()
    return out

apply_._prune_batch = paused_batch
real_reclaim = execution.reclaim

def reported_reclaim(*args, **kwargs):
    out = real_reclaim(*args, **kwargs)
    print(json.dumps({"after_reclaim": wal_identity()}), flush=True)
    return out

execution.reclaim = reported_reclaim
print(json.dumps({"result": engine.run_maintenance(options)}), flush=True)
"""

# A Hermes process that opens state.db, writes one session with one message, and closes.
WRITE_AND_CLOSE = r"""
import json, sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    db.create_session(sys.argv[2], sys.argv[3])
    db.append_message(sys.argv[2], "user", "written by %s while our run is paused" % sys.argv[2])
    mode = db._conn.execute("PRAGMA journal_mode").fetchone()[0]
finally:
    db.close()
print(json.dumps({"journal_mode": mode}))
"""

CASES = {
    "0.19.0": None,  # WAL on any SQLite (it has no WAL-reset gate)
    "0.22.2.post1": "fixed",  # WAL only on an SQLite without the WAL-reset bug
}


def child_env(case):
    """The environment of every child of a case: a fixed SQLite first for 0.22.2."""
    env = dict(os.environ)
    if CASES[case] == "fixed" and not wal_reset_fixed(sqlite3.sqlite_version_info):
        if not (SID_LIB / "libsqlite3.so.0").exists():
            pytest.skip(
                "Hermes 0.22.2 runs WAL only on an SQLite without the WAL-reset bug; this one is %s and "
                "%s is not built (bash scripts/build_sqlite.sh sid)" % (sqlite3.sqlite_version, SID_LIB)
            )
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(SID_LIB), env.get("LD_LIBRARY_PATH")) if p)
    return env


def release_write(case, db, sid, source, env):
    """The release opens state.db, writes ``sid`` and closes, as a Hermes CLI run does."""
    env = dict(env, HERMES_HOME=os.path.dirname(db))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [hermes_python(case), "-c", WRITE_AND_CLOSE, db, sid, source],
        capture_output=True, text=True, env=env, cwd=os.path.dirname(db), timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, "Hermes %s failed to write %s: %s" % (case, sid, proc.stderr[-3000:])
    assert json.loads(proc.stdout.strip().splitlines()[-1])["journal_mode"] == "wal"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_process_that_closes_beside_our_run_loses_nothing(case, tmp_path, monkeypatch):
    if hermes_python(case) is None:
        pytest.skip("no hermes-%s venv (tests/setup_hermes_venvs.sh)" % case)
    env = child_env(case)
    monkeypatch.setenv("LD_LIBRARY_PATH", env.get("LD_LIBRARY_PATH", ""))  # the fixture's init writer too
    home = tmp_path / "home"
    now = time.time()
    db = str(make_big_home(home, "hermes-" + case, n_sessions=40, msgs_per_session=10, old_fraction=0.5, now=now))
    assert query(db, "PRAGMA journal_mode")[0][0] == "wal"
    before = {sid for (sid,) in query(db, "SELECT id FROM sessions")}
    options = dict(OPTIONS, hermes_home=[str(home)])
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(COLLECTIONS_ROOT), json.dumps(options), json.dumps(list(PAUSES))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    reports, writes = [], {1: ("cli-while-paused", "cli"), 2: ("gateway-after", "telegram")}
    try:
        for _pause in PAUSES:
            line = json.loads(child.stdout.readline() or "{}")
            assert "paused" in line, "the run did not pause: %s" % child.stderr.read()[-3000:]
            reports.append(line)
            sid, source = writes[line["paused"]]
            release_write(case, db, sid, source, env)
            child.stdin.write("go\n")
            child.stdin.flush()
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    reports += [x for x in lines if "after_reclaim" in x]
    result = [x["result"] for x in lines if "result" in x]
    assert result, "the run did not finish: %s" % err[-3000:]
    profile = result[0]["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["sessions_pruned"] > len(PAUSES) and profile["preflight"]["journal_mode"] == "wal"

    for report in reports:
        wal = report.get("wal") or report["after_reclaim"]
        assert wal["fd"] == wal["path"] and wal.get("links", 1) >= 1, (
            "the -wal our connection writes is no longer state.db-wal: %s" % reports
        )
    after = {sid for (sid,) in query(db, "SELECT id FROM sessions")}
    written = {sid for sid, _source in writes.values()}
    assert written <= after, "rows Hermes wrote beside our run are gone: %s" % sorted(written - after)
    pruned = before - after
    assert len(pruned) == profile["sessions_pruned"] and after == (before - pruned) | written
    counts = dict(query(db, "SELECT session_id, COUNT(*) FROM messages GROUP BY session_id"))
    assert all(counts.get(sid) == 1 for sid in written)
    assert not set(counts) & pruned
    assert db_problems(db) == []


@pytest.mark.parametrize("left", ["-wal", "-shm"])
def test_check_mode_reads_a_lone_sidecar_pair_from_a_private_copy(left, tmp_path):
    """A crash image (a -wal without its -shm, or a stray -shm) is read from a private copy made
    through ``copy_db_bytes``: all committed rows seen, nothing created or changed beside state.db."""
    live = tmp_path / "live"
    live.mkdir()
    conn = sqlite3.connect(str(live / "state.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY)")
    conn.executemany("INSERT INTO sessions VALUES (?)", [("s%d" % i,) for i in range(50)])
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(str(live / "state.db"), str(home / "state.db"))  # as a crash leaves them
    shutil.copyfile(str(live / ("state.db" + left)), str(home / ("state.db" + left)))
    conn.close()
    if left == "-shm":  # a checkpointed file beside a stray -shm
        shutil.copyfile(str(live / "state.db"), str(home / "state.db"))
    before = sorted((p.name, p.read_bytes()) for p in home.iterdir())
    db = ReadOnlyDB(str(home / "state.db"))
    try:
        assert db.conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 50
    finally:
        db.close()
    assert sorted((p.name, p.read_bytes()) for p in home.iterdir()) == before
