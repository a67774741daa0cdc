# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Off-site pushes to real restic repositories (local paths in a temporary directory).

The push runs as root and must read only the engine's own backups of the profile's user:
the tests plant what a compromised agent could (a link, root's file under a backup's name)
and check that nothing of it reaches the repository.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes import offsite
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import whole_file as backup

RESTIC = shutil.which("restic")
OWNER = 65534  # nobody: the profile's user, not root
HOST = "host1"

pytestmark = [
    # restic's side does not change with the managed node's Python: the matrix legs leave it to units
    pytest.mark.slow,
    pytest.mark.skipif(RESTIC is None, reason="restic is not installed (apt-get install restic)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the push runs as root (it reads another user's backups)"),
]


@pytest.fixture(scope="module")
def empty_repository(tmp_path_factory):
    """One repository initialised (restic's key derivation takes seconds), copied per test."""
    tmp = tmp_path_factory.mktemp("offsite")
    password = tmp / "password"
    password.write_text("correct horse\n")
    password.chmod(0o600)
    tool = offsite.Restic(str(tmp / "repo"), str(password), cache_dir=str(tmp / "cache"))
    assert offsite.init_repository(tool) is True
    assert offsite.init_repository(tool) is False  # there already: left alone
    return tmp


@pytest.fixture
def site(tmp_path, empty_repository):
    password = tmp_path / "password"
    shutil.copy2(empty_repository / "password", password)
    backups = tmp_path / "home" / "backups"
    backups.mkdir(parents=True)
    os.chown(backups, OWNER, OWNER)
    backups.chmod(0o700)
    repo = tmp_path / "repo"
    cache = tmp_path / "cache"
    shutil.copytree(empty_repository / "repo", repo)
    return {"tmp": tmp_path, "password": str(password), "backups": backups, "repo": str(repo), "cache": str(cache)}


def make_backup(backups, profile, when, rows=200, owner=OWNER):
    """A state.db-like SQLite file under the name the engine gives a finished backup."""
    path = backups / backup.backup_name(profile, when)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT)")
    conn.executemany("INSERT INTO messages (content) VALUES (?)", [(os.urandom(200).hex(),) for _row in range(rows)])
    conn.commit()
    conn.close()
    os.chown(path, owner, owner)
    path.chmod(0o600)
    return path


def run_push(site, **kwargs):
    return offsite.push(
        kwargs.pop("repository", site["repo"]),
        kwargs.pop("password_file", site["password"]),
        [str(site["backups"])],
        OWNER,
        "hermes",
        HOST,
        cache_dir=site["cache"],
        **kwargs,
    )


def snapshots(site):
    tool = offsite.Restic(site["repo"], site["password"], cache_dir=site["cache"])
    return tool.run_json(["snapshots"])


def restored(site, snapshot_id, path):
    tool = offsite.Restic(site["repo"], site["password"], cache_dir=site["cache"])
    return subprocess.run(
        [tool.binary, "dump", snapshot_id, "/" + path], env=tool.env, stdout=subprocess.PIPE, check=True
    ).stdout


def test_push_dedup_and_retention(site):
    day = 86400
    now = time.time()
    first = make_backup(
        site["backups"], "default", now - 3 * day, rows=20000
    )  # ~9 MB: several of restic's chunks (1 MiB on average)
    result = run_push(site)
    assert result["status"] == "ok", result
    [pushed] = result["pushed"]
    assert pushed["name"] == first.name and pushed["bytes_added"] > 0
    target = offsite.snapshot_path(HOST, "hermes", "default", first.name)
    assert restored(site, pushed["snapshot"], target) == first.read_bytes()
    [snap] = snapshots(site)
    assert {"hermes-ops", "user=hermes", "profile=default"} <= set(snap["tags"]) and snap["hostname"] == HOST
    assert result["snapshots"] == 1 and result["repository_bytes"] > 0
    assert result["newest_snapshot"] == backup.parse_backup_name(first.name)[1]  # the backup's own time

    # The same backup again: nothing pushed.
    again = run_push(site)
    assert again["status"] == "ok" and again["pushed"] == [] and len(again["skipped"]) == 1

    # A newer backup sharing most pages with the first: restic stores only what differs.
    # Retention daily=1: the newest of the profile's snapshots stays, the older goes.
    second = site["backups"] / backup.backup_name("default", now - 2 * day)
    shutil.copyfile(first, second)
    conn = sqlite3.connect(second)
    conn.execute("INSERT INTO messages (content) VALUES ('one more')")
    conn.commit()
    conn.close()
    os.chown(second, OWNER, OWNER)
    result = run_push(site, keep={"daily": 1, "weekly": 0, "monthly": 0})
    assert result["status"] == "ok", result
    [pushed2] = result["pushed"]
    assert pushed2["name"] == second.name
    assert pushed2["bytes_added"] < pushed["bytes_added"] / 4, (pushed, pushed2)
    left = snapshots(site)
    assert [s["paths"] for s in left] == [["/" + offsite.snapshot_path(HOST, "hermes", "default", second.name)]]
    assert result["snapshots"] == 1


def test_planted_link_and_foreign_file_refused(site):
    secret = site["tmp"] / "root-secret"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    now = time.time()
    # A link under a backup's name: the agent asking root to send another file off the host.
    os.symlink(secret, site["backups"] / backup.backup_name("default", now))
    # Root's own file (a hard link would do the same) under a backup's name.
    foreign = site["backups"] / backup.backup_name("work", now)
    shutil.copyfile(secret, foreign)
    # And one honest backup of a third profile, which still goes.
    make_backup(site["backups"], "ok", now)
    result = run_push(site)
    assert result["status"] == "failed" and result["reason"] == "refused_file"
    refused = {r["profile"]: r["error"] for r in result["refused"]}
    assert "symbolic link" in refused["default"]
    assert "belongs to uid 0" in refused["work"]
    assert [p["profile"] for p in result["pushed"]] == ["ok"]
    for snap in snapshots(site):
        assert snap["paths"][0].split("/")[3] == "ok"

    text = offsite.render(result, {}, time.time())
    assert 'hermes_ops_offsite_last_run_status{host="host1",user="hermes",reason="refused_file"} 1' in text
    assert "hermes_ops_offsite_failures{" in text and "last_success_timestamp_seconds" not in text


def test_bad_repository_reported_not_raised(site, tmp_path):
    make_backup(site["backups"], "default", time.time())
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    wrong.chmod(0o600)
    result = run_push(site, password_file=str(wrong))
    assert result["status"] == "failed" and result["reason"] == "wrong_password", result
    assert "wrong password" in result["error"]

    result = run_push(site, repository="sftp:nobody@127.0.0.1:/nowhere")
    assert result["status"] == "failed" and result["reason"] == "unreachable", result

    result = run_push(site, repository=str(tmp_path / "not-a-repo"))
    assert result["status"] == "failed" and result["reason"] == "unreachable", result
    assert not (tmp_path / "not-a-repo").exists()  # a push never creates a repository

    # Metrics: the failures count up; the last success stays.
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    ok = run_push(site)
    assert ok["status"] == "ok"
    offsite.record(str(metrics_dir), ok, finished=1000.0)
    offsite.record(str(metrics_dir), result, finished=2000.0)
    offsite.record(str(metrics_dir), result, finished=3000.0)
    figures = offsite.previous_figures(str(metrics_dir / offsite.offsite_metrics_filename("hermes")))
    assert figures["failures"] == 2 and figures["last_success_timestamp_seconds"] == 1000.0
    assert figures["last_run_timestamp_seconds"] == 3000.0 and figures["snapshots"] == 1


def test_locked_repository_reported(site):
    make_backup(site["backups"], "default", time.time())
    tool = offsite.Restic(site["repo"], site["password"], cache_dir=site["cache"])
    # Another restic holding the repository (a backup still reading its input): the push's
    # prune needs the exclusive lock, is refused by restic's own locking, and says so.
    holder = subprocess.Popen(
        [tool.binary, "backup", "--stdin", "--stdin-filename", "other"],
        env=dict(tool.env),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock_dir = os.path.join(site["repo"], "locks")
        deadline = time.time() + 20
        while not os.listdir(lock_dir):
            assert time.time() < deadline, "the other restic never took its lock"
            time.sleep(0.05)
        result = run_push(site)
    finally:
        holder.stdin.close()
        holder.wait()
    assert result["status"] == "failed" and result["reason"] == "locked", result["error"]
    assert "locked" in result["error"]


def test_password_file_must_be_roots_alone(site):
    make_backup(site["backups"], "default", time.time())
    os.chmod(site["password"], 0o644)
    result = run_push(site)
    assert result["status"] == "failed" and result["reason"] == "password_file"
    assert "readable by root alone" in result["error"]
    os.chmod(site["password"], 0o600)
    os.chown(site["password"], OWNER, OWNER)
    result = run_push(site)
    assert result["status"] == "failed" and "must be root's" in result["error"]
    os.chown(site["password"], 0, 0)
    link = site["tmp"] / "password-link"
    os.symlink(site["password"], link)
    result = run_push(site, password_file=str(link))
    assert result["status"] == "failed" and "not a regular file" in result["error"]


def test_command_line_needs_roots_config(site, tmp_path, capsys):
    make_backup(site["backups"], "default", time.time())
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    config = tmp_path / "offsite.json"
    config.write_text(
        json.dumps(
            {
                "repository": site["repo"],
                "password_file": site["password"],
                "backup_dirs": [str(site["backups"])],
                "uid": OWNER,
                "user": "hermes",
                "host": HOST,
                "metrics_dir": str(metrics_dir),
                "cache_dir": site["cache"],
                "keep": {"daily": 7, "weekly": 4, "monthly": 6},
            }
        )
    )
    config.chmod(0o600)
    assert offsite.main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("off-site %s: ok; pushed default" % site["repo"])
    figures = offsite.previous_figures(str(metrics_dir / offsite.offsite_metrics_filename("hermes")))
    assert figures["snapshots"] == 1 and figures["check_ok"] == 1  # the first run checks
    os.chown(config, OWNER, OWNER)
    assert offsite.main(["--config", str(config)]) == 2


def test_fetch_brings_the_backup_back(site, tmp_path):
    now = time.time()
    older = make_backup(site["backups"], "default", now - 86400)
    assert run_push(site)["status"] == "ok"
    newer = make_backup(site["backups"], "default", now)
    result = run_push(site)
    assert result["status"] == "ok"
    first_id = snapshots(site)[0]["short_id"]
    older_bytes, newer_bytes = older.read_bytes(), newer.read_bytes()
    shutil.rmtree(site["backups"])  # the disk is gone
    into = tmp_path / "restore"
    got = offsite.fetch(site["repo"], site["password"], HOST, "hermes", "default", str(into), cache_dir=site["cache"])
    assert got["name"] == newer.name and Path(got["path"]).read_bytes() == newer_bytes
    assert (os.stat(got["path"]).st_mode & 0o777, os.stat(into).st_mode & 0o777) == (0o600, 0o700)
    got = offsite.fetch(
        site["repo"], site["password"], HOST, "hermes", "default", str(into), snapshot=first_id, cache_dir=site["cache"]
    )
    assert got["name"] == older.name and Path(got["path"]).read_bytes() == older_bytes
    with pytest.raises(offsite.OffsiteError, match="no snapshot of host host1, user hermes, profile work"):
        offsite.fetch(site["repo"], site["password"], HOST, "hermes", "work", str(into), cache_dir=site["cache"])
