# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus metrics of real runner runs on real state.db files.

Each written file is parsed by prometheus_client's own text parser (in the venv
``make metrics-setup`` makes) and checked with ``promtool check metrics``; the figures
are compared with what SQLite says about the files.
"""

import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes import offsite, runner
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report import metrics
from hermes_fixtures import build_home, layout_available, missing_venv_message, standard_scenario

REPO = Path(__file__).resolve().parents[4]
METRICS_PYTHON = os.environ.get("HERMES_METRICS_PYTHON") or str(REPO / ".cache" / "metrics-venv" / "bin" / "python")
PROMTOOL = (
    os.environ.get("HERMES_PROMTOOL") or shutil.which("promtool") or str(REPO / ".cache/prometheus/usr/bin/promtool")
)
# `make metrics` sets this: there a missing parser is an error, not a skip.
REQUIRED = os.environ.get("HERMES_METRICS_REQUIRED") == "1"
LAYOUT = "hermes-0.19.0"

PARSE = r"""
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append({"family": family.name, "type": family.type, "documentation": family.documentation,
                    "name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps(out))
"""


def _need(path, what):
    if os.access(path, os.X_OK):
        return path
    message = f"{what} not found at {path}: run `make metrics-setup`"
    if REQUIRED:
        pytest.fail(message)
    pytest.skip(message)


def parse(text):
    """Samples as prometheus_client parses them: {(name, frozenset(labels)): value}, families."""
    python = _need(METRICS_PYTHON, "the metrics venv (prometheus_client)")
    proc = subprocess.run([python, "-c", PARSE], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    samples = json.loads(proc.stdout)
    values = {(s["name"], frozenset(s["labels"].items())): s["value"] for s in samples}
    families = {s["family"]: (s["type"], s["documentation"]) for s in samples}
    return values, families


def promtool_check(path):
    tool = _need(PROMTOOL, "promtool")
    with open(path) as handle:
        proc = subprocess.run([tool, "check", "metrics"], stdin=handle, capture_output=True, text=True, check=False)
    # promtool prints lint findings (naming problems) and exits non-zero on any
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), proc.stdout + proc.stderr


@pytest.fixture
def home(tmp_path):
    if not layout_available(LAYOUT):
        pytest.skip(missing_venv_message(LAYOUT))
    home = tmp_path / "hermes"
    specs, expected = standard_scenario(LAYOUT)
    build_home(home, LAYOUT, specs)
    build_home(home, LAYOUT, standard_scenario(LAYOUT)[0], profile="work")
    return home, expected


def _run(tmp_path, home, *extra, **options):
    metrics_dir = tmp_path / "textfile"
    metrics_dir.mkdir(exist_ok=True)
    cfg = tmp_path / "maintenance.json"
    cfg.write_text(
        json.dumps(
            dict(
                {"prune_days": 7, "hermes_home": [str(home)], "syslog": False, "metrics_dir": str(metrics_dir)},
                **options,
            )
        )
    )
    rc = runner.main(["--config", str(cfg), *extra])
    return rc, metrics_dir


def _db_counts(db):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:

        def one(sql):
            return conn.execute(sql).fetchone()[0]

        version = one("SELECT version FROM schema_version")
        return {
            "sessions": one("SELECT COUNT(*) FROM sessions"),
            "messages": one("SELECT COUNT(*) FROM messages"),
            "open_sessions": one("SELECT COUNT(*) FROM sessions WHERE ended_at IS NULL"),
            "schema_version": version,
        }
    finally:
        conn.close()


def _labels(home, profile):
    return frozenset({"home": str(home), "profile": profile}.items())


def _prom_file(metrics_dir):
    files = sorted(metrics_dir.iterdir())
    assert [f.name for f in files] == [metrics.metrics_filename(metrics._user_name())], files  # no temp file left
    return files[0]


def test_real_run_writes_figures_that_match_the_databases(tmp_path, home, capsys):
    home, expected = home
    started = time.time()
    rc, metrics_dir = _run(tmp_path, home)
    assert rc == 0, capsys.readouterr().err
    prom = _prom_file(metrics_dir)
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    promtool_check(prom)
    text = prom.read_text()
    values, families = parse(text)
    for name, (kind, documentation) in families.items():
        assert name.startswith("hermes_ops_") and documentation, name
        assert kind == "gauge", name  # nothing here only ever goes up
    for profile, db in (("default", home / "state.db"), ("work", home / "profiles/work/state.db")):
        labels = _labels(home, profile)
        counts = _db_counts(db)
        for key in ("sessions", "messages", "open_sessions", "schema_version"):
            assert values[(f"hermes_ops_{key}", labels)] == counts[key], key
        assert values[("hermes_ops_db_size_bytes", labels)] == db.stat().st_size
        wal = Path(str(db) + "-wal")
        assert values[("hermes_ops_wal_size_bytes", labels)] == (wal.stat().st_size if wal.exists() else 0)
        assert values[("hermes_ops_last_run_zombies_closed", labels)] == len(expected["zombies"])
        assert values[("hermes_ops_last_run_sessions_pruned", labels)] == len(expected["pruned"])
        assert values[("hermes_ops_last_run_messages_pruned", labels)] == expected["messages_pruned"]
        assert values[("hermes_ops_prunable_sessions", labels)] == 0  # the run pruned them all
        assert values[("hermes_ops_last_run_duration_seconds", labels)] > 0
        assert values[("hermes_ops_last_run_freed_bytes", labels)] >= 0
        assert values[("hermes_ops_backups", labels)] == 1
        backup_time = values[("hermes_ops_backup_newest_timestamp_seconds", labels)]
        assert started - 1 <= backup_time <= time.time() + 1
        status = labels | {("status", "ok"), ("reason", "none")}
        assert values[("hermes_ops_profile_status", frozenset(status))] == 1
        # Storage: the messages table's pages and each role's payload, as SQLite reads them.
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        pages = dict(conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"))
        roles = dict(conn.execute("SELECT role, SUM(length(CAST(content AS BLOB))) FROM messages GROUP BY role"))
        conn.close()
        assert values[("hermes_ops_db_object_bytes", labels | {("object", "messages")})] == pages["messages"]
        fts = sum(
            v for k, v in pages.items() if k == "messages_fts" or k.startswith("messages_fts_") and "trigram" not in k
        )
        assert values[("hermes_ops_db_object_bytes", labels | {("object", "messages_fts")})] == fts
        for role, payload in roles.items():  # these messages carry content only
            assert values[("hermes_ops_payload_bytes", labels | {("role", role)})] == payload, role
    user = frozenset({"user": metrics._user_name()}.items())
    last_run = values[("hermes_ops_last_run_timestamp_seconds", user)]
    assert started <= last_run <= time.time()
    assert values[("hermes_ops_last_success_timestamp_seconds", user)] == last_run
    assert values[("hermes_ops_last_run_failed_profiles", user)] == 0


def test_no_chat_content_in_the_metrics(tmp_path, home):
    home, _expected = home
    rc, metrics_dir = _run(tmp_path, home)
    assert rc == 0
    text = _prom_file(metrics_dir).read_text()
    conn = sqlite3.connect(str(home / "state.db"))
    secrets = [r[0] for r in conn.execute("SELECT content FROM messages WHERE content IS NOT NULL LIMIT 50")]
    secrets += [r[0] for r in conn.execute("SELECT id FROM sessions")]
    conn.close()
    assert secrets
    assert not [s for s in secrets if s and s in text]


def test_failed_run_keeps_the_last_success_time_and_names_a_bounded_reason(tmp_path, home, capsys):
    home, _expected = home
    rc, metrics_dir = _run(tmp_path, home)
    assert rc == 0
    user = frozenset({"user": metrics._user_name()}.items())
    first, _types = parse(_prom_file(metrics_dir).read_text())
    success = first[("hermes_ops_last_success_timestamp_seconds", user)]

    broken = home / "profiles" / "broken"
    broken.mkdir()
    (broken / "state.db").write_bytes(b"SQLite format 3\x00" + b"\x00" * 4000)  # a damaged file
    time.sleep(0.01)
    rc, metrics_dir = _run(tmp_path, home)
    assert rc == 1
    prom = _prom_file(metrics_dir)
    promtool_check(prom)
    values, _types = parse(prom.read_text())
    assert values[("hermes_ops_last_success_timestamp_seconds", user)] == success
    assert values[("hermes_ops_last_run_timestamp_seconds", user)] > success
    assert values[("hermes_ops_last_run_failed_profiles", user)] == 1
    failed = [(k, v) for k, v in values.items() if k[0] == "hermes_ops_profile_status" and ("status", "failed") in k[1]]
    assert len(failed) == 1 and failed[0][1] == 1
    labels = dict(failed[0][0][1])
    assert labels["profile"] == "broken" and labels["reason"] in metrics.ALL_REASONS and labels["reason"] != "error"
    # the others are still reported ok
    assert values[("hermes_ops_profile_status", _labels(home, "work") | {("status", "ok"), ("reason", "none")})] == 1

    shutil.rmtree(broken)
    rc, metrics_dir = _run(tmp_path, home)
    assert rc == 0
    values, _types = parse(_prom_file(metrics_dir).read_text())
    assert values[("hermes_ops_last_success_timestamp_seconds", user)] > success


def test_dry_run_writes_no_metrics(tmp_path, home):
    home, _expected = home
    rc, metrics_dir = _run(tmp_path, home, "--dry-run")
    assert rc == 0
    assert list(metrics_dir.iterdir()) == []


def test_missing_metrics_dir_is_reported_and_the_run_still_succeeds(tmp_path, home, capsys):
    home, _expected = home
    cfg = tmp_path / "maintenance.json"
    missing = tmp_path / "no-such-dir"
    cfg.write_text(
        json.dumps({"prune_days": 7, "hermes_home": [str(home)], "syslog": False, "metrics_dir": str(missing)})
    )
    assert runner.main(["--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert f"cannot write metrics to {missing}" in err and "does not exist" in err


@pytest.mark.parametrize(
    ("status", "error", "reason"),
    [
        ("ok", None, "none"),
        ("skipped", "another maintenance run (ours or Hermes's auto-maintenance) holds /x.lock", "locked"),
        ("failed", "/x/state.db failed quick_check (database disk image is malformed): nothing was changed", "damaged"),
        ("failed", "schema_version 99 is newer than any this collection knows (up to 31)", "unknown_schema"),
        ("failed", "Hermes home /nope does not exist: check hermes_home", "missing_home"),
        ("failed", "something nobody foresaw: 'Secret chat title'", "error"),
    ],
)
def test_reason_label_is_from_a_fixed_set(status, error, reason):
    assert metrics.reason_of({"status": status, "error": error}) == reason
    assert reason in metrics.ALL_REASONS


def test_the_shipped_alert_rules_use_only_metrics_the_runner_writes():
    rules = (REPO / "roles/session_maintenance/files/prometheus/hermes-ops.rules.yml").read_text()
    written = {
        metrics.PREFIX + m[0]
        for m in metrics.PROFILE_METRICS
        + metrics.HOME_METRICS
        + metrics.STORAGE_METRICS
        + metrics.RUN_METRICS
        + (metrics.STATUS_METRIC,)
    }
    # ...and root's off-site push, into its own file
    written |= {offsite.METRICS_PREFIX + m[0] for m in offsite.METRICS} | {offsite.METRICS_PREFIX + "last_run_status"}
    used = set(re.findall(r"\bhermes_ops_[a-z_]+", re.sub(r"#.*", "", rules)))
    assert used and used <= written, used - written


def _samples(text):
    """{name: [(labels dict, value)]} of the text format, read by line (no parser needed)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def test_no_profiles_and_config_errors_are_no_success(tmp_path, home, capsys):
    """A home with no state.db (a typo) exits 3 and a refused config 2; neither bumps the
    last-success time, both say so in the metrics and the config error in the log too."""
    home, _expected = home
    log = tmp_path / "maintenance.log"
    assert _run(tmp_path, home, log_file=str(log))[0] == 0
    success = _samples(_prom_file(tmp_path / "textfile").read_text())["hermes_ops_last_success_timestamp_seconds"]

    typo = tmp_path / ".hermse"
    typo.mkdir()
    rc, metrics_dir = _run(tmp_path, typo, log_file=str(log))
    assert rc == runner.EXIT_NO_PROFILES
    assert "default: no_profiles: no state.db under %s" % typo in capsys.readouterr().out
    samples = _samples(_prom_file(metrics_dir).read_text())
    assert samples["hermes_ops_last_success_timestamp_seconds"] == success
    assert samples["hermes_ops_profile_status"] == [
        ({"home": str(typo), "profile": "default", "status": "no_profiles", "reason": "no_database"}, 1.0)
    ]
    assert not list(typo.iterdir())  # nothing created in it

    rc, metrics_dir = _run(tmp_path, home, log_file=str(log), prune_days=-1)
    assert rc == runner.EXIT_CONFIG
    assert "prune_days must not be negative" in capsys.readouterr().err
    samples = _samples(_prom_file(metrics_dir).read_text())
    assert samples["hermes_ops_last_run_config_error"][0][1] == 1
    assert samples["hermes_ops_last_success_timestamp_seconds"] == success
    assert "hermes_ops_profile_status" not in samples
    last_run = log.read_text().split("=== Session Maintenance Start")[-1]
    assert "ERROR config %s: prune_days must not be negative" % (tmp_path / "maintenance.json") in last_run
