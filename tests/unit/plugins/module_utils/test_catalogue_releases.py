"""The whole catalogue on every release's own file: each table, view, trigger, foreign key and
state_meta key family a release writes is one the engine knows, with its rule
(docs/compatibility.md, "Every object of the catalogue")."""

import sqlite3

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.catalogue import (
    fully_known,
    read_catalogue,
)
from hermes_fixtures import LAYOUTS, UPGRADES, build_home, layout_available, missing_venv_message

pytestmark = [pytest.mark.slow, pytest.mark.releases]
OLD = dict(started_days_ago=40, ended_days_ago=39, messages=3)

RELEASE_LAYOUTS = [name for name in LAYOUTS if name.startswith("hermes-") or name in UPGRADES] + ["v30"]


@pytest.mark.parametrize("layout", RELEASE_LAYOUTS)
def test_every_release_file_is_fully_known(tmp_path, layout):
    """Each table, view, trigger and key of what the releases write is in the catalogue, with its rule."""
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    specs = [dict(id="a", **OLD), dict(id="b", parent="a", started_days_ago=3, ended_days_ago=2)]
    db = build_home(str(tmp_path), layout, specs)
    conn = sqlite3.connect(str(db))
    try:
        catalogue = read_catalogue(conn)
    finally:
        conn.close()
    assert fully_known(catalogue), catalogue["unknown"]
