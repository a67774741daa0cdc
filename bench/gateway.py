"""What a client of a REAL Hermes 0.22.2 gateway sees while the file is pruned: our maintenance
against Hermes's own ``hermes sessions prune --force``.

    python bench/gateway.py                    # make bench-gateway: the 0.7 GB file
    python bench/gateway.py --sizes 0.7GB,5GB  # also the 5 GB file (its template is made once: ~20 min)
    python bench/gateway.py --build-only       # make the templates, measure nothing

Per size and run, on a fresh copy of a template file (0.22.2's own schema, rollback-journal mode
as 0.22.2 picks on this SQLite; half of the sessions ended 8..90 days ago; made once into
build/bench-gateway/) and a fresh ``hermes gateway run`` of the release (tests/lib/hermes_gateway.py:
its API server on loopback, a stub model): the gateway settles (its own start-up maintenance, then
``--settle`` seconds in all), a client sends a chat request every 100 ms through a quiet period
(``--quiet``), the maintenance in its own process, and ``--after`` seconds more. The maintenance is

* ``ours``: ``run_maintenance`` with ``prune_days: 7`` (``allow_unknown_schema``: 0.22.2's schema is
  newer than the engine's table; the engine's defaults otherwise, the backup included);
* ``hermes --force``: the release's CLI, ``hermes sessions prune --older-than 7 --yes --force``
  (without ``--force`` it refuses while the gateway holds the file).

Recorded per phase (before / during / after): requests, failed, p50 / p99 / worst latency; the
maintenance's wall time and the messages it pruned; and every turn the client was answered for
must be in state.db once the gateway has stopped: a lost turn is printed loudly and makes the
exit status 1, as does a failed request during our run. Results: bench/results/gateway-0.22.json,
then docs/benchmarks.md is rewritten (bench/report.py). Measure on a quiet machine: nothing else
running (under ``flock /tmp/hermes-host.lock`` on a shared one, as the other benches).
"""

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests" / "lib")]  # run as a script too

from hermes_gateway import (  # noqa: E402
    RELEASE,
    REQUEST_INTERVAL,
    Client,
    Gateway,
    gateway_env,
    gateway_missing,
    hermes_command,
    latency_summary,
    stored_user_messages,
    wait_settled,
)
from hermes_rollback import journal_mode, make_big_rollback_home  # noqa: E402

from bench.common import REPO, RESULTS, collections_root, load_average, machine  # noqa: E402

# size label -> (sessions, messages each): ~0.7 GB (4,000 sessions, as the manual measurement of
# the reference notes) and the ~5 GB file of `make bench-large` (7.4M messages).
SIZES = {"0.7GB": (4000, 270), "5GB": (74000, 100)}
KINDS = ("ours", "hermes --force")
PRUNE_DAYS = 7
CHUNK_MESSAGES = 800000  # rows made and inserted at a time while a template is built
SEED = 55
NAME = "gateway-0.22"
OURS_CODE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
p = run_maintenance(json.loads(sys.argv[2]))["profiles"][0]
print(json.dumps({"status": p["status"], "error": p["error"], "sessions_pruned": p["sessions_pruned"],
                  "messages_pruned": p["messages_pruned"],
                  "live_rollback": bool((p.get("preflight") or {}).get("live_rollback"))}))
"""


# ------------------------------------------------------------------------ the files


def template(workdir, size):
    """The home of ``size``'s template file (made once, then reused): returns (home, seconds its
    build took in this call or None, when it was built)."""
    sessions, per_session = SIZES[size]
    home = Path(workdir).resolve() / ("rollback-%dx%d" % (sessions, per_session)) / "home"
    done = home.parent / ".done"
    if done.exists():
        return home, None, json.loads(done.read_text())["built"]
    shutil.rmtree(str(home.parent), ignore_errors=True)
    home.parent.mkdir(parents=True)
    print("  building the %s template: %d sessions x %d messages ..." % (size, sessions, per_session), flush=True)
    t0 = time.time()
    db = make_big_rollback_home(
        home, sessions, per_session, seed=SEED, release=RELEASE, chunk_sessions=max(1, CHUNK_MESSAGES // per_session)
    )
    if journal_mode(str(db)) != "delete":
        sys.exit("hermes %s chose %s here, not DELETE: not the file this bench is about" % (RELEASE, journal_mode(db)))
    seconds = round(time.time() - t0, 1)
    done.write_text(json.dumps({"seconds": seconds, "built": t0}))
    print("  built in %.0f s: %.2f GB" % (seconds, os.path.getsize(str(db)) / 1e9), flush=True)
    return home, seconds, t0


def fresh_copy(src_home, dst_home):
    """``dst_home``: a copy of the template home (state.db 0600), written out before the run."""
    shutil.rmtree(str(dst_home), ignore_errors=True)
    shutil.copytree(str(src_home), str(dst_home))
    os.sync()  # the copy's write-back must not land in the measured seconds
    return Path(dst_home) / "state.db"


def count_template_messages(db):
    """The template's own messages (sessions ``big-*``; the client's are ``api-*``)."""
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=60)
    try:
        return conn.execute("SELECT COUNT(*) FROM messages WHERE session_id LIKE 'big-%'").fetchone()[0]
    finally:
        conn.close()


# ------------------------------------------------------------------------ one run


def maintenance_command(kind, home):
    """(argv, env) of the maintenance process of ``kind`` on ``home``."""
    if kind == "ours":
        options = {"hermes_home": [str(home)], "prune_days": PRUNE_DAYS, "allow_unknown_schema": True}
        return [sys.executable, "-c", OURS_CODE, collections_root(), json.dumps(options)], None
    hermes = hermes_command(RELEASE)
    if hermes is None:
        raise RuntimeError(gateway_missing(RELEASE))
    argv = hermes + ["sessions", "prune", "--older-than", str(PRUNE_DAYS), "--yes", "--force"]
    env = gateway_env(home)
    env.pop("PYTHONPATH", None)
    return argv, env


def run_maintenance_process(kind, home):
    """Run the maintenance of ``kind``; returns what it reported (ours: its JSON; Hermes: its output)."""
    argv, env = maintenance_command(kind, home)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(home), check=False, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError("%s failed (rc %d): %s" % (kind, proc.returncode, (proc.stderr or proc.stdout)[-3000:]))
    if kind == "ours":
        return json.loads(proc.stdout.strip().splitlines()[-1])
    return {"status": "ok", "output": proc.stdout.strip()[-500:]}


def phases(attempts, t0, t1):
    """The client's attempts split at the maintenance's start ``t0`` and end ``t1`` (monotonic):
    {before, during, after: latency summary}, by when each request started."""
    spans = {"before": (float("-inf"), t0), "during": (t0, t1), "after": (t1, float("inf"))}
    return {name: latency_summary([a for a in attempts if lo <= a["start"] < hi]) for name, (lo, hi) in spans.items()}


def lost_turns(answered, stored):
    """The messages the client got an answer for that state.db does not hold (sorted)."""
    return sorted(set(answered) - set(stored))


def series(attempts, origin):
    """Every attempt as [seconds from ``origin``, latency ms, ok] (the raw data of the row)."""
    return [[round(a["start"] - origin, 3), round(a["latency"] * 1000, 1), a["ok"]] for a in attempts]


def measure_one(size, kind, template_home, workdir, args):
    """One run of ``kind`` on a fresh copy beside a fresh gateway: the results row."""
    home = Path(workdir) / "run" / "home"
    db = fresh_copy(template_home, home)
    with Gateway(home) as gateway:
        started = time.monotonic()
        wait_settled(str(db), timeout=max(90.0, args.settle * 10))
        time.sleep(max(0.0, args.settle - (time.monotonic() - started)))
        settled_s = time.monotonic() - started
        before_count = count_template_messages(db)
        with Client(gateway.port, prefix="bench") as client:
            time.sleep(args.quiet)
            t0 = time.monotonic()
            result = run_maintenance_process(kind, home)
            t1 = time.monotonic()
            time.sleep(args.after)
    attempts = client.snapshot()
    pruned = before_count - count_template_messages(db)
    lost = lost_turns(client.messages_sent, stored_user_messages(str(db), client.prefix))
    row = {
        "size": size,
        "kind": kind,
        "file_bytes": os.path.getsize(str(template_home / "state.db")),
        "settled_s": round(settled_s, 1),
        "maintenance_s": round(t1 - t0, 2),
        "messages_pruned": pruned,
        "reported": result,
        "phases": phases(attempts, t0, t1),
        "answered": len(client.messages_sent),
        "lost_turns": lost,
        "series": series(attempts, t0),
    }
    shutil.rmtree(str(home.parent), ignore_errors=True)
    return row


def row_problems(row):
    """What must make the bench fail loudly: lost turns, our run's failed requests or its error."""
    problems = []
    if row["lost_turns"]:
        problems.append(
            "%d TURNS LOST: answered to the client but not in state.db (first: %s)"
            % (len(row["lost_turns"]), row["lost_turns"][:3])
        )
    if row["kind"] == "ours":
        failed = sum(row["phases"][p]["failed"] for p in ("during", "after"))
        if failed:
            problems.append("%d requests failed during or after our run" % failed)
        if row["reported"].get("status") != "ok":
            problems.append("our run: %s: %s" % (row["reported"].get("status"), row["reported"].get("error")))
        elif not row["reported"].get("live_rollback"):
            problems.append("our run did not see the gateway hold the file: the row proves nothing")
    return problems


# ------------------------------------------------------------------------ the bench


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--sizes", default="0.7GB", help="comma-separated, of %s" % ", ".join(SIZES))
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench-gateway", help="templates and runs")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds from the gateway's start to the client's")
    parser.add_argument("--quiet", type=float, default=10.0, help="the client's quiet period before the maintenance")
    parser.add_argument("--after", type=float, default=5.0, help="the client's seconds after the maintenance")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where %s.json is written" % NAME)
    parser.add_argument("--no-out", action="store_true", help="print only, write neither results nor the page")
    parser.add_argument("--build-only", action="store_true", help="make the templates of --sizes, measure nothing")
    args = parser.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.workdir = args.workdir.resolve()  # the gateway runs in the home: HERMES_HOME must not be relative
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        parser.error("unknown size %s (known: %s)" % (", ".join(unknown), ", ".join(SIZES)))
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    why = gateway_missing(RELEASE)
    if why:
        sys.exit(why)
    from bench import report

    doc = {
        "name": NAME,
        "release": RELEASE,
        "command": ("python bench/gateway.py " + " ".join(argv)).strip(),
        "machine": machine(),
        "load_before": load_average(),
        "started": time.time(),
        "settle_s": args.settle,
        "quiet_s": args.quiet,
        "after_s": args.after,
        "interval_s": REQUEST_INTERVAL,
        "prune_days": PRUNE_DAYS,
        "templates": {},
        "rows": [],
    }
    print("machine: %s, load average %s" % (doc["machine"], doc["load_before"]), flush=True)
    problems = []
    for size in args.sizes:
        home, seconds, built = template(args.workdir, size)
        size_bytes = os.path.getsize(str(home / "state.db"))
        doc["templates"][size] = {"sessions_x_messages": SIZES[size], "bytes": size_bytes, "built": built}
        if seconds is not None:
            doc["templates"][size]["build_s"] = seconds
        print("[%s] template %s: %.2f GB (%d sessions x %d messages)" % ((size, home, size_bytes / 1e9) + SIZES[size]))
        if args.build_only:
            continue
        for kind in KINDS:
            print("[%s] %s beside a fresh gateway ..." % (size, kind), flush=True)
            row = measure_one(size, kind, home, args.workdir, args)
            doc["rows"].append(row)
            print("\n".join(report.gateway_table([row])[2:]), flush=True)
            problems += ["[%s %s] %s" % (size, kind, p) for p in row_problems(row)]
    if args.build_only:
        return 0
    doc.update(finished=time.time(), load_after=load_average())
    print()
    print("\n".join(report.gateway_table(doc["rows"])))
    print("load average before %s, after %s" % (doc["load_before"], doc["load_after"]))
    if not args.no_out:
        args.results.mkdir(parents=True, exist_ok=True)
        out = args.results / (NAME + ".json")
        out.write_text(json.dumps(doc, indent=1) + "\n")
        report.write(args.results)
        print("wrote %s and rewrote docs/benchmarks.md from %s" % (out, args.results))
    for problem in problems:
        print("!!! " + problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
