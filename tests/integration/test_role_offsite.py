# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Off-site copies through the role: real ``ansible-playbook`` runs of playbooks/schedule.yml
with a restic repository (a local path) for the test user ``hermes-ops-i40``, as root.

* a password file that is not root's 0600 fails the apply, naming the variable;
* applied, the push is root's: an /etc/cron.d entry that runs as root, a 0600 config, the
  repository created; the Hermes user can read neither the config nor the password;
* the maintenance (run as the user) makes a backup, and root's push sends it: one snapshot,
  tagged with the user and the profile, whose content is the backup; the metrics file and
  report.yml say so;
* restore_sessions.yml -e hermes_restore_from=offsite puts the sessions the prune deleted back
  from the repository's copy (check mode's prediction, then the run);
* with state.db, its sidecars and the backups deleted, restore.yml -e hermes_restore_from=offsite
  fetches the backup (root's, 0600) and restores it: the owner's file, every session.
"""

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from hermes_role_host import RoleHost, role_host

pytestmark = [
    pytest.mark.managed_node,
    pytest.mark.skipif(os.geteuid() != 0, reason="the off-site push is root's"),
    pytest.mark.skipif(shutil.which("restic") is None, reason="restic is not installed (apt-get install restic)"),
]

USER = "hermes-ops-i40"
LIB = Path("/usr/local/lib/hermes-ops") / USER
ETC = Path("/etc/hermes-ops") / USER
WRAPPER = LIB / "bin" / "hermes-session-maintenance"
PUSH = LIB / "bin" / "hermes-ops-offsite"
CRON_FILE = Path("/etc/cron.d") / ("hermes-ops-offsite-" + USER)
FETCHED = Path("/var/lib/hermes-ops/offsite-restore") / USER  # where restore.yml's fetch writes

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def _remove_everything():
    for path in (LIB, ETC, FETCHED):
        shutil.rmtree(str(path), ignore_errors=True)
    for path in (CRON_FILE,):
        if path.exists():
            path.unlink()
    subprocess.run(["crontab", "-r", "-u", USER], capture_output=True, check=False)


@pytest.fixture
def host():
    with role_host(RoleHost, USER, SPECS, _remove_everything) as h:
        yield h


def test_offsite_push_is_roots(ansible_playbook, host, tmp_path):
    h = host
    password = h.base / "restic-password"
    password.write_text("integration secret\n")
    password.chmod(0o644)
    repo = h.base / "repo"
    metrics = h.base / "metrics"
    extra = h.vars(
        hermes_maintenance_scheduler="cron",
        hermes_maintenance_metrics_dir=str(metrics),
        hermes_maintenance_offsite_repository=str(repo),
        hermes_maintenance_offsite_password_file=str(password),
        hermes_maintenance_offsite_keep={"daily": 3},
        hermes_maintenance_offsite_host="node1",
    )

    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=extra)
    text = getattr(out, "text", str(out))
    assert rc != 0
    assert "hermes_maintenance_offsite_password_file" in text and "mode 0644" in text, text
    assert not repo.exists()

    password.chmod(0o600)
    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)

    assert (repo / "config").is_file()  # the role created the repository
    cron = CRON_FILE.read_text()
    assert f"#Ansible: hermes_agent.ops off-site push ({USER})" in cron
    assert f"30 5 * * * root {PUSH} | logger -t hermes-ops-offsite" in cron
    config = ETC / "offsite.json"
    st = config.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    settings = json.loads(config.read_text())
    assert settings["keep"] == {"daily": 3, "weekly": 4, "monthly": 6}
    assert settings["uid"] == h.uid and settings["host"] == "node1"

    # The Hermes user reads neither the push's config nor (through it) the password, and
    # cannot run the push.
    for path in (config, password, PUSH):
        probe = subprocess.run(
            ["/usr/bin/python3", "-c", f"open({str(path)!r}).read()"],
            capture_output=True,
            check=False,
            cwd="/",
            **h.as_user(),
        )
        assert probe.returncode != 0 and b"PermissionError" in probe.stderr, path

    # The user's maintenance makes a backup; root's push sends it.
    run = subprocess.run(
        [str(WRAPPER)],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        **h.as_user(),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    backups = sorted((h.hermes / "backups").glob("hermes-ops_*.db*"))
    assert backups, run.stdout
    push = subprocess.run([str(PUSH), "--json"], capture_output=True, text=True, cwd="/", check=False)
    assert push.returncode == 0, push.stdout + push.stderr
    result = json.loads(push.stdout)
    assert result["status"] == "ok" and [p["name"] for p in result["pushed"]] == [backups[-1].name]
    assert result["snapshots"] == 1

    env = {"PATH": "/usr/bin:/bin", "RESTIC_REPOSITORY": str(repo), "RESTIC_PASSWORD_FILE": str(password)}
    env["RESTIC_CACHE_DIR"] = str(tmp_path / "cache")
    listed = json.loads(
        subprocess.run(["restic", "snapshots", "--json"], capture_output=True, text=True, env=env, check=True).stdout
    )
    [snap] = listed
    assert snap["hostname"] == "node1" and {"hermes-ops", f"user={USER}", "profile=default"} <= set(snap["tags"])
    dumped = subprocess.run(["restic", "dump", snap["id"], snap["paths"][0]], capture_output=True, env=env, check=True)
    assert dumped.stdout == backups[-1].read_bytes()

    prom = (metrics / f"hermes_ops_offsite_{USER}.prom").read_text()
    assert f'hermes_ops_offsite_snapshots{{host="node1",user="{USER}"}} 1' in prom
    assert f'hermes_ops_offsite_failures{{host="node1",user="{USER}"}} 0' in prom

    # report.yml shows the host's off-site state from the push's metrics.
    report = {
        "hermes_maintenance_user": USER,
        "hermes_maintenance_homes": [str(h.hermes)],
        "hermes_maintenance_metrics_dir": str(metrics),
        "hermes_report_markdown": "",
        "hermes_report_csv": "",
    }
    rc, out = ansible_playbook("playbooks/report.yml", extra_vars=report)
    assert rc == 0, getattr(out, "text", out)
    lines = out.result("Print the off-site table")["msg"]
    assert lines[0].startswith("| host | snapshots | newest copy |")
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells[0] == "localhost" and cells[1] == "1" and cells[3] == "0.0 days ago", lines
    assert cells[5:] == ["0", "ok"], lines

    # The prune deleted sessions the pushed backup holds: restore_sessions.yml takes them back
    # from the repository's copy (root fetches it; the owner's process reads it through root's
    # descriptor), first as a prediction, then for real, into the live file in place.
    with sqlite3.connect(f"file:{backups[-1]}?mode=ro", uri=True) as conn:
        held = {r[0] for r in conn.execute("SELECT id FROM sessions")}
    with sqlite3.connect(f"file:{h.hermes / 'state.db'}?mode=ro", uri=True) as conn:
        live_before = {r[0] for r in conn.execute("SELECT id FROM sessions")}
    gone = sorted(held - live_before)
    assert gone, (held, live_before)
    shutil.rmtree(FETCHED, ignore_errors=True)
    back = {
        "hermes_maintenance_user": USER,
        "hermes_maintenance_homes": [str(h.hermes)],
        "hermes_restore_hosts": "localhost",
        "hermes_restore_from": "offsite",
        "hermes_restore_sessions": gone,
    }
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=dict(back, hermes_restore_backup="newest"))
    text = getattr(out, "text", str(out))
    assert rc != 0 and "leave hermes_restore_backup out" in text, text
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=back, check=True)
    assert rc == 0, getattr(out, "text", out)
    predicted = out.result("Restore the sessions")
    assert predicted["sessions_restored"] == len(gone)
    assert predicted["backup"]["path"] == str(FETCHED / backups[-1].name)
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=back)
    assert rc == 0, getattr(out, "text", out)
    assert f"Off-site snapshot {snap['short_id']}" in out.result("Which snapshot")["msg"]
    done = out.result("Restore the sessions")
    assert (done["sessions_restored"], done["messages_restored"]) == (
        predicted["sessions_restored"],
        predicted["messages_restored"],
    )
    with sqlite3.connect(f"file:{h.hermes / 'state.db'}?mode=ro", uri=True) as conn:
        assert {r[0] for r in conn.execute("SELECT id FROM sessions")} == held
    fetched = FETCHED / backups[-1].name
    assert (fetched.stat().st_uid, fetched.stat().st_mode & 0o777, FETCHED.stat().st_mode & 0o777) == (0, 0o600, 0o700)
    assert not [p.name for p in (h.hermes / "backups").iterdir() if p.name.startswith(".hermes-ops-restore_")]

    # The disk is lost: state.db, its sidecars and the backups go. restore.yml brings the
    # profile back from the repository, with the checks of a local restore.
    saved = tmp_path / "pushed-backup.db"
    saved.write_bytes(backups[-1].read_bytes())
    with sqlite3.connect(saved) as conn:
        sessions = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    for suffix in ("", "-wal", "-shm"):
        if (h.hermes / ("state.db" + suffix)).exists():
            (h.hermes / ("state.db" + suffix)).unlink()
    shutil.rmtree(h.hermes / "backups")
    restore = {
        "hermes_maintenance_user": USER,
        "hermes_maintenance_homes": [str(h.hermes)],
        "hermes_restore_hosts": "localhost",
        "hermes_restore_from": "offsite",
    }
    rc, out = ansible_playbook("playbooks/restore.yml", extra_vars=restore)
    assert rc == 0, getattr(out, "text", out)
    assert f"Off-site snapshot {snap['short_id']}" in out.result("Which snapshot")["msg"]
    fetched = FETCHED / backups[-1].name
    assert fetched.read_bytes() == saved.read_bytes() and (fetched.stat().st_uid, fetched.stat().st_mode & 0o777) == (
        0,
        0o600,
    )
    restored_db = h.hermes / "state.db"
    st = restored_db.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (h.uid, 0o600)
    with sqlite3.connect(restored_db) as conn:
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == sessions > 0
