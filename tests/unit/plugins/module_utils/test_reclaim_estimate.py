"""Check mode's ``freed`` is what the run frees, within 25%.

Each file is built by a real Hermes release (0.19.0 in WAL mode, 0.22.2 in rollback-journal
mode): 600 sessions of 20 messages, two thirds of them older than the retention, then three tool
outputs per session of 300 to 20,000 bytes appended by the release's own ``append_message`` (one
transaction each, so both FTS5 indexes hold many segments as a gateway leaves them). Check mode runs
on one copy, the real run on another, with a full VACUUM and, on a copy switched to
``auto_vacuum=INCREMENTAL``, with incremental steps; ``reclaim.bytes_freed`` of the two is compared.
Run with ``-s`` for the table of the estimate against the run (columns: release, journal mode, vacuum,
sessions pruned, the file before, check mode's ``freed``, the run's, the difference).
"""

import json
import os
import random
import shutil
import sqlite3

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.reclaim import full_vacuum
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.actions import human_size
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from hermes_fixtures import (
    APPEND_MESSAGES,
    hermes_python,
    layout_available,
    make_big_home,
    missing_venv_message,
    run_release_code,
    terminal_dump,
)

RELEASES = {"hermes-0.19.0": "wal", "hermes-0.22.2.post1": "delete"}
TOOL_SIZES = (300, 2000, 6000, 20000)
TOLERANCE = 0.25
pytestmark = [pytest.mark.slow, pytest.mark.releases]


def add_tool_outputs(db, layout, workdir, per_session=3, seed=5):
    """Tool outputs in every session, each appended in its own transaction by the release itself."""
    rng = random.Random(seed)
    conn = sqlite3.connect(db)
    spans = conn.execute("SELECT id, started_at, COALESCE(ended_at, started_at + 60) FROM sessions ORDER BY id")
    rows = [
        [sid, "tool", terminal_dump(sid, i, rng.choice(TOOL_SIZES)), "terminal", (start + end) / 2]
        for sid, start, end in spans.fetchall()
        for i in range(per_session)
    ]
    conn.close()
    plan = os.path.join(workdir, "append.json")
    with open(plan, "w") as handle:
        json.dump(rows, handle)
    proc = run_release_code(hermes_python(layout), APPEND_MESSAGES, db, plan, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One file per release, and its copy in auto_vacuum=INCREMENTAL mode, built once."""
    files = {}

    def get(layout, incremental):
        if not layout_available(layout):
            pytest.skip(missing_venv_message(layout))
        if layout not in files:
            home = tmp_path_factory.mktemp(layout)
            db = str(make_big_home(str(home), layout, 600, 20, old_fraction=0.69, seed=3))
            add_tool_outputs(db, layout, str(home))
            switched = str(tmp_path_factory.mktemp(layout + "-incremental") / "state.db")
            shutil.copyfile(db, switched)
            conn = sqlite3.connect(switched, isolation_level=None)
            full_vacuum(conn, True)  # as a run with vacuum_mode=full and vacuum_switch_incremental leaves it
            conn.close()
            files[layout] = {False: db, True: switched}
        return files[layout][incremental]

    return get


def copy_home(db, home):
    os.makedirs(os.path.join(home, "sessions"))
    target = os.path.join(home, "state.db")
    shutil.copyfile(db, target)
    os.chmod(target, 0o600)
    return target


def freed(db, home, check_mode, mode):
    copy_home(db, home)
    options = {"hermes_home": [home], "prune_days": 7, "vacuum_mode": mode, "backup": False, "batch_pause": 0}
    result = run_maintenance(options, check_mode=check_mode)
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile
    return profile, result["summary"][0]


@pytest.mark.parametrize("mode", ["full", "incremental"])
@pytest.mark.parametrize("layout", sorted(RELEASES))
def test_check_mode_freed_is_within_a_quarter_of_the_run(built, tmp_path, layout, mode):
    db = built(layout, mode == "incremental")
    check, check_line = freed(db, str(tmp_path / "check"), True, mode)
    run, _line = freed(db, str(tmp_path / "run"), False, mode)
    assert run["preflight"]["journal_mode"] == RELEASES[layout]
    assert check["reclaim"]["action"] == run["reclaim"]["action"] == mode
    assert check["sessions_pruned"] == run["sessions_pruned"] > 300
    estimate, measured = check["reclaim"]["bytes_freed"], run["reclaim"]["bytes_freed"]
    before = run["before"]["db_bytes"] + run["before"]["wal_bytes"]
    print(
        "\n| %s | %s | %s | %d of %d | %s | %s | %s | %+.1f%% |"
        % (layout, RELEASES[layout], mode, run["sessions_pruned"], run["before"]["sessions"], human_size(before),
           human_size(estimate), human_size(measured), 100.0 * (estimate - measured) / measured)
    )  # fmt: skip
    assert measured > 0
    assert abs(estimate - measured) <= TOLERANCE * measured, (estimate, measured, check["reclaim"], run["reclaim"])
    assert "freed=~%s " % human_size(estimate) in check_line, check_line
