"""Locks and contention between real processes (test_bad_input.py covers the same-process cases).

* two maintenance runs at once: the second skips the profile the first is working on,
  naming the lock, and maintains the others; the first finishes its work;
* Hermes's own auto-maintenance (newer releases flock ``state.db.auto-maintenance.lock``,
  non-blocking) running in another process: that profile is skipped, the others maintained;
* the gateway takes the write lock in the middle of our prune and holds it longer than
  busy_timeout: the profile is skipped with that reason, the committed part of the work
  is consistent, nothing that is kept is touched, and the next run completes.
"""

import json
import subprocess
import sys
import textwrap
import time

import pytest
from hermes_reliability import CHILD, COLLECTIONS_ROOT, db_problems, full_rows, parse_mark, session_rows

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import deleter as maintain_deleter
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from hermes_fixtures import build_home, make_big_home

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3},
    {"id": "zombie", "source": "cli", "started_days_ago": 3, "messages": 2, "last_message_days_ago": 2},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def by_name(result):
    return {p["name"]: p for p in result["profiles"]}


def start_child(*args, stdin=None):
    """A Python child with its output on pipes, as text."""
    return subprocess.Popen(
        [sys.executable, "-c", *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_line(proc, wanted, timeout=60):
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        line = proc.stderr.readline() if wanted.startswith("@@") else proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        mark = parse_mark(line)
        if line.startswith(wanted) or (mark and "@@ " + mark[1] == wanted):
            return
    proc.kill()
    pytest.fail("child never printed %r: %s" % (wanted, "".join(seen)[-2000:]))


def test_second_run_skips_the_profile_the_first_is_working_on(tmp_path):
    make_big_home(str(tmp_path), "v30", 400, 5, old_fraction=0.5, seed=5)
    build_home(str(tmp_path), "v30", SPECS, profile="work")
    slow = {
        "prune_days": 7,
        "hermes_home": [str(tmp_path)],
        "batch_size": 20,
        "batch_pause": 0.05,
        "profiles": ["default"],
    }
    first = start_child(CHILD, str(COLLECTIONS_ROOT), json.dumps(slow))
    try:
        wait_for_line(first, "@@ prune start")
        second = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]}))
        check = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]}, check_mode=True))
        assert first.poll() is None, "the first run ended too early for this test"
    finally:
        out, err = first.communicate(timeout=120)
    assert second["default"]["status"] == "skipped"
    assert "holds %s" % (tmp_path / "state.db.auto-maintenance.lock") in second["default"]["error"]
    assert check["default"]["status"] == "skipped"
    assert second["work"]["status"] == "ok" and second["work"]["sessions_pruned"] == 1
    first_result = by_name(json.loads(out.strip().splitlines()[-1]))
    assert first.returncode == 0 and first_result["default"]["status"] == "ok", err
    assert first_result["default"]["sessions_pruned"] == 200
    assert db_problems(tmp_path / "state.db") == []


HERMES_LOCK_HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1] + ".auto-maintenance.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # as Hermes's auto-maintenance does
    print("locked", flush=True)
    sys.stdin.read()                                  # until the test closes our stdin
    """
)


def test_hermes_auto_maintenance_in_another_process_skips_that_profile(tmp_path):
    build_home(str(tmp_path), "v30", SPECS)
    busy = build_home(str(tmp_path), "v30", SPECS, profile="busy")
    before = full_rows(busy)
    hermes = start_child(HERMES_LOCK_HOLDER, str(busy), stdin=subprocess.PIPE)
    try:
        wait_for_line(hermes, "locked")
        result = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]}))
    finally:
        hermes.communicate("", timeout=30)
    assert result["busy"]["status"] == "skipped" and "Hermes's auto-maintenance" in result["busy"]["error"]
    assert result["default"]["status"] == "ok" and result["default"]["sessions_pruned"] == 1
    assert full_rows(busy) == before
    after = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]}))
    assert after["busy"]["status"] == "ok" and after["busy"]["sessions_pruned"] == 1


GATEWAY_WRITER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
    conn.execute("BEGIN IMMEDIATE")                   # the gateway's write transaction
    conn.execute("UPDATE sessions SET title = 'busy' WHERE id = (SELECT MIN(id) FROM sessions)")
    print("writing", flush=True)
    time.sleep(float(sys.argv[2]))
    conn.execute("ROLLBACK")
    """
)


def test_writer_taking_the_lock_mid_prune_skips_the_profile(tmp_path, monkeypatch):
    db = make_big_home(str(tmp_path), "v30", 200, 5, old_fraction=0.5, seed=9)
    build_home(str(tmp_path), "v30", SPECS, profile="work")
    before = session_rows(db)
    reference_home = tmp_path / "reference"
    make_big_home(str(reference_home), "v30", 200, 5, old_fraction=0.5, seed=9)  # same rows
    real_prune = maintain_deleter.prune
    writers = []

    def prune_with_gateway(conn, *args, **kwargs):
        path = conn.execute("PRAGMA database_list").fetchone()[2]
        if path == str(db) and not writers:
            writer = subprocess.Popen(
                [sys.executable, "-c", GATEWAY_WRITER, path, "1.5"], stdout=subprocess.PIPE, text=True
            )
            writers.append(writer)
            assert writer.stdout.readline().startswith("writing")
        return real_prune(conn, *args, **kwargs)

    monkeypatch.setattr(maintain_deleter, "prune", prune_with_gateway)
    opts = {"prune_days": 7, "hermes_home": [str(tmp_path)], "busy_timeout": 0.3, "batch_pause": 0}
    result = by_name(run_maintenance(opts))
    writers[0].wait(30)
    assert result["default"]["status"] == "skipped"
    assert "longer than busy_timeout (0.3s)" in result["default"]["error"]
    # What was done before the writer blocked us is still reported: the backup it took.
    assert result["default"]["changed"] is True and result["default"]["backup"]["verified"]
    assert result["work"]["status"] == "ok" and result["work"]["sessions_pruned"] == 1
    assert db_problems(db) == []
    monkeypatch.setattr(maintain_deleter, "prune", real_prune)
    reference = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(reference_home)], "batch_pause": 0}))[
        "default"
    ]
    kept = session_rows(reference_home / "state.db")
    now_rows = session_rows(db)
    assert all(now_rows[sid] == before[sid] for sid in kept)
    again = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_pause": 0}))["default"]
    assert again["status"] == "ok" and again["sessions_pruned"] == reference["sessions_pruned"]
    assert set(session_rows(db)) == set(kept)


def test_a_run_leaves_the_unfinished_backup_of_a_similarly_named_profile_alone(tmp_path):
    """Profile work_bot's backup in progress (another run holds its lock) while profile work is maintained."""
    build_home(str(tmp_path), "v30", SPECS, profile="work")
    build_home(str(tmp_path), "v30", SPECS, profile="work_bot")
    backups = tmp_path / "backups"
    backups.mkdir(mode=0o700)
    in_progress = backups / (".hermes-ops_work_bot_%s.db.partial" % time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    in_progress.write_bytes(b"being written by the other run")
    stale = backups / ".hermes-ops_work_20200101T000000Z.db.partial"
    stale.write_bytes(b"left by a killed run of profile work")
    result = by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "profiles": ["work"]}))
    assert result["work"]["status"] == "ok" and result["work"]["backup"]
    assert in_progress.exists(), "a run of profile work removed profile work_bot's unfinished backup"
    assert not stale.exists()
