"""Benchmark: Hermes's own prune versus this collection's maintenance, side by side, under a live writer.

    python bench/run.py                    # Hermes 0.19.0, WAL mode: 50k, 200k, 800k messages (make bench)
    python bench/run.py --sizes 50k        # quicker
    python bench/run.py --sweep            # also the batch_size x batch_pause x batch_time grid (make bench-sweep)
    python bench/run.py --rollback         # Hermes 0.22.2, journal_mode=DELETE (make bench-rollback)
    LD_LIBRARY_PATH=<fixed libsqlite3> python bench/run.py --current-wal   # 0.22.2, WAL (make bench-current-wal)

Each run writes its raw data to bench/results/<mode>.json (wal-0.19, delete-0.22, wal-0.22), then
rewrites docs/benchmarks.md, its plots and the detail pages from every results file (bench/report.py;
the plots need matplotlib: the make targets run this with the venv of requirements/bench.txt).
``--no-out`` prints only. Exit status 1 when a target is missed. How the runs are made: bench/runs.py.
"""

import argparse
import json
import resource
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report, runs  # noqa: E402
from bench.common import MODES, PAGE, PLOTS, REPO, RESULTS, collections_root, load_average  # noqa: E402
from hermes_fixtures import hermes_python  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--sizes", default="50k,200k,800k")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--out", default=str(PAGE), help="the page rewritten from the results (docs/benchmarks.md)")
    parser.add_argument("--results", default=str(RESULTS), help="where <mode>.json is written (bench/results)")
    parser.add_argument("--plots", default=str(PLOTS), help="where the page's PNGs are written (docs/benchmarks)")
    parser.add_argument("--no-out", action="store_true", help="print only, write neither results nor the page")
    parser.add_argument(
        "--label", default="", help="results in <mode>-<label>.json beside the mode's own (make bench-large: large)"
    )
    parser.add_argument("--no-inc", action="store_true", help="skip the ours-inc runs (0.19.0)")
    parser.add_argument(
        "--refusals",
        action="store_true",
        help="also a copy of the largest file on a disk that cannot hold its backup or a VACUUM (root: a tmpfs; "
        "make bench-large)",
    )
    parser.add_argument("--sweep", action="store_true", help="also the batch_size x batch_pause x batch_time grid")
    parser.add_argument("--sweep-size", default="50k")
    parser.add_argument(
        "--ceiling", type=float, default=runs.CEILING_BOUND,
        help="the bound (s) of the ceiling's transactions, run beside ours each round (0: no ceiling run)",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=3, help="rounds of the main runs per size (medians)")
    parser.add_argument("--reps", type=int, default=2, help="repeats of every sweep point (round robin)")
    parser.add_argument("--opts", default=None, help="JSON engine options for the ours runs (exploration only)")
    parser.add_argument(
        "--writer-interval",
        type=float,
        default=0.02,
        help="seconds between the live writer's appends; 3600: a gateway that holds the file but does not write "
        "(make bench-idle)",
    )
    parser.add_argument("--rollback", action="store_true", help="Hermes 0.22.2 in journal_mode=DELETE instead")
    parser.add_argument(
        "--current-wal",
        action="store_true",
        help="Hermes 0.22.2 in journal_mode=WAL on a fixed SQLite (LD_LIBRARY_PATH; make bench-current-wal) instead",
    )
    parser.add_argument(
        "--grid",
        default=None,
        help="batch_size:batch_pause[:batch_time] points for --sweep (batch_time 0 = no time bound); default: "
        "%s, with --rollback or --current-wal %s" % (runs.WAL_GRID, runs.ROLLBACK_GRID),
    )
    return parser.parse_args(argv)


def refusal(mode, args):
    """Why this bench cannot run here (None: it can), said before anything is generated."""
    release = MODES[mode]["release"]
    if hermes_python(release) is None:
        return "no venv with Hermes %s (.cache/venvs/hermes-%s): run tests/setup_hermes_venvs.sh" % (release, release)
    if release != "0.19.0":  # Hermes >= 0.20 picks the journal mode from the linked SQLite
        sys.path.insert(0, collections_root())
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import (
            sqlite_wal_reset_affected,
        )

        chosen = "delete" if sqlite_wal_reset_affected(sqlite3.sqlite_version_info) else "wal"
        if chosen != MODES[mode]["journal"]:
            return "SQLite %s here: 0.22.2 runs %s on it, not %s. %s" % (
                sqlite3.sqlite_version,
                chosen.upper(),
                MODES[mode]["journal"].upper(),
                "Run `make bench-current-wal` (it puts a fixed libsqlite3 first on LD_LIBRARY_PATH)."
                if mode == "wal-0.22"
                else "Run it without LD_LIBRARY_PATH pointing at a fixed libsqlite3.",
            )
    if not args.no_out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return "no matplotlib for the page's plots: run it as `make bench*` (requirements/bench.txt), or --no-out"
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    mode = "wal-0.22" if args.current_wal else "delete-0.22" if args.rollback else "wal-0.19"
    why = refusal(mode, args)
    if why:
        sys.exit(why)
    name = mode + ("-" + args.label if args.label else "")
    doc = runs.measure(mode, args, argv, name)
    print()
    print(report.console(doc))
    print("load average before %s, after %s" % (doc["load_before"], load_average()))
    if not args.no_out:
        results = Path(args.results)
        results.mkdir(parents=True, exist_ok=True)
        (results / (name + ".json")).write_text(json.dumps(doc, indent=1, default=str) + "\n")
        report.write(results, Path(args.out), Path(args.plots))
        print("wrote %s and rewrote %s from %s" % (results / (name + ".json"), args.out, results))
    print("(bench driver peak RSS %.0f MB)" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0))
    return 1 if report.missed([doc]) else 0


if __name__ == "__main__":
    sys.exit(main())
