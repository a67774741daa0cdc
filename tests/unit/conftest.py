# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pytest set-up for the engine unit tests.

Makes these imports work in a plain ``pytest tests/unit`` run (no install, no activation)::

    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_engine import run_maintenance
    import hermes_fixtures          # tests/lib/hermes_fixtures.py

by putting ``<repo>/build/collections`` (creating the ``ansible_collections/hermes_agent/ops``
symlink to the repo root there if it is missing, as ``make collection-link`` does) and
``<repo>/tests/lib`` on ``sys.path``. Under ``ansible-test units`` the collection already sits
at a real ``ansible_collections/hermes_agent/ops`` path, which is used as is.
"""

import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
# Importing it puts the collection and tests/lib on sys.path.
import collection_paths  # noqa: E402, F401  # pylint: disable=unused-import
import hermes_markers  # noqa: E402


def pytest_configure(config):
    hermes_markers.register(config)


def pytest_collection_modifyitems(items):
    hermes_markers.mark_heavy(items)


def pytest_report_header(config):
    # the support matrix records which Python and which SQLite library each run tested
    return "hermes_agent.ops: Python %s (%s), SQLite %s" % (
        sys.version.split()[0],
        sys.executable,
        sqlite3.sqlite_version,
    )
