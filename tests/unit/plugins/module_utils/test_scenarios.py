"""Every selection rule, on files made by real Hermes releases and by the v2/v30 layouts.

Each case runs the whole cycle an operator runs: check mode (predicts, changes no byte,
creates no file), the real run (does exactly what was predicted), a second run (no
change), then the Hermes release that made the file opens, lists and searches it.
"""

import hashlib
import os
import sqlite3
import stat

import pytest
from hermes_reliability import query as rows

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_engine import run_maintenance
from hermes_fixtures import (
    LAYOUT_FEATURES,
    LAYOUTS,
    build_home,
    layout_available,
    missing_venv_message,
    open_with_release,
    standard_scenario,
)

COUNTS = ("zombies_closed", "sessions_pruned", "messages_pruned", "sessions_orphaned", "transcripts_removed")


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


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
    result = run_maintenance({"hermes_home": [home]}, check_mode=True)
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
    predicted = run_maintenance({"hermes_home": [home]}, check_mode=True)["profiles"][0]
    pre_rows = rows(db, "SELECT id, started_at FROM sessions")
    inode = os.stat(db).st_ino
    result = run_maintenance({"hermes_home": [home]})
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert {k: profile[k] for k in COUNTS} == {k: predicted[k] for k in COUNTS}
    assert profile["prompts_collected"] == expected["prompts_collected"]
    assert os.stat(db).st_ino == inode, "state.db must never be replaced"

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

    again = run_maintenance({"hermes_home": [home]})
    assert again["changed"] is False, again["profiles"][0]
    assert run_maintenance({"hermes_home": [home]}, check_mode=True)["changed"] is False


@pytest.mark.releases
def test_release_still_reads_the_file(scenario, tmp_path):
    layout, home, db, specs, expected = scenario
    run_maintenance({"hermes_home": [home]})
    release = layout if layout.startswith("hermes-") else "hermes-0.19.0"
    if not layout_available(release):
        pytest.skip(missing_venv_message(release))
    if not layout.startswith("hermes-"):
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
