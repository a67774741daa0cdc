# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""prune_days_by_source on a state.db the real 0.22.2 release wrote, with sessions of several
sources: each source's own retention, the rest prune_days, every protection rule still on;
check mode predicts the real run exactly; the summary line says which retention applied to what.
"""

import json

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes import runner
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import build_home, layout_available, missing_venv_message, session_ids

LAYOUT = "hermes-0.22.2.post1"
OPTIONS = {"prune_days": 7, "prune_days_by_source": {"cron": 3, "telegram": 365}, "zombie_days": 1}


def _ended(sid, source, days, **more):
    return dict(id=sid, source=source, started_days_ago=days + 0.5, ended_days_ago=days, messages=2, **more)


SPECS = [
    _ended("cron-5d", "cron", 5),  # cron's 3 days: pruned
    _ended("cron-2d", "cron", 2),  # kept
    _ended("cron-pinned-30d", "cron", 30, pinned=True),  # a pin protects it whatever the retention
    _ended("telegram-100d", "telegram", 100),  # a year for telegram: kept
    _ended("telegram-400d", "telegram", 400),  # pruned
    _ended("cli-10d", "cli", 10),  # prune_days 7: pruned
    _ended("cli-5d", "cli", 5),  # kept (cron's shorter retention is not cli's)
    _ended("discord-30d", "discord", 30),  # no entry of its own: prune_days, pruned
    # a delegate goes with its parent, by the parent's retention (telegram: kept, with its child)
    _ended("telegram-parent-50d", "telegram", 50),
    dict(_ended("subagent-child-50d", "subagent", 50), parent="telegram-parent-50d", delegate=True),
]
PRUNED = {"cron-5d", "telegram-400d", "cli-10d", "discord-30d"}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    if not layout_available(LAYOUT):
        pytest.skip(missing_venv_message(LAYOUT))
    home = tmp_path_factory.mktemp("by-source") / "hermes"
    build_home(home, LAYOUT, SPECS)
    return home


def test_each_source_takes_its_own_retention_and_check_mode_is_exact(home):
    db = home / "state.db"
    before = session_ids(db)
    predicted = run_maintenance(dict(OPTIONS, hermes_home=[str(home)]), check_mode=True)
    p = predicted["profiles"][0]
    assert p["status"] == "ok", p["error"]
    assert session_ids(db) == before  # check mode wrote nothing
    assert p["sessions_pruned"] == len(PRUNED)
    assert p["retention"] == {
        "prune_days": 7.0,
        "by_source": {"cron": 3.0, "telegram": 365.0},
        "selected": {"cron": 1, "telegram": 1, "cli": 1, "discord": 1},
    }
    line = predicted["summary"][0]
    assert "retention 7d (2 sessions), cron 3d (1), telegram 365d (1)" in line, line
    result = run_maintenance(dict(OPTIONS, hermes_home=[str(home)], backup=False))
    done = result["profiles"][0]
    assert done["status"] == "ok", done["error"]
    assert before - session_ids(db) == PRUNED
    for key in ("sessions_pruned", "messages_pruned", "sessions_orphaned", "transcripts_removed", "retention"):
        assert done[key] == p[key], key
    assert result["summary"][0].split("; ", 1)[1].startswith("retention 7d (2 sessions), cron 3d (1)")


@pytest.mark.parametrize(
    "by_source, message",
    [
        ({"cron": 0.5}, "zombie_days (1) is larger than prune_days_by_source[cron] (0.5)"),
        ({"cron": -1}, "prune_days_by_source[cron] must not be negative"),
        ({"cron": "soon"}, "prune_days_by_source[cron] must be a number of days"),
        (["cron", 3], "prune_days_by_source must be a mapping of source to days"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(tmp_path, by_source, message):
    with pytest.raises(MaintenanceError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        run_maintenance({"hermes_home": [str(tmp_path)], "zombie_days": 1, "prune_days_by_source": by_source})


def test_the_runner_takes_the_mapping_from_its_config(tmp_path, home, capsys):
    cfg = tmp_path / "maintenance.json"
    cfg.write_text(json.dumps(dict(OPTIONS, hermes_home=[str(home)], syslog=False)))
    assert runner.main(["--config", str(cfg), "--dry-run"]) == 0
    assert "cron 3d" in capsys.readouterr().out
    cfg.write_text(json.dumps({"hermes_home": [str(home)], "syslog": False, "prune_days_by_source": 3}))
    assert runner.main(["--config", str(cfg), "--dry-run"]) != 0
    assert "'prune_days_by_source' must be a mapping" in capsys.readouterr().err
