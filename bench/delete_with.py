"""``delete_with: hermes`` beside the engine on the same 0.22.2 file, a live writer appending.

    sudo .venv/bin/python bench/delete_with.py [--sessions 3000] [--messages 20] [--rounds 1]

Builds one 0.22.2 home (half its sessions prunable), copies it per run into a directory owned by a
test user (the hermes path runs the release as the file's owner, never as root), starts 0.22.2's
own writer appending every 20 ms, runs the maintenance with ``delete_with`` engine then hermes (in
alternation over ``--rounds``) and prints, per run: sessions left, messages pruned, prune rows/s
(messages pruned over the profile's duration) and the writer's worst stall during the run. The
machine may be loaded: compare the two sides of one round, not figures across runs.
"""

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "lib")]

from hermes_releases import hermes_python_for  # noqa: E402
from hermes_reliability import chown_tree, user_with_dir  # noqa: E402
from hermes_writer import WriterProcess, latency_stats  # noqa: E402

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance  # noqa: E402
from hermes_fixtures import copy_db, hermes_python, make_big_home, session_ids  # noqa: E402

LAYOUT = "hermes-0.22.2.post1"


def one_run(side, original, base, uid, gid, python):
    home = base / side
    if home.exists():
        shutil.rmtree(str(home))
    home.mkdir()
    db = home / "state.db"
    copy_db(original, db)
    chown_tree(home, uid, gid)
    writer = WriterProcess(hermes_python(LAYOUT), db, base / ("writer-%s.jsonl" % side), interval=0.02)
    writer.start()
    time.sleep(1.0)
    t0 = time.time()
    result = run_maintenance(
        {"hermes_home": [str(home)], "backup": False, "vacuum_mode": "never", "delete_with": side,
         "hermes_python": python}
    )  # fmt: skip
    t1 = time.time()
    time.sleep(0.5)
    writer.stop()
    stall = latency_stats(writer.records(), t0, t1)
    (p,) = result["profiles"]
    assert p["status"] == "ok", p["error"]
    return {
        "side": side,
        "deleted_by": p["deleted_by"],
        "left": len(session_ids(db)),
        "pruned": p["sessions_pruned"],
        "messages": p["messages_pruned"],
        "seconds": p["duration"],
        "rows_s": p["messages_pruned"] / p["duration"],
        "worst_ms": 1000 * (stall["max"] or 0),
        "p99_ms": 1000 * (stall["p99"] or 0),
        "failed": stall["failed"],
        "appends": stall["n"] if "n" in stall else None,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=3000)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-delete-with-"))
    try:
        original = make_big_home(str(scratch / "original"), LAYOUT, args.sessions, args.messages)
        with user_with_dir("hermes-ops-delw", "hermes-ops-delw-bench-") as (uid, gid, base):
            python = hermes_python_for(LAYOUT, base)
            print("file: %s, %d sessions x %d messages" % (LAYOUT, args.sessions, args.messages))
            for round_ in range(args.rounds):
                sides = ("engine", "hermes") if round_ % 2 == 0 else ("hermes", "engine")
                runs = {side: one_run(side, original, base, uid, gid, python) for side in sides}
                for side in ("engine", "hermes"):
                    print("round %d %s" % (round_, runs[side]))
                e, h = runs["engine"], runs["hermes"]
                print(
                    "round %d: sessions left %d (engine) %d (hermes); rows/s %.0f vs %.0f (hermes/engine %.2fx); "
                    "worst stall %.0f ms vs %.0f ms" % (
                        round_, e["left"], h["left"], e["rows_s"], h["rows_s"], h["rows_s"] / e["rows_s"],
                        e["worst_ms"], h["worst_ms"],
                    )
                )  # fmt: skip
    finally:
        shutil.rmtree(str(scratch), ignore_errors=True)


if __name__ == "__main__":
    main()
