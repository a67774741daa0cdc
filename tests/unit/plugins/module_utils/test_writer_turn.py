"""The prune's pacing beside a live gateway, with a real second process.

* ``writer_probe`` sees another process inside a write transaction (its RESERVED lock; in WAL
  mode the -shm's write lock) and nothing once it committed, without dropping our own
  connection's locks;
* ``WriterTurn.wait`` ends soon after a writer that was waiting has committed, and without
  one lasts until just past a waiting writer's next poll (never shorter than the pause); in
  WAL mode it is never longer than the pause;
* the reclaim's steps (FTS merge, incremental_vacuum) wait for the same turn after each commit
  (``turn_after_commit``), in both journal modes, and past a waiting writer's next poll when
  there is no descriptor to ask with;
* ``LockBudget`` refuses another session once the time so far, that session at the rate
  measured so far and the last COMMIT would not fit;
* a prune transaction still running past the hard bound is interrupted, rolled back by
  SQLite and retried in two, in either journal mode: every session is still pruned, the file
  is sound;
* a transaction SQLite rolled back by itself (the hard bound's interrupt) keeps no read lock: at
  some interrupt steps of 0.22.2's deletes SQLite 3.40.1 left the connection holding SHARED, and a
  gateway's COMMIT waited for it through the whole turn given to it;
* in rollback-journal mode the prune keeps its journal between its transactions
  (``journal_mode=PERSIST`` on its connection: no file created and deleted per commit) and
  leaves neither the journal nor another journal mode behind.
"""

import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
from hermes_reliability import db_problems

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import prune as hermes_apply_prune
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune import (
    LockBudget,
    WriterTurn,
    poll_gap,
    turn_after_commit,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import inspection as maintain_inspection
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import (
    end_read_left_by_rollback,
    open_rw,
    write_transaction,
    writer_probe,
)
from hermes_fixtures import build_home, hermes_python, make_big_home

WRITER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
    time.sleep(float(sys.argv[2]))
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (1)")
    print("in", flush=True)
    time.sleep(float(sys.argv[3]))
    conn.execute("COMMIT")
    print("committed", time.time(), flush=True)
    """
)


def rollback_db(tmp_path, journal="delete"):
    db = str(tmp_path / "state.db")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=%s" % journal)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    return db


def writer(db, delay, hold):
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, db, str(delay), str(hold)], stdout=subprocess.PIPE, text=True
    )


def test_probe_sees_another_process_writing(tmp_path):
    db = rollback_db(tmp_path)
    conn = open_rw(db)
    conn.execute("SELECT COUNT(*) FROM t").fetchone()  # SQLite has the file open now
    writing = writer_probe(db)
    assert writing is not None and not writing()
    proc = writer(db, 0, 0.5)
    assert proc.stdout.readline().strip() == "in"
    assert writing()
    with_lock = conn.execute("BEGIN")  # our own SHARED lock survives the probes
    conn.execute("SELECT COUNT(*) FROM t").fetchone()
    assert writing()
    with_lock.execute("COMMIT")
    proc.stdout.readline()
    assert proc.wait(10) == 0
    assert not writing()
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone() == (1,)
    conn.close()


def test_probe_sees_a_wal_writer_through_the_shm_write_lock(tmp_path):
    db = rollback_db(tmp_path, journal="wal")
    conn = open_rw(db)
    conn.execute("SELECT COUNT(*) FROM t").fetchone()  # SQLite has state.db and its -shm open now
    writing = writer_probe(db, wal=True)
    assert writing is not None and not writing()
    proc = writer(db, 0, 0.5)
    assert proc.stdout.readline().strip() == "in"
    assert writing()
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone() == (0,)  # a WAL reader is not blocked
    proc.stdout.readline()
    assert proc.wait(10) == 0
    assert not writing()
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone() == (1,)
    conn.close()


CHECKPOINTER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(  # about 50 MB of frames for the checkpoint to copy
        "INSERT INTO t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 12000) "
        "SELECT randomblob(3000) FROM n"
    )
    conn.execute("COMMIT")
    print("written", flush=True)
    sys.stdin.readline()
    print("checkpoint", flush=True)
    print(conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone(), flush=True)
    """
)


def test_probe_counts_a_wal_writers_checkpoint_as_its_turn(tmp_path):
    """Hermes checkpoints right after its commit, the write lock free again: a transaction of ours begun
    then reads from the -wal and may not restart it, so the probe says "writing" until the checkpoint ends."""
    db = rollback_db(tmp_path, journal="wal")
    conn = open_rw(db)
    conn.execute("SELECT COUNT(*) FROM t").fetchone()
    writing = writer_probe(db, wal=True)
    argv = [sys.executable, "-c", CHECKPOINTER, db]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
        assert not writing()  # committed: neither the write lock nor a checkpoint
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "checkpoint"
        seen = 0
        while proc.poll() is None:
            seen += writing()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    answer = proc.stdout.read()
    assert seen > 0, "the probe never saw the checkpoint (%s)" % answer.strip()
    assert not writing()
    conn.close()


def test_a_wal_turn_is_never_longer_than_the_pause(tmp_path):
    db = rollback_db(tmp_path, journal="wal")
    conn = open_rw(db)
    conn.execute("SELECT COUNT(*) FROM t").fetchone()
    turn = WriterTurn(writer_probe(db, wal=True), pause=0.01, cover_poll=False)
    start = time.monotonic()
    turn.wait(held=0.2)  # a rollback-mode turn would wait for the 50 ms poll
    assert 0.01 <= time.monotonic() - start < poll_gap(0.2)
    turn = WriterTurn(writer_probe(db, wal=True), pause=5.0, cover_poll=False)
    proc = writer(db, 0.05, 0.1)  # takes the lock 50 ms into the wait, commits 100 ms later
    start = time.time()
    turn.wait(held=0.0)
    ended = time.time()
    committed = float(proc.stdout.read().split()[-1])
    assert proc.wait(10) == 0
    assert committed <= ended < start + 2.0  # ended by the writer's commit, far less than the 5 s pause
    conn.close()


def test_probe_needs_an_open_descriptor(tmp_path):
    assert writer_probe(rollback_db(tmp_path)) is None


def test_turn_ends_once_the_waiting_writer_committed(tmp_path):
    db = rollback_db(tmp_path)
    conn = open_rw(db)
    conn.execute("SELECT COUNT(*) FROM t").fetchone()
    turn = WriterTurn(writer_probe(db), pause=5.0)
    proc = writer(db, 0.05, 0.1)  # takes the lock 50 ms into the wait, commits 100 ms later
    start = time.time()
    turn.wait(held=0.0)
    ended = time.time()
    committed = float(proc.stdout.read().split()[-1])
    assert proc.wait(10) == 0
    assert committed <= ended < start + 2.0  # far less than the 5 s pause
    assert turn.last_commit is not None
    conn.close()


def test_turn_without_a_writer_covers_its_next_poll(tmp_path):
    db = rollback_db(tmp_path)
    conn = open_rw(db)
    conn.execute("SELECT COUNT(*) FROM t").fetchone()
    turn = WriterTurn(writer_probe(db), pause=0.01)
    start = time.monotonic()
    turn.wait(held=0.2)  # a writer waiting 200 ms polls every 50 ms
    assert time.monotonic() - start >= poll_gap(0.2) == 0.05
    start = time.monotonic()
    WriterTurn(writer_probe(db), pause=0.08).wait(held=0.0)
    assert time.monotonic() - start >= 0.08
    conn.close()


def test_the_reclaims_steps_wait_for_the_gateways_turn_in_both_journal_modes(tmp_path):
    for journal in ("delete", "wal"):
        (tmp_path / journal).mkdir()
        db = rollback_db(tmp_path / journal, journal)
        conn = open_rw(db)
        conn.execute("SELECT COUNT(*) FROM t").fetchone()
        wait = turn_after_commit(conn, pause=5.0)
        proc = writer(db, 0.05, 0.1)  # takes the lock 50 ms into the wait, commits 100 ms later
        start = time.time()
        wait(0.0)
        ended = time.time()
        committed = float(proc.stdout.read().split()[-1])
        assert proc.wait(10) == 0
        assert committed <= ended < start + 2.0, journal  # the writer's commit ended it, not the 5 s pause
        conn.close()


def test_without_a_descriptor_the_reclaims_pause_covers_a_waiting_writers_next_poll():
    conn = sqlite3.connect(":memory:")  # no file to ask with
    wait = turn_after_commit(conn, pause=0.01)
    start = time.monotonic()
    wait(0.2)  # a step held 200 ms: a writer waiting that long polls every 50 ms
    assert time.monotonic() - start >= poll_gap(0.2) + 0.005
    conn.close()


def test_budget_keeps_room_for_the_commit():
    budget = LockBudget(1.0)
    budget.begin()
    assert budget.fits(0, 10**6)  # nothing measured yet: the first session always goes
    time.sleep(0.02)
    assert budget.fits(100, 100)  # ~0.04 s of 1 s
    budget.commit = 0.97
    assert not budget.fits(100, 100)
    assert LockBudget(0).fits(100, 10**9)  # 0: no time bound


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_a_transaction_past_the_hard_bound_is_rolled_back_and_retried(tmp_path, monkeypatch, journal):
    specs = [
        {"id": "p%02d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(10)
    ]
    db = str(build_home(str(tmp_path), "v30", specs))
    if journal == "delete":  # bound 0.06 + 0.04 s, hard bound 1.5x: 0.15 s
        real_preflight = maintain_inspection.preflight_check

        def beside_a_live_gateway(conn, db_path):  # as if the gateway held the file in rollback mode
            report = real_preflight(conn, db_path)
            report.update(live_rollback=True, holders=1)
            return report

        monkeypatch.setattr(maintain_inspection, "preflight_check", beside_a_live_gateway)
    else:  # bound 0.06 s, hard bound 0.15 s (its floor): in WAL mode as well
        setup = sqlite3.connect(db, isolation_level=None)
        assert setup.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
        setup.close()
    monkeypatch.setattr(hermes_apply_prune, "PROGRESS_STEPS", 1)
    real_check, slowed, in_this_transaction = hermes_apply_prune.still_prunable, [], []

    def preempted_once(conn, sid, plan, schema, leased):
        # The process loses the CPU for a while, holding the lock: at p03 (on a machine slow enough
        # that p03 opens a transaction, the interrupt never stops a first session: the next one)
        in_this_transaction.append(sid)
        if not slowed and sid >= "p03" and len(in_this_transaction) > 1:
            slowed.append((sid, len(opened)))
            time.sleep(0.3)  # well past the hard bound (0.15 s)
        return real_check(conn, sid, plan, schema, leased)

    monkeypatch.setattr(hermes_apply_prune, "still_prunable", preempted_once)
    opened, real_transaction = [], hermes_apply_prune.write_transaction

    def counted(conn):
        opened.append(1)
        in_this_transaction.clear()
        return real_transaction(conn)

    monkeypatch.setattr(hermes_apply_prune, "write_transaction", counted)
    tripped, real_interrupt = [], hermes_apply_prune.LockBudget.interrupt

    def interrupt(budget):  # SQLite's progress handler: True rolls the transaction back
        stop = real_interrupt(budget)
        if stop:
            tripped.append(len(opened))  # in which transaction
        return stop

    monkeypatch.setattr(hermes_apply_prune.LockBudget, "interrupt", interrupt)
    # every session fits the bound on its own
    options = {"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_size": 1000, "batch_time": 0.06, "backup": False}
    profile = run_maintenance(options)["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["sessions_pruned"] == 10 and profile["messages_pruned"] == 30
    assert len(slowed) == 1
    # interrupted at p03 (p00-p02 rolled back with it), then p00-p02, then p03-p09: in one
    # transaction on a quick machine (3 in all), in more where the budget measures a slower rate
    assert tripped and tripped[0] == slowed[0][1]  # the transaction that was held too long
    assert len(opened) >= tripped[0] + 2  # then the sessions before it, on their own, then the rest
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM sessions WHERE id LIKE 'p%'").fetchone() == (0,)
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE session_id LIKE 'p%'").fetchone() == (0,)
    conn.close()
    assert db_problems(db) == []


def our_locks(db):
    """The POSIX locks this process holds on ``db`` (/proc/locks)."""
    inode = ":%d " % os.stat(db).st_ino
    with open("/proc/locks") as fh:
        return [line for line in fh if inode in line and line.split()[4] == str(os.getpid())]


@pytest.mark.releases
@pytest.mark.skipif(
    hermes_python("0.22.2.post1") is None, reason="no hermes-0.22.2.post1 venv (tests/setup_hermes_venvs.sh)"
)
def test_an_interrupted_transaction_keeps_no_read_lock(tmp_path):
    # 0.22.2's schema (two FTS5 indexes behind triggers), deleted as the prune does: groups of
    # sessions in one transaction, each group's statements making FTS5 flush and merge the one before.
    db = str(make_big_home(str(tmp_path), "hermes-0.22.2.post1", n_sessions=300, msgs_per_session=30, now=time.time()))
    # Rollback-journal mode, where a reader holds SHARED only while it reads and a gateway's COMMIT
    # waits for it (0.22.2 picks WAL on a fixed SQLite, whose connections hold SHARED while open).
    setup = sqlite3.connect(db, isolation_level=None)
    assert setup.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    setup.close()
    conn = open_rw(db)
    sids = [row[0] for row in conn.execute("SELECT id FROM sessions ORDER BY id")][:200]

    def delete_in_groups():
        for start in range(0, len(sids), 20):
            part = sids[start : start + 20]
            marks = ",".join("?" * len(part))
            conn.execute("DELETE FROM messages WHERE session_id IN (%s)" % marks, part)
            conn.execute("DELETE FROM sessions WHERE id IN (%s)" % marks, part)

    def interrupt_after(calls):
        count = [0]

        def handler():
            count[0] += 1
            return 1 if count[0] > calls else 0

        conn.set_progress_handler(handler, 50)

    # The instant at which SQLite's own rollback leaves the read lock: the first found, interrupting
    # ever later (the same file and statements each time: every attempt is rolled back). SQLite
    # 3.40.1 leaves it first at 4,330 handler calls here; 3.46.1 and 3.53.4 at none up to 20,000.
    left_at = None
    for calls in range(1, 7000, 37):
        interrupt_after(calls)
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            delete_in_groups()
        conn.set_progress_handler(None, 0)
        assert not conn.in_transaction  # SQLite rolled it back itself
        if our_locks(db):
            left_at = calls
            break
    if sqlite3.sqlite_version_info < (3, 46):
        assert left_at is not None, "no interrupt left a read lock: the case this test guards is not reached"
    if left_at is not None:
        assert [line.split()[3] for line in our_locks(db)] == ["READ"]  # SHARED, with no transaction open
        end_read_left_by_rollback(conn)
        assert our_locks(db) == []
    # The same interrupt through write_transaction, as the prune and the FTS merge run theirs
    interrupt_after(left_at or 4330)
    with pytest.raises(sqlite3.OperationalError, match="interrupted"), write_transaction(conn):
        delete_in_groups()
    conn.set_progress_handler(None, 0)
    assert our_locks(db) == []
    assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone() == (300,)  # nothing of it happened
    conn.close()
    assert db_problems(db) == []


def test_a_rollback_prune_keeps_its_journal_between_transactions_and_leaves_none(tmp_path, monkeypatch):
    specs = [
        {"id": "p%02d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(4)
    ]
    db = str(build_home(str(tmp_path), "v30", specs))
    setup = sqlite3.connect(db, isolation_level=None)
    assert setup.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    setup.close()
    real_batch, between = hermes_apply_prune._prune_batch, []

    def watched(*args, **kwargs):
        out = real_batch(*args, **kwargs)
        between.append(os.path.exists(db + "-journal"))
        return out

    monkeypatch.setattr(hermes_apply_prune, "_prune_batch", watched)
    options = {"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_size": 3, "batch_pause": 0, "backup": False}
    profile = run_maintenance(options)["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["sessions_pruned"] == 4 and between == [True] * 4  # a transaction per session
    assert not os.path.exists(db + "-journal")
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    conn.close()
    assert db_problems(db) == []
