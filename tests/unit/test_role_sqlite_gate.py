# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role decides which candidate interpreter's SQLite has the WAL-reset bug with its own
Jinja expression (it asks each interpreter only for its version, before the engine is on the
host): it must say what the engine's ``sqlite_wal_reset_affected`` says, at every boundary."""

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import sqlite_wal_reset_affected

TASKS = Path(__file__).resolve().parents[2] / "roles" / "session_maintenance" / "tasks" / "runner_python.yml"
VERSIONS = ["3.6.23", "3.7.0", "3.40.1", "3.44.5", "3.44.6", "3.44.7", "3.45.0", "3.45.1", "3.46.1", "3.50.6"]
VERSIONS += ["3.50.7", "3.50.8", "3.51.0", "3.51.1", "3.51.2", "3.51.3", "3.52.0", "3.53.4", "4.0.0"]


def _role_expression():
    tasks = yaml.safe_load(TASKS.read_text())
    (note,) = [task for task in tasks if task["name"] == "Note what each candidate offers"]
    return note["vars"]["_session_maintenance_v_affected"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_role_and_the_engine_agree_on_which_sqlite_is_affected(version):
    templar = Templar(loader=DataLoader(), variables={"_session_maintenance_v_sqlite": version})
    role_says = templar.template(trust_as_template(_role_expression()))
    engine_says = sqlite_wal_reset_affected(tuple(int(part) for part in version.split(".")))
    assert role_says is engine_says, version
