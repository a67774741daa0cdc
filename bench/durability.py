"""Benchmark: what the power-loss durability steps cost, beside a live Hermes writer.

    .venv/bin/python bench/durability.py [--commits 60] [--pause 0.1] [--rounds 3] [--workdir build/bench-durability]

(``make bench-durability``; about 3 minutes.) A Hermes home built by the test fixtures (tests/lib/hermes_fixtures:
400 ended sessions of 30 messages, layout v30, both FTS indexes) is copied fresh for each variant.
The real Hermes 0.22.2 ``SessionDB`` appends a message every 20 ms to it (tests/lib/hermes_writer.py,
as in ``make bench``) while our connection (``open_rw``, the engine's) commits ``--commits`` small
prune-like transactions (BEGIN IMMEDIATE, delete 5 messages of one session through the FTS
triggers, COMMIT), ``--pause`` apart as the prune's pacing lets the writer in:

* ``wal``: WAL mode at ``synchronous=NORMAL`` (the engine's), no fsync after the COMMIT;
* ``wal+commits_durable``: the same, ``commits_durable`` after every COMMIT (fsync of the
  ``-wal``, the file and the directory). The prune calls it once per transaction that removes
  transcripts, after the COMMIT: outside the write lock, so it should cost the writer nothing;
* ``delete/EXTRA`` and ``delete/FULL``: rollback-journal mode (``journal_mode=DELETE``, where EXTRA
  adds a directory fsync after each journal deletion) at the engine's EXTRA and at FULL;
* ``persist/EXTRA`` and ``persist/FULL``: ``journal_mode=PERSIST``, what the prune uses;
* ``writer alone``: no commits of ours in the same window (this shared machine's noise floor).

The variants run in turn, ``--rounds`` times (the machine's load drifts); a row is all of a variant's
rounds together. Prints one row per variant: our COMMIT statement's median and worst (where ``synchronous`` decides
the fsyncs; the lock is held through it), ``commits_durable``'s median, and the writer's appends in the window (count,
median, p99, worst latency, failures).
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import REPO, collections_root  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "lib"))
from hermes_writer import WriterProcess, latency_stats  # noqa: E402

from hermes_fixtures import build_home, hermes_python  # noqa: E402

RELEASE = "hermes-0.22.2.post1"
VARIANTS = (
    ("writer alone", "wal", None, False),
    ("wal", "wal", None, False),
    ("wal+commits_durable", "wal", None, True),
    ("delete/EXTRA", "delete", "EXTRA", False),
    ("delete/FULL", "delete", "FULL", False),
    ("persist/EXTRA", "persist", "EXTRA", False),
    ("persist/FULL", "persist", "FULL", False),
)


def template(workdir):
    home = workdir / "template"
    if not (home / "state.db").exists():
        specs = [
            {"id": "s%04d" % i, "source": "cli", "started_days_ago": 40, "ended_days_ago": 39, "messages": 30}
            for i in range(400)
        ]
        build_home(str(home), "v30", specs)
    return home / "state.db"


def variant(workdir, name, journal, synchronous, durable, commits, pause):
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import commits_durable, open_rw

    home = workdir / name.replace("/", "-").replace(" ", "-").replace("+", "-")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    db = str(home / "state.db")
    shutil.copyfile(str(template(workdir)), db)
    setup = sqlite3.connect(db)
    setup.execute("PRAGMA journal_mode=%s" % ("WAL" if journal == "wal" else "DELETE")).fetchone()
    setup.close()
    writer = WriterProcess(hermes_python(RELEASE), db, str(home / "writer.jsonl"), prefix="bench-d")
    writer.start()
    commit_times, durable_times = [], []
    try:
        time.sleep(0.5)
        conn = open_rw(db)
        if journal == "persist":
            conn.execute("PRAGMA journal_mode=PERSIST").fetchone()
        if synchronous:
            conn.execute("PRAGMA synchronous=%s" % synchronous)
        sessions = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE id LIKE 's%' ORDER BY id")]
        start = time.time()
        for i in range(commits):
            if name == "writer alone":
                time.sleep(pause)
                continue
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "DELETE FROM messages WHERE id IN (SELECT id FROM messages WHERE session_id = ? LIMIT 5)",
                (sessions[i % len(sessions)],),
            )
            began = time.perf_counter()  # the COMMIT alone: where synchronous decides the fsyncs
            conn.execute("COMMIT")
            committed = time.perf_counter()
            commit_times.append(committed - began)
            if durable:
                commits_durable(db)
                durable_times.append(time.perf_counter() - committed)
            time.sleep(pause)
        end = time.time()
        conn.close()
        time.sleep(0.3)
    finally:
        summary = writer.stop()
    window = [r for r in writer.records() if start <= r["t"] <= end]
    return commit_times, durable_times, window, summary["failed"]


def summarize(name, runs):
    """One row from a variant's rounds: every commit and every append of its windows together."""
    commit_times = [t for run in runs for t in run[0]]
    durable_times = [t for run in runs for t in run[1]]
    stats = latency_stats([r for run in runs for r in run[2]])
    return {
        "variant": name,
        "commits": len(commit_times),
        "commit_median_ms": statistics.median(commit_times) * 1000 if commit_times else None,
        "commit_max_ms": max(commit_times) * 1000 if commit_times else None,
        "commits_durable_median_ms": statistics.median(durable_times) * 1000 if durable_times else None,
        "writer_appends": stats["n"],
        "writer_p50_ms": stats["p50"] * 1000 if stats["p50"] is not None else None,
        "writer_p99_ms": stats["p99"] * 1000 if stats["p99"] is not None else None,
        "writer_max_ms": stats["max"] * 1000 if stats["max"] is not None else None,
        "writer_failed": stats["failed"] + sum(run[3] for run in runs),
    }


def _cell(value):
    return "-" if value is None else "%.2f" % value if value < 10 else "%.1f" % value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--commits", type=int, default=60)
    parser.add_argument("--pause", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3, help="the variants in turn, this many times (drift)")
    parser.add_argument("--workdir", default=str(REPO / "build" / "bench-durability"))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args(argv)
    if hermes_python(RELEASE) is None:
        sys.exit("%s: no venv under .cache/venvs (make prepare)" % RELEASE)
    sys.path.insert(0, collections_root())
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    runs = {v[0]: [] for v in VARIANTS}
    for _round in range(args.rounds):
        for v in VARIANTS:
            runs[v[0]].append(variant(workdir, *v, commits=args.commits, pause=args.pause))
    rows = [summarize(name, runs[name]) for name, *_rest in VARIANTS]
    print(
        "%s, SQLite %s (ours), %d rounds of %d commits %.0f ms apart, load %s before, %s after"
        % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), sqlite3.sqlite_version, args.rounds, args.commits,
           args.pause * 1000, " ".join("%.2f" % x for x in load), " ".join("%.2f" % x for x in os.getloadavg()))
    )  # fmt: skip
    print()
    print(
        "| variant | our COMMIT median / worst (ms) | commits_durable median (ms) | writer appends "
        "| writer median / p99 / worst (ms) | writer failures |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            "| %s | %s / %s | %s | %d | %s / %s / %s | %d |"
            % (
                row["variant"], _cell(row["commit_median_ms"]), _cell(row["commit_max_ms"]),
                _cell(row["commits_durable_median_ms"]), row["writer_appends"], _cell(row["writer_p50_ms"]),
                _cell(row["writer_p99_ms"]), _cell(row["writer_max_ms"]), row["writer_failed"],
            )
        )  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
