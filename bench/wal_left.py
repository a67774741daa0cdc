"""The WAL our run leaves behind when it may not checkpoint (a WAL-reset-affected SQLite next to a holder).

    .venv/bin/python bench/wal_left.py [--size 800k] [--workdir build/bench]

Uses the cached base file of ``make bench`` (bench/datasets.py: a real 0.19.0 home, generated on first use), in WAL
mode, next to a holder that never checkpoints either (an idle reader with
wal_autocheckpoint=0: the worst case, nobody moves our frames into the file). Runs the
engine with its defaults and prints, while the holder is still open: the -wal size, the
frames in it, how many were backfilled (0 means nobody checkpointed), the file size, what
the run pruned and how many FTS merge steps it did.
"""

import argparse
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import REPO, collections_root, parse_size, size_label  # noqa: E402
from bench.datasets import base_db  # noqa: E402  (the cached base files of make bench)

HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint=0")
conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
print("ready", flush=True)
sys.stdin.read()
"""


def shm_counts(db):
    with open(db + "-shm", "rb") as handle:
        head = handle.read(104)
    return struct.unpack_from("=I", head, 16)[0], struct.unpack_from("=I", head, 96)[0]


def measure(workdir, n):
    base = base_db(workdir, "wal-0.19", n)
    home = workdir / "wal-left"
    shutil.rmtree(home, ignore_errors=True)
    (home / "sessions").mkdir(parents=True)
    db = str(home / "state.db")
    shutil.copyfile(base, db)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, db], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()
        sys.path.insert(0, collections_root())
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance

        started = time.time()
        result = run_maintenance({"hermes_home": [str(home)], "backup": False})
        took = time.time() - started
        frames, backfilled = shm_counts(db)
        wal = os.path.getsize(db + "-wal")
    finally:
        holder.communicate(b"", timeout=60)
    p = result["profiles"][0]
    return {
        "size": size_label(n),
        "sqlite": result["sqlite"],
        "db_mb": round(os.path.getsize(db) / 1e6, 1),
        "wal_left_mb": round(wal / 1e6, 1),
        "wal_frames": frames,
        "frames_backfilled": backfilled,
        "messages_pruned": p["messages_pruned"],
        "sessions_pruned": p["sessions_pruned"],
        "fts_merge_steps": p["reclaim"]["fts_merge_steps"],
        "checkpoint": p["reclaim"]["checkpoint"],
        "checkpoint_skipped_reason": p["reclaim"]["checkpoint_skipped_reason"],
        "vacuum_skipped_reason": p["reclaim"]["skipped_reason"],
        "run_seconds": round(took, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--size", default="800k")
    parser.add_argument("--workdir", default=str(REPO / "build" / "bench"))
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(json.dumps(measure(workdir, parse_size(args.size)), indent=2))


if __name__ == "__main__":
    main()
