"""Giving space back without breaking a live Hermes: which VACUUM runs when, and what it keeps."""

import contextlib
import os
import sqlite3
import subprocess
import sys

import pytest
from hermes_reliability import query
from hermes_writer import CheckpointWatch

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune import (
    PILE_FRAMES,
    PILE_OVER,
    FramesPer,
    HolderCheckpoints,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import WAL_BUDGET
from hermes_fixtures import build_home

SPECS = [
    {"id": "old%03d" % i, "source": "cli", "started_days_ago": 40, "ended_days_ago": 39, "messages": 30}
    for i in range(60)
] + [
    {"id": "keep%02d" % i, "source": "cli", "started_days_ago": 2, "ended_days_ago": 1, "messages": 5} for i in range(5)
]


def pragma(db, name):
    return query(db, "PRAGMA %s" % name)[0][0]


@pytest.fixture
def home(tmp_path):
    build_home(str(tmp_path), "v30", SPECS)
    return str(tmp_path)


@contextlib.contextmanager
def live_holder(db):
    """Another process with the database open, as a running gateway has."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1]); "
         "c.execute('select count(*) from sessions').fetchone(); print('ready', flush=True); time.sleep(60)", db],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == b"ready"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def maintain(home, **options):
    options.setdefault("batch_pause", 0)
    return run_maintenance(dict(prune_days=7, hermes_home=[home], **options))["profiles"][0]


def test_auto_runs_a_full_vacuum_in_place_when_nobody_holds_the_file(home):
    db = os.path.join(home, "state.db")
    inode, app_id = os.stat(db).st_ino, pragma(db, "application_id")
    assert app_id != 0
    profile = maintain(home, vacuum_threshold=10)
    assert profile["status"] == "ok"
    assert profile["reclaim"]["action"] == "full", profile["reclaim"]
    assert profile["reclaim"]["bytes_freed"] > 0
    assert profile["after"]["db_bytes"] < profile["before"]["db_bytes"]
    assert os.stat(db).st_ino == inode, "VACUUM must keep the inode Hermes remembers"
    assert pragma(db, "application_id") == app_id
    assert pragma(db, "auto_vacuum") == 2, "a full VACUUM leaves the file in incremental mode"
    assert pragma(db, "freelist_count") == 0
    assert maintain(home)["changed"] is False


def test_a_live_holder_blocks_the_full_vacuum_with_a_reason(home):
    db = os.path.join(home, "state.db")
    with live_holder(db) as holder:
        profile = maintain(home, vacuum_threshold=10)
    assert profile["sessions_pruned"] == 60
    assert profile["reclaim"]["action"] is None
    assert (
        "held open by" in profile["reclaim"]["skipped_reason"]
        and "pid %d" % holder.pid in profile["reclaim"]["skipped_reason"]
    )
    assert pragma(db, "freelist_count") > 0


def test_incremental_file_is_reclaimed_in_steps_even_while_held(home):
    db = os.path.join(home, "state.db")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("VACUUM")
    conn.close()
    inode = os.stat(db).st_ino
    with live_holder(db):
        profile = maintain(home)
    assert profile["reclaim"]["action"] == "incremental", profile["reclaim"]
    assert pragma(db, "freelist_count") == 0
    assert os.stat(db).st_ino == inode


def test_incremental_mode_on_a_plain_file_explains_itself(home):
    profile = maintain(home, vacuum_mode="incremental")
    assert profile["reclaim"]["action"] is None
    assert "auto_vacuum=INCREMENTAL" in profile["reclaim"]["skipped_reason"]


def test_never_reclaims_nothing(home):
    profile = maintain(home, vacuum_mode="never", vacuum_threshold=0)
    assert profile["reclaim"]["action"] is None and profile["reclaim"]["skipped_reason"] == "vacuum_mode is never"
    assert pragma(os.path.join(home, "state.db"), "freelist_count") > 0


def test_below_threshold_auto_waits(home):
    profile = maintain(home, vacuum_threshold=99)
    assert profile["reclaim"]["action"] is None
    assert "below vacuum_threshold" in profile["reclaim"]["skipped_reason"]


def test_full_mode_in_a_service_window_then_idempotent(home):
    maintain(home, vacuum_mode="never")
    profile = maintain(home, vacuum_mode="full")
    assert profile["reclaim"]["action"] == "full" and profile["changed"] is True
    again = maintain(home, vacuum_mode="full")
    assert again["changed"] is False and again["reclaim"]["skipped_reason"] == "no free pages"


def test_deleted_messages_leave_the_fts_index_consistent(home):
    maintain(home, vacuum_threshold=10)
    conn = sqlite3.connect(os.path.join(home, "state.db"))
    for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%fts5%'"
    ).fetchall():
        conn.execute("INSERT INTO %s(%s) VALUES('integrity-check')" % (name, name))
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone() == (25,)


def _copies_beside_a_holder(db, rows_for):
    """Transactions of ours (no checkpoint of our own) of ``rows_for(k)`` one-page rows, each followed
    by one commit of a holder that keeps SQLite's wal_autocheckpoint; the frames each of the holder's
    commits copied into the file (the -shm's nBackfill before and after it)."""
    ours = sqlite3.connect(db, isolation_level=None)
    ours.execute("PRAGMA journal_mode=wal")
    ours.execute("PRAGMA wal_autocheckpoint=0")
    ours.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("INSERT INTO t (body) VALUES (x'00')")
    watch = CheckpointWatch(db)
    copies = []
    for k in range(40):
        rows = rows_for(k)
        ours.execute("BEGIN IMMEDIATE")
        ours.executemany("INSERT INTO t (body) VALUES (randomblob(3000))", [()] * rows)
        ours.execute("COMMIT")
        watch.before()
        holder.execute("INSERT INTO t (body) VALUES (x'01')")
        copies.append(watch.after())
    return ours, holder, [c for c in copies if c]


def test_each_transaction_brings_the_wal_just_past_the_holders_checkpoint(tmp_path):
    """Beside a holder that copies our frames (we may not checkpoint), transactions of 900 frames
    leave the -wal short of SQLite's 1000 after one of them, so the holder copies two at a time;
    sized by HolderCheckpoints, each brings it just past, and each copy is about one interval."""
    fixed_ours, fixed_holder, fixed = _copies_beside_a_holder(str(tmp_path / "fixed.db"), lambda k: 900)
    assert fixed and min(fixed) > 1700, fixed  # the problem: two transactions in each copy
    db = str(tmp_path / "paced.db")
    state = {}

    def paced_rows(k):
        if "pile" not in state:  # the file exists from the first call on
            state["pile"], state["per_row"] = HolderCheckpoints(db, 4096, WAL_BUDGET), FramesPer()
        pile, per_row = state["pile"], state["per_row"]
        if k:
            per_row.measured(pile.frames_written(), state["rows"])
        state["rows"] = per_row.most(pile.begin()) or 900
        return state["rows"]

    ours, holder, paced = _copies_beside_a_holder(db, paced_rows)
    assert len(paced) >= len(fixed), (paced, fixed)
    assert max(paced) <= PILE_FRAMES + PILE_OVER + 50, paced
    for conn in (fixed_ours, fixed_holder, ours, holder):
        conn.close()
