"""Backups: verified, private, named by profile and time, and retention that touches only our files."""

import errno
import gzip
import os
import sqlite3
import stat
import time

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.whole_file import (
    apply_retention,
    backup_name,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from hermes_fixtures import build_home

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]
DAY = 86400


def test_gzip_backup_decompresses_to_the_pre_run_database(tmp_path):
    build_home(str(tmp_path), "v30", SPECS, profile="work")
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "backup_compress": True})["profiles"][0]
    backup = profile["backup"]
    assert backup["path"].endswith(".db.gz") and "hermes-ops_work_" in os.path.basename(backup["path"])
    assert backup["path"].startswith(str(tmp_path / "backups"))
    assert stat.S_IMODE(os.stat(backup["path"]).st_mode) == 0o600
    plain = tmp_path / "restored.db"
    plain.write_bytes(gzip.open(backup["path"]).read())
    conn = sqlite3.connect(str(plain))
    assert sorted(r[0] for r in conn.execute("SELECT id FROM sessions")) == ["new", "old"]
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",), "a backup stands alone, no -wal"


def test_retention_keeps_newest_and_never_touches_foreign_files(tmp_path):
    now = time.time()
    names = [backup_name("default", now - days * DAY) for days in (0, 10, 40, 50)]
    names.append(backup_name("work", now - 60 * DAY))  # another profile's
    for name in names + ["pre-update-0.19.0.zip", "notes.txt"]:
        (tmp_path / name).write_bytes(b"x")
    removed = apply_retention(str(tmp_path), "default", 30, None, now, None)
    assert sorted(os.path.basename(p) for p in removed) == sorted(names[2:4])
    assert sorted(os.listdir(tmp_path)) == sorted(names[:2] + [names[4], "pre-update-0.19.0.zip", "notes.txt"])
    removed = apply_retention(str(tmp_path), "default", None, 1, now, None)
    assert [os.path.basename(p) for p in removed] == [names[1]]
    # Even when every backup is old, the newest one stays.
    assert apply_retention(str(tmp_path), "work", 1, None, now, None) == []


def test_partial_files_are_invisible_to_retention(tmp_path):
    now = time.time()
    (tmp_path / ("." + backup_name("default", now) + ".partial")).write_bytes(b"half")
    (tmp_path / backup_name("default", now - 100 * DAY)).write_bytes(b"x")
    assert apply_retention(str(tmp_path), "default", 1, None, now, None) == []


def test_backup_interval_takes_a_backup_without_other_changes(tmp_path):
    build_home(str(tmp_path), "v30", SPECS[1:])
    options = {"prune_days": 7, "hermes_home": [str(tmp_path)], "backup_interval_days": 7}
    first = run_maintenance(options)["profiles"][0]
    assert first["backup"] and first["changed"] is True and first["sessions_pruned"] == 0
    second = run_maintenance(options)["profiles"][0]
    assert second["backup"] is None and second["changed"] is False
    assert len(os.listdir(tmp_path / "backups")) == 1


def test_no_change_no_backup(tmp_path):
    build_home(str(tmp_path), "v30", SPECS[1:])
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert profile["changed"] is False and profile["backup"] is None
    assert not (tmp_path / "backups").exists()


def test_backup_off_still_maintains(tmp_path):
    build_home(str(tmp_path), "v30", SPECS)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)], "backup": False})["profiles"][0]
    assert profile["sessions_pruned"] == 1 and profile["backup"] is None


def test_backup_copies_through_a_buffer_where_sendfile_wants_a_socket(tmp_path, monkeypatch):
    """macOS's sendfile only writes to sockets: the byte copy then goes through pread/pwrite."""

    def socket_only(*_args):
        raise OSError(errno.ENOTSOCK, "Socket operation on non-socket")

    monkeypatch.setattr(os, "sendfile", socket_only)
    build_home(str(tmp_path), "v30", SPECS)
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(tmp_path)]})["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["backup"]["copied_by"] == "files" and profile["backup"]["sessions"] == 2
    conn = sqlite3.connect(profile["backup"]["path"])
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert sorted(r[0] for r in conn.execute("SELECT id FROM sessions")) == ["new", "old"]
