"""0.22.2's /heartbeat and /loop schedules (state_meta ``heartbeat:<sid>``, ``loop:<sid>``), written by
the release's own functions: the store stays fully known, an active schedule keeps its session
(named in ``sessions_kept``, by check mode alike), and a paused, done or cleared one is left as the
release's own prune_sessions leaves it when the session goes (docs/compatibility.md)."""

import contextlib
import json
import sqlite3
import time

import pytest
from hermes_markers import release_module_marks
from hermes_reliability import query as rows

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune import PruneResult, prune
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import normalize_options
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.plan.selection import build_plan
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import open_rw
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.catalogue import (
    fully_known,
    read_catalogue,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.schema import inspect_schema
from hermes_fixtures import build_home, hermes_python, run_release_code

LAYOUT = "hermes-0.22.2.post1"
pytestmark = release_module_marks("0.22.2.post1")

OLD = dict(started_days_ago=40, ended_days_ago=39, messages=3)
SPECS = [dict(id=sid, **OLD) for sid in ("hb-on", "hb-paused", "hb-reset", "loop-on", "loop-done", "plain")]
OPTS = {"prune_days": 30, "backup": False}

# The release's own writers: HeartbeatManager.set/pause, the reset's stop (an empty value, as the
# gateway's _promote_session_reset writes it through set_meta), LoopManager.set and a finished loop.
SCHEDULE = r"""
import sys
from hermes_cli import heartbeat, loops
from hermes_cli.goals import _get_session_db
heartbeat.HeartbeatManager("hb-on").set("check the build", 3600)
heartbeat.HeartbeatManager("hb-paused").set("check the build", 3600)
heartbeat.HeartbeatManager("hb-paused").pause()
heartbeat.HeartbeatManager("hb-reset").set("check the build", 3600)
_get_session_db().set_meta("heartbeat:hb-reset", "")
loops.LoopManager("loop-on").set("poll the queue", interval_seconds=600)
loops.save_loop("loop-done", loops.LoopState(prompt="poll the queue", status="done"))
_get_session_db().close()
"""


@pytest.fixture()
def home(tmp_path):
    build_home(str(tmp_path), LAYOUT, SPECS)
    db = tmp_path / "state.db"
    proc = run_release_code(hermes_python(LAYOUT), SCHEDULE, db)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path


def _meta(db):
    return dict(rows(db, "SELECT key, value FROM state_meta WHERE key LIKE 'heartbeat:%' OR key LIKE 'loop:%'"))


def test_release_schedules_are_known_and_an_active_one_keeps_its_session(home):
    db = home / "state.db"
    before = _meta(db)
    assert json.loads(before["heartbeat:hb-on"])["status"] == "active"
    assert json.loads(before["heartbeat:hb-paused"])["status"] == "paused"
    assert before["heartbeat:hb-reset"] == ""
    assert json.loads(before["loop:loop-on"])["status"] == "active"
    assert json.loads(before["loop:loop-done"])["status"] == "done"
    with contextlib.closing(sqlite3.connect(str(db))) as conn:
        catalogue = read_catalogue(conn)
    assert fully_known(catalogue), catalogue["unknown"]

    kept = {
        "hb-on": "an active /heartbeat schedule (state_meta heartbeat:hb-on)",
        "loop-on": "an active /loop schedule (state_meta loop:loop-on)",
    }
    checked = run_maintenance(dict(OPTS, hermes_home=[str(home)]), check_mode=True)["profiles"][0]
    assert checked["status"] == "ok", checked["error"]
    assert {k["session"]: k["reason"] for k in checked["sessions_kept"]} == kept
    assert checked["sessions_pruned"] == 4

    ran = run_maintenance(dict(OPTS, hermes_home=[str(home)]))["profiles"][0]
    assert ran["status"] == "ok", ran["error"]
    assert {k["session"]: k["reason"] for k in ran["sessions_kept"]} == kept
    assert {r[0] for r in rows(db, "SELECT id FROM sessions")} == {"hb-on", "loop-on"}
    assert _meta(db) == before  # left as the release's prune_sessions leaves them


def test_a_schedule_set_after_the_plan_keeps_its_session(home):
    """The check inside the deleting transaction sees a /heartbeat set since the plan."""
    db = home / "state.db"
    conn = open_rw(str(db), 5.0)
    try:
        schema = inspect_schema(conn, str(home))
        schema["catalogue"] = read_catalogue(conn)
        plan = build_plan(
            conn, schema, normalize_options({"prune_days": 30, "zombie_days": 1, "zombie_sources": []}), time.time(), ""
        )
        assert "plain" in plan.delete_order
        code = "from hermes_cli import heartbeat\nheartbeat.HeartbeatManager('plain').set('ping', 60)\n"
        proc = run_release_code(hermes_python(LAYOUT), code, db)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = prune(conn, plan, schema, batch_size=100, pause=0.0, result=PruneResult())
    finally:
        conn.close()
    assert "plain" in result.left_alone
    assert rows(db, "SELECT id FROM sessions WHERE id = 'plain'") == [("plain",)]
