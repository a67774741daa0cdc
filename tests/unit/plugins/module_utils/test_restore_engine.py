"""The restore engine (hermes_restore_whole_file) on its own: choice, refusals, and putting things back on failure.

playbooks/restore.yml end to end is tests/integration/test_restore.py.
"""

import fcntl
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest
from hermes_reliability import COLLECTIONS_ROOT, db_problems, digest, full_rows, query, tiny_fs

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import (
    whole_file as hermes_restore_whole_file,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.whole_file import plan_restore, restore
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import (
    add_index_with_missing_tokenizer,
    build_home,
    hermes_python,
    make_big_home,
    missing_venv_message,
    run_release_code,
)

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def ids(db):
    """Session ids as a reader sees them, WAL included."""
    return {r[0] for r in query(db, "SELECT id FROM sessions")}


@pytest.fixture
def home(tmp_path):
    """A home whose backup has 'old' and 'new' and whose state.db, after the prune, only 'new'."""
    build_home(str(tmp_path), "v30", SPECS)
    result = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert result["sessions_pruned"] == 1 and result["backup"]
    return tmp_path


def test_newest_verified_backup_is_restored_and_the_old_files_kept(home):
    db = home / "state.db"
    (home / "state.db-journal").write_bytes(b"")  # a journal goes with its database, never stays behind
    before = digest(db)
    plan = plan_restore(str(home), "default")
    done = restore(plan)
    assert ids(db) == {"old", "new"} and done["restored"]["sessions"] == 2
    aside = done["moved_aside"]["dir"]
    assert sorted(os.listdir(aside)) == ["state.db", "state.db-journal"]
    assert digest(os.path.join(aside, "state.db")) == before
    assert not os.path.exists(str(db) + "-journal")
    assert oct(os.stat(str(db)).st_mode & 0o777) == "0o600"


def test_backup_with_an_index_this_sqlite_cannot_open_is_restored(home):
    # SQLite 3.44+ aborts quick_check at a virtual table whose tokenizer it lacks (Hermes's
    # CJK index without its extension): that is no reason to call the backup damaged.
    (backup,) = [p for p in (home / "backups").iterdir() if p.name.endswith(".db")]
    add_index_with_missing_tokenizer(backup)
    done = restore(plan_restore(str(home), "default"))
    assert done["restored"]["sessions"] == 2 and ids(home / "state.db") == {"old", "new"}


def test_damaged_newer_backup_is_passed_over(home):
    backups = home / "backups"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + 60))
    bad = backups / ("hermes-ops_default_%s.db.gz" % stamp)
    bad.write_bytes(b"not gzip at all")
    plan = plan_restore(str(home), "default")
    assert plan["rejected"][0]["path"] == str(bad) and "decompress" in plan["rejected"][0]["error"]
    assert plan["backup"]["sessions"] == 2


def test_no_usable_backup_is_an_error_naming_them(home):
    for name in os.listdir(str(home / "backups")):
        (home / "backups" / name).write_bytes(b"SQLite format 3\x00" + b"\x00" * 1000)
    with pytest.raises(MaintenanceError) as err:
        plan_restore(str(home), "default")
    assert "no backup of profile default verifies" in str(err.value)
    with pytest.raises(MaintenanceError) as err:
        plan_restore(str(home), "work")
    assert "no backup of profile work" in str(err.value)


def test_a_partial_is_never_restored(home):
    (home / "backups" / ".hermes-ops_default_20990101T000000Z.db.partial").write_bytes(b"x")
    with pytest.raises(MaintenanceError) as err:
        plan_restore(str(home), "default", backup=".hermes-ops_default_20990101T000000Z.db.partial")
    assert "unfinished backup" in str(err.value)


def test_failure_after_the_move_puts_everything_back(home, monkeypatch):
    db = home / "state.db"
    conn = sqlite3.connect(str(db))  # leaves -wal and -shm beside it while open
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('only-in-wal', 'cli', ?)", (time.time(),))
    conn.commit()
    files = sorted(n for n in os.listdir(str(home)) if n.startswith("state.db"))
    digests = {n: digest(home / n) for n in files}
    plan = plan_restore(str(home), "default")
    real_counts = hermes_restore_whole_file.db_counts
    calls = []

    def fail_on_the_final_check(path):
        calls.append(path)
        if path == str(db):
            raise MaintenanceError("simulated: the restored file does not verify")
        return real_counts(path)

    monkeypatch.setattr(hermes_restore_whole_file, "db_counts", fail_on_the_final_check)
    with pytest.raises(MaintenanceError):
        restore(plan, force=True)  # force: this test holds the file open itself
    assert sorted(n for n in os.listdir(str(home)) if n.startswith("state.db")) == files
    assert {n: digest(home / n) for n in files} == digests
    assert not [n for n in os.listdir(str(home)) if n.startswith(".state.db.restore")]
    assert conn.execute("SELECT COUNT(*) FROM sessions WHERE id = 'only-in-wal'").fetchone() == (1,)
    conn.close()


def test_held_open_is_refused_without_force(home):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); "
            "c.execute('SELECT 1').fetchall(); print('open', flush=True); time.sleep(30)",
            str(home / "state.db"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "open"
        before = digest(home / "state.db")
        with pytest.raises(MaintenanceError) as err:
            restore(plan_restore(str(home), "default"))
        assert "held open by" in str(err.value) and "pid %d" % proc.pid in str(err.value)
        assert digest(home / "state.db") == before
    finally:
        proc.kill()
        proc.wait()


def test_restore_waits_for_no_maintenance_run(home):
    fd = os.open(str(home / "state.db.auto-maintenance.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(MaintenanceError) as err:
            restore(plan_restore(str(home), "default"))
        assert "locked by a maintenance run" in str(err.value)
    finally:
        os.close(fd)


@pytest.mark.tmpfs
@pytest.mark.root
def test_no_room_for_the_restored_file_refused_before_anything_moves(tmp_path):
    """(root) The home on a tiny tmpfs, the backup elsewhere: refused with the space needed, nothing moved."""
    source = tmp_path / "source"
    make_big_home(str(source), "v30", 400, 6, seed=1)
    with tiny_fs(int(os.path.getsize(str(source / "state.db")) * 1.6) // 1024) as mnt:
        home = mnt / "home"
        home.mkdir()
        shutil.copyfile(str(source / "state.db"), str(home / "state.db"))
        backups = tmp_path / "backups"
        backups.mkdir()
        shutil.copyfile(str(source / "state.db"), str(backups / "hermes-ops_default_20260101T000000Z.db"))
        filler = home / "filler"
        filler.write_bytes(b"\0" * (int(shutil.disk_usage(str(mnt)).free) - 256 * 1024))
        before = digest(home / "state.db")
        with pytest.raises(MaintenanceError) as err:
            restore(plan_restore(str(home), "default", backup_dir=str(backups)))
        assert "not enough space in %s for the restored file" % home in str(err.value)
        assert "MB needed" in str(err.value) and "nothing was changed" in str(err.value)
        assert sorted(os.listdir(str(home))) == ["filler", "state.db", "state.db.auto-maintenance.lock"]
        assert digest(home / "state.db") == before


def test_failure_before_the_new_file_arrives_puts_everything_back(home, monkeypatch):
    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('only-in-wal', 'cli', ?)", (time.time(),))
    conn.commit()
    files = sorted(n for n in os.listdir(str(home)) if n.startswith("state.db"))
    digests = {n: digest(home / n) for n in files}
    inode = os.stat(str(db)).st_ino
    real_rename = os.rename

    def no_rename_of_the_new_file(src, dst):
        if os.path.basename(src) == hermes_restore_whole_file.PARTIAL:
            raise OSError(5, "simulated I/O error")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", no_rename_of_the_new_file)
    with pytest.raises(OSError):
        restore(plan_restore(str(home), "default"), force=True)
    monkeypatch.setattr(os, "rename", real_rename)
    assert sorted(n for n in os.listdir(str(home)) if n.startswith("state.db")) == files
    assert {n: digest(home / n) for n in files} == digests and os.stat(str(db)).st_ino == inode
    assert os.stat(str(db)).st_nlink == 1  # the second name in the aside directory is gone again
    assert not [n for n in os.listdir(str(home)) if n.startswith(".state.db.restore")]
    assert conn.execute("SELECT COUNT(*) FROM sessions WHERE id = 'only-in-wal'").fetchone() == (1,)
    conn.close()


def test_failure_after_a_settled_move_puts_the_old_rows_back(home, monkeypatch):
    """Nobody holds the file, so the restore checkpoints its -wal into it first: a failure after
    the rename puts the old file back at its name (same inode) with every committed row, and the
    -wal SQLite's checkpoint emptied comes back from its copy; nothing is left aside."""
    from powerloss_paths import close_leaving_the_wal

    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('only-in-wal', 'cli', ?)", (time.time(),))
    conn.commit()
    close_leaving_the_wal(conn, db)  # the pair as a killed gateway leaves it, no holder
    files = sorted(n for n in os.listdir(str(home)) if n.startswith("state.db"))
    probe = home.parent / "before"
    probe.mkdir()
    for name in files:
        shutil.copyfile(str(home / name), str(probe / name))
    old, inode = full_rows(probe / "state.db"), os.stat(str(db)).st_ino
    real_counts = hermes_restore_whole_file.db_counts

    def fail_on_the_final_check(path):
        if path == str(db):
            raise MaintenanceError("simulated: the restored file does not verify")
        return real_counts(path)

    monkeypatch.setattr(hermes_restore_whole_file, "db_counts", fail_on_the_final_check)
    with pytest.raises(MaintenanceError):
        restore(plan_restore(str(home), "default"))
    assert sorted(n for n in os.listdir(str(home)) if n.startswith("state.db")) == files
    assert os.stat(str(db)).st_ino == inode and os.stat(str(db)).st_nlink == 1
    assert not [n for n in os.listdir(str(home)) if n.startswith((".state.db.restore", "state.db.pre-restore-"))]
    assert full_rows(db) == old and "only-in-wal" in ids(db)


RESTORE_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.whole_file import plan_restore, restore
plan = plan_restore(sys.argv[2], "default", backup=sys.argv[3])
os.write(2, b"@@ planned\n")
print(json.dumps(restore(plan, force=True)["restored"]))
"""


@pytest.mark.timing
def test_sigkill_during_restore_never_leaves_less_than_before(tmp_path):
    """Kill the restore at seeded random moments: state.db is always a whole database, old or new."""
    trials = int(os.environ.get("HERMES_RESTORE_CRASH_TRIALS", "8"))
    base = int(os.environ.get("HERMES_CRASH_SEED") or random.SystemRandom().randrange(10**6))
    template = tmp_path / "template"
    make_big_home(str(template), "v30", 1500, 6, seed=2)  # a few MB: the copy takes a while
    run_maintenance({"prune_days": 7, "hermes_home": [str(template)], "batch_pause": 0})
    (backup,) = [str(template / "backups" / n) for n in os.listdir(str(template / "backups"))]
    backup_ids = ids(backup)
    report = []
    for i in range(trials):
        seed = base + i
        rng = random.Random(seed)
        home = tmp_path / ("trial-%d" % seed)
        shutil.copytree(str(template), str(home))
        writer = sqlite3.connect(str(home / "state.db"))  # committed data only in the -wal
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("INSERT INTO sessions (id, source, started_at) VALUES ('in-wal', 'cli', ?)", (time.time(),))
        writer.commit()
        old_ids = ids(home / "state.db")
        child = subprocess.Popen(
            [sys.executable, "-c", RESTORE_CHILD, str(COLLECTIONS_ROOT), str(home), backup],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stderr.readline().startswith("@@ planned"), child.stderr.read()
        time.sleep(rng.random() * 0.15)
        child.kill()
        child.wait()
        writer.close()
        now = ids(home / "state.db")
        asides = [n for n in os.listdir(str(home)) if n.startswith("state.db.pre-restore-")]
        state = "old" if now == old_ids else "new" if now == backup_ids else "OTHER"
        if now == old_ids - {"in-wal"} and asides and os.path.exists(str(home / asides[0] / "state.db-wal")):
            state = "old, its -wal already aside (the documented window of a few system calls)"
        report.append("seed %d: state.db is the %s file" % (seed, state))
        assert state != "OTHER", "seed %d: state.db holds neither the old nor the restored sessions" % seed
        assert db_problems(home / "state.db") == []
        for aside in asides:
            if not os.path.exists(str(home / aside / "state.db")):
                # Killed between creating the directory and linking the old file into it:
                # the old file is still at its name (checked above), nothing was moved yet.
                continue
            probe = tmp_path / ("probe-%d" % seed)
            shutil.copytree(str(home / aside), str(probe))
            assert ids(probe / "state.db") == old_ids, "seed %d: the kept old file lost data" % seed
        # Restoring again completes it.
        done = restore(plan_restore(str(home), "default", backup=backup), force=True)
        assert done["restored"]["sessions"] == len(backup_ids) and ids(home / "state.db") == backup_ids
        assert not [n for n in os.listdir(str(home)) if n.startswith(".state.db.restore")]
        shutil.rmtree(str(home))
    print("restore kills, base seed %d:\n%s" % (base, "\n".join(report)))


KILLED_AT_A_STEP = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.whole_file import plan_restore, restore
plan = plan_restore(sys.argv[2], "default")
step, seen = int(sys.argv[3]), [0]


def moment():
    seen[0] += 1
    if seen[0] == step:
        os.kill(os.getpid(), signal.SIGKILL)


def killed_around(real):
    def call(*args, **kwargs):
        moment()
        try:
            return real(*args, **kwargs)
        finally:
            moment()

    return call


for name in ("mkdir", "link", "rename", "unlink"):  # every change of a name the restore makes, before and after
    setattr(os, name, killed_around(getattr(os, name)))
restore(plan)
print("done", seen[0])
"""

RELEASE_COUNTS = r"""
import json, sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    print(json.dumps([db._conn.execute("SELECT count(*) FROM %s" % t).fetchone()[0] for t in ("sessions", "messages")]))
finally:
    db.close()
"""


@pytest.mark.parametrize("layout", ["hermes-0.19.0", "hermes-0.22.2.post1"], ids=["wal-frames", "rollback-hot-journal"])
def test_sigkill_at_each_step_leaves_the_old_database_or_the_restored_one(tmp_path, layout):
    """A home a gateway crashed in: 40 sessions, 240 messages, and then (WAL, 0.19.0) 5 committed
    messages only in the -wal, or (rollback journal, 0.22.2) a hot journal of an uncommitted
    change. The restore is SIGKILLed before and after each change of a name it makes (the aside
    directory, the old file's second name, the sidecars leaving, the rename): the real release, opening the
    home's own state.db, counts the old database's rows (every committed message) or the
    backup's; nothing has to be fetched from the aside directory; restoring again completes."""
    from powerloss_paths import hot_journal, messages_only_in_the_wal, restore_home

    python = hermes_python(layout)
    if python is None:
        pytest.skip(missing_venv_message(layout))
    template = tmp_path / "template"
    db = str(restore_home(str(template), layout, time.time()))
    if layout == "hermes-0.19.0":
        messages_only_in_the_wal(db, 5)
        assert os.path.getsize(db + "-wal") > 0
    else:
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
        hot_journal(db)
    (backup,) = [str(template / "backups" / n) for n in os.listdir(str(template / "backups"))]
    old_probe = tmp_path / "old-probe"
    shutil.copytree(str(template), str(old_probe))
    old, new = full_rows(old_probe / "state.db"), full_rows(backup)
    counts = {"old": (40, 245 if layout == "hermes-0.19.0" else 240), "restored": (40, 240)}
    states, step = [], 0
    while True:
        step += 1
        home = tmp_path / ("kill-%d" % step)
        shutil.copytree(str(template), str(home))
        child = subprocess.run(
            [sys.executable, "-c", KILLED_AT_A_STEP, str(COLLECTIONS_ROOT), str(home), str(step)],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode == 0:
            assert child.stdout.startswith("done"), child.stdout
            break
        assert child.returncode == -9, child.stderr[-2000:]
        rows = full_rows(_copy_home(home, tmp_path / ("probe-%d" % step)) / "state.db")
        state = "old" if rows == old else "restored" if rows == new else None
        seen = run_release_code(python, RELEASE_COUNTS, home / "state.db")
        assert seen.returncode == 0, seen.stderr[-2000:]
        states.append((step, state, tuple(json.loads(seen.stdout.strip().splitlines()[-1]))))
        assert state is not None and states[-1][2] == counts[state], states
        done = restore(plan_restore(str(home), "default"))
        assert full_rows(home / "state.db") == new and done["restored"]["sessions"] == 40
        shutil.rmtree(str(home))
    assert step > 4 and {s for _step, s, _counts in states} == {"old", "restored"}, states
    print("kills before and after each name change (%s): %s" % (layout, states))


def _copy_home(home, probe):
    """A copy of state.db and its sidecars at the home's own paths (reading must not change the home)."""
    probe.mkdir()
    for name in os.listdir(str(home)):
        if name.startswith("state.db") and os.path.isfile(str(home / name)):
            shutil.copyfile(str(home / name), str(probe / name))
    return probe
