"""Bad input: a clear error that names the thing, nothing lost, the other profiles still maintained."""

import fcntl
import hashlib
import os
import shutil
import sqlite3
import time

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import normalize_options
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import add_index_with_missing_tokenizer, build_home, layout_available, missing_venv_message

OLD = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3},
    {"id": "zombie", "source": "cli", "started_days_ago": 3, "messages": 2, "last_message_days_ago": 2},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def digest(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture
def home(tmp_path):
    """A home whose default profile is healthy; tests add a broken profile beside it."""
    build_home(str(tmp_path), "v30", OLD)
    return tmp_path


def broken_profile(home, name):
    path = home / "profiles" / name
    path.mkdir(parents=True)
    return path / "state.db"


def by_name(result):
    return {p["name"]: p for p in result["profiles"]}


def run_both_modes(home):
    """Check mode then the real run; return both results keyed by profile."""
    return by_name(run_maintenance({"prune_days": 7, "hermes_home": [str(home)]}, check_mode=True)), by_name(
        run_maintenance({"prune_days": 7, "hermes_home": [str(home)]})
    )


def assert_good_one_maintained(results):
    check, real = results
    assert check["default"]["status"] == "ok" and check["default"]["sessions_pruned"] == 1
    assert real["default"]["status"] == "ok" and real["default"]["sessions_pruned"] == 1
    assert real["default"]["zombies_closed"] == 1


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.write_bytes(b"this is a text file, not sqlite" * 40), "not a SQLite database"),
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.mkdir(), "is a directory"),
    ],
    ids=["not-sqlite", "empty", "directory"],
)
def test_broken_file_is_named_and_left_alone(home, make, words):
    path = broken_profile(home, "broken")
    make(path)
    before = digest(path) if path.is_file() else None
    results = run_both_modes(home)
    assert_good_one_maintained(results)
    for mode in results:
        assert mode["broken"]["status"] == "failed"
        assert words in mode["broken"]["error"] and str(path) in mode["broken"]["error"]
    if before:
        assert digest(path) == before
    assert sorted(os.listdir(path.parent)) == ["state.db"]


def test_truncated_file(home):
    path = broken_profile(home, "truncated")
    data = open(home / "state.db", "rb").read()
    path.write_bytes(data[: len(data) // 2 + 100])
    before = digest(path)
    results = run_both_modes(home)
    assert_good_one_maintained(results)
    assert all(r["truncated"]["status"] == "failed" for r in results)
    assert "truncated" in results[1]["truncated"]["error"]
    assert digest(path) == before


def test_page_aligned_truncation_fails_quick_check(tmp_path):
    build_home(str(tmp_path), "v30", OLD * 1)
    db = tmp_path / "state.db"
    data = db.read_bytes()
    page = int.from_bytes(data[16:18], "big")
    db.write_bytes(data[: (len(data) // page // 2) * page])
    before = digest(db)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert profile["status"] == "failed"
    assert "quick_check" in profile["error"] or "malformed" in profile["error"]
    assert digest(db) == before


def test_symlinked_state_db_refused(home, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    build_home(str(elsewhere), "v30", OLD)
    link = broken_profile(home, "linked")
    link.symlink_to(elsewhere / "state.db")
    before = digest(elsewhere / "state.db")
    results = run_both_modes(home)
    assert_good_one_maintained(results)
    assert "symbolic link" in results[1]["linked"]["error"]
    assert digest(elsewhere / "state.db") == before


@pytest.mark.parametrize("kind, shown", [("ms", "milliseconds"), ("iso", "not unix seconds")])
def test_column_in_wrong_unit_refuses_the_profile(home, kind, shown):
    db = build_home(str(home), "v30", OLD, profile="wrongunit")
    conn = sqlite3.connect(str(db))
    if kind == "ms":
        conn.execute("UPDATE sessions SET started_at = started_at * 1000")
    else:
        conn.execute("UPDATE sessions SET started_at = strftime('%Y-%m-%dT%H:%M:%S', started_at, 'unixepoch')")
    conn.commit()
    conn.close()
    before = digest(db)
    results = run_both_modes(home)
    assert_good_one_maintained(results)
    error = results[1]["wrongunit"]["error"]
    assert "sessions.started_at" in error and shown in error
    assert digest(db) == before


def test_isolated_bad_rows_are_counted_not_touched(tmp_path):
    specs = OLD + [
        {"id": "bad", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 2, "bad_time": "ms"}
    ]
    build_home(str(tmp_path), "v30", specs)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert profile["status"] == "ok"
    assert profile["bad_time_rows"] == 1
    conn = sqlite3.connect(str(tmp_path / "state.db"))
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = 'bad'").fetchone() == (2,)


def test_missing_home_is_an_error_the_other_home_still_runs(home, tmp_path_factory):
    missing = str(tmp_path_factory.mktemp("x") / "nope")
    result = run_maintenance({"prune_days": 7, "hermes_home": [missing, str(home)]})
    names = {(p["home"], p["status"]) for p in result["profiles"]}
    assert (missing, "failed") in names
    assert "does not exist" in [p for p in result["profiles"] if p["home"] == missing][0]["error"]
    assert [p for p in result["profiles"] if p["home"] == str(home)][0]["sessions_pruned"] == 1


def test_the_database_file_or_a_home_without_profiles_is_never_a_success(home, tmp_path_factory):
    db, empty = str(home / "state.db"), tmp_path_factory.mktemp("empty")
    result = run_maintenance({"prune_days": 7, "hermes_home": [db, str(empty)]}, check_mode=True)
    by_home = {p["home"]: p for p in result["profiles"]}
    assert by_home[db]["status"] == "failed"
    assert by_home[db]["error"].startswith("%s is the database file; give its home, %s" % (db, home))
    assert by_home[str(empty)]["status"] == "no_profiles" and result["status"] == "failed"

    later = str(empty / "not-yet")  # a host where Hermes is not set up yet, allowed
    result = run_maintenance({"prune_days": 7, "hermes_home": [str(empty), later], "allow_empty_homes": True})
    assert result["status"] == "no_profiles" and result["failed"] == []
    assert [p["status"] for p in result["profiles"]] == ["no_profiles", "no_profiles"]
    assert (
        result["summary"][1] == "default: no_profiles: no state.db under %s: the home does not exist yet "
        "(allow_empty_homes)" % later
    )
    assert os.listdir(str(empty)) == []  # nothing created


def test_held_lock_skips_the_profile(home):
    lock_path = str(home / "state.db.auto-maintenance.lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        before = digest(home / "state.db")
        for check in (True, False):
            profile = run_maintenance({"prune_days": 7, "hermes_home": [str(home)]}, check_mode=check)["profiles"][0]
            assert profile["status"] == "skipped" and "auto-maintenance.lock" in profile["error"]
        assert digest(home / "state.db") == before
    finally:
        os.close(fd)
    assert run_maintenance({"prune_days": 7, "hermes_home": [str(home)]})["profiles"][0]["sessions_pruned"] == 1


def test_writer_holding_the_lock_longer_than_busy_timeout_skips(home):
    build_home(str(home), "v30", OLD, profile="busy")
    busy_db = str(home / "profiles" / "busy" / "state.db")
    holder = sqlite3.connect(busy_db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        result = by_name(
            run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "busy_timeout": 0.2, "backup": False})
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result["busy"]["status"] == "skipped" and "busy_timeout" in result["busy"]["error"]
    assert result["default"]["status"] == "ok" and result["default"]["sessions_pruned"] == 1
    conn = sqlite3.connect(busy_db)
    assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone() == (3,)


def test_newer_schema_refused_but_reported(tmp_path):
    db = build_home(str(tmp_path), "v30", OLD)
    conn = sqlite3.connect(str(db))
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    before = digest(db)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert profile["status"] == "failed" and "schema_version 99" in profile["error"]
    assert digest(db) == before
    info = gather_info({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert info["status"] == "ok" and info["schema_version"] == 99 and info["prunable_sessions"] == 1
    allowed = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "allow_unknown_schema": True})[
        "profiles"
    ][0]
    assert allowed["status"] == "ok" and allowed["sessions_pruned"] == 1


def test_schema_31_of_hermes_0_22_is_known_and_32_is_refused(tmp_path):
    if not layout_available("hermes-0.22.2.post1"):
        pytest.skip(missing_venv_message("hermes-0.22.2.post1"))
    build_home(str(tmp_path / "known"), "hermes-0.22.2.post1", OLD)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path / "known")]}, check_mode=True)["profiles"][
        0
    ]
    assert profile["status"] == "ok" and profile["sessions_pruned"] == 1, profile["error"]
    db = build_home(str(tmp_path / "newer"), "hermes-0.22.2.post1", OLD)
    conn = sqlite3.connect(str(db))
    conn.execute("UPDATE schema_version SET version = 32")
    conn.commit()
    conn.close()
    before = digest(db)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path / "newer")]})["profiles"][0]
    assert profile["status"] == "failed" and "schema_version 32" in profile["error"]
    assert "up to 31" in profile["error"]
    assert digest(db) == before
    allowed = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path / "newer")], "allow_unknown_schema": True})
    assert allowed["profiles"][0]["status"] == "ok" and allowed["profiles"][0]["sessions_pruned"] == 1


def test_missing_tokenizer_refuses_deletes_but_closes_zombies(tmp_path):
    db = build_home(str(tmp_path), "v30", OLD)
    add_index_with_missing_tokenizer(db)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert profile["status"] == "failed"
    assert "messages_fts_cjk" in profile["error"] and "pruning refused" in profile["error"]
    # A healthy file: restoring a backup would lose every message written since.
    assert "quick_check" not in profile["error"] and "restore" not in profile["error"]
    assert profile["zombies_closed"] == 1 and profile["sessions_pruned"] == 0
    conn = sqlite3.connect(str(db))
    assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone() == (3,)


def test_damaged_file_with_missing_tokenizer_is_still_called_damaged(tmp_path):
    # SQLite 3.44+ aborts quick_check at the index it cannot open, damaged file or not; the
    # table-by-table check behind it must still find the damaged b-tree.
    db = build_home(str(tmp_path), "v30", OLD)
    add_index_with_missing_tokenizer(db)
    conn = sqlite3.connect(str(db))
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE type = 'index' AND tbl_name = 'messages'").fetchone()
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with open(str(db), "r+b") as handle:
        handle.seek((root[0] - 1) * page_size + 8)
        handle.write(b"\x00\x01" * 50)
    before = digest(db)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert profile["status"] == "failed"
    assert "failed quick_check" in profile["error"] and "restore the newest backup" in profile["error"]
    assert profile["zombies_closed"] == 0
    assert digest(db) == before


@pytest.mark.parametrize(
    "options, words",
    [
        ({"prune_days": -1}, "prune_days must not be negative"),
        ({"zombie_days": 10, "prune_days": 7}, "zombie_days (10) is larger than prune_days (7)"),
        ({"vacuum_mode": "sometimes"}, "vacuum_mode must be one of"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"vacuum_threshold": 150}, "vacuum_threshold is a percentage"),
    ],
)
def test_invalid_options_are_refused_by_name(options, words):
    with pytest.raises(MaintenanceError) as err:
        normalize_options(options)
    assert words in str(err.value)


def test_unsafe_backup_dir_refused_before_any_change(home, tmp_path_factory):
    target = tmp_path_factory.mktemp("real-backups")
    link = home / "linked-backups"
    link.symlink_to(target)
    before = digest(home / "state.db")
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "backup_dir": str(link)})["profiles"][0]
    assert profile["status"] == "failed" and "symbolic link" in profile["error"]
    assert digest(home / "state.db") == before
    open_dir = tmp_path_factory.mktemp("open-backups")
    os.chmod(open_dir, 0o777)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "backup_dir": str(open_dir)})["profiles"][0]
    assert "writable by group or others" in profile["error"]
    assert digest(home / "state.db") == before


def test_failed_backup_changes_nothing(home, monkeypatch):
    """ENOSPC from the disk: the partial file goes, the database stays as it was."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import (
        whole_file as hermes_backup_whole_file,
    )

    real_copy = shutil.copyfileobj

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hermes_backup_whole_file.shutil, "copyfileobj", full_disk)
    before = digest(home / "state.db")
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "backup_compress": True})["profiles"][0]
    monkeypatch.setattr(hermes_backup_whole_file.shutil, "copyfileobj", real_copy)
    assert profile["status"] == "failed" and "ran out of space" in profile["error"]
    assert digest(home / "state.db") == before
    assert os.listdir(home / "backups") == []


def test_session_resumed_during_the_run_is_left_alone(tmp_path, monkeypatch):
    """Hermes reopens a planned session before its batch: the in-transaction re-check keeps it."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import decision as maintain_decision

    specs = [
        {"id": "s%02d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(20)
    ]
    db = str(build_home(str(tmp_path), "v30", specs))
    real_build_plan = maintain_decision.build_plan

    def plan_then_resume(*args):
        plan = real_build_plan(*args)
        gateway = sqlite3.connect(db, timeout=5)
        gateway.execute("UPDATE sessions SET ended_at = NULL WHERE id = 's07'")
        gateway.execute(
            "INSERT INTO messages(session_id, role, content, timestamp) VALUES ('s07', 'user', 'back again', ?)",
            (time.time(),),
        )
        gateway.commit()
        gateway.close()
        return plan

    monkeypatch.setattr(maintain_decision, "build_plan", plan_then_resume)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_size": 6})["profiles"][0]
    assert profile["status"] == "ok"
    assert profile["sessions_pruned"] == 19 and profile["sessions_left_alone"] == 1
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT id FROM sessions").fetchall() == [("s07",)]
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = 's07'").fetchone() == (4,)


def test_a_run_stopped_halfway_reports_what_it_committed(tmp_path, monkeypatch):
    """The gateway locks us out after some batches: the result still counts what was done."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import prune as hermes_apply_prune

    specs = OLD + [
        {"id": "p%02d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(9)
    ]
    db = str(build_home(str(tmp_path), "v30", specs))
    real_check = hermes_apply_prune.still_prunable
    seen = []

    def locked_after_two_batches(conn, sid, *args):
        seen.append(sid)
        if len(seen) > 2:
            raise sqlite3.OperationalError("database is locked")
        return real_check(conn, sid, *args)

    monkeypatch.setattr(hermes_apply_prune, "still_prunable", locked_after_two_batches)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "batch_size": 3, "batch_pause": 0})[
        "profiles"
    ][0]
    assert profile["status"] == "skipped" and "busy_timeout" in profile["error"]
    assert profile["changed"] is True and profile["zombies_closed"] == 1
    assert profile["sessions_pruned"] == 2 and profile["messages_pruned"] == 6
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone() == (len(specs) - 2,)


@pytest.mark.parametrize("batch_time, transactions", [(1e-9, 10), (60, 1)])
def test_batch_time_bounds_each_transaction(tmp_path, monkeypatch, batch_time, transactions):
    """The write lock is given back after batch_time, however many messages batch_size allows."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import prune as hermes_apply_prune

    specs = [
        {"id": "p%02d" % i, "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}
        for i in range(10)
    ]
    build_home(str(tmp_path), "v30", specs)
    opened = []
    real_transaction = hermes_apply_prune.write_transaction

    def counted(conn):
        opened.append(1)
        return real_transaction(conn)

    monkeypatch.setattr(hermes_apply_prune, "write_transaction", counted)
    options = {
        "prune_days": 7,
        "hermes_home": [str(tmp_path)],
        "batch_size": 1000,
        "batch_time": batch_time,
        "batch_pause": 0,
    }
    profile = run_maintenance(options)["profiles"][0]
    assert profile["sessions_pruned"] == 10 and profile["messages_pruned"] == 30
    assert len(opened) == transactions
