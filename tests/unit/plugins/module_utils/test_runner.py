# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The scheduled job's CLI (runner): output format, dry run, exit codes, config
errors, root refusal, syslog and log rotation, and running as the plain package
``hermes_ops`` the role installs (no Ansible on the path)."""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes import runner
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import sqlite_wal_reset_affected

REPO = Path(__file__).resolve().parents[4]
LINE = re.compile(
    r"^\d\d:\d\d:\d\d (?P<name>[\w-]+): zombies=(?P<z>\d+) pruned=(?P<p>\d+) freed=~?[0-9.]+[KMG]?B "
    r"remaining=\d+ sessions, \d+ messages(?:; .*)?$"
)
PROFILES = ["default", "work", "research"]


def _demo_module():
    spec = importlib.util.spec_from_file_location(
        "hermes_demo_home", REPO / "playbooks" / "files" / "hermes_demo_home.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def home(tmp_path):
    """A generated Hermes home (the demo generator: 0.19.0 schema), three profiles."""
    path = tmp_path / "hermes"
    assert _demo_module().main([str(path), "--profiles", ",".join(PROFILES), "--sessions", "40", "--force"]) == 0
    return path


def _config(tmp_path, **options):
    path = tmp_path / "maintenance.json"
    path.write_text(json.dumps(options))
    return str(path)


def _db_paths(home):
    return [home / "state.db"] + sorted(home.glob("profiles/*/state.db"))


def _digests(home):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in _db_paths(home)}


def _run(capsys, argv):
    rc = runner.main(argv)
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


@pytest.fixture(autouse=True)
def no_syslog(monkeypatch):
    monkeypatch.setattr(runner, "syslog", None)


def test_dry_run_prints_seed_lines_and_changes_nothing(tmp_path, home, capsys):
    cfg = _config(tmp_path, hermes_home=[str(home)], prune_days=90, syslog=False)
    before = _digests(home)
    rc, lines, err = _run(capsys, ["--config", cfg, "--dry-run"])
    assert rc == 0, err
    assert lines[0] == "=== Session Maintenance Start ==="
    assert lines[-1] == "=== Session Maintenance Done ==="
    matches = [LINE.match(line) for line in lines[1:-1]]
    assert all(matches), lines
    assert sorted(m["name"] for m in matches) == sorted(PROFILES)
    assert any(int(m["p"]) > 0 for m in matches)
    assert _digests(home) == before
    assert not (home / "backups").exists() or not list((home / "backups").iterdir())


def test_real_run_does_what_the_dry_run_predicted(tmp_path, home, capsys):
    cfg = _config(tmp_path, hermes_home=[str(home)], prune_days=90, syslog=False)
    predicted = _run(capsys, ["--config", cfg, "--dry-run"])[1]
    rc, done, err = _run(capsys, ["--config", cfg])
    assert rc == 0, err

    def counts(lines):
        return {m["name"]: (m["z"], m["p"]) for m in map(LINE.match, lines[1:-1])}

    assert counts(done) == counts(predicted)
    # after the seed's words, the same words for what was (would be) done and why
    stamp = re.compile(r"_(<timestamp>|\d{8}T\d{6}Z)\.db")
    for lines in (predicted, done):
        for line in lines[1:-1]:
            name = LINE.match(line)["name"]
            details = stamp.sub("_T.db", line.split("; ", 1)[1]).split("; ")
            assert details[:2] == ["retention 90d", "backup=file backups/hermes-ops_%s_T.db" % name], line
            assert details[2].startswith(("vacuum skipped: ", "vacuum full", "vacuum incremental")), line
    rc, again, err = _run(capsys, ["--config", cfg, "--dry-run"])
    assert rc == 0, err
    assert set(counts(again).values()) == {("0", "0")}
    assert all("; retention 90d; no backup (nothing changed); vacuum " in line for line in again[1:-1]), again


def test_json_output(tmp_path, home, capsys):
    cfg = _config(tmp_path, hermes_home=[str(home)], syslog=False)
    rc, lines, err = _run(capsys, ["--config", cfg, "--dry-run", "--json"])
    assert rc == 0, err
    result = json.loads("\n".join(lines))
    assert {p["name"] for p in result["profiles"]} == set(PROFILES)
    assert result["failed"] == []
    assert len(result["summary"]) == len(PROFILES)


def test_failed_profile_exit_1_others_maintained(tmp_path, home, capsys):
    broken = home / "profiles" / "broken"
    broken.mkdir()
    (broken / "state.db").write_bytes(b"this is not a database\n")
    cfg = _config(tmp_path, hermes_home=[str(home)], prune_days=90, syslog=False)
    rc, lines, err = _run(capsys, ["--config", cfg])
    assert rc == 1
    assert "broken" in err and str(broken / "state.db") in err
    ok = [m["name"] for m in map(LINE.match, lines[1:-1]) if m]
    assert sorted(ok) == sorted(PROFILES)
    assert lines[-1] == "=== Session Maintenance Done ==="


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ({"zombiedays": 3}, "unknown key 'zombiedays'"),
        ({"zombie_days": "three"}, "key 'zombie_days' must be a number"),
        ({"backup": "yes"}, "key 'backup' must be true/false"),
        ({"prune_days": 7, "hermes_home": [1]}, "key 'hermes_home' must be a list"),
        ({"log_keep": 0}, "key 'log_keep' must be at least 1"),
        ({"zombie_days": 30, "prune_days": 7}, "zombie_days"),  # refused by the engine
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_config_exit_2_names_file_and_key(tmp_path, home, capsys, content, needle):
    if isinstance(content, dict):
        content = dict(content, hermes_home=content.get("hermes_home", [str(home)]))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    before = _digests(home)
    rc, lines, err = _run(capsys, ["--config", str(path)])
    assert rc == 2
    assert str(path) in err and needle in err, err
    assert _digests(home) == before


def test_unreadable_or_invalid_config(tmp_path, capsys):
    rc, err = _run(capsys, ["--config", str(tmp_path / "missing.json")])[::2]
    assert rc == 2 and "missing.json" in err and "cannot read" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    rc, err = _run(capsys, ["--config", str(bad)])[::2]
    assert rc == 2 and "not valid JSON" in err


@pytest.mark.root
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_root_refuses_a_home_of_another_user(tmp_path, home, capsys):
    for path in [home, *home.rglob("*")]:
        os.lchown(path, 65534, 65534)
    cfg = _config(tmp_path, hermes_home=[str(home)], syslog=False)
    before = _digests(home)
    rc, err = _run(capsys, ["--config", cfg, "--dry-run"])[::2]
    assert rc == 2
    assert "refusing to run as root" in err and "--allow-root" in err and str(home) in err
    assert _digests(home) == before


def test_syslog_one_line_per_profile(tmp_path, home, capsys, monkeypatch):
    calls = []

    class FakeSyslog:
        LOG_PID = LOG_USER = LOG_INFO = 0
        LOG_ERR = 3

        def openlog(self, ident, *args):
            calls.append(("open", ident))

        def syslog(self, priority, message):
            calls.append(("log", priority, message))

        def closelog(self):
            calls.append(("close",))

    monkeypatch.setattr(runner, "syslog", FakeSyslog())
    cfg = _config(tmp_path, hermes_home=[str(home)])
    rc = _run(capsys, ["--config", cfg, "--dry-run"])[0]
    assert rc == 0
    assert ("open", "hermes-maintenance") in calls
    logged = [c[2] for c in calls if c[0] == "log"]
    assert len(logged) == len(PROFILES)
    assert all(m.startswith("dry run: ") for m in logged)


def test_log_file_keeps_last_runs(tmp_path, home, capsys):
    log = tmp_path / "log" / "maintenance.log"
    cfg = _config(tmp_path, hermes_home=[str(home)], log_file=str(log), log_keep=2, syslog=False)
    for _dummy in range(3):
        assert runner.main(["--config", cfg, "--dry-run"]) == 0
    capsys.readouterr()
    text = log.read_text()
    assert text.count("=== Session Maintenance Start") == 2
    assert text.count("=== Session Maintenance Done ===") == 2
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    # Each run says which SQLite did its work, and through which interpreter.
    bug = "has the WAL-reset bug" if sqlite_wal_reset_affected() else "free of the WAL-reset bug"
    assert text.count(f" SQLite {sqlite3.sqlite_version} ({bug}), python {sys.executable}\n") == 2, text


def test_runs_as_plain_package_without_ansible(tmp_path, home):
    """What the role installs: module_utils/_hermes/ as package hermes_ops, python3 -m."""
    pkg = tmp_path / "lib" / "hermes_ops"
    shutil.copytree(REPO / "plugins" / "module_utils" / "_hermes", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "__init__.py").write_text("")
    cfg = _config(tmp_path, hermes_home=[str(home)], syslog=False)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(tmp_path / "lib"), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-s", "-m", "hermes_ops.runner", "--config", cfg, "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "=== Session Maintenance Start ===" and lines[-1] == "=== Session Maintenance Done ==="
    assert len([ln for ln in lines if LINE.match(ln)]) == len(PROFILES)
    check = subprocess.run(
        [sys.executable, "-s", "-c", "import hermes_ops.runner, sys; print('ansible' in sys.modules)"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert check.stdout.strip() == "False"


def test_summary_names_the_holder_that_kept_vacuum_from_running(tmp_path, home, capsys):
    """The reason a reclaim was skipped, with the holder's name and pid, is on the summary
    line (and predicted the same in a dry run), not only in the JSON."""
    db = home / "state.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); "
         "c.execute('SELECT COUNT(*) FROM sessions').fetchone(); print('open', flush=True); time.sleep(60)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        cfg = _config(tmp_path, hermes_home=[str(home)], profiles=["default"], vacuum_mode="full", syslog=False)
        for argv in (["--config", cfg, "--dry-run"], ["--config", cfg]):
            rc, lines, err = _run(capsys, argv)
            assert rc == 0, err
            assert LINE.match(lines[1]), lines
            assert "; vacuum skipped: held open by python" in lines[1] and "(pid %d)" % holder.pid in lines[1], lines
    finally:
        holder.kill()
        holder.wait()


def test_record_logs_a_run_made_elsewhere_and_refuses_what_is_not_one(tmp_path, home, capsys):
    """--record: the result of a run made elsewhere (maintain.yml's) goes to the log as this job's run,
    nothing is run again; a file that is no run result is a configuration error, logged, nothing run."""
    log = tmp_path / "maintenance.log"
    cfg = _config(tmp_path, hermes_home=[str(home)], prune_days=90, log_file=str(log), syslog=False)
    result = runner.run_maintenance({"hermes_home": [str(home)], "prune_days": 90}, check_mode=True)
    recorded = tmp_path / "result.json"
    recorded.write_text(json.dumps(result))
    before = _digests(home)
    rc, lines, err = _run(capsys, ["--config", cfg, "--record", str(recorded), "--dry-run"])
    assert rc == 0, err
    assert [line.split(" ", 1)[1] for line in lines[1:-1]] == result["summary"]
    assert _digests(home) == before
    text = log.read_text()
    assert text.startswith("=== Session Maintenance Start === (dry run)") and all(s in text for s in result["summary"])

    recorded.write_text(json.dumps({"msg": "not a run"}))
    rc, _lines, err = _run(capsys, ["--config", cfg, "--record", str(recorded)])
    assert rc == runner.EXIT_CONFIG and "not a run result (no profiles)" in err
    assert "ERROR --record %s: not a run result" % recorded in log.read_text()
