"""The benchmark against Hermes's own prune (``make bench``, ``make bench-rollback``, ``make bench-current-wal``).

One module per concern, imported in this order only (no cycle):

* ``common``: paths, sizes, the targets, formatting helpers;
* ``datasets``: the generated base files (one per mode and size, cached) and the fresh copies;
* ``writer``: the live Hermes writer and the control writer beside a run, and what their
  appends waited for;
* ``runs``: the release's prune and ours, side by side on identical copies, rounds and sweeps;
* ``report`` / ``plots``: bench/results/*.json -> docs/benchmarks.md and its PNGs (stdlib tables;
  matplotlib only in ``plots``);
* ``run``: the command line (``python bench/run.py [--rollback | --current-wal] ...``).
"""

import sys
from pathlib import Path

# The harness every part uses (hermes_fixtures, hermes_writer, hermes_rollback: standard library).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))
