"""What every part of the bench shares: paths, sizes, the targets, formatting."""

import os
import platform
import sqlite3
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"  # one JSON per mode: the raw data the page is made from
NOTES = REPO / "bench" / "notes"  # hand-written notes the page includes
PAGE = REPO / "docs" / "benchmarks.md"
# The elision bench's hand-written page beside it (bench/elision.py prints its figures; no results file).
ELISION = "benchmarks_elision.md"
PLOTS = REPO / "docs" / "benchmarks"  # the page's PNGs

MB = 1024 * 1024
MSGS_PER_SESSION = 100
# The targets for a run beside a gateway that writes every 20 ms (docs/benchmarks.md's table).
TARGETS = {"stall": 0.250, "rows_ratio": 0.6, "backup_ratio": 0.8, "rss_mb": 100, "p99": 0.150}
CEILING_RATIO = 0.85  # the ceiling (bounded transactions back to back) against the release's one transaction
IDLE_ROWS_RATIO = 0.9  # of the ceiling (of the release's, where none was run) beside a gateway that holds the file
# but does not write (--writer-interval 3600)

# The three benchmarks: which release's prune, in which journal mode, and the base files' name.
MODES = {
    "wal-0.19": {"release": "0.19.0", "journal": "wal", "base": "base", "hermes": "hermes"},
    "delete-0.22": {"release": "0.22.2.post1", "journal": "delete", "base": "rollback-base", "hermes": "hermes-0.22"},
    "wal-0.22": {"release": "0.22.2.post1", "journal": "wal", "base": "current-wal-base", "hermes": "hermes-0.22"},
}


def idle_gateway(doc):
    """Whether the live writer of a results document held the file without writing (make bench-idle)."""
    return (doc.get("writer_interval") or 0.02) >= 1


def collections_root():
    """build/collections, where ansible_collections.hermes_agent.ops is this checkout."""
    root = REPO / "build" / "collections"
    link = root / "ansible_collections" / "hermes_agent" / "ops"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("..", "..", "..", ".."), target_is_directory=True)
    return str(root)


def parse_size(text):
    text = text.strip().lower()
    return int(float(text[:-1]) * 1000) if text.endswith("k") else int(text)


def size_label(n):
    return "%dk" % (n // 1000)


def db_bytes(db):
    return sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))


def ms(value):
    return "-" if value is None else "%.0f" % (value * 1000)


def fmt_mb(value):
    return "%.1f" % (value / MB)


def load_average():
    return "%.2f %.2f %.2f" % os.getloadavg()


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return "%s, %d cores (%s), %.0f GB RAM, Python %s, SQLite %s" % (
        platform.platform(),
        os.cpu_count(),
        cpu,
        mem,
        platform.python_version(),
        sqlite3.sqlite_version,
    )


def utc(t, fmt="%Y-%m-%d %H:%M"):
    return time.strftime(fmt, time.gmtime(t))
