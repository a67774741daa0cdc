"""The maintenance connection's settings, against "How To Corrupt An SQLite Database File".

3.2 (sync disabled by PRAGMAs): the connection that writes state.db keeps SQLite's FULL in
rollback-journal mode, where NORMAL can corrupt the file at a badly timed power loss, and uses
NORMAL only in WAL mode, where it can only undo the last commits. 8.2 (switches between
rollback and WAL): a run never changes the file's journal mode, nor leaves a lock or mmap
setting of its own on it.
"""

import sqlite3

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import open_rw
from hermes_fixtures import hermes_python, make_big_home

RELEASES = ("0.19.0", "0.22.2.post1")  # WAL; rollback journal on an SQLite with the WAL-reset bug


@pytest.mark.parametrize("release", RELEASES)
def test_maintenance_connection_settings(release, tmp_path):
    if hermes_python(release) is None:
        pytest.skip("no hermes-%s venv" % release)
    home = tmp_path / "home"
    db = str(make_big_home(home, "hermes-" + release, n_sessions=20, msgs_per_session=4, old_fraction=0.5))
    conn = open_rw(db)
    try:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        # NORMAL in WAL mode; EXTRA (3) in rollback-journal mode: FULL leaves a full VACUUM malformed
        # after a power loss that kept its truncate and lost its journal's deletion (test_powerloss.py)
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == (1 if mode == "wal" else 3)
        assert conn.execute("PRAGMA locking_mode").fetchone()[0] == "normal"
        assert conn.execute("PRAGMA mmap_size").fetchone()[0] == 0
    finally:
        conn.close()
    options = {
        "prune_days": 7,
        "hermes_home": [str(home)],
        "allow_unknown_schema": True,
        "vacuum_mode": "full",
        "vacuum_threshold": 0,
    }
    result = run_maintenance(options)["profiles"][0]
    assert result["status"] == "ok" and result["sessions_pruned"] > 0, result["error"]
    assert result["reclaim"]["action"] == "full"
    check = sqlite3.connect(db)
    try:
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == result["preflight"]["journal_mode"] == mode
    finally:
        check.close()
