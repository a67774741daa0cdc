"""Every selection rule, on files made by real Hermes releases (and by 0.19.0 then migrated
by 0.22.2) and by the v2/v30 layouts.

Each case runs the whole cycle an operator runs: check mode (predicts, changes no byte,
creates no file), the real run (does exactly what was predicted), a second run (no
change), then the Hermes release that made the file opens, lists and searches it.
"""

import hashlib
import os
import sqlite3
import stat

import pytest
from hermes_reliability import db_problems
from hermes_reliability import query as rows

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from hermes_fixtures import (
    LAYOUT_FEATURES,
    LAYOUTS,
    build_home,
    layout_available,
    missing_venv_message,
    open_with_release,
    release_for,
    standard_scenario,
)

COUNTS = ("zombies_closed", "sessions_pruned", "messages_pruned", "sessions_orphaned", "transcripts_removed")


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def file_identity(db):
    """Journal mode (0.20+ run DELETE on an SQLite with the WAL-reset bug), application_id and
    Hermes's generation stamp (0.22+ refuses a file whose stamp changed)."""
    generation = []
    if rows(db, "SELECT 1 FROM sqlite_master WHERE name = 'state_meta'"):
        generation = rows(db, "SELECT value FROM state_meta WHERE key = 'db_file_generation'")
    return rows(db, "PRAGMA journal_mode"), rows(db, "PRAGMA application_id"), generation


def listing(home):
    return sorted(os.path.relpath(os.path.join(d, f), home) for d, _dirs, files in os.walk(home) for f in files)


@pytest.fixture(scope="module", params=LAYOUTS)
def scenario(request, tmp_path_factory):
    layout = request.param
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    home = str(tmp_path_factory.mktemp(layout))
    specs, expected = standard_scenario(layout)
    db = str(build_home(home, layout, specs))
    return layout, home, db, specs, expected


def test_check_mode_predicts_and_writes_nothing(scenario):
    layout, home, db, specs, expected = scenario
    before_files, before_digest = listing(home), digest(db)
    result = run_maintenance({"prune_days": 7, "hermes_home": [home]}, check_mode=True)
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert result["changed"] is True
    assert profile["zombies_closed"] == len(expected["zombies"])
    assert profile["sessions_pruned"] == len(expected["pruned"])
    assert profile["messages_pruned"] == expected["messages_pruned"]
    assert profile["sessions_orphaned"] == len(expected["orphaned"])
    assert profile["transcripts_removed"] == expected["transcripts_removed"]
    assert profile["bad_time_rows"] == expected["bad_time_rows"]
    assert profile["prompts_collected"] == expected["prompts_collected"]
    assert profile["after"]["sessions"] == profile["before"]["sessions"] - len(expected["pruned"])
    assert digest(db) == before_digest
    assert listing(home) == before_files  # no backup, no lock file, no -wal/-shm


def test_real_run_does_what_check_mode_said(scenario):
    layout, home, db, specs, expected = scenario
    predicted = run_maintenance({"prune_days": 7, "hermes_home": [home]}, check_mode=True)["profiles"][0]
    pre_rows = rows(db, "SELECT id, started_at FROM sessions")
    inode = os.stat(db).st_ino
    identity = file_identity(db)
    result = run_maintenance({"prune_days": 7, "hermes_home": [home]})
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert {k: profile[k] for k in COUNTS} == {k: predicted[k] for k in COUNTS}
    assert profile["prompts_collected"] == expected["prompts_collected"]
    assert os.stat(db).st_ino == inode, "state.db must never be replaced"
    assert file_identity(db) == identity, "journal mode and Hermes's identity stamp stay as Hermes set them"

    left = {r[0] for r in rows(db, "SELECT id FROM sessions")}
    assert left == expected["kept"]
    for sid in expected["zombies"] - expected["pruned"]:
        ended, reason = rows(db, "SELECT ended_at, end_reason FROM sessions WHERE id = ?", sid)[0]
        newest = rows(db, "SELECT MAX(timestamp) FROM messages WHERE session_id = ?", sid)[0][0]
        assert reason == "startup_orphan_reap"
        assert ended == pytest.approx(newest), "ended_at is the last activity, not a made-up time"
    for sid in expected["orphaned"]:
        assert rows(db, "SELECT parent_session_id FROM sessions WHERE id = ?", sid) == [(None,)]
    # Messages and FTS rows of kept sessions are all there; none of the pruned.
    assert rows(db, "SELECT COUNT(*) FROM messages WHERE session_id NOT IN (SELECT id FROM sessions)") == [(0,)]
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert rows(db, "PRAGMA foreign_key_check") == []
    for (fts,) in rows(db, "SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%fts5%'"):
        conn = sqlite3.connect(db)
        conn.execute("INSERT INTO %s(%s) VALUES('integrity-check')" % (fts, fts))
        conn.close()
    # Transcripts of pruned sessions are gone, the others stay.
    names = os.listdir(os.path.join(home, "sessions"))
    for sid in expected["pruned"]:
        assert not [n for n in names if n.startswith(sid + ".") or n.startswith("request_dump_%s_" % sid)]
    for sid in {s["id"] for s in specs if s.get("transcripts")} - expected["pruned"]:
        assert "%s.json" % sid in names

    backup = profile["backup"]
    assert backup["verified"] is True
    assert stat.S_IMODE(os.stat(backup["path"]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(backup["path"])).st_mode) == 0o700
    assert sorted(rows(backup["path"], "SELECT id, started_at FROM sessions")) == sorted(pre_rows)

    again = run_maintenance({"prune_days": 7, "hermes_home": [home]})
    assert again["changed"] is False, again["profiles"][0]
    assert run_maintenance({"prune_days": 7, "hermes_home": [home]}, check_mode=True)["changed"] is False


@pytest.mark.releases
def test_release_still_reads_the_file(scenario, tmp_path):
    layout, home, db, specs, expected = scenario
    run_maintenance({"prune_days": 7, "hermes_home": [home]})
    release = release_for(layout)
    if not layout_available(release):
        pytest.skip(missing_venv_message(release))
    if layout in ("v2", "v30"):
        # 0.19.0 migrates older files on open: let it work on a copy.
        copy = tmp_path / "state.db"
        copy.write_bytes(open(db, "rb").read())
        db = str(copy)
    seen = open_with_release(release, db, search_word="zebra")
    listed = set(seen["sessions"])
    assert listed <= expected["kept"]
    assert not listed & expected["pruned"]


def test_layout_features_are_what_the_scenario_used(scenario):
    layout, home, db, specs, expected = scenario
    assert LAYOUT_FEATURES[layout]["schema_version"] == rows(db, "SELECT version FROM schema_version")[0][0]


@pytest.mark.parametrize("layout", ["hermes-0.20.1.2", "hermes-0.22.2.post1"])
def test_vacuum_keeps_a_rollback_journal_file_as_hermes_made_it(layout, tmp_path):
    """0.20+ run journal_mode=DELETE here: a full VACUUM (service window) and incremental
    steps leave the mode, the inode and 0.22's identity stamp as they were, with no -wal."""
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    home = str(tmp_path / "home")
    specs, expected = standard_scenario(layout)
    # kept by the first run, pruned by the later one: enough messages to empty whole pages (the
    # scenario's own few rows share their pages with the rows that stay)
    specs.append({"id": "later-long", "source": "cli", "started_days_ago": 2, "ended_days_ago": 1, "messages": 400})
    db = str(build_home(home, layout, specs))
    identity, inode = file_identity(db), os.stat(db).st_ino
    if identity[0] != [("delete",)]:  # a fixed SQLite: test_identity_guards.py covers the WAL file
        pytest.skip("on SQLite %s %s runs %s, not a rollback journal" % (sqlite3.sqlite_version, layout, identity[0]))

    full = run_maintenance({"prune_days": 7, "hermes_home": [home], "vacuum_mode": "full"})["profiles"][0]
    assert full["status"] == "ok", full["error"]
    assert full["reclaim"]["action"] == "full"
    assert rows(db, "PRAGMA auto_vacuum") == [(2,)]  # left in incremental mode for live runs
    # a later prune (everything ended over half a day ago) is reclaimed in short steps
    more = run_maintenance({"hermes_home": [home], "prune_days": 0.5, "zombie_days": 0.5})["profiles"][0]
    assert more["status"] == "ok", more["error"]
    assert more["sessions_pruned"] > 0 and more["reclaim"]["action"] == "incremental"
    assert rows(db, "PRAGMA freelist_count") == [(0,)]

    assert file_identity(db) == identity and os.stat(db).st_ino == inode
    assert not os.path.exists(db + "-wal")
    assert db_problems(db) == []
    seen = open_with_release(layout, db, search_word="zebra")
    assert seen["hits"] > 0 and set(seen["sessions"]) <= expected["kept"]
