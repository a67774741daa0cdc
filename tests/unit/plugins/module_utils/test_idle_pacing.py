# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The prune's pacing follows the gateway (IdlePacing), seen from SQLite's own state.

* our own commits and another connection's reads leave ``PRAGMA data_version`` alone: after
  IDLE_STREAK quiet transactions the bound doubles up to IDLE_HOLD_CAP and the pause halves down
  to just past a waiting writer's next poll; the first commit of a real second connection puts
  both back to the configured values, in either journal mode;
* a real prune with nobody else writing runs its later transactions with the longer bound, and
  the hard bound grows with it;
* a file nobody has written to for IDLE_SECONDS lets a transaction take more than batch_size
  messages (up to IDLE_SIZE_FACTOR times), the time bound still ending it; another connection's
  commit puts batch_size back;
* (timing) beside a writer that commits every 150 ms, the pacing opens up between its writes and
  is put back by each of them, and no write waits long.
"""

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import prune as hermes_apply_prune
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune import (
    IDLE_HOLD_CAP,
    IDLE_SECONDS,
    IDLE_SIZE_FACTOR,
    IDLE_STREAK,
    IdlePacing,
    hard_bound,
    poll_gap,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import open_rw
from hermes_fixtures import build_home, layout_available, missing_venv_message

RELEASE = "hermes-0.22.2.post1"  # the newest release (schema 31)


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_another_connections_commit_resets_the_pacing(tmp_path, journal):
    db = str(tmp_path / "state.db")
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("PRAGMA journal_mode=%s" % journal)
    setup.execute("CREATE TABLE t (x)")
    setup.close()
    ours, other = open_rw(db), sqlite3.connect(db, isolation_level=None)
    pacing = IdlePacing(ours, 0.06, 0.08)
    assert (pacing.bound(), pacing.pause(0.06)) == (0.06, 0.08)

    def our_transaction():
        ours.execute("BEGIN IMMEDIATE")
        ours.execute("INSERT INTO t VALUES (1)")
        ours.execute("COMMIT")
        pacing.observe()

    for _step in range(IDLE_STREAK - 1):
        our_transaction()
        assert (pacing.bound(), pacing.pause(0.06)) == (0.06, 0.08)  # not idle for long enough yet
    our_transaction()
    assert pacing.bound() == 2 * 0.06 == IDLE_HOLD_CAP
    assert pacing.pause(0.06) == 0.04  # halved, still past the 25 ms poll gap of a writer waiting 60 ms
    assert other.execute("SELECT COUNT(*) FROM t").fetchone() == (IDLE_STREAK,)  # a read is no write
    our_transaction()
    assert pacing.bound() == IDLE_HOLD_CAP  # capped
    assert pacing.pause(0.06) == poll_gap(0.06) + 0.005  # the floor: the writer's next poll
    assert pacing.pause(0.2) == 0.055  # past 128 ms of waiting the writer polls every 50 ms

    other.execute("INSERT INTO t VALUES (2)")  # the gateway commits
    pacing.observe()
    assert (pacing.streak, pacing.bound(), pacing.pause(0.06)) == (0, 0.06, 0.08)
    ours.close()
    other.close()

    # no time bound stays none, a bound over the cap is not cut, a short pause is not lengthened
    for bound, pause, held, want in ((0.0, 0.03, 0.06, (0.0, 0.03)), (0.2, 0.01, 0.2, (0.2, 0.01))):
        conn = sqlite3.connect(db, isolation_level=None)
        pacing = IdlePacing(conn, bound, pause)
        for _step in range(IDLE_STREAK + 2):
            pacing.observe()
        assert (pacing.bound(), pacing.pause(held)) == want
        conn.close()


def test_a_prune_nobody_else_writes_to_runs_its_later_transactions_longer(tmp_path, monkeypatch):
    specs = [
        {"id": "p%02d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(IDLE_STREAK + 4)
    ]
    build_home(str(tmp_path), "v30", specs)
    bounds = []

    class Watched(IdlePacing):  # the real pacing, its answers recorded
        def bound(self):
            bounds.append(super().bound())
            return bounds[-1]

    hards = []

    class Budget(hermes_apply_prune.LockBudget):  # the real budget, the hard bound of each transaction recorded
        def begin(self):
            hards.append(self.hard)
            super().begin()

    monkeypatch.setattr(hermes_apply_prune, "IdlePacing", Watched)
    monkeypatch.setattr(hermes_apply_prune, "LockBudget", Budget)
    # one session per transaction (3 messages each), short pauses: a transaction per session
    options = {"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_size": 3, "batch_pause": 0.001, "backup": False}
    profile = run_maintenance(options)["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["sessions_pruned"] == len(specs)
    assert bounds == [0.06] * IDLE_STREAK + [IDLE_HOLD_CAP] * 4
    # the hard bound follows the bound in force: a longer transaction is not cut short at the live one's
    assert hards == [hard_bound(bound) for bound in bounds]
    # 1.5x the bound, never below 150 ms
    assert [hard_bound(b) for b in (0.06, 0.1, IDLE_HOLD_CAP, 0.2)] == pytest.approx([0.15, 0.15, 0.18, 0.3])


HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT COUNT(*) FROM sessions").fetchall()
print("holding", flush=True)
sys.stdin.readline()
"""


def test_beside_a_gateway_in_rollback_mode_the_hold_ends_before_a_waiting_writers_128_ms_poll(tmp_path, monkeypatch):
    """In rollback-journal mode beside a gateway, whose bound holds the COMMIT's allowance (0.06 s and
    0.04 s), the statements are cut at 1.1x it: 110 ms, so that a 10-20 ms COMMIT still ends before
    the 128 ms poll of a writer that waited since BEGIN. Once nobody has committed for a while, the
    grown bound is cut at 1.5x again (nobody waits)."""
    specs = [
        {"id": "p%02d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(IDLE_STREAK + 4)
    ]
    if not layout_available(RELEASE):
        pytest.skip(missing_venv_message(RELEASE))
    db = build_home(str(tmp_path), RELEASE, specs)  # the newest release's file, schema 31
    setup = sqlite3.connect(db)
    setup.execute("PRAGMA journal_mode=DELETE").fetchall()  # the release's mode on an SQLite with the WAL-reset bug
    setup.close()
    holder = subprocess.Popen(  # another process with the file open, as the gateway holds it: it never writes
        [sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "holding"
    seen = []

    class Budget(hermes_apply_prune.LockBudget):  # the real budget, its bound and hard bound recorded
        def begin(self):
            seen.append((self.seconds, self.hard))
            super().begin()

    monkeypatch.setattr(hermes_apply_prune, "LockBudget", Budget)
    options = {"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_size": 3, "batch_pause": 0.001, "backup": False}
    try:
        profile = run_maintenance(options)["profiles"][0]
    finally:
        holder.communicate("done\n", timeout=30)
    assert profile["status"] == "ok", profile["error"]
    assert profile["preflight"]["live_rollback"], "the holder did not hold the file: the test proves nothing"
    assert profile["sessions_pruned"] == len(specs)
    live, idle = seen[:IDLE_STREAK], seen[IDLE_STREAK:]
    assert [hard for _bound, hard in live] == pytest.approx([0.11] * IDLE_STREAK)
    assert [bound for bound, _hard in live] == pytest.approx([0.1] * IDLE_STREAK)
    assert idle and all(bound > 0.1 + 1e-9 for bound, _hard in idle), seen
    assert [hard for _bound, hard in idle] == pytest.approx([hard_bound(bound) for bound, _hard in idle])


def test_transactions_take_more_than_batch_size_only_while_nobody_has_written_for_a_while(tmp_path):
    db = str(tmp_path / "state.db")
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("CREATE TABLE t (x)")
    setup.close()
    ours, other = open_rw(db), sqlite3.connect(db, isolation_level=None)
    fresh = IdlePacing(ours, 0.06, 0.03, quiet_since=time.time())
    idle = IdlePacing(ours, 0.06, 0.03, quiet_since=time.time() - 3600)
    unbound = IdlePacing(ours, 0.0, 0.03, quiet_since=time.time() - 3600)  # no time bound to end a larger one
    sizes = []
    for _step in range(IDLE_STREAK):
        sizes.append([pacing.size(4000) for pacing in (fresh, idle, unbound)])
        ours.execute("BEGIN IMMEDIATE")
        ours.execute("INSERT INTO t VALUES (1)")
        ours.execute("COMMIT")
        for pacing in (fresh, idle, unbound):
            pacing.observe()
    sizes.append([pacing.size(4000) for pacing in (fresh, idle, unbound)])
    # the file written just now: batch_size until it has been quiet for IDLE_SECONDS
    assert sizes == [[4000, 4000, 4000]] * IDLE_STREAK + [[4000, 4000 * IDLE_SIZE_FACTOR, 4000]]
    fresh.quiet_since -= IDLE_SECONDS
    assert fresh.size(4000) == 4000 * IDLE_SIZE_FACTOR
    other.execute("INSERT INTO t VALUES (2)")  # the gateway commits
    idle.observe()
    assert idle.size(4000) == 4000
    for _step in range(IDLE_STREAK):
        idle.observe()
    assert idle.size(4000) == 4000  # quiet for IDLE_STREAK transactions, but not for IDLE_SECONDS yet
    ours.close()
    other.close()


def test_a_prune_of_a_file_left_alone_for_an_hour_joins_batches_within_the_time_bound(tmp_path, monkeypatch):
    specs = [
        {"id": "p%03d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(60)
    ]
    specs.append({"id": "long", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 10})
    specs.append({"id": "keep", "source": "cli", "started_days_ago": 1, "ended_days_ago": 1, "messages": 2})
    db = build_home(str(tmp_path), "v30", specs)
    hour_ago = time.time() - 3600
    for path in (db, "%s-wal" % db):
        if os.path.exists(path):
            os.utime(path, (hour_ago, hour_ago))
    taken = []  # messages per committed transaction

    class Budget(hermes_apply_prune.LockBudget):  # the real budget, what each transaction deleted recorded
        def measured(self, rows):
            taken.append((rows, self.most, self.seconds))
            super().measured(rows)

    monkeypatch.setattr(hermes_apply_prune, "LockBudget", Budget)
    options = {"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_size": 3, "batch_pause": 0.001, "backup": False}
    profile = run_maintenance(options)["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert (profile["sessions_pruned"], profile["messages_pruned"]) == (61, 190)
    assert sum(rows for rows, _most, _bound in taken) == 190
    first = taken[:IDLE_STREAK]
    assert first == [(3, 3, 0.06)] * IDLE_STREAK  # not idle yet by our own count: one session each
    later = taken[IDLE_STREAK:]
    assert all(most == 3 * IDLE_SIZE_FACTOR and bound == IDLE_HOLD_CAP for _rows, most, bound in later)
    assert max(rows for rows, _most, _bound in later) > 3  # batches joined
    assert all(rows <= 3 * IDLE_SIZE_FACTOR for rows, _most, _bound in later)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT id FROM sessions").fetchall() == [("keep",)]
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone() == (2,)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


SPARSE_WRITER = """
import json, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
interval, count = float(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
latencies = []
for i in range(count):
    time.sleep(interval)
    t0 = time.monotonic()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE sessions SET title = ? WHERE id = 'keep'", ("write %d" % i,))
    conn.execute("COMMIT")
    latencies.append(time.monotonic() - t0)
print(json.dumps(latencies), flush=True)
"""


@pytest.mark.timing
def test_a_writer_that_turns_up_after_a_quiet_while_gets_in_and_resets_the_pacing(tmp_path, monkeypatch):
    """A gateway that writes every 150 ms: between its writes the prune's pacing opens up, each write
    puts it back (seen through data_version in the real loop), and no write waits long (the 250 ms
    target is the benchmark's; 1 s is the safety net on a shared machine)."""
    specs = [{"id": "keep", "source": "cli", "started_days_ago": 1, "ended_days_ago": 1, "messages": 2}]
    specs += [
        {"id": "p%03d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(150)
    ]
    db = build_home(str(tmp_path), "v30", specs)
    seen = []  # per transaction: its bound; None where the pacing saw another connection's commit

    class Watched(IdlePacing):
        def bound(self):
            seen.append(super().bound())
            return seen[-1]

        def observe(self):
            super().observe()
            if self.streak == 0:
                seen.append(None)

    monkeypatch.setattr(hermes_apply_prune, "IdlePacing", Watched)
    proc = subprocess.Popen(
        [sys.executable, "-c", SPARSE_WRITER, str(db), "0.15", "8"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write("go\n")
    proc.stdin.flush()
    options = {"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_size": 3, "batch_pause": 0.01, "backup": False}
    profile = run_maintenance(options)["profiles"][0]
    latencies = json.loads(proc.communicate(timeout=30)[0].splitlines()[-1])
    assert profile["status"] == "ok", profile["error"]
    assert profile["sessions_pruned"] == 150
    print("writes during the prune: worst %.0f ms, %s" % (max(latencies) * 1000, [round(x * 1000) for x in latencies]))
    assert len(latencies) == 8 and max(latencies) < 1.0
    resets = [i for i, b in enumerate(seen) if b is None]
    assert resets, "the writer's commits were never seen"
    assert IDLE_HOLD_CAP in seen, "the pacing never opened up between two writes"
    # after every commit of the writer that the prune saw, its next transaction had the configured bound
    assert all(seen[i + 1] in (None, 0.06) for i in resets if i + 1 < len(seen))
