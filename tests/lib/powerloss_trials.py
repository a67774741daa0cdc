"""Power-loss trials: every path in both models, then every negative control (``make powerloss-trials``).

    python tests/lib/powerloss_trials.py [--paths a,b] [--controls a,b|none] [--points N]

Prints one line per path and model (distinct crash states checked, violations, seconds) and per
control (violations found: must be > 0); exits 1 when a path has a violation or a control none.
``--points N`` checks about N crash points per path instead of all (the unit suite's subset).
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


def trial(path, models=MODELS, disable=(), points=None, eatmydata=False):
    """{model: {states, violations, seconds}} for one recorded run of ``path``."""
    with tempfile.TemporaryDirectory(prefix="powerloss-") as workdir:
        recording, check = powerloss_paths.record_path(path, workdir, disable, eatmydata=eatmydata)
        out = {}
        for model in models:
            began = time.monotonic()
            found = crash_states.explore(recording, check, model, workdir, limit_points=points)
            found["seconds"] = time.monotonic() - began
            found["ops"] = len(recording.ops)
            out[model] = found
        return out


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--paths", default=",".join(powerloss_paths.PATHS))
    parser.add_argument("--controls", default=",".join(list(powerloss_paths.CONTROLS) + ["eatmydata"]))
    parser.add_argument("--points", type=int, default=None)
    args = parser.parse_args(argv)
    failed = False
    print("| path | model | operations | crash states | violations | seconds |")
    print("|---|---|---|---|---|---|")
    for path in filter(None, args.paths.split(",")):
        for model, found in trial(path, points=args.points).items():
            print(
                "| %s | %s | %d | %d | %d | %.1f |"
                % (path, model, found["ops"], found["states"], len(found["violations"]), found["seconds"])
            )
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
