"""Power-loss trials: every path in both models, then every negative control (``make powerloss-trials``).

    python tests/lib/powerloss_trials.py [--paths a,b] [--controls a,b|eatmydata|none] [--points N] [--deep N]

Prints one line per path and model (distinct crash states checked, violations, how many states the
real release opened and found a kept session in, how many reruns of the maintenance converged,
seconds) and per control (violations found: must be > 0; ``eatmydata``: the run under eatmydata,
every fsync a no-op); exits 1 when a path has a violation or a control none.
``--points N`` checks about N crash points per path instead of all (the unit suite's subset);
``--deep N`` the release read and the rerun on every N-th state (default every one; 0 none).
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# imported for its side effect: it puts the collection on sys.path
import collection_paths  # noqa: E402, F401  # pylint: disable=unused-import
import crash_states  # noqa: E402
import powerloss_paths  # noqa: E402

MODELS = ("strict", "ext4")


def trial(path, models=MODELS, disable=(), points=None, eatmydata=False, deep=None):
    """{model: {states, violations, seconds, deep}} for one recorded run of ``path``.

    ``deep``: check every ``deep``-th distinct state with the release and a rerun too (Deep);
    ``found["deep"]`` counts them."""
    deeper = powerloss_paths.Deep(deep) if deep else None
    try:
        with tempfile.TemporaryDirectory(prefix="powerloss-") as workdir:
            recording, check = powerloss_paths.record_path(path, workdir, disable, eatmydata=eatmydata, deep=deeper)
            out = {}
            for model in models:
                began = time.monotonic()
                if check.deep:
                    check.deep.reset()
                found = crash_states.explore(recording, check, model, workdir, limit_points=points)
                found["seconds"] = time.monotonic() - began
                found["ops"] = len(recording.ops)
                found["deep"] = dict(check.deep.counts) if check.deep else None
                out[model] = found
            return out
    finally:
        if deeper:
            deeper.close()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--paths", default=",".join(powerloss_paths.PATHS))
    parser.add_argument("--controls", default=",".join(list(powerloss_paths.CONTROLS) + ["eatmydata"]))
    parser.add_argument("--points", type=int, default=None)
    parser.add_argument("--deep", type=int, default=1, help="release read and rerun on every N-th state (0: none)")
    args = parser.parse_args(argv)
    failed = False
    print(
        "| path | model | operations | crash states | violations | release opened / found a kept session "
        "| reruns converged | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for path in filter(None, args.paths.split(",")):
        for model, found in trial(path, points=args.points, deep=args.deep).items():
            deep = found["deep"] or dict.fromkeys(("release_opened", "release_found_kept", "reruns", "converged"), 0)
            print(
                "| %s | %s | %d | %d | %d | %d / %d | %d of %d | %.1f |"
                % (
                    path, model, found["ops"], found["states"], len(found["violations"]), deep["release_opened"],
                    deep["release_found_kept"], deep["converged"], deep["reruns"], found["seconds"],
                )
            )  # fmt: skip
            for where, text in found["violations"][:5]:
                print("|   | %s: %s |" % (where, text))
            failed |= bool(found["violations"])
    controls = [] if args.controls == "none" else list(filter(None, args.controls.split(",")))
    if controls:
        print()
        print("| negative control (one durability step made a no-op) | path | strict violations | ext4 violations |")
        print("|---|---|---|---|")
    runs = [(name, path) for name in controls if name != "eatmydata" for path in powerloss_paths.CONTROLS[name][:1]]
    if "eatmydata" in controls:  # every fsync at once
        runs += [("eatmydata", path) for path in powerloss_paths.EATMYDATA_PATHS]
    for name, path in runs:
        if name == "eatmydata":
            found = trial(path, points=args.points, eatmydata=True)
        else:
            found = trial(path, disable=(name,), points=args.points)
        counts = [len(found[m]["violations"]) for m in MODELS]
        print("| %s | %s | %d | %d |" % (name, path, counts[0], counts[1]))
        example = (found["strict"]["violations"] or found["ext4"]["violations"])[:1]
        for where, text in example:
            print("|   | e.g. %s: %s |" % (where, text))
        failed |= not sum(counts)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
