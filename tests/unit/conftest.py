# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pytest set-up for the engine unit tests.

Makes these imports work in a plain ``pytest tests/unit`` run (no install, no activation)::

    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
    import hermes_fixtures          # tests/lib/hermes_fixtures.py

by putting ``<repo>/build/collections`` (creating the ``ansible_collections/hermes_agent/ops``
symlink to the repo root there if it is missing, as ``make collection-link`` does) and
``<repo>/tests/lib`` on ``sys.path``. Under ``ansible-test units`` the collection already sits
at a real ``ansible_collections/hermes_agent/ops`` path, which is used as is.
"""

import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
# Importing it puts the collection and tests/lib on sys.path.
import collection_paths  # noqa: E402, F401  # pylint: disable=unused-import
import hermes_markers  # noqa: E402


def pytest_configure(config):
    hermes_markers.register(config)


def _under_ansible_test():
    return "ansible_pytest_collections" in os.environ.get("PYTEST_PLUGINS", "")


def pytest_collection_modifyitems(config, items):
    hermes_markers.mark_heavy(items)
    # ansible-test units runs its tests on -n auto workers and takes no marker expression:
    # the timing tests (which must run alone) are left to `make unit-timing`, on the same
    # Python, one at a time.
    if _under_ansible_test():
        timing = [item for item in items if item.get_closest_marker("timing")]
        if timing:
            config.hook.pytest_deselected(items=timing)
            items[:] = [item for item in items if not item.get_closest_marker("timing")]


def pytest_report_header(config):
    # the support matrix records which Python and which SQLite library each run tested
    header = "hermes_agent.ops: Python %s (%s), SQLite %s" % (
        sys.version.split()[0],
        sys.executable,
        sqlite3.sqlite_version,
    )
    if _under_ansible_test():
        header += "; under ansible-test: the timing tests are deselected (make unit-timing runs them)"
    return header


@pytest.fixture
def home(release_home, tmp_path):
    """A private copy of the Hermes home a test module builds once as its ``release_home``."""
    copy = tmp_path / "hermes"
    shutil.copytree(release_home, copy)
    return copy
