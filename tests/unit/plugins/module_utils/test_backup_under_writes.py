"""A backup taken while another process commits and checkpoints as fast as it can is a
consistent database holding every message committed before the backup began.

The writer (a separate process, so SQLite's file locks are the real cross-process ones)
appends a message per transaction (2 ms apart) with ``wal_autocheckpoint`` at 8 pages and a RESTART
checkpoint every 50 commits: checkpoints copy frames into state.db while the backup
reads it, and the -wal is restarted from its start over and over. Both copy paths are
checked: the byte copy pinned by a read snapshot (the default) and SQLite's backup API
(used when the -wal is bigger than ``RAW_WAL_LIMIT``).
"""

import os
import sqlite3
import subprocess
import sys
import time

import pytest
from hermes_reliability import db_problems, query

import ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.whole_file as backup_mod
from hermes_fixtures import build_home

BACKUPS = 8
BUSY_COMMITS = 100  # the writer commits at least this many while the backups run
WRITER = r"""
import sqlite3, sys, time
db, stop = sys.argv[1], sys.argv[2]
conn = sqlite3.connect(db, timeout=1.0, isolation_level=None)  # Hermes's busy timeout
conn.execute("PRAGMA wal_autocheckpoint=8")
n = 0
while True:
    try:
        open(stop).close()
        break
    except OSError:
        pass
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        continue  # Hermes retries too
    conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) VALUES ('busy', 'user', ?, ?)",
        ("message %d " % n + "x" * 3000, time.time()),
    )
    conn.execute("COMMIT")
    n += 1
    if n % 50 == 0:
        conn.execute("PRAGMA wal_checkpoint(RESTART)")  # gives up after 1 s while a backup reads
    print(n, time.time(), flush=True)
    time.sleep(0.002)
"""


def commits_so_far(log):
    with open(str(log)) as f:
        return sum(1 for _line in f)


def wait_for_first_commit(log, writer, timeout=30):
    deadline = time.time() + timeout
    while commits_so_far(log) == 0:
        assert writer.poll() is None, "the writer exited before its first commit"
        assert time.time() < deadline, "the writer made no commit in %ds" % timeout
        time.sleep(0.05)


@pytest.mark.parametrize("path", ["files", "backup_api"])
def test_backups_under_a_checkpointing_writer_are_consistent_and_complete(tmp_path, monkeypatch, path):
    if path == "backup_api":
        monkeypatch.setattr(backup_mod, "RAW_WAL_LIMIT", -1)
    specs = [{"id": "busy", "source": "telegram", "started_days_ago": 1, "messages": 0}]
    specs += [
        {"id": "s%03d" % i, "source": "cli", "started_days_ago": 3, "ended_days_ago": 2, "messages": 20}
        for i in range(150)
    ]
    db = str(build_home(str(tmp_path / "home"), "v30", specs))
    backups = tmp_path / "backups"
    backups.mkdir(mode=0o700)
    stop = tmp_path / "stop"
    log = tmp_path / "writer.log"
    with open(str(log), "w") as out:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, db, str(stop)], stdout=out)
    taken = []
    try:
        wait_for_first_commit(log, writer)
        conn = sqlite3.connect(db, isolation_level=None)
        # Backups go on until the writer is well under way, however slow a loaded machine
        # makes it: the point is backups overlapping many commits and checkpoints.
        deadline = time.time() + 120
        while len(taken) < BACKUPS or (commits_so_far(log) <= BUSY_COMMITS and time.time() < deadline):
            started = time.time()
            result = backup_mod.take_backup(conn, db, str(backups), "default", False, {"s000": 20, "s149": 20})
            taken.append((started, result))
            time.sleep(0.05)
        conn.close()
    finally:
        stop.write_text("")
        assert writer.wait(timeout=30) == 0
    commits = [line.split() for line in log.read_text().splitlines()]
    assert len(commits) > BUSY_COMMITS, "the writer did not get going"
    for started, result in taken:
        assert result["verified"] is True
        assert db_problems(result["path"]) == []  # integrity_check, both FTS integrity-checks, foreign keys
        assert query(result["path"], "PRAGMA journal_mode") == [("delete",)]
        contents = [r[0] for r in query(result["path"], "SELECT content FROM messages WHERE session_id = 'busy'")]
        numbers = sorted(int(c.split()[1]) for c in contents)
        # A state the writer really committed: its first k messages, none missing in between...
        assert numbers == list(range(len(numbers)))
        # ...and at least every one committed before the backup began.
        before = sum(1 for n, t in commits if float(t) < started)
        assert len(numbers) >= before, (len(numbers), before)
        assert result["messages"] == 150 * 20 + len(numbers)
    assert not [n for n in os.listdir(str(backups)) if n.startswith(".")], "partial files left behind"
    # The byte copy gives way to the backup API only when the write lock stays taken for busy_timeout.
    used = [result["copied_by"] for _started, result in taken]
    assert used.count(path) >= len(taken) // 2, used
