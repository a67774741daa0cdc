"""The live writer beside every measured run, and what its slowest appends waited for.

A REAL Hermes ``SessionDB`` of the mode's release appends a message every 20 ms to the copy under
maintenance (tests/lib/hermes_writer.py); a second, *control* writer appends to its own small
untouched copy at the same time: its latencies are what this shared machine alone does to a
writer in that window (the noise floor), reported next to the measured ones.
"""

import shutil
import sqlite3
import statistics
import time

from hermes_writer import WriterProcess, latency_stats

from bench.common import db_bytes
from hermes_fixtures import hermes_python

BETWEEN = "(between phases)"


def with_writer(home, release, control_src, run, interval=0.02):
    """Start the writers on home/state.db (an append every ``interval`` seconds; 3600: a gateway
    that holds the file but does not write) and on a copy of ``control_src`` (every 20 ms), run(),
    stop them; return (result, rss, writer stats)."""
    db = str(home / "state.db")
    control_home = home.parent / "control"
    shutil.rmtree(control_home, ignore_errors=True)
    control_home.mkdir()
    shutil.copyfile(str(control_src), control_home / "state.db")
    python = hermes_python(release)
    writer = WriterProcess(python, db, str(home / "writer.jsonl"), prefix="bench-w", interval=interval)
    control = WriterProcess(
        python, str(control_home / "state.db"), str(control_home / "writer.jsonl"), prefix="control"
    )
    writer.start()
    control.start()
    try:
        time.sleep(0.5)
        before = db_bytes(db)
        result, rss = run()
        after = db_bytes(db)
        time.sleep(0.5)
    finally:
        if interval >= 1:  # it waits for its next append; SIGTERM ends that wait (the stop file does not)
            writer.proc.terminate()
        summary = writer.stop()
        control.stop()
    # Settled size: once the writers are gone, one TRUNCATE checkpoint (what Hermes does when
    # it closes) moves the WAL into the file; a VACUUM done through the WAL only shows then.
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    settled = db_bytes(db)
    records, control_records = writer.records(), control.records()
    stats = latency_stats(records, result["start"], result["end"])
    stats["control"] = latency_stats(control_records, result["start"], result["end"])
    stats["phases"] = {
        name: latency_stats(records, span[0], span[1]) for name, span in result["phases"].items() if span
    }
    stats["worst_appends"] = worst_appends(records, result, result.get("locks") or [])
    stats["slow_appends"] = slow_appends(records, result)
    stats["series"] = {"writer": series(records, result), "control": series(control_records, result)}
    stats["total_failed"] = summary["failed"]
    stats["file_problems"] = summary["file_problems"]
    result["bytes_reclaimed"] = before - after
    result["bytes_reclaimed_settled"] = before - settled
    shutil.rmtree(control_home, ignore_errors=True)
    return result, rss, stats


def series(records, result):
    """Every append of the run as [ms since the run's start, latency ms] (the latency plot's data)."""
    return [
        [round((r["t"] - result["start"]) * 1000), round(r["lat"] * 1000, 1)]
        for r in records
        if result["start"] <= r["t"] <= result["end"]
    ]


def appended(home):
    """Messages the writer added during the run (so pruned = before + appended - after)."""
    with open(home / "writer.jsonl") as fh:
        return sum(1 for line in fh if '"id": ' in line and '"id": null' not in line)


def phase_at(phases, t):
    """The phase whose span holds time ``t`` (the first of overlapping ones), else BETWEEN."""
    inside = [name for name, span in phases.items() if span and span[0] <= t <= span[1]]
    return min(inside, key=lambda name: phases[name][1] - phases[name][0]) if inside else BETWEEN


def blocking_lock(locks, t0, t1):
    """Of our lock spans, the one that overlaps the append [t0, t1] the most (None if none does)."""
    best, overlap = None, 0.0
    for lock in locks:
        shared = min(lock[1], t1) - max(lock[0], t0)
        if shared > overlap:
            best, overlap = lock, shared
    return best


def worst_appends(records, result, locks, n=5):
    """The ``n`` slowest appends of the run: when, the phase they started and ended in, and the
    transaction or statement of ours that overlapped them most (what they waited for)."""
    window = [r for r in records if result["start"] <= r["t"] <= result["end"]]
    out = []
    for r in sorted(window, key=lambda r: r["lat"], reverse=True)[:n]:
        lock = blocking_lock(locks, r["t"], r["t"] + r["lat"])
        out.append(
            {
                "t": r["t"] - result["start"],
                "lat": r["lat"],
                "phase": phase_at(result["phases"], r["t"]),
                "ended_in": phase_at(result["phases"], r["t"] + r["lat"]),
                "lock_s": (lock[1] - lock[0]) if lock else None,
                "lock_commit_s": lock[3] if lock else None,
                "lock": lock[2] if lock else None,
                "ckpt_frames": r.get("ckpt"),  # frames the writer's own commit checkpointed (WAL)
            }
        )
    return out


def slow_appends(records, result, over=0.15):
    """How many appends of the run took longer than ``over`` seconds, and how many of those ran
    the writer's own checkpoint (WAL: SQLite's wal_autocheckpoint inside its commit)."""
    slow = [r for r in records if result["start"] <= r["t"] <= result["end"] and r["lat"] > over]
    return {
        "over_ms": round(over * 1000),
        "count": len(slow),
        "with_own_checkpoint": sum(1 for r in slow if r.get("ckpt")),
    }


def longest_lock(locks, span):
    """Our longest transaction or statement that began inside ``span``: (seconds, what)."""
    inside = [lock for lock in locks if span and span[0] <= lock[0] <= span[1]]
    if not inside:
        return None, None
    lock = max(inside, key=lambda lock: lock[1] - lock[0])
    return lock[1] - lock[0], lock[2]


def transactions(locks, span):
    """Our write transactions that began inside ``span``: how many, how long they held the lock
    (median / max), their COMMIT (median) and the gap between one and the next (median: the
    gateway's turn)."""
    txns = sorted(lock for lock in locks if span and span[0] <= lock[0] <= span[1] and lock[2].startswith("txn"))
    if not txns:
        return None
    holds = [end - start for start, end, _what, _commit in txns]
    gaps = [b[0] - a[1] for a, b in zip(txns, txns[1:])]
    return {
        "n": len(txns),
        "hold_median": statistics.median(holds),
        "hold_max": max(holds),
        "commit_median": statistics.median(lock[3] for lock in txns),
        "gap_median": statistics.median(gaps) if gaps else None,
    }
