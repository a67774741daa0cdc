"""A quick figure for tool-payload elision (not the bench's 0.7/5 GB rows): a Hermes 0.22.2 home
whose bytes are mostly old tool output (the release appends every message itself), one run with
``prune_days: 365, tool_payload_days: 30`` beside a 0.22.2 writer appending every 20 ms, and the
same file again without a writer; prints the elided rows, the run's duration, the writer's worst
wait and ``storage`` (state_db_info) before and after, as JSON.

    .venv/bin/python bench/elision_quick.py WORKDIR [SESSIONS] [BODIES] [BYTES]
"""

import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))
# collection_paths puts the collection on sys.path when imported
import collection_paths  # noqa: E402, F401  # pylint: disable=unused-import
from hermes_writer import WriterProcess, latency_stats  # noqa: E402

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance  # noqa: E402
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info  # noqa: E402
from hermes_fixtures import (  # noqa: E402
    APPEND_MESSAGES,
    build_home,
    copy_db,
    hermes_python,
    run_release_code,
    terminal_dump,
)

RELEASE = "hermes-0.22.2.post1"
DAY = 86400.0


def storage_summary(home):
    st = gather_info({"hermes_home": [str(home)]})["profiles"][0]["storage"]
    objects = {k: v["bytes"] for k, v in st["by_object"].items() if v["bytes"] >= 65536}
    return {"file_bytes": st["page_count"] * st["page_size"], "free_bytes": st["free_bytes"], "objects": objects,
            "by_role": st["by_role"]}  # fmt: skip


def run(home, writer_dir=None):
    opts = {"hermes_home": [str(home)], "prune_days": 365, "tool_payload_days": 30, "vacuum_mode": "full"}
    writer = None
    if writer_dir:
        opts["vacuum_mode"] = "auto"
        writer = WriterProcess(hermes_python(RELEASE), home / "state.db", str(writer_dir / "w.jsonl"), prefix="q")
        writer.start()
        time.sleep(0.5)
    try:
        before = storage_summary(home)
        t0 = time.time()
        profile = run_maintenance(opts)["profiles"][0]
        t1 = time.time()
        out = {"status": profile["status"], "error": profile["error"], "seconds": round(t1 - t0, 2),
               "tool_payloads": profile["tool_payloads"], "storage_before": before}  # fmt: skip
        if writer:
            summary = writer.stop()
            during = latency_stats(writer.records(), t0, t1)
            out["writer"] = {
                "appends": during["n"],
                "failed": summary["failed"],
                "worst_ms": round(1000 * during["max"]),
                "p99_ms": round(1000 * during["p99"]),
            }
        out["storage_after"] = storage_summary(home)
        return out
    finally:
        if writer:
            writer.kill()


def main():
    work = Path(sys.argv[1])
    sessions, bodies, size = (int(a) for a in (sys.argv[2:5] + ["40", "100", "8000"][len(sys.argv[2:5]) :]))
    now = time.time()
    base = work / "base"
    if not (base / "state.db").exists():
        specs = [dict(id="s%d" % i, started_days_ago=200, ended_days_ago=100, messages=4) for i in range(sessions)]
        db = build_home(base, RELEASE, specs, now=now)
        rows = [["s%d" % i, "tool", terminal_dump("s%d" % i, j, size), "web_extract", now - (150 - j / 100.0) * DAY]
                for i in range(sessions) for j in range(bodies)]  # fmt: skip
        (work / "rows.json").write_text(json.dumps(rows))
        proc = run_release_code(hermes_python(RELEASE), APPEND_MESSAGES, db, str(work / "rows.json"), timeout=3000)
        assert proc.returncode == 0, proc.stderr[-2000:]
        conn = sqlite3.connect(str(db))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    results = {}
    for name, live in (("live", True), ("idle", False)):
        home = work / name
        shutil.rmtree(str(home), ignore_errors=True)
        home.mkdir(parents=True)
        copy_db(base / "state.db", home / "state.db")
        results[name] = run(home, work if live else None)
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
