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

# ansible-test units runs pytest with its own ini file (not pyproject.toml): register the
# project's markers here too, so --strict-markers accepts them there.
MARKERS = (
    "slow: takes more than a few seconds (still part of `make test`)",
    "matrix: support-matrix run over Hermes releases / Python versions (`make matrix`, not in `make test`)",
)


def pytest_configure(config):
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def pytest_report_header(config):
    # the support matrix records which Python and which SQLite library each run tested
    return "hermes_agent.ops: Python %s (%s), SQLite %s" % (
        sys.version.split()[0],
        sys.executable,
        sqlite3.sqlite_version,
    )
