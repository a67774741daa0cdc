"""Permissions: run as root on homes owned by Hermes users (root only; CI runs as root).

* every file the run creates (lock, -wal/-shm, backups, the backup directory) belongs to
  the owner of the state.db, backups are 0600 and directories 0700, state.db stays 0600
  (also through a full VACUUM);
* one run over two users' homes writes no file of one user as the other; a backup
  directory owned by another user is refused, the database left byte-identical;
* a state.db its owner cannot read is named in a clear error, the other profile is still
  maintained;
* the scheduled runner refuses root on a home another user owns unless told to.

The test users (``hermes-ops-t1``, ``hermes-ops-t2``) are created when absent.
"""

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys

import pytest
from hermes_reliability import (
    COLLECTIONS_ROOT,
    REPO_ROOT,
    chown_tree,
    digest,
    ensure_user,
    files_not_owned_by,
    need_root,
    world_traversable_dir,
)

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes import runner as hermes_runner
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import deleter as maintain_deleter
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from hermes_fixtures import build_home

# Switches users and chowns: root only.
pytestmark = [pytest.mark.root]

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3, "transcripts": True},
    {"id": "zombie", "source": "cli", "started_days_ago": 3, "messages": 2, "last_message_days_ago": 2},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def mode(path):
    return stat.S_IMODE(os.lstat(str(path)).st_mode)


def make_user_home(parent, user, profiles=("default",)):
    """A Hermes home owned by ``user``: dirs 0700, state.db 0600, as Hermes leaves them."""
    uid, gid = ensure_user(user)
    home = parent / user
    for profile in profiles:
        build_home(str(home), "v30", SPECS, profile=None if profile == "default" else profile)
    chown_tree(home, uid, gid)
    for dirpath, _dirs, filenames in os.walk(str(home)):
        os.chmod(dirpath, 0o700)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o600)
    return home, uid, gid


@pytest.fixture
def parent():
    need_root()
    path = world_traversable_dir("hermes-ops-perm-")
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def test_root_run_creates_only_owner_files_with_private_modes(parent, monkeypatch):
    home, uid, _gid = make_user_home(parent, "hermes-ops-t1", profiles=("default", "work"))
    seen_dir = world_traversable_dir("hermes-ops-seen-")
    os.chmod(str(seen_dir), 0o1777)
    real_prune = maintain_deleter.prune

    def prune_and_look(conn, plan, *args, **kwargs):
        """Mid-run, in the worker: which uid is working, and who owns the sidecars it opened."""
        db = conn.execute("PRAGMA database_list").fetchone()[2]
        names = [n for n in os.listdir(os.path.dirname(db)) if n.startswith("state.db")]
        seen = {n: os.lstat(os.path.join(os.path.dirname(db), n)).st_uid for n in names}
        with open(os.path.join(str(seen_dir), "%d.json" % os.getpid()), "w") as out:
            json.dump({"euid": os.geteuid(), "files": seen, "db": db}, out)
        return real_prune(conn, plan, *args, **kwargs)

    monkeypatch.setattr(maintain_deleter, "prune", prune_and_look)
    try:
        result = run_maintenance(
            {"prune_days": 7, "hermes_home": [str(home)], "vacuum_mode": "full", "backup_compress": False}
        )
        looks = [json.loads((seen_dir / n).read_text()) for n in os.listdir(str(seen_dir))]
    finally:
        subprocess.run(["rm", "-rf", str(seen_dir)], check=False)
    assert not result["failed"], result["summary"]
    assert {p["name"] for p in result["profiles"]} == {"default", "work"}
    assert all(p["sessions_pruned"] == 1 and p["reclaim"]["action"] == "full" for p in result["profiles"])
    assert len(looks) == 2
    for look in looks:
        assert look["euid"] == uid, "the worker did not switch to the owner"
        assert {"state.db", "state.db-wal", "state.db-shm", "state.db.auto-maintenance.lock"} <= set(look["files"])
        assert set(look["files"].values()) == {uid}, look
    assert files_not_owned_by(home, uid) == []
    backups = home / "backups"
    assert mode(backups) == 0o700
    made = sorted(os.listdir(str(backups)))
    assert len(made) == 2 and all(n.startswith("hermes-ops_") for n in made)
    assert all(mode(backups / n) == 0o600 for n in made)
    for db in (home / "state.db", home / "profiles" / "work" / "state.db"):
        assert mode(db) == 0o600, "%s is %o after a full VACUUM" % (db, mode(db))
        lock = str(db) + ".auto-maintenance.lock"
        assert mode(lock) == 0o600


def test_two_users_never_write_each_others_files(parent):
    home1, uid1, gid1 = make_user_home(parent, "hermes-ops-t1")
    home2, uid2, gid2 = make_user_home(parent, "hermes-ops-t2")
    # A profile of user 2 inside user 1's home: worked on as user 2, and it may not
    # write into user 1's backup directory.
    build_home(str(home1), "v30", SPECS, profile="visitor")
    visitor = home1 / "profiles" / "visitor"
    chown_tree(visitor, uid2, gid2)
    os.chown(str(home1 / "profiles"), uid1, gid1)
    for path in (home1, home1 / "profiles"):  # user 2 may pass through to its profile
        os.chmod(str(path), 0o711)
    os.chmod(str(visitor / "state.db"), 0o600)
    visitor_before = digest(visitor / "state.db")
    result = run_maintenance({"prune_days": 7, "hermes_home": [str(home1), str(home2)]})
    by = {(p["home"], p["name"]): p for p in result["profiles"]}
    assert by[(str(home1), "default")]["status"] == "ok" and by[(str(home2), "default")]["status"] == "ok"
    refused = by[(str(home1), "visitor")]
    assert refused["status"] == "failed"
    assert "owned by uid %d, not by the owner of state.db (uid %d)" % (uid1, uid2) in refused["error"]
    assert digest(visitor / "state.db") == visitor_before
    assert files_not_owned_by(home2, uid2) == []
    assert files_not_owned_by(visitor, uid2) == []
    others = [p for p in files_not_owned_by(home1, uid1) if not p.startswith(str(visitor))]
    assert others == []


def test_backup_dir_of_another_user_refused(parent):
    home, uid, _gid = make_user_home(parent, "hermes-ops-t1")
    build_home(str(home), "v30", SPECS, profile="mine")
    chown_tree(home / "profiles", uid, uid)
    other_uid, other_gid = ensure_user("hermes-ops-t2")
    theirs = parent / "their-backups"
    theirs.mkdir(mode=0o700)
    os.chown(str(theirs), other_uid, other_gid)
    before = digest(home / "state.db")
    result = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "backup_dir": str(theirs)})
    for profile in result["profiles"]:
        assert profile["status"] == "failed"
        assert "backup directory %s is owned by uid %d" % (theirs, other_uid) in profile["error"]
    assert digest(home / "state.db") == before
    assert os.listdir(str(theirs)) == []


def test_unreadable_state_db_named_others_maintained(parent):
    home, uid, gid = make_user_home(parent, "hermes-ops-t1", profiles=("default", "locked"))
    locked = home / "profiles" / "locked" / "state.db"
    os.chmod(str(locked), 0o000)
    before = digest(locked)
    for check in (True, False):
        by = {
            p["name"]: p
            for p in run_maintenance({"prune_days": 7, "hermes_home": [str(home)]}, check_mode=check)["profiles"]
        }
        assert by["locked"]["status"] == "failed"
        assert str(locked) in by["locked"]["error"] and "permission denied" in by["locked"]["error"]
        assert by["default"]["status"] == "ok" and by["default"]["sessions_pruned"] == 1
    assert digest(locked) == before and mode(locked) == 0
    assert sorted(os.listdir(str(locked.parent))) == ["sessions", "state.db"]  # no lock, no sidecar


def _as(uid):
    """subprocess's ``user=``/``group=`` need Python 3.9; this works on the 3.8 of the matrix too."""

    def switch():
        os.setgroups([])
        os.setgid(pwd.getpwuid(uid).pw_gid)
        os.setuid(uid)

    return {"preexec_fn": switch}


def _python_for(uid):
    """An interpreter the user can run: this one, or the system python3 (the engine is stdlib only)."""
    try:
        subprocess.run([sys.executable, "-c", "import _strptime"], capture_output=True, check=True, **_as(uid))
        return sys.executable
    except (OSError, subprocess.CalledProcessError):
        return "/usr/bin/python3"


def _engine_for_users(parent):
    """The engine and runner where another user can read them, as the role installs them on a
    host: the checkout itself may sit in a directory only root can enter (``mktemp -d``)."""
    root = parent / "code"
    dest = root / "ansible_collections" / "hermes_agent" / "ops" / "plugins" / "module_utils"
    shutil.copytree(str(REPO_ROOT / "plugins" / "module_utils"), str(dest))
    for dirpath, _dirs, _files in os.walk(str(root)):
        os.chmod(dirpath, 0o755)
    return root


def _runner(config, *args, user=None, python=sys.executable, code_root=COLLECTIONS_ROOT):
    cmd = [
        python,
        "-c",
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.runner import main; "
        "sys.exit(main(sys.argv[2:]))",
        str(code_root),
        "--config",
        str(config),
        "--json",
    ] + list(args)
    kwargs = _as(user) if user is not None else {}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/", check=False, **kwargs)


def test_runner_refuses_root_on_a_foreign_home_unless_told(parent):
    home, uid, gid = make_user_home(parent, "hermes-ops-t1")
    config = parent / "maintenance.json"
    config.write_text(json.dumps({"prune_days": 7, "hermes_home": [str(home)], "syslog": False}))
    os.chmod(str(config), 0o644)
    before = digest(home / "state.db")
    refused = _runner(config)
    assert refused.returncode == hermes_runner.EXIT_CONFIG, refused.stderr
    assert "refusing to run as root on %s" % home in refused.stderr and "hermes-ops-t1" in refused.stderr
    assert digest(home / "state.db") == before and sorted(os.listdir(str(home))) == ["sessions", "state.db"]
    # This interpreter may live where the Hermes user cannot run it (a Python under /root);
    # the engine is standard library only, so the system python3 does as well.
    as_user = _runner(config, user=uid, python=_python_for(uid), code_root=_engine_for_users(parent))
    assert as_user.returncode == 0, as_user.stderr
    assert json.loads(as_user.stdout)["profiles"][0]["sessions_pruned"] == 1
    told = _runner(config, "--allow-root")
    assert told.returncode == 0, told.stderr
    assert files_not_owned_by(home, uid) == []
