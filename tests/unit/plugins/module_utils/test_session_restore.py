"""The restore of archived sessions honours the locks maintenance honours.

On a file the real Hermes 0.22.2 wrote (rollback-journal mode), pruned beside a 0.22.2 holder so
that the run took an archive: while Hermes 0.22.2 itself holds its repair, quarantine or
FTS-rebuild lock (its own functions, in a process of its own), or while a maintenance run holds
``state.db.auto-maintenance.lock``, ``restore_from_archive`` refuses, naming the lock, and
restores nothing, in check mode too; once the lock is gone it restores.
"""

import os
import shutil
import sqlite3

import pytest
from hermes_locks import hold_hermes_lock
from hermes_markers import release_module_marks
from hermes_reliability import full_rows
from hermes_rollback import RELEASE, make_big_rollback_home
from hermes_writer import WriterProcess

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.host.profiles import ProfileLock
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import restore_from_archive
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import hermes_python

# Like the other modules that keep a real 0.22.2 writer on a rollback-journal file: slow, so
# the SQLite legs leave them out (on a fixed SQLite, 0.22 turns the file to WAL and the run
# takes a whole-file backup instead of the archive these tests restore from).
pytestmark = release_module_marks(RELEASE)


@pytest.fixture
def archived(tmp_path):
    """(home, db, archive name): 10 of 20 sessions pruned into an archive beside a 0.22.2 holder."""
    home = tmp_path / "home"
    db = make_big_rollback_home(home, 20, 6, seed=9)
    writer = WriterProcess(hermes_python(RELEASE), db, str(tmp_path / "writer.jsonl"), prefix="lock-gw")
    writer.start()
    try:
        profile = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "allow_unknown_schema": True})[
            "profiles"
        ][0]
    finally:
        assert writer.stop()["failed"] == 0
    assert profile["backup"]["kind"] == "archive" and profile["sessions_pruned"] == 10, profile
    return str(home), db, os.path.basename(profile["backup"]["path"])


@pytest.mark.parametrize(
    "which, operation",
    [("repair", "a schema repair"), ("quarantine", "a quarantine of a damaged file"),
     ("fts_rebuild", "a full-text index rebuild")],
)  # fmt: skip
def test_a_held_hermes_operation_lock_refuses_the_restore(archived, which, operation):
    home, db, archive = archived
    before = full_rows(db)
    holder = hold_hermes_lock(db, which)
    try:
        for check_mode in (True, False):
            with pytest.raises(MaintenanceError) as refused:
                restore_from_archive(home, "default", archive, check_mode=check_mode)
            assert operation in str(refused.value) and "%s.%s.lock" % (db, which) in str(refused.value)
            assert "nothing was restored" in str(refused.value)
    finally:
        holder.communicate("", timeout=30)
    assert full_rows(db) == before
    done = restore_from_archive(home, "default", archive, pause=0)
    assert done["sessions_restored"] == 10 and len(full_rows(db)) == len(before) + 10


def test_a_maintenance_run_holding_the_profile_lock_refuses_the_restore(archived):
    home, db, archive = archived
    before = full_rows(db)
    with ProfileLock(str(db), check_mode=False):  # what a maintenance run (or Hermes's auto-maintenance) holds
        with pytest.raises(MaintenanceError) as refused:
            restore_from_archive(home, "default", archive)
    assert "state.db.auto-maintenance.lock is held by a maintenance run" in str(refused.value)
    assert full_rows(db) == before
    assert restore_from_archive(home, "default", archive, pause=0)["sessions_restored"] == 10


def test_an_archive_lacking_a_column_the_file_requires_is_refused(archived):
    """Columns are matched by name; a NOT NULL column without default that the archive lacks cannot be filled."""
    home, db, archive = archived
    path = os.path.join(home, "backups", archive)
    lacking = path.replace(".db", "-1.db")
    shutil.copyfile(path, lacking)
    conn = sqlite3.connect(lacking)
    conn.execute("ALTER TABLE sessions DROP COLUMN source")  # an older layout without it
    conn.commit()
    conn.close()
    before = full_rows(db)
    for check_mode in (True, False):
        with pytest.raises(MaintenanceError) as refused:
            restore_from_archive(home, "default", os.path.basename(lacking), check_mode=check_mode)
        assert "sessions.source (NOT NULL, no default) is not in the archive; nothing was restored" in str(
            refused.value
        )
    assert full_rows(db) == before
