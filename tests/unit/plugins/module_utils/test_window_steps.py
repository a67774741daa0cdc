"""The service window's remaining steps and what check mode reports before one.

Files built by Hermes's real releases: a 0.19.0 WAL file that a clean close left without its
``-wal`` (check mode reads such a file ``immutable``, and must still report WAL, writing nothing);
a 0.19.0 file (inline FTS) that the real 0.22.2 gateway opened, migrated and flagged for its
``optimize-storage``, which the window runs beside that gateway, as the file's owner (a test user:
root never runs the Hermes account's code), once.
"""

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hermes_gateway import (
    StubModel,
    free_port,
    gateway_missing,
    gateway_pid,
    healthy,
    supervisor_stop,
    wait_settled,
    warm_up,
    write_gateway_config,
)
from hermes_releases import hermes_python_for
from hermes_reliability import chown_tree, db_problems, user_with_dir
from hermes_reliability import query as q

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.storage_upgrade import (
    run_storage_upgrade,
    storage_upgrade_pending,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.host.profiles import run_as_owner
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.plan.inventory import store_facts
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import hermes_python, layout_available, make_big_home, missing_venv_message, open_with_release

WAL_RELEASE, RELEASE = "hermes-0.19.0", "hermes-0.22.2.post1"
USER = "hermes-ops-t1"
GATEWAY_SCRIPT = str(Path(__file__).resolve().parents[4] / "tests" / "lib" / "hermes_gateway.py")
pytestmark = [pytest.mark.slow, pytest.mark.releases]


def _release_home(tmp_path, layout, sessions=20, messages=4):
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    home = str(tmp_path / layout)
    return home, str(make_big_home(home, layout, sessions, messages, old_fraction=0.5, seed=3))


def _listing(home):
    """Every file under ``home`` with its size and modification time: what a write would change."""
    seen = {}
    for root, _dirs, files in os.walk(home):
        for name in files:
            st = os.stat(os.path.join(root, name))
            seen[os.path.join(root, name)] = (st.st_size, st.st_mtime_ns)
    return seen


def test_check_mode_reports_wal_on_a_wal_file_with_no_wal_sidecar(tmp_path):
    home, db = _release_home(tmp_path, WAL_RELEASE)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # the release made it WAL
    conn.close()  # the last connection's close checkpoints and removes the sidecars
    assert not os.path.exists(db + "-wal") and not os.path.exists(db + "-shm")
    before = _listing(home)

    result = run_maintenance({"hermes_home": [home], "prune_days": 7, "batch_pause": 0}, check_mode=True)

    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile
    assert profile["preflight"]["journal_mode"] == "wal", profile["preflight"]
    assert store_facts(db)["journal_mode"] == "wal"
    assert _listing(home) == before  # nothing written, no sidecar created


def _meta(db):
    return dict(q(db, "SELECT key, value FROM state_meta WHERE key LIKE 'fts_%'"))


def _user_venvs(base):
    """A venv directory the test user can run (HERMES_VENV_DIR): the release's packages under the
    system python3 (hermes_python_for), its ``hermes`` script beside it; the real venv's python is
    under /root here."""
    bin_dir = base / "venvs" / RELEASE / "bin"
    bin_dir.mkdir(parents=True)
    shutil.move(hermes_python_for(RELEASE, str(bin_dir)), str(bin_dir / "python"))
    shutil.copyfile(str(Path(hermes_python(RELEASE)).parent / "hermes"), str(bin_dir / "hermes"))
    return str(base / "venvs"), str(bin_dir / "python")


def _as_user(venvs, action, home):
    """The supervisor of tests/lib/hermes_gateway.py run as the test user: a gateway_*_command."""
    return ["/usr/sbin/runuser", "-u", USER, "--", "/usr/bin/env", "HERMES_VENV_DIR=%s" % venvs,
            "/usr/bin/python3", GATEWAY_SCRIPT, action, str(home)]  # fmt: skip


@pytest.mark.skipif(gateway_missing(RELEASE) is not None, reason=str(gateway_missing(RELEASE)))
def test_window_runs_hermes_optimize_storage_once_beside_the_real_gateway():
    if not layout_available(WAL_RELEASE):
        pytest.skip(missing_venv_message(WAL_RELEASE))
    with user_with_dir(USER, "hermes-ops-optimize-storage-") as (uid, gid, base), StubModel() as model:
        home = base / "home"
        db = str(make_big_home(str(home), WAL_RELEASE, 200, 20, old_fraction=0.5, seed=11))
        venvs, python = _user_venvs(base)
        port = free_port()
        write_gateway_config(home, model.url, port)
        chown_tree(home, uid, gid)
        options = dict(
            hermes_home=[str(home)], allow_unknown_schema=True, prune_days=7, hermes_python=python,
            gateway_stop_command=_as_user(venvs, "stop", home), gateway_start_command=_as_user(venvs, "start", home),
        )  # fmt: skip
        try:
            subprocess.run(_as_user(venvs, "start", home), check=True, timeout=120)
            warm_up(port)
            wait_settled(db)  # the 0.22.2 gateway migrated the 0.19 file and flagged its FTS upgrade
            assert _meta(db).get("fts_optimize_available") == "1", _meta(db)
            assert "tool_name" not in q(db, "SELECT sql FROM sqlite_master WHERE name = 'messages_fts'")[0][0]
            pid_before = gateway_pid(home)

            check = run_maintenance(options, check_mode=True)
            predicted = check["profiles"][0]
            assert predicted["status"] == "ok", predicted["error"]
            window = predicted["window"]
            assert window["opened"] and "optimize_storage" in window["steps"], window
            assert window["steps"][: window["steps"].index("optimize_storage")] in ([], ["backup"]), window
            assert _meta(db).get("fts_optimize_available") == "1"  # check mode ran nothing
            assert any("would open for" in line and "optimize_storage" in line for line in check["summary"]), check

            began = time.monotonic()
            result = run_maintenance(options)
            took = time.monotonic() - began
            profile = result["profiles"][0]
            assert profile["status"] == "ok", profile["error"]
            window = profile["window"]
            assert window["opened"] and window["gateway_back"] and "optimize_storage" in window["done"], window
            assert 0 < window["downtime_s"] <= 120, window
            meta = _meta(db)
            assert meta.get("fts_storage_version") == "3" and "fts_optimize_available" not in meta, meta
            assert "tool_name" in q(db, "SELECT sql FROM sqlite_master WHERE name = 'messages_fts'")[0][0]
            kept = q(db, "SELECT COUNT(*) FROM messages")[0][0]
            assert kept == profile["after"]["messages"] > 0  # nothing lost beyond the prune
            assert q(db, "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'zebra'")[0][0] > 0
            assert db_problems(db) == []
            assert os.stat(db).st_uid == uid
            assert gateway_pid(home) not in (None, pid_before) and healthy(port)
            assert any("optimize_storage" in line for line in result["summary"]), result["summary"]

            again = run_maintenance(options)["profiles"][0]  # nothing left to do: not repeated
            assert again["status"] == "ok", again["error"]
            assert "optimize_storage" not in (again["window"] or {}).get("steps", []), again["window"]
            sys.stdout.write(
                "\noptimize-storage in the window: %d messages kept, run %.1f s, downtime %.1f s (estimate %.0f s),"
                " state.db %d -> %d bytes; steps %s; the next run's window: %s\n"
                % (kept, took, window["downtime_s"], window["estimate_s"], profile["before"]["db_bytes"],
                   profile["after"]["db_bytes"], window["done"], again["window"])
            )  # fmt: skip
        finally:
            supervisor_stop(home)


def test_optimize_storage_interrupted_at_the_bound_resumes_and_refuses_root():
    """The step alone, as the file's owner (a test user): SIGINT at the deadline leaves Hermes's own
    resume markers, which the plan sees as work left; the next run finishes it; root is refused."""
    if not layout_available(WAL_RELEASE):
        pytest.skip(missing_venv_message(WAL_RELEASE))
    with user_with_dir(USER, "hermes-ops-optimize-bound-") as (uid, gid, base):
        home = base / "home"
        # 12,000 messages: Hermes may run on past SIGINT (a chunk that swallows it), so the whole
        # upgrade must take longer than the cut plus STOP_GRACE, or the "cut" run can end done
        db = str(make_big_home(str(home), WAL_RELEASE, 600, 20, old_fraction=0.0, seed=12))
        assert open_with_release(RELEASE, db)["schema_version"] == 31  # migrated and flagged
        messages = q(db, "SELECT COUNT(*) FROM messages")[0][0]
        chown_tree(home, uid, gid)
        _venvs, python = _user_venvs(base)
        with sqlite3.connect("file:%s?mode=ro" % db, uri=True) as conn:
            assert storage_upgrade_pending(conn) == "state_meta.fts_optimize_available"
        with pytest.raises(MaintenanceError, match="root never runs code from the Hermes account"):
            run_storage_upgrade(python, str(home), db, time.time() + 60, vacuum=True)

        # 3 s: well inside the FTS phases even on a machine twice as fast; a cut before Hermes runs
        # leaves the flag, which counts as work left too
        cut = run_as_owner(uid, run_storage_upgrade, python, str(home), db, time.time() + 3.0, True)
        assert not cut["done"] and "interrupted at the bound" in cut["reason"], cut
        with sqlite3.connect("file:%s?mode=ro" % db, uri=True) as conn:  # its markers, or the flag (cut early)
            left = storage_upgrade_pending(conn)
        assert left is not None and db_problems(db) == []
        done = run_as_owner(uid, run_storage_upgrade, python, str(home), db, time.time() + 600, True)
        assert done["done"] and done["reason"] is None, done
        assert _meta(db).get("fts_storage_version") == "3"
        assert q(db, "SELECT COUNT(*) FROM messages")[0][0] == messages
        assert open_with_release(RELEASE, db)["hits"] > 0 and db_problems(db) == []
        sys.stdout.write("\noptimize-storage: cut after %.1f s (left: %s), finished in %.1f s (%d messages)\n"
                         % (cut["seconds"], left, done["seconds"], messages))  # fmt: skip
