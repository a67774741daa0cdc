"""Three simulated months beside an always-on REAL Hermes 0.22.2 gateway, with the role's
defaults plus the service window, against the same runs on a twin copy nobody holds.

    .venv/bin/python bench/window_months.py [--sessions 1600] [--messages 100] [--months 3]
        [--release 0.19.0] [--tool-payload-days 30]

The home: a 0.22.2 state.db as the release makes it here (rollback journal, auto_vacuum NONE;
``--release 0.19.0``: one 0.19.0 writes, in WAL mode, which the 0.22.2 gateway migrates and keeps
in WAL), a third of its sessions ended 128..210 days ago, the rest as tests/lib/hermes_rollback.py
(or hermes_fixtures.make_big_home) lays them out (half ended 8..90 days ago, half recent); its twin
is a copy taken after the gateway's first start (its migration done), with the gateway stopped. Each month the engine's
clock is 30 days further on (the gateway's is the real one: what it writes during the months
is new), the gateway serves a client sending a chat request every 100 ms that retries a failed
one, and the run maintains the live file with the role's defaults (prune_days 90, vacuum auto)
and a window (stop: SIGTERM of gateway.pid's pid, start: a new ``hermes gateway run``); the twin
gets the same run with no holder. Printed: a Markdown table per month of the bytes each gave
back, their ratio, the window, the client's requests failed in and after it, the FTS indexes live
against no holder, and the writes lost (a message the gateway answered that state.db lacks).
``--tool-payload-days 30``: both runs also elide tool payloads.
"""

import argparse
import os
import random
import re
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

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.host import profiles as hermes_host_profiles
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import run as hermes_maintain_run  # noqa: E402
from hermes_fixtures import bulk_rows, copy_db, make_big_home  # noqa: E402

FTS = ("messages_fts", "messages_fts_trigram")

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


def build(home, sessions, messages, release, seed=53):
    """The home: hermes_rollback's layout (make_big_home's for 0.19.0), plus a third more sessions ended
    128..210 days ago."""
    if release == "0.19.0":
        db = str(make_big_home(home, "hermes-0.19.0", sessions, messages, old_fraction=0.5, seed=seed))
    else:
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


def read_pragma(db, name):
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=30)
    try:
        return conn.execute("PRAGMA %s" % name).fetchone()[0]
    finally:
        conn.close()


def fts_bytes(db):
    """MB of each FTS index's segments."""
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=30)
    try:
        return [conn.execute("SELECT SUM(LENGTH(block)) FROM %s_data" % name).fetchone()[0] / 1e6 for name in FTS]
    finally:
        conn.close()


def lost_writes(db, client, since):
    """The client's messages the gateway answered (200) that state.db does not hold."""
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT content FROM messages WHERE timestamp >= ?", (since,)).fetchall()
    finally:
        conn.close()
    stored = set(re.findall(re.escape(client.prefix) + r"-\d{6}", " ".join(str(r[0]) for r in rows)))
    return len(set(client.messages_sent) - stored)


def month(home, db, twin, port, payload_days):
    """One month: the live run beside the gateway with its client, then the twin's run."""
    common = {"allow_unknown_schema": True}  # 0.22.2 writes schema 31
    if payload_days:
        common["tool_payload_days"] = payload_days
    options = dict(
        common,
        gateway_stop_command=supervisor_argv("stop", home),
        gateway_start_command=supervisor_argv("start", home),
    )
    before = size(db)
    since = time.time() - 5
    load = os.getloadavg()[0]
    with Client(port, retry=True) as client:
        time.sleep(2.0)
        t0 = time.monotonic()
        live = hermes_maintain_run.run_maintenance(dict(options, hermes_home=[home]))["profiles"][0]
        t1 = time.monotonic()
        time.sleep(8.0)
    twin_before = size(twin)
    alone = hermes_maintain_run.run_maintenance(dict(common, hermes_home=[os.path.dirname(twin)]))
    alone = alone["profiles"][0]
    attempts = client.snapshot()
    window = live["window"] or {}
    for name, profile in (("live", live), ("no holder", alone)):
        if profile["status"] not in ("ok", "changed") or not profile["reclaim"]:
            print("%s run: %s: %s" % (name, profile["status"], profile.get("error") or profile.get("summary")))
    live["reclaim"], alone["reclaim"] = live["reclaim"] or {}, alone["reclaim"] or {}
    return {
        "live_freed": before - size(db),
        "alone_freed": twin_before - size(twin),
        "live_status": live["status"],
        "pruned": (live["sessions_pruned"], alone["sessions_pruned"]),
        "reclaim": "%s / %s" % (live["reclaim"].get("action"), alone["reclaim"].get("action")),
        "free_after": (read_pragma(db, "freelist_count"), read_pragma(twin, "freelist_count")),
        "fts_merge_steps": (live["reclaim"].get("fts_merge_steps", 0), alone["reclaim"].get("fts_merge_steps", 0)),
        "wal": (size(db) - os.path.getsize(db), size(twin) - os.path.getsize(twin)),
        "window": "%s %.1f s" % ("+".join(window.get("done") or []), window["downtime_s"])
        if window.get("downtime_s")
        else "none",
        "failed_during": sum(1 for a in attempts if not a["ok"] and t0 <= a["start"] < t1),
        "failed_after": sum(1 for a in attempts if not a["ok"] and a["start"] >= t1),
        "lost": lost_writes(db, client, since),
        "fts": (fts_bytes(db), fts_bytes(twin)),
        "elided": ((live.get("tool_payloads") or {}).get("elided"), (alone.get("tool_payloads") or {}).get("elided")),
        "load": load,
    }


HEADER = (
    "| month | pruned live / no holder | given back live | with no holder | live / no holder "
    "| vacuum live / no holder | free pages after | -wal MB after | FTS steps | FTS MB live / no holder | elided "
    "| window "
    "| failed in it | after | lost | load |"
)


def print_rows(rows, first=1):
    """The months' table (``first``: the number of the first row), and the total of the months."""
    print(HEADER)
    print("| --- " * HEADER.count("|", 1) + "|")
    for number, row in enumerate(rows, first):
        ratio = row["live_freed"] / float(row["alone_freed"]) if row["alone_freed"] else float("nan")
        fts = " + ".join("%.1f" % b for b in row["fts"][0]), " + ".join("%.1f" % b for b in row["fts"][1])
        print(
            "| %d | %d / %d | %.1f MB | %.1f MB | %.2f | %s | %d / %d | %.1f / %.1f | %d / %d | %s / %s | %s / %s "
            "| %s | %d | %d | %d | %.1f |"
            % (number, row["pruned"][0], row["pruned"][1], row["live_freed"] / 1e6, row["alone_freed"] / 1e6,
               ratio, row["reclaim"], row["free_after"][0], row["free_after"][1], row["wal"][0] / 1e6,
               row["wal"][1] / 1e6, row["fts_merge_steps"][0],
               row["fts_merge_steps"][1], fts[0], fts[1], row["elided"][0], row["elided"][1], row["window"],
               row["failed_during"], row["failed_after"], row["lost"], row["load"])
        )  # fmt: skip
    total_live, total_alone = sum(r["live_freed"] for r in rows), sum(r["alone_freed"] for r in rows)
    print("total: %.1f MB live, %.1f MB with no holder (%.2f)" % (
        total_live / 1e6, total_alone / 1e6, total_live / float(total_alone or 1)), flush=True)  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1600)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--months", type=int, default=3)
    parser.add_argument(
        "--release", choices=("0.22.2", "0.19.0"), default="0.22.2", help="the release that wrote the file"
    )
    parser.add_argument("--tool-payload-days", type=int, default=None, help="tool_payload_days for both runs")
    parser.add_argument("--cache", help="a state.db path: the file built is kept there, and used when it exists")
    args = parser.parse_args()
    clock = ShiftedClock()
    hermes_maintain_run.time = clock
    hermes_host_profiles.time = clock  # each profile's run starts from its clock
    base = tempfile.mkdtemp(prefix="hermes-ops-months-")
    try:
        home = os.path.join(base, "home")
        began = time.time()
        if args.cache and os.path.exists(args.cache):
            os.makedirs(os.path.join(home, "sessions"))
            db = str(copy_db(args.cache, os.path.join(home, "state.db")))
        else:
            db = build(home, args.sessions, args.messages, args.release)
            if args.cache:  # the next run on the same file starts from this one (--cache)
                copy_db(db, args.cache)
        os.makedirs(os.path.join(base, "twin"))
        twin = os.path.join(base, "twin", "state.db")
        mode = read_pragma(db, "journal_mode")
        print("file: %.1f MB, %d sessions, written by %s in %s mode (built in %.0f s)" % (
            size(db) / 1e6, args.sessions * 3 // 2, args.release, mode, time.time() - began))  # fmt: skip
        rows = []
        with StubModel() as model:
            port = free_port()
            # docs/fleet.md: with this collection scheduled, Hermes's own auto-prune is turned off (else
            # the gateway prunes the live file at start and the twin, which no gateway opens, differs)
            write_gateway_config(home, model.url, port, extra="sessions: {auto_prune: false}\n")
            supervisor_start(home)
            try:
                warm_up(port)
                # the twin: the file as the gateway left it after its first start (a 0.19.0 file migrated)
                supervisor_stop(home)
                copy_db(db, twin)
                supervisor_start(home)
                warm_up(port)
                time.sleep(5.0)  # no start-up maintenance to wait for: auto_prune is off
                for _month in range(args.months):
                    rows.append(month(home, db, twin, port, args.tool_payload_days))
                    print_rows(rows[-1:], len(rows))
                    clock.offset += MONTH
            finally:
                supervisor_stop(home)
        print("\nmachine: %d cores, load average %.1f / %.1f / %.1f at the end; %.0f s in all" % (
            (os.cpu_count() or 0,) + os.getloadavg() + (time.time() - began,)))  # fmt: skip
        print_rows(rows)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
