"""Hermes 0.22.2 in WAL mode, inside its file-identity guards, while we maintain its file.

Hermes 0.21+ records the ``(st_dev, st_ino)`` of state.db and of its ``-wal``/``-shm`` when
it opens the file, and a generation stamp minted once per file (``state_meta``
``db_file_generation``, mirrored into ``PRAGMA application_id``). Before every write it
compares them with the files at the path: a different state.db inode or application_id
raises ``StateDbReplacedError``, a sidecar whose inode changed or vanished raises
``DeletedWalGenerationError``; both are sticky, the handle writes nothing more.

Hermes >= 0.20 runs WAL only on an SQLite without the WAL-reset bug (3.51.3+, or the
3.50.7 / 3.44.6 backports); on Debian 12's 3.40.1 it falls back to journal_mode=DELETE.
So these tests run where the process links such an SQLite: ``make matrix-sqlite`` runs
them with Debian sid's libsqlite3 (3.53) first on LD_LIBRARY_PATH, which the real 0.22.2
writer processes inherit. Elsewhere they are skipped, saying so.

Size: 300 sessions of 25 messages; ``HERMES_LIVE_SIZE=full`` (``make live-wal-full``) 4,000.

The writer is the release's own ``SessionDB`` (tests/lib/hermes_writer.py), kept open and
appending every 20 ms; its summary carries the guard flags and the result of the guard's own
live probe (``_halt_if_db_generation_changed``) just before it closes.
"""

import contextlib
import json
import os
import random
import sqlite3
import subprocess
import time

import pytest
from hermes_reliability import db_problems
from hermes_writer import MARK, WriterProcess

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import reclaim as hermes_apply_reclaim
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.whole_file import plan_restore, restore
from hermes_fixtures import WRITER, hermes_python

RELEASE = "0.22.2.post1"
DAY = 86400.0
# 7,500 messages in `make matrix-sqlite`; HERMES_LIVE_SIZE=full (`make live-wal-full`) 100,000.
SESSIONS, MESSAGES = (4000, 25) if os.environ.get("HERMES_LIVE_SIZE") == "full" else (300, 25)
ZOMBIES = 10
GUARD_ERRORS = ("StateDbReplacedError", "DeletedWalGenerationError", "StateDbCorruptError")
# Hermes gives up on a write after ~20 s; the latency targets are the benchmark's business.
STALL_LIMIT = 5.0


def wal_reset_fixed(version):
    """Hermes's own rule (hermes_cli.sqlite_runtime.is_sqlite_wal_reset_vulnerable)."""
    return version >= (3, 51, 3) or (3, 50, 7) <= version < (3, 51, 0) or (3, 44, 6) <= version < (3, 45, 0)


pytestmark = [
    pytest.mark.skipif(hermes_python(RELEASE) is None, reason="no hermes-%s venv (make setup)" % RELEASE),
    pytest.mark.skipif(
        not wal_reset_fixed(sqlite3.sqlite_version_info),
        reason="SQLite %s has the WAL-reset bug, so Hermes 0.22 runs journal_mode=DELETE here; "
        "`make matrix-sqlite` runs these on Debian sid's SQLite, where it runs WAL" % sqlite3.sqlite_version,
    ),
]


def file_identity(db):
    """What the guards compare: inodes of state.db and sidecars, application_id, the stamp."""
    # Stat first: opening a connection creates the sidecars when nobody else has the file open.
    inodes = {s: os.stat(db + s).st_ino for s in ("", "-wal", "-shm") if os.path.exists(db + s)}
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        stamp = conn.execute("SELECT value FROM state_meta WHERE key = 'db_file_generation'").fetchone()
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    finally:
        conn.close()
    return {"inodes": inodes, "application_id": app_id, "generation": stamp[0] if stamp else None}


def header_application_id(db):
    """application_id as the guard reads it: bytes 68..71 of the file header."""
    with open(db, "rb") as handle:
        handle.seek(68)
        return int.from_bytes(handle.read(4), "big")


def build_022_home(home, now, seed=7):
    """A state.db whose schema (31), generation stamp and WAL mode come from 0.22.2 itself,
    filled by bulk INSERTs through its own triggers: half the sessions ended 8-60 days ago
    (prunable at prune_days 7, inside 0.22.2's own 90-day auto-prune), ZOMBIES open cli
    sessions idle for 2-5 days, the rest recent."""
    home.mkdir()
    db = str(home / "state.db")
    plan = home.parent / "plan.json"
    plan.write_text(json.dumps({"home": str(home), "db_path": db, "mode": "init", "sessions": []}))
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("PYTHONPATH", None)
    subprocess.run([hermes_python(RELEASE), str(WRITER), str(plan)], env=env, cwd=str(home), check=True, timeout=120)
    rng = random.Random(seed)
    conn = sqlite3.connect(db, timeout=30)
    conn.execute("PRAGMA foreign_keys=ON")
    sessions, messages = [], []
    for i in range(SESSIONS):
        sid = "guard-%05d" % i
        if i < ZOMBIES:
            source, end, last = "cli", None, now - rng.uniform(2, 5) * DAY
        elif i < SESSIONS // 2:
            source, end = rng.choice(("cli", "telegram", "cron")), now - rng.uniform(8, 60) * DAY
            last = end
        else:
            source, end = rng.choice(("cli", "telegram")), now - rng.uniform(0.01, 6) * DAY
            last = end
        start = last - 3600.0
        sessions.append((sid, source, start, end, "user_exit" if end else None, MESSAGES))
        for j in range(MESSAGES):
            role = "user" if j % 2 == 0 else "assistant"
            messages.append((sid, role, "%s zebra nightly %d" % (sid, j), start + (j + 1) * 3600.0 / MESSAGES))
    with conn:
        conn.executemany(
            "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, message_count) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            sessions,
        )
        conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)", messages)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    os.chmod(db, 0o600)
    return db


@pytest.fixture
def home_022(tmp_path):
    home = tmp_path / "home"
    return str(home), build_022_home(home, time.time())


def start_writer(db, tmp_path, name):
    return WriterProcess(hermes_python(RELEASE), db, str(tmp_path / ("%s.jsonl" % name)), prefix=name).start()


@contextlib.contextmanager
def live_gateway(db, tmp_path):
    """A 0.22.2 gateway appending to ``db`` through the block; killed however the block ends."""
    writer = start_writer(db, tmp_path, "gateway")
    try:
        yield writer
    finally:
        writer.kill()


def identity_while_writing(db):
    """The file's identity once the gateway's first appends are in."""
    time.sleep(0.3)
    return file_identity(db)


def identity_after_more_writes(db):
    """The file's identity after the gateway went on appending for a second."""
    time.sleep(1.0)
    return file_identity(db)


def assert_writer_unharmed(writer, summary, db):
    """No failed write, no guard tripped (flags and the guard's own probe), WAL all along,
    every message it appended is in the file and found by FTS."""
    errors = [r["err"] for r in writer.records() if r["err"]]
    print(
        "0.22.2 writer on SQLite %s: %d appends, %d failed, worst %.0f ms, guards %s"
        % (summary["sqlite_version"], summary["attempts"], summary["failed"], 1000 * summary["max"], summary["guards"])
    )
    assert summary["failed"] == 0 and not errors, errors[:3]
    assert not any(name in (e or "") for e in errors for name in GUARD_ERRORS)
    guards = summary["guards"]
    assert guards["wal"] is True, "0.22.2 did not run WAL on SQLite %s" % summary["sqlite_version"]
    assert not guards["replaced"] and not guards["wal_generation_lost"] and not guards["quarantined"], guards
    assert guards["probe"] == "ok", guards
    assert summary["file_problems"] == [], summary["file_problems"]
    assert summary["message_count_seen"] == summary["appended"] > 0
    assert max(r["lat"] for r in writer.records()) < STALL_LIMIT
    conn = sqlite3.connect(db)
    try:
        ids = json.dumps(summary["ids"])
        present = conn.execute("SELECT COUNT(*) FROM messages WHERE id IN (SELECT value FROM json_each(?))", (ids,))
        assert present.fetchone()[0] == summary["appended"]
        hits = conn.execute("SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH ?", (MARK,)).fetchone()[0]
        assert hits >= summary["appended"]
    finally:
        conn.close()


def restart_gateway(db, tmp_path):
    """The gateway starts again on ``db`` and writes for a moment, unharmed; its summary."""
    restarted = start_writer(db, tmp_path, "restarted")
    try:
        time.sleep(0.5)
        summary = restarted.stop()
    finally:
        restarted.kill()
    assert_writer_unharmed(restarted, summary, db)
    return summary


def test_hermes_runs_wal_on_this_sqlite_and_delete_on_the_systems(tmp_path):
    """The control: the same release on the system's libsqlite3 refuses WAL and says why."""
    for name, env in (("swapped", {}), ("system", {"LD_LIBRARY_PATH": ""})):
        home = tmp_path / name
        home.mkdir()
        db = str(home / "state.db")
        writer = WriterProcess(hermes_python(RELEASE), db, str(tmp_path / (name + ".jsonl")), prefix=name, env=env)
        summary = writer.start().stop()
        with open(writer.out_path + ".stderr") as handle:
            stderr = handle.read()
        if name == "swapped":
            assert summary["sqlite_version"] == sqlite3.sqlite_version
            assert summary["guards"]["wal"] is True and "vulnerable to the WAL-reset" not in stderr
        elif summary["sqlite_version"] != sqlite3.sqlite_version:  # the system's SQLite really is another one
            assert summary["guards"]["wal"] is False and "vulnerable to the WAL-reset" in stderr


def test_full_run_beside_a_live_wal_writer_keeps_its_identity(home_022, tmp_path):
    home, db = home_022
    before = file_identity(db)
    with live_gateway(db, tmp_path) as writer:
        with_writer = identity_while_writing(db)
        result = run_maintenance({"prune_days": 7, "hermes_home": [home], "allow_unknown_schema": True})
        after = identity_after_more_writes(db)  # it keeps writing after the run, through the same handle
        summary = writer.stop()
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["zombies_closed"] == ZOMBIES
    assert profile["sessions_pruned"] == SESSIONS // 2 - ZOMBIES and profile["backup"]["path"]
    assert profile["reclaim"]["checkpoint"] == "PASSIVE"  # a holder: never TRUNCATE under it
    assert_writer_unharmed(writer, summary, db)
    assert after["application_id"] == before["application_id"] == header_application_id(db)
    assert after["generation"] == before["generation"]
    assert after["inodes"] == with_writer["inodes"]  # state.db, -wal and -shm are the writer's own
    assert db_problems(db) == []


def test_zombies_incremental_vacuum_and_checkpoints_beside_a_live_wal_writer(home_022, tmp_path):
    home, db = home_022
    # What one service-window run leaves: auto_vacuum=INCREMENTAL (VACUUM in place, no holder).
    conn = sqlite3.connect(db)
    conn.execute("UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id IN ('guard-00200', 'guard-00201')")
    conn.commit()
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("VACUUM")
    conn.close()
    before = file_identity(db)
    with live_gateway(db, tmp_path) as writer:
        with_writer = identity_while_writing(db)
        result = run_maintenance(
            {"prune_days": 7, "hermes_home": [home], "allow_unknown_schema": True, "zombie_days": 0.001}
        )
        profile = result["profiles"][0]
        # Every kind of checkpoint from another connection, the writer still appending.
        conn = sqlite3.connect(db, timeout=10)
        checkpoints = [conn.execute("PRAGMA wal_checkpoint(%s)" % kind).fetchone() for kind in ("PASSIVE", "FULL")]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        conn.close()
        after = identity_after_more_writes(db)
        summary = writer.stop()
    assert profile["status"] == "ok", profile["error"]
    assert profile["zombies_closed"] >= ZOMBIES and profile["sessions_pruned"] > 0
    assert profile["reclaim"]["action"] == "incremental"
    assert all(row[0] == 0 for row in checkpoints), checkpoints  # not busy: they ran
    assert_writer_unharmed(writer, summary, db)
    assert after["inodes"] == with_writer["inodes"]  # a TRUNCATE empties the -wal, keeps its inode
    assert (after["application_id"], after["generation"]) == (before["application_id"], before["generation"])


def test_full_vacuum_waits_for_the_service_window(home_022, tmp_path):
    home, db = home_022
    opts = {"prune_days": 7, "hermes_home": [home], "allow_unknown_schema": True, "vacuum_mode": "full"}
    before = file_identity(db)
    with live_gateway(db, tmp_path) as writer:
        held = run_maintenance(opts)["profiles"][0]
        summary = writer.stop()
    assert held["status"] == "ok" and held["reclaim"]["action"] is None
    assert "held open by" in held["reclaim"]["skipped_reason"]
    assert_writer_unharmed(writer, summary, db)
    # The gateway stopped (its process gone): the window's full VACUUM, in place.
    inode = os.stat(db).st_ino
    window = run_maintenance(dict(opts, prune_days=2))["profiles"][0]
    assert window["status"] == "ok" and window["reclaim"]["action"] == "full", window["reclaim"]
    assert os.stat(db).st_ino == inode
    vacuumed = file_identity(db)
    assert (vacuumed["application_id"], vacuumed["generation"]) == (before["application_id"], before["generation"])
    assert header_application_id(db) == before["application_id"]
    # The gateway starts again on the vacuumed file and writes.
    restart_gateway(db, tmp_path)
    assert file_identity(db)["generation"] == before["generation"]  # Hermes kept the stamp: same file


def test_in_place_vacuum_under_an_open_handle_keeps_its_identity(home_022, tmp_path):
    """Should a holder go unseen (another pid namespace, another user), the engine's own
    VACUUM still keeps every identity the guards check: it stalls the writer, never stops it."""
    home, db = home_022
    before = file_identity(db)
    with live_gateway(db, tmp_path) as writer:
        with_writer = identity_while_writing(db)
        conn = sqlite3.connect(db, timeout=30, isolation_level=None)
        conn.execute("DELETE FROM messages WHERE session_id IN ('guard-00100', 'guard-00101')")
        hermes_apply_reclaim.full_vacuum(conn, True)
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        conn.close()
        after = identity_after_more_writes(db)
        summary = writer.stop()
    assert_writer_unharmed(writer, summary, db)
    assert after["inodes"] == with_writer["inodes"]
    assert (after["application_id"], after["generation"]) == (before["application_id"], before["generation"])
    assert sqlite3.connect(db).execute("PRAGMA auto_vacuum").fetchone()[0] == 2


def test_restored_file_keeps_its_stamp_and_a_restarted_gateway_writes(home_022, tmp_path):
    home, db = home_022
    original = file_identity(db)
    with live_gateway(db, tmp_path) as writer:
        run = run_maintenance({"prune_days": 7, "hermes_home": [home], "allow_unknown_schema": True})["profiles"][0]
        summary = writer.stop()  # the gateway stopped for the restore
    assert run["status"] == "ok" and run["backup"]["path"]
    assert_writer_unharmed(writer, summary, db)
    plan = restore(plan_restore(home, "default"))
    assert plan["restored"]["messages"] == plan["backup"]["messages"]
    restored = file_identity(db)
    # A byte copy of the same file: the same stamp, under a new inode.
    assert restored["inodes"][""] != original["inodes"][""]
    assert (restored["application_id"], restored["generation"]) == (original["application_id"], original["generation"])
    summary = restart_gateway(db, tmp_path)
    assert summary["guards"]["application_id"] == original["application_id"]
    assert file_identity(db)["generation"] == original["generation"]


def test_forced_restore_under_a_running_gateway_stops_its_writes(home_022, tmp_path):
    """The inode, not the stamp, is what tells a running 0.22.2 its file was swapped: the
    restored file carries the old stamp, and the handle still refuses to write into it."""
    home, db = home_022
    run = run_maintenance({"prune_days": 7, "hermes_home": [home], "allow_unknown_schema": True})["profiles"][0]
    assert run["status"] == "ok" and run["backup"]["path"]
    with live_gateway(db, tmp_path) as writer:
        time.sleep(0.3)
        plan = restore(plan_restore(home, "default"), force=True)
        time.sleep(0.5)
        summary = writer.stop()
    swapped_at = plan["restored"]
    assert swapped_at["messages"] == plan["backup"]["messages"]
    errors = [r["err"] for r in writer.records() if r["err"]]
    print(
        "forced restore under a live 0.22.2: %d refused writes, first: %s; guards %s"
        % (len(errors), errors[0][:60], summary["guards"])
    )
    assert summary["failed"] > 0 and all(e.startswith(GUARD_ERRORS[:2]) for e in errors), errors[:3]
    assert summary["guards"]["replaced"] or summary["guards"]["wal_generation_lost"]
    # Nothing of the refused writes went into the restored file.
    conn = sqlite3.connect(db)
    refused = [r["k"] for r in writer.records() if r["err"]]
    found = conn.execute("SELECT COUNT(*) FROM messages WHERE content LIKE ?", ("%% gateway k%d %%" % refused[0],))
    assert found.fetchone()[0] == 0
    conn.close()
    assert db_problems(db) == []
