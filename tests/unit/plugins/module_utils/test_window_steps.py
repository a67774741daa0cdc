"""The service window's remaining steps and what check mode reports before one.

Files built by Hermes's real releases: a 0.19.0 WAL file that a clean close left without its
``-wal`` (check mode reads such a file ``immutable``, and must still report WAL, writing nothing).
"""

import os
import sqlite3

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_engine import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_inventory import store_facts
from hermes_fixtures import layout_available, make_big_home, missing_venv_message

WAL_RELEASE = "hermes-0.19.0"
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
