"""The filesystem state.db is on, and what the engine does on a network or VM-shared one.

POSIX locks on NFS, SMB, 9p, virtiofs and the like may be missing, broken or local to one
client (sqlite.org/howtocorrupt.html, 2.1), other hosts' processes are not in /proc, and
WAL's index is shared memory nobody on another host shares (Hermes refuses WAL there). The
engine finds the mount from ``/proc/self/mountinfo`` (``filesystem_of``: the mount of the
file's own device, longest mount point first) and on such a filesystem counts the file as
held by processes it cannot see: a rollback-journal file is worked on as beside a live
gateway (archive instead of a whole-file copy, short reads, no full VACUUM), a WAL file is
refused with the reason, and restore refuses unless forced.

The mountinfo texts are real lines of hosts with those mounts; the real mount made here is a
tmpfs (root only), which is local.
"""

import os
import time

import pytest
from hermes_reliability import full_rows, query, tiny_fs

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.whole_file import plan_restore, restore
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite import db as hermes_sqlite_db
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import (
    MaintenanceError,
    filesystem_of,
    holders,
    parse_mountinfo,
    shared_filesystem,
)
from hermes_fixtures import hermes_python, make_big_home

# From real hosts: a Debian VM (ext4 root, a 9p and a virtiofs share), an NFS client, an
# SMB mount with a space in its path, an sshfs, and a container's overlay root.
MOUNTINFO = r"""22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro
24 22 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
26 22 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=4017360k,nr_inodes=1004340,mode=755
31 22 0:26 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,size=806424k,mode=755
40 22 0:35 / /srv/share rw,relatime shared:20 - 9p hostshare rw,sync,dirsync,access=client,trans=virtio
41 22 0:36 / /mnt/virtio rw,relatime shared:21 - virtiofs myfs rw
42 22 0:37 / /home rw,relatime shared:22 - nfs4 fileserver:/export/home rw,vers=4.2,hard,proto=tcp,sec=sys
43 22 0:38 / /mnt/team\040share rw,relatime shared:23 - cifs //nas/team rw,vers=3.1.1,cache=strict,uid=1000,soft
44 42 0:39 / /home/hermes/remote rw,nosuid,nodev,relatime shared:24 - fuse.sshfs hermes@box:/srv rw,user_id=1000
45 22 0:40 / /var/lib/containers/overlay rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
"""


def test_mountinfo_says_which_filesystems_are_shared(tmp_path):
    mounts = parse_mountinfo(MOUNTINFO)
    assert [m["type"] for m in mounts] == [
        "ext4", "proc", "devtmpfs", "tmpfs", "9p", "virtiofs", "nfs4", "cifs", "fuse.sshfs", "overlay",
    ]  # fmt: skip
    assert mounts[7]["mount_point"] == "/mnt/team share"  # \040 unescaped
    # The decision for each mount, through a real directory standing at its mount point: the
    # mountinfo lines are rewritten to the directory's own device and path.
    dev = os.stat(str(tmp_path)).st_dev
    expected = {
        "ext4": None, "tmpfs": None, "overlay": None, "9p": "9p", "virtiofs": "virtiofs", "nfs4": "nfs4",
        "cifs": "cifs", "fuse.sshfs": "fuse.sshfs",
    }  # fmt: skip
    for line in MOUNTINFO.splitlines():
        fields = line.split(" ")
        fstype = line.split(" - ")[1].split()[0]
        if fstype not in expected:
            continue
        fields[2], fields[4] = "%d:%d" % (os.major(dev), os.minor(dev)), str(tmp_path)
        text = "22 1 254:1 / / rw - ext4 /dev/vda1 rw\n" + " ".join(fields) + "\n"
        assert filesystem_of(str(tmp_path), text)["type"] == fstype
        reason = shared_filesystem(str(tmp_path), text)
        if expected[fstype] is None:
            assert reason is None, fstype
        else:
            assert fstype in reason and str(tmp_path) in reason


def test_the_longest_mount_point_of_the_files_own_device_wins(tmp_path):
    dev = os.stat(str(tmp_path)).st_dev
    mine = "%d:%d" % (os.major(dev), os.minor(dev))
    text = (
        "1 0 %s / / rw - ext4 /dev/sda1 rw\n" % mine
        + "2 1 0:99 / %s rw - nfs4 srv:/x rw\n" % tmp_path.parent  # another device: not the file's
        + "3 1 %s / %s rw - nfs srv:/y rw\n" % (mine, tmp_path)
        + "4 1 %s / %s2 rw - cifs //nas/z rw\n" % (mine, tmp_path)  # a prefix of the name, not a parent
    )
    assert filesystem_of(str(tmp_path), text)["type"] == "nfs"
    assert filesystem_of(str(tmp_path), text.replace("nfs srv:/y", "ext4 /dev/sdb1"))["type"] == "ext4"
    # no mount of its device (btrfs subvolumes report their own): the longest prefix alone
    other = text.replace(mine, "0:98")
    assert filesystem_of(str(tmp_path), other)["type"] == "nfs"


def test_this_hosts_own_mounts_are_read():
    fs = filesystem_of("/proc/self/mountinfo")
    assert fs["type"] == "proc" and shared_filesystem("/proc/self/mountinfo") is None


@pytest.mark.root
@pytest.mark.tmpfs
def test_a_home_on_a_real_tmpfs_is_local(tmp_path):
    if hermes_python("0.19.0") is None:
        pytest.skip("no hermes-0.19.0 venv")
    with tiny_fs(64 * 1024) as mnt:
        home = mnt / "home"
        db = str(make_big_home(home, "hermes-0.19.0", n_sessions=20, msgs_per_session=4, old_fraction=0.5))
        assert filesystem_of(db)["type"] == "tmpfs" and filesystem_of(db)["mount_point"] == str(mnt)
        result = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "allow_unknown_schema": True})[
            "profiles"
        ][0]
        assert result["status"] == "ok" and result["preflight"]["shared_filesystem"] is None
        assert result["sessions_pruned"] > 0 and result["backup"]["copied_by"] == "files"


def _as_nfs(tmp_path, home):
    """A mountinfo file that says the home's directory is an NFS mount (its own device and path)."""
    dev = os.stat(str(home)).st_dev
    path = tmp_path / "mountinfo"
    path.write_text(
        "1 0 254:1 / / rw - ext4 /dev/vda1 rw\n"
        "9 1 %d:%d / %s rw,relatime - nfs4 fileserver:/export rw,vers=4.2\n" % (os.major(dev), os.minor(dev), home)
    )
    return str(path)


@pytest.mark.parametrize("release", ["0.19.0", "0.22.2.post1"])  # WAL; rollback journal on SQLite 3.40
def test_on_a_network_filesystem_only_what_is_safe(release, tmp_path, monkeypatch):
    if hermes_python(release) is None:
        pytest.skip("no hermes-%s venv" % release)
    now = time.time()
    home = tmp_path / "home"
    db = str(make_big_home(home, "hermes-" + release, n_sessions=30, msgs_per_session=4, old_fraction=0.5, now=now))
    mode = query(db, "PRAGMA journal_mode")[0][0]
    # a whole-file backup taken while the file is local, for the restore below
    backed = run_maintenance({"hermes_home": [str(home)], "prune_days": 9999, "backup_interval_days": 0})
    assert backed["profiles"][0]["backup"]["kind"] == "file"
    monkeypatch.setattr(hermes_sqlite_db, "MOUNTINFO", _as_nfs(tmp_path, home))
    assert "nfs4" in shared_filesystem(db)
    assert [h["evidence"] for h in holders(db)] == ["filesystem"]
    before = full_rows(db)
    options = {
        "prune_days": 7,
        "hermes_home": [str(home)],
        "allow_unknown_schema": True,
        "vacuum_mode": "full",
        "vacuum_threshold": 0,
    }
    result = run_maintenance(options)["profiles"][0]
    info = gather_info({"prune_days": 7, "hermes_home": [str(home)]})["profiles"][0]
    assert info["status"] == "ok" and info["holders"][0]["evidence"] == "filesystem"
    with pytest.raises(MaintenanceError, match="held open by processes on other hosts"):
        restore(plan_restore(str(home), "default"))
    if mode == "wal":
        assert result["status"] == "failed" and "WAL mode" in result["error"] and "nfs4" in result["error"]
        assert full_rows(db) == before  # nothing changed
        return
    assert result["status"] == "ok", result["error"]
    assert "nfs4" in result["preflight"]["shared_filesystem"] and result["preflight"]["live_rollback"]
    assert result["backup"]["kind"] == "archive" and result["backup_deferred"]  # no whole-file copy
    assert result["reclaim"]["action"] != "full" and "other hosts" in result["reclaim"]["skipped_reason"]
    assert result["sessions_pruned"] > 0
