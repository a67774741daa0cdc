# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's playbooks and role through real ansible-playbook runs on localhost:
demo.yml, maintain.yml (--check, real, a failing profile), report.yml (table, Markdown,
CSV) and schedule.yml with the role's `hermes` scheduler (Hermes's own cron/jobs.json),
switching it off, and state=absent. Everything lives under tmp_path and belongs to the
user running the tests (no root, no crontab, no systemd needed)."""

import contextlib
import csv
import getpass
import hashlib
import importlib.util
import json
import re
import sqlite3
import stat
import subprocess
from pathlib import Path

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import sqlite_wal_reset_affected

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(
    r"^(?P<name>[\w-]+): zombies=(?P<z>\d+) pruned=(?P<p>\d+) freed=~?[0-9.]+[KMG]?B "
    r"remaining=\d+ sessions, \d+ messages"
    r"(?:; .*)?$"  # the seed's words, then what was done and why
)
PROFILES = ["default", "work", "research"]


def make_home(path, sessions=20):
    spec = importlib.util.spec_from_file_location(
        "hermes_demo_home", REPO / "playbooks" / "files" / "hermes_demo_home.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([str(path), "--profiles", ",".join(PROFILES), "--sessions", str(sessions), "--force"]) == 0
    return path


def digests(home):
    paths = [home / "state.db"] + sorted(home.glob("profiles/*/state.db"))
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def counts(lines):
    return {m["name"]: (int(m["z"]), int(m["p"])) for m in map(LINE.match, lines) if m}


def common_vars(home):
    # No become: the tests run as whoever runs them, on files that user owns.
    return {
        "hermes_maintenance_homes": [str(home)],
        "hermes_maintenance_become": False,
        "hermes_maintenance_prune_days": 7,
    }


def role_home(tmp_path, scheduler, sessions, **options):
    """A demo home under ``tmp_path`` and the variables that apply the role to it for the user
    running the tests, installed under ``tmp_path/install``; each of ``options`` becomes
    ``hermes_maintenance_<name>``."""
    home = make_home(tmp_path / "hermes", sessions=sessions)
    install = tmp_path / "install"
    extra = dict(common_vars(home), **{"hermes_maintenance_" + name: value for name, value in options.items()})
    extra.update(
        hermes_maintenance_user=getpass.getuser(),
        hermes_maintenance_install_dir=str(install),
        hermes_maintenance_scheduler=scheduler,
        hermes_maintenance_syslog=False,
    )
    return home, install, extra


def test_demo(ansible_playbook, tmp_path):
    demo = tmp_path / "demo"
    rc, out = ansible_playbook(
        "playbooks/demo.yml", extra_vars={"hermes_demo_home": str(demo), "hermes_demo_sessions": 20}
    )
    assert rc == 0, getattr(out, "text", out)
    dry = out.result("Dry run (check mode)")
    real = out.result("Maintain for real")
    again = out.result("Maintain again")
    assert counts(dry["summary"]) == counts(real["summary"])
    assert set(counts(real["summary"])) == set(PROFILES)
    assert any(p for _z, p in counts(real["summary"]).values())
    assert not again["changed"]
    assert set(counts(again["summary"]).values()) == {(0, 0)}


def test_maintain_check_real_and_failing_profile(ansible_playbook, tmp_path):
    home = make_home(tmp_path / "hermes")
    broken = home / "profiles" / "broken"
    broken.mkdir()
    (broken / "state.db").write_bytes(b"not a database\n")
    extra = dict(common_vars(home), hermes_maintenance_prune_days=90)
    before = digests(home)

    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra, check=True)
    assert rc == 2, getattr(out, "text", out)  # the broken profile fails the host, also in check mode
    assert digests(home) == before
    predicted = counts(out.result("Summary")["msg"])
    assert set(predicted) == set(PROFILES)

    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra)
    assert rc == 2, getattr(out, "text", out)
    assert counts(out.result("Summary")["msg"]) == predicted
    failure = out.result("Fail when a profile failed")
    assert failure["_status"] == "failed"
    assert "broken" in failure["msg"] and str(broken / "state.db") in failure["msg"]

    (broken / "state.db").unlink()
    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    assert not out.result("Maintain")["changed"]
    assert out.result("Fail when a profile failed")["_status"] == "skipped"


def test_report(ansible_playbook, tmp_path):
    home = make_home(tmp_path / "hermes")
    broken = home / "profiles" / "broken"
    broken.mkdir()
    (broken / "state.db").write_bytes(b"not a database\n")
    (home / "profiles" / "research" / "config.yaml").write_text("database:\n  backend: postgres\n")
    md, csv_path = tmp_path / "report.md", tmp_path / "report.csv"
    extra = dict(common_vars(home), hermes_report_markdown=str(md), hermes_report_csv=str(csv_path))
    rc, out = ansible_playbook("playbooks/report.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    printed = out.result("Print the table")["msg"]
    assert printed[0].split("|")[1].strip() == "host"
    for name in [*PROFILES, "broken"]:
        assert any(f"| {name} " in line for line in printed), printed
    assert md.read_text().count("| localhost ") == len(PROFILES) + 1
    rows = list(csv.DictReader(csv_path.open()))
    assert {r["profile"] for r in rows} == {*PROFILES, "broken"}
    assert list(rows[0]) == ["host", "profile", "size", "sessions", "messages", "prunable", "newest_backup", "note"]
    by_name = {r["profile"]: r for r in rows}
    assert by_name["broken"]["note"].startswith("FAILED")
    assert int(by_name["default"]["prunable"]) > 0
    assert by_name["default"]["newest_backup"] == "none"
    assert by_name["research"]["note"].startswith("backend: postgres (%s" % (home / "profiles" / "research"))
    assert by_name["default"]["note"] == "" and "backend" not in by_name["work"]["note"]
    live = out.result("Print the live-Hermes table")["msg"]
    assert [c.strip() for c in live[0].split("|")[1:-1]] == [
        "host", "profile", "engine sqlite", "hermes auto_prune", "last auto prune", "last vacuum", "held by",
    ]  # fmt: skip
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in live[2:]}
    assert set(rows) == set(PROFILES)  # the broken file has nothing of this to show
    affected = " (WAL-reset bug)" if sqlite_wal_reset_affected() else " (fixed)"
    assert rows["default"][2] == sqlite3.sqlite_version + affected
    assert rows["default"][3] == "on, 90 days" and rows["default"][4:] == ["never", "never", "nobody"]
    files = out.result("Print the home-files table")["msg"]
    assert [c.strip() for c in files[0].split("|")[1:-1]] == [
        "host", "profile", "home", "named", "largest kinds", "retired WAL", "forensic copies", "orphaned transcripts",
    ]  # fmt: skip
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in files[2:]}
    assert set(rows) == set(PROFILES)  # the broken file's profile could not be read
    assert rows["default"][4].startswith("state_db ") and rows["default"][5:] == ["0", "0", "0"]
    assert float(rows["default"][3].rstrip("%")) >= 99.0
    # Where each file's bytes are: the figures of state_db_info's storage, formatted.
    storage = out.result("Print the storage table")["msg"]
    assert [c.strip() for c in storage[0].split("|")[1:-1]] == [
        "host", "profile", "fts indexes", "messages table", "free", "tool payload", "largest objects", "note",
    ]  # fmt: skip
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in storage[2:]}
    assert set(rows) == set(PROFILES)
    info = out.result("Read the state.db files", host="localhost")["profiles"]
    st = next(p["storage"] for p in info if p["name"] == "default")
    largest = sorted(st["by_object"].items(), key=lambda kv: -kv[1]["bytes"])[0][0]
    assert rows["default"][6].startswith(largest + " ") and rows["default"][7] == ""
    assert rows["default"][2] != "-" and rows["default"][3] != "-"


def test_schedule_with_hermes_cron_then_none_then_absent(ansible_playbook, tmp_path):
    textfile = str(tmp_path / "textfile")
    home, install, extra = role_home(tmp_path, "hermes", 20, prune_days=90, metrics_dir=textfile)
    # An existing job of the user's must survive every step.
    (home / "cron").mkdir()
    theirs = {"id": "abc123def456", "name": "their job", "schedule": {"kind": "interval", "minutes": 60}}
    (home / "cron" / "jobs.json").write_text(json.dumps({"jobs": [theirs]}))

    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    jobs = json.loads((home / "cron" / "jobs.json").read_text())["jobs"]
    assert [j["id"] for j in jobs][0] == "abc123def456"
    ours = [j for j in jobs if j["id"] != "abc123def456"]
    assert len(ours) == 1
    job = ours[0]
    assert job["no_agent"] is True and job["enabled"] is True
    assert job["schedule"] == {"kind": "cron", "expr": "0 4 1 * *", "display": "0 4 1 * *"}
    script = home / "scripts" / job["script"]
    assert script.is_file() and job["script"].endswith(".sh")
    assert stat.S_IMODE((home / "cron" / "jobs.json").stat().st_mode) == 0o600
    config = install / "maintenance.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text())["hermes_home"] == [str(home)]
    assert json.loads(config.read_text())["metrics_dir"] == str(tmp_path / "textfile")
    assert stat.S_IMODE((tmp_path / "textfile").stat().st_mode) == 0o1775
    assert stat.S_IMODE((home / "backups").stat().st_mode) == 0o700

    # What Hermes's scheduler would run: the script under bash, cwd = the scripts dir.
    before = digests(home)
    proc = subprocess.run(
        ["bash", str(script), "--dry-run"], cwd=str(script.parent), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "=== Session Maintenance Start ===" and lines[-1] == "=== Session Maintenance Done ==="
    assert set(counts(line.split(" ", 1)[1] for line in lines[1:-1])) == set(PROFILES)
    assert digests(home) == before

    # Hermes records run-time fields; applying again must neither undo them nor report a change.
    data = json.loads((home / "cron" / "jobs.json").read_text())
    for j in data["jobs"]:
        if j["id"] == job["id"]:
            j["next_run_at"] = "2030-01-01T04:00:00+00:00"
            j["repeat"]["completed"] = 3
    (home / "cron" / "jobs.json").write_text(json.dumps(data))
    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    assert out["stats"]["localhost"]["changed"] == 0, [
        t["name"] for t in out.tasks() if t["hosts"]["localhost"].get("changed")
    ]
    again = {j["id"]: j for j in json.loads((home / "cron" / "jobs.json").read_text())["jobs"]}
    assert again[job["id"]]["repeat"]["completed"] == 3

    # Switching the scheduler off removes the job and its script; theirs stays.
    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=dict(extra, hermes_maintenance_scheduler="none"))
    assert rc == 0, getattr(out, "text", out)
    assert [j["id"] for j in json.loads((home / "cron" / "jobs.json").read_text())["jobs"]] == ["abc123def456"]
    assert not script.exists()
    assert config.exists()

    # absent: nothing of the role is left but the backups.
    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=dict(extra, hermes_maintenance_state="absent"))
    assert rc == 0, getattr(out, "text", out)
    assert not install.exists()
    assert (home / "backups").is_dir()
    assert [j["id"] for j in json.loads((home / "cron" / "jobs.json").read_text())["jobs"]] == ["abc123def456"]


def auto_vacuum(db):
    with contextlib.closing(sqlite3.connect(str(db))) as conn:
        return conn.execute("PRAGMA auto_vacuum").fetchone()[0]


def test_maintain_passes_vacuum_switch_incremental(ansible_playbook, tmp_path):
    """A role variable the playbook once dropped: a full VACUUM must keep auto_vacuum=NONE when asked."""
    home = make_home(tmp_path / "hermes")
    assert {auto_vacuum(db) for db in digests(home)} == {0}
    extra = dict(
        common_vars(home),
        hermes_maintenance_prune_days=90,
        hermes_maintenance_vacuum_mode="full",
        hermes_maintenance_vacuum_switch_incremental=False,
    )
    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    profiles = out.result("Maintain")["profiles"]
    assert {p["reclaim"]["action"] for p in profiles} == {"full"}, profiles
    assert {auto_vacuum(db) for db in digests(home)} == {0}


def test_schedule_writes_every_engine_option_into_the_config(ansible_playbook, tmp_path):
    options = {"vacuum_switch_incremental": False, "batch_size": 500, "prune_days": 30, "zombie_sources": ["cli"]}
    options["prune_days_by_source"] = {"cron": 3, "telegram": 365}
    home, install, extra = role_home(tmp_path, "none", 5, **options)
    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    config = json.loads((install / "maintenance.json").read_text())
    assert config["vacuum_switch_incremental"] is False
    assert config["batch_size"] == 500 and config["prune_days"] == 30.0 and config["zombie_sources"] == ["cli"]
    assert "backup_keep_days" not in config and "batch_time" not in config  # unset: the engine's default
    assert config["prune_days_by_source"] == {"cron": 3, "telegram": 365}
