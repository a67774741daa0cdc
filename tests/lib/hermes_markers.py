# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The project's pytest markers, registered by both conftest files (ansible-test units reads
its own ini file, not pyproject.toml, so the markers cannot live there alone).

The heavy tests carry a marker that says why they are heavy; each of them also gets
``heavy``, so a contributor runs the fast set with ``pytest -m 'not heavy'``.
"""

MARKERS = (
    "slow: takes more than a few seconds (still part of `make test`)",
    "matrix: support-matrix run over Hermes releases / Python versions (`make matrix`, not in `make test`)",
    "crash: SIGKILL trials (a child killed at random points, then recovery checked)",
    "tmpfs: mounts a tiny tmpfs to fill the disk (root)",
    "root: needs root: switches users, chowns (skipped otherwise)",
    "releases: runs a real Hermes release from .cache/venvs (tests/setup_hermes_venvs.sh)",
    "heavy: any of slow, crash, tmpfs, root, releases; `pytest -m 'not heavy'` is the fast set",
    "release_line: a release between those every leg runs (0.20.0, 0.21.x): on the controller's Python and SQLite"
    " only (`make units`), not again in the matrix legs",
    "timing: timing-sensitive (live writers, stall bounds, race-dependent crash trials): runs alone, one at a time,"
    " never beside a parallel run (`make test`'s timing step)",
)
HEAVY = ("slow", "crash", "tmpfs", "root", "releases")
# Test modules whose every test depends on timing: a live writer's latency, a stall bound, a
# second process racing ours, a SIGKILL at a chosen step. Each of their tests gets ``timing``
# (a single such test elsewhere carries @pytest.mark.timing itself). CI runs them one at a
# time on an otherwise idle machine (scripts/pytest_split.sh), everything else with -n 2.
TIMING_MODULES = (
    "test_archive_crash",
    "test_backup_under_writes",
    "test_contention",
    "test_crash_safety",
    "test_identity_guards",
    "test_live_gateway",
    "test_live_hermes",
    "test_live_rollback",
    "test_live_writer",
    "test_restore_sessions",
    "test_service_window",
    "test_session_restore",
    "test_writer_turn",
)
RELEASE_LAYOUT_PREFIX = "hermes-"  # the fixture layouts that a real release builds
# The releases users run between the matrix's anchors (0.19.0, 0.20.1, 0.22.2): their breadth
# is in the controller's run; the matrix legs, which vary Python and SQLite, keep the anchors.
RELEASE_LINE = ("hermes-0.20.0.post2", "hermes-0.21.0.post1", "hermes-0.21.3.post1", "hermes-0.21.5.post2")


def register(config):
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def _layout_params(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    return [v for v in params.values() if isinstance(v, str) and v.startswith(RELEASE_LAYOUT_PREFIX)]


def _uses_a_release_layout(item):
    return bool(_layout_params(item))


def mark_heavy(items):
    """A layout parameter built by a real release marks the test ``releases``; heavy ones get
    ``heavy``; the tests of TIMING_MODULES get ``timing``."""
    import pytest

    for item in items:
        if item.path.stem in TIMING_MODULES and not item.get_closest_marker("timing"):
            item.add_marker(pytest.mark.timing)
        if _uses_a_release_layout(item) and not item.get_closest_marker("releases"):
            item.add_marker(pytest.mark.releases)
        if any(layout.startswith(RELEASE_LINE) for layout in _layout_params(item)):
            item.add_marker(pytest.mark.release_line)
        if any(item.get_closest_marker(name) for name in HEAVY):
            item.add_marker(pytest.mark.heavy)


def release_module_marks(version):
    """``pytestmark`` of a module that runs the real Hermes ``version`` throughout: slow,
    releases, and skipped where that release's venv is missing."""
    import pytest

    from hermes_fixtures import hermes_python

    missing = hermes_python(version) is None
    reason = "no hermes-%s venv (tests/setup_hermes_venvs.sh)" % version
    return [pytest.mark.slow, pytest.mark.releases, pytest.mark.skipif(missing, reason=reason)]
