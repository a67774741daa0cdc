"""Three simulated months beside an always-on REAL Hermes 0.22.2 gateway, with the role's
defaults plus the service window, against the same runs on a twin copy nobody holds.

    .venv/bin/python bench/window_months.py [--sessions 1600] [--messages 100] [--months 3]

The home: a 0.22.2 state.db as the release makes it here (rollback journal, auto_vacuum NONE),
a third of its sessions ended 128..210 days ago, the rest as tests/lib/hermes_rollback.py lays
them out (half ended 8..90 days ago, half recent); its twin is a copy. Each month the engine's
clock is 30 days further on (the gateway's is the real one: what it writes during the months
is new), the gateway serves a client sending a chat request every 100 ms that retries a failed
one, and the run maintains the live file with the role's defaults (prune_days 90, vacuum auto)
and a window (stop: SIGTERM of gateway.pid's pid, start: a new ``hermes gateway run``); the twin
gets the same run with no holder. Printed: a Markdown table per month of the bytes each gave
back, their ratio, the window, and the client's requests failed in and after it.
"""

import argparse
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
import collection_paths  # noqa: E402, F401  # pylint: disable=unused-import
from hermes_gateway import (  # noqa: E402
    Client,
    StubModel,
    free_port,
    supervisor_argv,
    supervisor_start,
    supervisor_stop,
    warm_up,
    write_gateway_config,
)
from hermes_rollback import WORDS, make_big_rollback_home  # noqa: E402

from ansible_collections.hermes_agent.ops.plugins.module_utils import _hermes_engine  # noqa: E402
from hermes_fixtures import bulk_rows  # noqa: E402

DAY = 86400.0
MONTH = 30 * DAY


class ShiftedClock:
    """``time`` as the engine sees it: ``offset`` seconds on (the months that have passed)."""

    def __init__(self):
        self.offset = 0.0

    def time(self):
        return time.time() + self.offset

    def __getattr__(self, name):
        return getattr(time, name)


def build(home, sessions, messages, seed=53):
    """The home: hermes_rollback's layout, plus a third more sessions ended 128..210 days ago."""
    db = str(make_big_rollback_home(home, sessions, messages, seed=seed, now=time.time()))
    rng = random.Random(seed)
    older, rows = bulk_rows(rng, sessions // 2, messages, 1.0, time.time() - 120 * DAY, WORDS, first=sessions)
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany(
            "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, message_count) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            older,
        )
        conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)", rows)
    conn.close()
    return db


def size(db):
    return os.path.getsize(db) + (os.path.getsize(db + "-wal") if os.path.exists(db + "-wal") else 0)


def free_pages(db):
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=30)
    try:
        return conn.execute("PRAGMA freelist_count").fetchone()[0]
    finally:
        conn.close()


def month(home, db, twin, port):
    """One month: the live run beside the gateway with its client, then the twin's run."""
    options = {
        "allow_unknown_schema": True,  # 0.22.2 writes schema 31
        "gateway_stop_command": supervisor_argv("stop", home),
        "gateway_start_command": supervisor_argv("start", home),
    }
    before = size(db)
    with Client(port, retry=True) as client:
        time.sleep(2.0)
        t0 = time.monotonic()
        live = _hermes_engine.run_maintenance(dict(options, hermes_home=[home]))["profiles"][0]
        t1 = time.monotonic()
        time.sleep(8.0)
    twin_before = size(twin)
    alone = _hermes_engine.run_maintenance({"allow_unknown_schema": True, "hermes_home": [os.path.dirname(twin)]})
    alone = alone["profiles"][0]
    attempts = client.snapshot()
    window = live["window"] or {}
    return {
        "live_freed": before - size(db),
        "alone_freed": twin_before - size(twin),
        "live_status": live["status"],
        "pruned": (live["sessions_pruned"], alone["sessions_pruned"]),
        "reclaim": "%s / %s" % (live["reclaim"]["action"], alone["reclaim"]["action"]),
        "free_after": (free_pages(db), free_pages(twin)),
        "fts_merge_steps": (live["reclaim"]["fts_merge_steps"], alone["reclaim"]["fts_merge_steps"]),
        "window": "%s %.1f s" % ("+".join(window.get("done") or []), window["downtime_s"])
        if window.get("downtime_s")
        else "none",
        "failed_during": sum(1 for a in attempts if not a["ok"] and t0 <= a["start"] < t1),
        "failed_after": sum(1 for a in attempts if not a["ok"] and a["start"] >= t1),
        "lost": len(set(a["message"] for a in attempts) - set(client.messages_sent)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1600)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--months", type=int, default=3)
    args = parser.parse_args()
    clock = ShiftedClock()
    _hermes_engine.time = clock
    base = tempfile.mkdtemp(prefix="hermes-ops-months-")
    try:
        home = os.path.join(base, "home")
        db = build(home, args.sessions, args.messages)
        os.makedirs(os.path.join(base, "twin"))
        twin = os.path.join(base, "twin", "state.db")
        shutil.copy2(db, twin)
        print("file: %.1f MB, %d sessions" % (size(db) / 1e6, args.sessions * 3 // 2))
        rows = []
        with StubModel() as model:
            port = free_port()
            # docs/fleet.md: with this collection scheduled, Hermes's own auto-prune is turned off (else
            # the gateway prunes the live file at start and the twin, which no gateway opens, differs)
            write_gateway_config(home, model.url, port, extra="sessions: {auto_prune: false}\n")
            supervisor_start(home)
            try:
                warm_up(port)
                time.sleep(5.0)  # no start-up maintenance to wait for: auto_prune is off
                for _month in range(args.months):
                    rows.append(month(home, db, twin, port))
                    clock.offset += MONTH
            finally:
                supervisor_stop(home)
        print(
            "| month | pruned live / no holder | given back live | with no holder | live / no holder "
            "| vacuum live / no holder | free pages after | FTS merge steps | window | failed in it | after | lost |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for number, row in enumerate(rows, 1):
            ratio = row["live_freed"] / float(row["alone_freed"]) if row["alone_freed"] else float("nan")
            print(
                "| %d | %d / %d | %.1f MB | %.1f MB | %.2f | %s | %d / %d | %d / %d | %s | %d | %d | %d |"
                % (number, row["pruned"][0], row["pruned"][1], row["live_freed"] / 1e6, row["alone_freed"] / 1e6,
                   ratio, row["reclaim"], row["free_after"][0], row["free_after"][1], row["fts_merge_steps"][0],
                   row["fts_merge_steps"][1], row["window"],
                   row["failed_during"], row["failed_after"], row["lost"])
            )  # fmt: skip
        total_live, total_alone = sum(r["live_freed"] for r in rows), sum(r["alone_freed"] for r in rows)
        print("total: %.1f MB live, %.1f MB with no holder (%.2f)" % (
            total_live / 1e6, total_alone / 1e6, total_live / float(total_alone or 1)))  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
