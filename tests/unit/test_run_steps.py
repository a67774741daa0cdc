# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""scripts/run_steps.sh, the runner of `make test` and `.ci/run`: budgets, the deadline, the
summary on any exit, per-step times against a baseline. Real make, real processes, a budgets
file of a few seconds (the committed one is .ci/budgets)."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

RUN_STEPS = Path(__file__).resolve().parents[2] / "scripts" / "run_steps.sh"

MAKEFILE = """\
quick:
\t@echo quick-output
slow:
\t@echo slow-output; sleep 60
broken:
\t@echo broken-output; exit 3
drifting:
\t@sleep 3
beside:
\t@sleep 4; touch beside.done
during:
\t@test ! -e beside.done
after-timing:
\t@test -e beside.done
pytestish:
\t@printf '%s\\n' '____ test_cut_at_the_bound ____' 'E   AssertionError: cut done' && seq 1 100 && exit 1
"""

BUDGETS = """\
# step baseline budget
total - 40
quick 5 20
slow 1 4
broken 1 20
drifting 1 20
beside 5 20
pytestish 1 20
"""


def _tree(tmp_path):
    (tmp_path / "Makefile").write_text(MAKEFILE)
    (tmp_path / "budgets").write_text(BUDGETS)
    return tmp_path


def _run(tree, *steps, **env):
    full_env = {"PATH": "/usr/bin:/bin", "STEPS_BUDGETS": str(tree / "budgets"), "STEPS_TITLE": "trial"}
    full_env.update(env)
    return subprocess.Popen(
        ["bash", str(RUN_STEPS), "make", *steps],
        cwd=str(tree),
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _processes_running(command):
    """Whether a process runs ``command`` (its argv joined by spaces), from /proc: a minimal
    Debian has no pgrep."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if f.read().replace(b"\0", b" ").strip() == command.encode():
                    return True
        except OSError:
            continue
    return False


def test_a_step_over_its_budget_is_stopped_and_named_with_the_end_of_its_log(tmp_path):
    tree = _tree(tmp_path)
    started = time.monotonic()
    out, _err = _run(tree, "quick", "slow", "broken").communicate(timeout=60)
    assert time.monotonic() - started < 30, out  # the 60 s sleep did not run out
    assert "make slow                TIMEOUT" in out, out
    assert "slow overran its budget of 4s" in out and "slow-output" in out.split("Stopped")[1], out
    assert "make broken              FAILED" in out and "broken-output" in out, out
    assert out.rstrip().endswith("steps: 1 passed, 2 failed"), out
    times = json.loads((tree / "build" / "logs" / "times.json").read_text())["steps"]
    assert times["quick"]["status"] == "ok" and times["slow"]["status"] == "TIMEOUT", times
    assert times["slow"]["budget"] == 4 and times["broken"]["status"] == "FAILED", times
    assert not _processes_running("sleep 60"), "the stopped step's process group is still running"


def test_a_hung_step_is_stopped_and_the_summary_printed_on_a_signal(tmp_path):
    tree = _tree(tmp_path)
    proc = _run(tree, "quick", "drifting", "broken", STEPS_HANG="drifting")
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    out, _err = proc.communicate(timeout=40)
    assert proc.returncode != 0
    assert "STEPS_HANG=drifting: sleeping 100000 s" in out, out
    assert "drifting: stopped by SIGTERM" in out and "summary: trial" in out, out
    # the step the signal kept from starting has its row, and counts as failed
    assert re.search(r"^broken +NOT-RUN", out, re.M) and "make broken: NOT RUN (SIGTERM came first)" in out, out
    assert out.rstrip().endswith("steps: 1 passed, 2 failed"), out
    assert not _processes_running("sleep 100000"), "the hung step survived its runner"


def test_the_deadline_stops_the_run_and_the_rest_does_not_run(tmp_path):
    tree = _tree(tmp_path)
    out, _err = _run(tree, "drifting", "quick", STEPS_DEADLINE="2").communicate(timeout=60)
    assert "drifting was running at the 2s deadline of trial" in out, out
    assert "make quick               NOT RUN (the 2s deadline had passed)" in out, out
    assert out.rstrip().endswith("steps: 0 passed, 2 failed"), out


def test_a_step_much_slower_than_its_baseline_is_named(tmp_path):
    tree = _tree(tmp_path)
    out, _err = _run(tree, "drifting", "quick", STEPS_DRIFT_MIN="0").communicate(timeout=60)
    assert "Slower than their baseline" in out, out
    assert re.search(r"drifting took [345]s, [345]\.0x its baseline of 1s", out), out
    assert "quick took" not in out, out


def test_a_timing_step_waits_for_the_jobs_started_beside_the_others(tmp_path):
    """ "&beside" runs while "during" does; "after-timing" starts only once it has ended."""
    tree = _tree(tmp_path)
    lock = tmp_path / "quiet.lock"
    out, _err = _run(tree, "&beside", "during", "after-timing", STEPS_QUIET_LOCK=str(lock)).communicate(timeout=60)
    assert "after-timing waits until the jobs beside it have ended" in out, out
    assert out.rstrip().endswith("steps: 3 passed, 0 failed"), out
    # without the lock (make test on its own) nothing waits
    (tree / "beside.done").unlink()
    out, _err = _run(tree, "during", "beside", "after-timing").communicate(timeout=60)
    assert "waits" not in out and out.rstrip().endswith("steps: 3 passed, 0 failed"), out


def test_a_failed_step_shows_its_failing_tests_and_assertions_above_the_tail(tmp_path):
    """pytest's traceback sits far above the last lines, which hold only the counts."""
    tree = _tree(tmp_path)
    out, _err = _run(tree, "pytestish", STEP_TAIL="5").communicate(timeout=60)
    head, tail = out.split("---- last 5 lines")
    assert "____ test_cut_at_the_bound ____" in head and "E   AssertionError: cut done" in head, out
    assert "\n100\n" in tail and "\n50\n" not in out, out
