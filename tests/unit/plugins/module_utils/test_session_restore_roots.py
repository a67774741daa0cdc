# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sessions back from a whole-file backup root holds in its own directory (the off-site fetch's
/var/lib/hermes-ops/offsite-restore/USER/: 0700, the file 0600, root's), as root on a user's file.

The restore works in the file owner's process, which cannot open root's copy: root opens it
and the owner's process reads that descriptor into a private copy in the backup directory,
removed afterwards (check mode too). root's copy is left as it was; a copy others can write
is refused before anything is read.
"""

import os
import shutil
import sqlite3
import time

import pytest
from hermes_reliability import chown_tree, user_with_dir

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.whole_file import backup_name
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import (
    WORK_PREFIX,
    restore_selected,
    selection,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import build_home

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="root restores a user's file")]

USER = "hermes-ops-u40r"
KEPT = {"id": "kept", "source": "cli", "started_days_ago": 2, "ended_days_ago": 1, "messages": 2}
GONE = {"id": "gone", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3}


def _ids(db):
    with sqlite3.connect("file:%s?mode=ro" % db, uri=True) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM sessions")}


@pytest.fixture
def site():
    with user_with_dir(USER, USER + "-") as (uid, gid, base):
        home = base / "home" / ".hermes"
        db = build_home(str(home), "v30", [KEPT])
        (home / "backups").mkdir()
        chown_tree(base / "home", uid, gid)
        os.chmod(str(base / "home"), 0o700)
        # root's directory, as the off-site fetch leaves it; the backup holds both sessions
        fetched = base / "offsite-restore"
        fetched.mkdir(mode=0o700)
        source = build_home(str(base / "source"), "v30", [KEPT, GONE])
        backup = fetched / backup_name("default", time.time() - 60)
        shutil.copyfile(source, backup)
        backup.chmod(0o600)
        yield {"home": str(home), "db": db, "backup": str(backup), "uid": uid}


def test_root_fetched_backup_restores_through_roots_descriptor(site):
    before = open(site["backup"], "rb").read()
    assert os.stat(site["db"]).st_uid == site["uid"] and os.stat(site["backup"]).st_uid == 0
    chosen = selection(sessions=["gone"])
    plan = restore_selected(site["home"], "default", backup=site["backup"], select=chosen, check_mode=True)
    assert plan["sessions_restored"] == 1 and plan["backup"]["path"] == site["backup"]
    assert _ids(site["db"]) == {"kept"}
    done = restore_selected(site["home"], "default", backup=site["backup"], select=chosen)
    assert (done["sessions_restored"], done["messages_restored"]) == (1, 3)
    assert _ids(site["db"]) == {"kept", "gone"}
    backups = os.path.join(site["home"], "backups")
    assert not [n for n in os.listdir(backups) if n.startswith(WORK_PREFIX)]  # the private copy is gone
    assert open(site["backup"], "rb").read() == before
    st = os.stat(site["backup"])
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)


def test_root_copy_others_can_write_is_refused(site):
    os.chmod(site["backup"], 0o666)
    with pytest.raises(MaintenanceError, match="writable by others"):
        restore_selected(site["home"], "default", backup=site["backup"], select=selection(sessions=["gone"]))
    assert _ids(site["db"]) == {"kept"}
