"""Release matrix, the part test_scenarios.py does not cover: after our maintenance, each
Hermes release resumes and appends, makes children, compression splits and delegates
through its own API, and a second maintenance run leaves all of that alone.

For 0.13.0 / 0.16.0 / 0.19.0 / 0.20.1 / 0.22.2 the release built the file itself (standard
scenario); the upgrade layout (written by 0.19.0, migrated by 0.22.2) is resumed by 0.22.2; the
v2 and v30 layouts are resumed by 0.19.0 on a copy (it migrates older files on open).
"""

import json
import sqlite3

import pytest
from hermes_reliability import db_problems
from hermes_reliability import query as q

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from hermes_fixtures import (
    LAYOUT_FEATURES,
    LAYOUTS,
    build_home,
    hermes_python,
    layout_available,
    missing_venv_message,
    open_with_release,
    release_for,
    run_release_code,
    standard_scenario,
)

# A real Hermes release reopens and appends to the maintained file.
pytestmark = [pytest.mark.releases]

# Runs under the release's python: argv = db path, JSON {"resume": [ids], "append_to": [ids]}.
RELEASE_CODE = r"""
import inspect, json, sys, time
from pathlib import Path
import hermes_state
plan = json.loads(sys.argv[2])
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
out = {"resumed": {}, "appended": {}, "created": [], "tips": {}}
try:
    for sid in plan["resume"]:
        target = db.resolve_resume_session_id(sid) if hasattr(db, "resolve_resume_session_id") else sid
        conv = db.get_messages_as_conversation(target)
        out["resumed"][sid] = [target, len(conv)]
    for sid in plan["append_to"]:
        ended = db.get_session(sid)["ended_at"] is not None
        if ended:
            db.reopen_session(sid)
        ids = [db.append_message(sid, "user", "resumetoken appended to %s" % sid),
               db.append_message(sid, "assistant", "resumetoken reply in %s" % sid)]
        out["appended"][sid] = ids
        if ended:
            db.end_session(sid, "user_exit")
    parent = plan["append_to"][0]
    # a plain child (branch) of a kept session
    child = parent + "-newchild"
    db.create_session(child, "cli", parent_session_id=parent)
    out["appended"][child] = [db.append_message(child, "user", "resumetoken child of %s" % parent)]
    out["created"].append(child)
    # a compression split: the parent ends with 'compression', the continuation goes on
    root = plan["append_to"][1]
    if db.get_session(root)["ended_at"] is None:
        db.end_session(root, "compression")
    else:
        db.reopen_session(root)
        db.end_session(root, "compression")
    time.sleep(0.01)
    cont = root + "-newcont"
    db.create_session(cont, "cli", parent_session_id=root)
    out["appended"][cont] = [db.append_message(cont, "user", "resumetoken continuation of %s" % root)]
    out["created"].append(cont)
    out["tips"][root] = [db.get_compression_tip(root), db.resolve_resume_session_id(root)]
    # a delegate subagent child, where the release tags them
    if plan["delegate"]:
        deleg = parent + "-newdelegate"
        db.create_session(deleg, "subagent", parent_session_id=parent, model_config={"_delegate_from": parent})
        out["appended"][deleg] = [db.append_message(deleg, "assistant", "resumetoken delegate of %s" % parent)]
        db.end_session(deleg, "completed")
        out["created"].append(deleg)
    out["hits"] = len(db.search_messages("resumetoken", limit=1000))
    out["listed"] = [r["id"] for r in db.list_sessions_rich(limit=10000)]
finally:
    db.close()
print(json.dumps(out))
"""


def run_release(release, db, plan):
    proc = run_release_code(hermes_python(release), RELEASE_CODE, db, json.dumps(plan))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def left_ids(db):
    return {r[0] for r in q(db, "SELECT id FROM sessions")}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_release_resumes_and_appends_after_maintenance(layout, tmp_path):
    release = release_for(layout)
    for needed in (layout, release):
        if not layout_available(needed):
            pytest.skip(missing_venv_message(needed))
    home = tmp_path / "home"
    specs, expected = standard_scenario(layout)
    db = build_home(str(home), layout, specs)
    first = run_maintenance({"prune_days": 7, "hermes_home": [str(home)]})["profiles"][0]
    assert first["status"] == "ok", first["error"]
    assert first["sessions_pruned"] == len(expected["pruned"])
    assert db_problems(db) == []

    if layout in ("v2", "v30"):
        # 0.19.0 migrates older files on open: the matrix cell is "0.19.0 on a copy of v2 / v30"
        copy_home = tmp_path / "copy"
        copy_home.mkdir()
        src, dst = sqlite3.connect(str(db)), sqlite3.connect(str(copy_home / "state.db"))
        src.backup(dst)
        src.close()
        dst.close()
        home, db = copy_home, copy_home / "state.db"

    by_id = {s["id"]: s for s in specs}
    kept = sorted(expected["kept"] - expected.get("bad_time", set()))
    with_messages = [s for s in kept if by_id[s].get("messages", 2) > 0]
    # a recently ended one, an open one, then whatever else is kept: resumed and appended to
    ended = [s for s in with_messages if by_id[s].get("ended_days_ago") is not None]
    # (not one a live lease holds: 0.20.0 refuses another writer's append there, as a guard should)
    open_ = [
        s
        for s in with_messages
        if by_id[s].get("ended_days_ago") is None and s not in expected["zombies"] and not by_id[s].get("lease")
    ]
    append_to = (ended[:1] + open_[:1] + [s for s in with_messages if s not in ended[:1] + open_[:1]])[:3]
    plan = {"resume": kept, "append_to": append_to, "delegate": LAYOUT_FEATURES[release]["delegate"]}
    seen = run_release(release, db, plan)

    for sid in with_messages:
        target, n = seen["resumed"][sid]
        assert target in left_ids(db) and n > 0, (sid, target, n)
    root = append_to[1]
    tip, resume_target = seen["tips"][root]
    assert tip == root + "-newcont"
    assert resume_target in (root, tip)  # 0.13.0 resumes a parent that has messages itself
    appended = [i for ids in seen["appended"].values() for i in ids]
    assert seen["hits"] == len(appended)
    assert append_to[0] in seen["listed"]
    assert len(seen["created"]) == (3 if plan["delegate"] else 2)

    # A second maintenance run: the fresh work is recent, nothing of it goes.
    second = run_maintenance({"prune_days": 7, "hermes_home": [str(home)]})["profiles"][0]
    assert second["status"] == "ok", second["error"]
    assert second["zombies_closed"] == 0
    left = left_ids(db)
    assert set(seen["created"]) <= left
    assert set(append_to) <= left
    present = q(db, "SELECT COUNT(*) FROM messages WHERE id IN (SELECT value FROM json_each(?))", json.dumps(appended))
    assert present[0][0] == len(appended)
    assert db_problems(db) == []
    after = open_with_release(release, str(db), search_word="resumetoken")
    assert after["hits"] == len(appended)
    assert set(append_to) <= set(after["sessions"])
