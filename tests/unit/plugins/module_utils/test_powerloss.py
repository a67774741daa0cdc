"""Power loss at any instant loses nothing: crash states of recorded runs (tests/lib/crash_states.py).

Each test records one real run under strace and checks the crash states it could leave (strict
POSIX model and ext4-like model) against the path's invariants (tests/lib/powerloss_paths.py).
This is the unit suite's subset: about four crash points per path (HERMES_POWERLOSS_POINTS; the
end of the run always among them) in both models, and each negative control in the strict model on
the path that shows it. ``make powerloss-trials`` checks every crash point of every path in both
models, and every control in both.
"""

import os
import shutil

import powerloss_trials
import pytest

from hermes_fixtures import hermes_python

POINTS = int(os.environ.get("HERMES_POWERLOSS_POINTS", "4"))
# The release's read and the maintenance rerun on every DEEP-th distinct state (CPU: see docs/safety.md).
DEEP = int(os.environ.get("HERMES_POWERLOSS_DEEP", "4"))

pytestmark = [
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (CI installs it)"),
]


@pytest.mark.parametrize(
    "path",
    [
        "prune-wal-frames",
        "prune-archive-holder",
        "restore",
        "restore-rollback",
        "session-restore",
        "file-retention",
        "metrics-log",
    ],
)
def test_no_crash_state_breaks_an_invariant(path):
    """And on a sample of the states: the real release opens state.db and its search finds a kept
    session; on the maintenance paths a rerun converges to the uninterrupted run, a second changes
    nothing; on the restore paths the release counts the old database's rows or the backup's, and
    restoring again then a maintenance run converge; restoring the sessions again converges."""
    found = powerloss_trials.trial(path, points=POINTS, deep=DEEP)
    for model, result in found.items():
        assert result["states"] > 1, (model, result)
        assert result["violations"] == [], (model, result["violations"][:5])
        deep = result["deep"]
        if deep is None:  # metrics and log: no state.db
            continue
        if hermes_python(powerloss_trials.powerloss_paths.RELEASE) is not None:
            assert deep["release_found_kept"] > 0, (model, deep)
        if path.startswith(("prune-", "restore")) or path in ("file-retention", "session-restore"):
            assert deep["converged"] == deep["reruns"] > 0, (model, deep)


@pytest.mark.parametrize(
    "control",
    [
        "backup_dir_created_durably",
        "transcripts_after_durable_commit",
        "transcript_list_durable",
        "transcript_removals_durable",
        "rollback_synchronous_extra",
        "restore_aside_durable",
        "restore_settles_the_old_file",
        "session_restore_pending_after_commits",
        "retention_newest_durable",
        "metrics_rename_durable",
        "runner_log_durable",
    ],
)
def test_each_durability_step_is_needed(control):
    """With one durability step made a no-op (in the recorded child only), violations show."""
    path = powerloss_trials.powerloss_paths.CONTROLS[control][0]
    # the lost backup directory shows at one crash point only (the first delete's): every point (45 states)
    points = None if control == "backup_dir_created_durably" else POINTS
    found = powerloss_trials.trial(path, models=("strict",), disable=(control,), points=points)
    assert found["strict"]["violations"], found["strict"]["states"]


@pytest.mark.skipif(shutil.which("eatmydata") is None, reason="needs eatmydata (CI installs it)")
@pytest.mark.parametrize("path", powerloss_trials.powerloss_paths.EATMYDATA_PATHS)
def test_eatmydata_breaks_the_invariants(path):
    """Under eatmydata (fsync a no-op in the libc, the kernel never asked) the explorer reports violations:
    it sees the run's fsyncs in the trace, not the engine's intent."""
    found = powerloss_trials.trial(path, models=("strict",), points=POINTS, eatmydata=True)
    assert found["strict"]["violations"], found["strict"]["states"]
