"""Bench rows for tool-payload elision (``tool_payload_days``): bodies/s and the worst stall of a
Hermes 0.22.2 writer appending every 20 ms, and ``storage`` before and after.

    python bench/elision.py                       # make bench-elision: 0.7 GB file, one live round
    python bench/elision.py --sessions 34000      # the 5 GB file (made in about 9 minutes)
    python bench/elision.py --sessions 400        # quicker (~60 MB)
    python bench/elision.py --compare ../main     # also another checkout's engine, alternating
    python bench/elision.py --runs 0 --restore    # the run with no holder, then the undo from its backup

The bench's own 0.7/5 GB files (bench/datasets.py) hold short messages, a fifth of them tool
ones of a few words: nothing like the tool output a long-lived state.db is mostly made of. So
this bench makes its own (cached in the workdir like theirs): an empty state.db created by the
release's own ``SessionDB`` (its schema, both FTS indexes and their triggers), then per session
ten user, ten assistant and ten tool messages bulk-inserted through those triggers, the tool ones
varied output (``terminal_dump``) of log-normal size (median ~5 kB, at most 64 kB), the sessions
ended 1 to 365 days ago: ``tool_payload_days: 30`` elides about 92% of the tool bodies,
``prune_days: 3650`` keeps every session.

Each round copies the file into a fresh home and runs the maintenance in its own process
(``--child``) beside a 0.22.2 ``SessionDB`` appending every 20 ms (rollback-journal mode, as
0.22.2 picks on this SQLite); the phases are timed by wrapping the engine's own ``elide`` and
``take_payload_archive`` (they run unchanged). ``--idle`` also runs once with no holder and
``vacuum_mode: full`` (the service window: the FTS optimize and the VACUUM give the bytes back).
Rows: bodies elided / seconds of the elision phase; the writer's worst and p99 append wait during
that phase and during the whole run, and beside them a *control* writer's worst: the same release
appending every 20 ms to its own small untouched file (``--sessions 40``) during the same seconds,
what this shared machine alone does to a writer then (the noise floor, as in bench/writer.py).
``--restore``: after the run with no holder, its payload archive is deleted and
``session_restore``'s ``tool_payloads`` puts the bodies back from the whole-file backup that run
took, beside the 20 ms writer: check mode and the restore timed, every message row there before
compared (a digest), ``integrity_check`` and both FTS indexes' ``integrity-check``, and a second
restore that must find nothing. The figures measured are written up by hand in
docs/benchmarks_elision.md (this bench keeps no results file).
"""

import argparse
import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lib"))

RELEASE = "0.22.2.post1"
DAY = 86400.0
MB = 1024 * 1024
TOOLS = ("terminal", "web_extract", "browser_snapshot", "read_file")
WORDS = "the a to of and in deploy error build test config retry log user file check run fix".split()
CHUNK = 200  # sessions per insert transaction while the file is made
STALL = 0.250  # the prune's bound (docs/benchmarks.md's targets)
CONTROL_SESSIONS = 40  # the control writer's file: a small one made the same way


def tool_size(rng):
    return min(64 * 1024, max(200, int(rng.lognormvariate(8.5, 0.9))))


def build_base(workdir, sessions, seed=41):
    """workdir/elision-base-<sessions>/state.db (made once, then cached): the release's schema, tool-heavy."""
    from hermes_rollback import init_schema

    from hermes_fixtures import terminal_dump

    home = workdir / ("elision-base-%d" % sessions)
    db = home / "state.db"
    if (home / ".done").exists():
        return db, json.loads((home / ".done").read_text())
    shutil.rmtree(home, ignore_errors=True)
    (home / "sessions").mkdir(parents=True)
    t0 = time.time()
    init_schema(RELEASE, home, db)
    rng, now = random.Random(seed), time.time()
    conn = sqlite3.connect(str(db), timeout=30)
    conn.execute("PRAGMA synchronous=OFF")
    try:
        for first in range(0, sessions, CHUNK):
            srows, mrows = [], []
            for i in range(first, min(sessions, first + CHUNK)):
                sid = "eb-%06d" % i
                end = now - rng.uniform(1, 365) * DAY
                start = end - rng.uniform(0.05, 1.0) * DAY
                srows.append((sid, "cli", start, end, "user_exit", 30))
                for j in range(30):
                    stamp = start + (end - start) * (j + 1) / 31.0
                    if j % 3 == 2:
                        tool = TOOLS[rng.randrange(len(TOOLS))]
                        mrows.append((sid, "tool", terminal_dump(sid, j, tool_size(rng)), tool, stamp))
                    else:
                        role = "user" if j % 3 == 0 else "assistant"
                        text = " ".join(rng.choice(WORDS) for _w in range(rng.randint(8, 60)))
                        mrows.append((sid, role, text, None, stamp))
            with conn:
                conn.executemany(
                    "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, message_count) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    srows,
                )
                conn.executemany(
                    "INSERT INTO messages (session_id, role, content, tool_name, timestamp) VALUES (?, ?, ?, ?, ?)",
                    mrows,
                )
    finally:
        conn.close()
    os.chmod(str(db), 0o600)
    made = {"seconds": round(time.time() - t0, 1), "bytes": os.path.getsize(str(db)), "sessions": sessions}
    (home / ".done").write_text(json.dumps(made))
    return db, made


def storage_summary(gather_info, home):
    st = gather_info({"hermes_home": [str(home)]})["profiles"][0]["storage"]
    return {
        "file_bytes": st["page_count"] * st["page_size"],
        "free_bytes": st["free_bytes"],
        "by_object": {k: v["bytes"] for k, v in st["by_object"].items() if v["bytes"] >= MB},
        "by_role": st["by_role"],
    }


def rows_digest(db, top=None):
    """(rows, sha256) of every message row up to id ``top`` (all when None): what a restore gives back."""
    import hashlib

    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        top = conn.execute("SELECT MAX(id) FROM messages").fetchone()[0] if top is None else top
        digest, count = hashlib.sha256(), 0
        for row in conn.execute(
            "SELECT id, session_id, role, typeof(content), CAST(content AS BLOB), tool_name, timestamp "
            "FROM messages WHERE id <= ? ORDER BY id",
            (top,),
        ):
            digest.update(repr(row).encode())
            count += 1
    finally:
        conn.close()
    return top, count, digest.hexdigest()


def integrity(db):
    """PRAGMA integrity_check, then FTS5's integrity-check of both message indexes: "ok" or the failure."""
    conn = sqlite3.connect(str(db), timeout=30)
    try:
        check = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        if check != ["ok"]:
            return "; ".join(check[:3])
        for name in ("messages_fts", "messages_fts_trigram"):
            conn.execute("INSERT INTO %s(%s, rank) VALUES('integrity-check', 1)" % (name, name))
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        conn.close()
    return "ok"


def restore_phase(home, profile, before, control=None):
    """The undo from the run's whole-file backup, its payload archive deleted, beside the 20 ms writer."""
    from hermes_writer import WriterProcess, latency_stats

    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import (
        restore_tool_payloads,
    )
    from hermes_fixtures import hermes_python

    os.unlink(profile["tool_payloads"]["archive"])
    backup = os.path.basename(profile["backup"]["path"])
    writer = WriterProcess(hermes_python("hermes-" + RELEASE), home / "state.db", str(home / "r.jsonl"), prefix="rb")
    writer.start()
    try:
        time.sleep(0.5)
        t0 = time.time()
        plan = restore_tool_payloads(str(home), "default", backup=backup, check_mode=True)
        t1 = time.time()
        done = restore_tool_payloads(str(home), "default", backup=backup)
        t2 = time.time()
        again = restore_tool_payloads(str(home), "default", backup=backup)
        time.sleep(0.5)
        summary = writer.stop()
        during = latency_stats(writer.records(), t1, t2)
        noise = latency_stats(control.records(), t1, t2)["max"] if control else None
    finally:
        writer.kill()
    after = rows_digest(home / "state.db", before[0])
    return {"planned": plan["planned"], "planned_bytes": plan["bytes"], "unmatched": plan["unmatched"],
            "restored": done["done"]["restored"], "bytes": done["done"]["bytes"], "check_s": t1 - t0,
            "restore_s": t2 - t1, "again": again["planned"], "rows": before[1], "identical": after == before,
            "integrity": integrity(home / "state.db"), "writer": {"appends": during["n"], "worst": during["max"],
            "p99": during["p99"], "failed": summary["failed"], "control_worst": noise}}  # fmt: skip


def _varint(buf, i):
    """FTS5's varint (SQLite's: big-endian 7 bits a byte, the ninth byte whole)."""
    value = 0
    for n in range(8):
        byte = buf[i + n]
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, i + n + 1
    return (value << 8) | buf[i + 8], i + 9


def fts_structure(conn, table):
    """An FTS5 index's structure record (row 10 of its %_data): the write counter and, per level,
    (segments being merged, [pages of each segment]); FTS5's automerge works off these."""
    blob = conn.execute('SELECT block FROM "%s_data" WHERE id = 10' % table).fetchone()[0]
    v2 = blob[4:8] == b"\xff\x00\x00\x01"  # SQLite 3.44+ (origins and tombstones per segment)
    i = 8 if v2 else 4
    nlevel, i = _varint(blob, i)
    _nseg, i = _varint(blob, i)
    counter, i = _varint(blob, i)
    levels = []
    for _level in range(nlevel):
        merging, i = _varint(blob, i)
        count, i = _varint(blob, i)
        pages = []
        for _seg in range(count):
            _segid, i = _varint(blob, i)
            first, i = _varint(blob, i)
            last, i = _varint(blob, i)
            for _extra in range(5 if v2 else 0):
                _x, i = _varint(blob, i)
            pages.append(last - first + 1)
        levels.append((merging, pages))
    return {"counter": counter, "levels": levels}


def fts_structures(conn):
    names = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%fts5%'")]  # fmt: skip
    return {name: fts_structure(conn, name) for name in names}


def child(code, home, live, out, limit=None, restore=False, trace=None, control_db=None):
    """One run of ``code``'s engine on ``home`` (a fresh copy), its phases timed; JSON to ``out``."""
    sys.path.insert(0, str(Path(code) / "build" / "collections"))
    from hermes_writer import WriterProcess, latency_stats

    try:
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import run as engine
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
    except ImportError:  # a tree from before the engine's layers
        from ansible_collections.hermes_agent.ops.plugins.module_utils import _hermes_engine as engine

        gather_info = engine.gather_info
    from hermes_fixtures import hermes_python

    phases = {"spans": []}  # <name>_start/_end: its last call; spans: every call, in order

    def timed(name, func):
        def run(*args, **kwargs):
            phases[name + "_start"] = time.time()
            try:
                return func(*args, **kwargs)
            finally:
                phases[name + "_end"] = time.time()
                phases["spans"].append([name, phases[name + "_start"], phases[name + "_end"]])

        return run

    # the engine's steps: maintain.run, or the modules of its steps where it has them
    steps = [engine] + [
        sys.modules[m]
        for m in (engine.__name__.rsplit(".", 1)[0] + "." + s for s in ("inspection", "decision", "execution"))
        if m in sys.modules
    ]

    def patch(name, wrapper):
        for module in steps:
            if hasattr(module, name):
                setattr(module, name, wrapper(getattr(module, name)))

    patch("elide", lambda func: timed("elide", func))
    holds = []  # how long each elision transaction held the write lock (engines that have _elide_group)
    interrupted = []  # the size of each group interrupted at the hard bound
    traced = []  # with --trace: each transaction, its FTS5 structure before and after
    utils = engine.__name__.split("._hermes", 1)[0]
    payloads = sys.modules.get(utils + "._hermes.apply.elision") or sys.modules.get(utils + "._hermes_payloads")
    if payloads is not None and hasattr(payloads, "_elide_group"):
        real_group = payloads._elide_group

        def group(*args, **kwargs):
            before = fts_structures(args[0]) if trace else None
            wall, start = time.time(), time.monotonic()
            try:
                began, committing = real_group(*args, **kwargs)
            except sqlite3.OperationalError:
                interrupted.append(len(args[3]))  # past the hard bound: rolled back, retried in halves
                if trace:
                    # from BEGIN where the engine's deadline starts there (its .began), else from the call
                    locked = max(start, getattr(args[6], "began", start))
                    traced.append({"t": wall, "held": time.monotonic() - locked, "waited": locked - start,
                                   "bodies": len(args[3]), "interrupted": True, "before": before})  # fmt: skip
                raise
            holds.append((time.monotonic() - began, committing - began, len(args[3])))
            if trace:
                traced.append({"t": wall, "held": holds[-1][0], "statements": holds[-1][1], "bodies": len(args[3]),
                               "waited": began - start, "interrupted": False, "before": before,
                               "after": fts_structures(args[0])})  # fmt: skip
            return began, committing

        payloads._elide_group = group
    if limit:
        # the engine's own stop callback, ended after ``limit`` seconds of elision: what it did till then counts
        def limited_by(real_elide):
            def limited(*args, **kwargs):
                given, deadline = kwargs.get("stop"), time.time() + limit

                def stop():
                    return "bench time limit" if time.time() > deadline else (given() if given else None)

                kwargs["stop"] = stop
                return real_elide(*args, **kwargs)

            return limited

        patch("elide", limited_by)
    patch("take_payload_archive", lambda func: timed("archive", func))
    for name in ("stats", "build_plan", "plan_payloads", "reclaim"):  # the other phases that read or write state.db
        patch(name, lambda func, name=name: timed(name, func))
    home = Path(home)
    opts = {"hermes_home": [str(home)], "prune_days": 3650, "tool_payload_days": 30}
    opts["vacuum_mode"] = "auto" if live else "full"
    before = storage_summary(gather_info, home)
    digest = rows_digest(home / "state.db") if restore else None
    writer = control = None
    python = hermes_python("hermes-" + RELEASE)
    if live:
        writer = WriterProcess(python, home / "state.db", str(home / "w.jsonl"), prefix="eb")
        writer.start()
    if control_db:
        control = WriterProcess(python, control_db, str(Path(control_db).parent / "w.jsonl"), prefix="control")
        control.start()
    if writer or control:
        time.sleep(0.5)
    try:
        t0 = time.time()
        profile = engine.run_maintenance(opts)["profiles"][0]
        t1 = time.time()
        result = {"status": profile["status"], "error": profile["error"], "seconds": t1 - t0,
                  "tool_payloads": profile["tool_payloads"], "storage_before": before,
                  "archive_s": phases.get("archive_end", 0) - phases.get("archive_start", 0),
                  "elide_s": phases.get("elide_end", 0) - phases.get("elide_start", 0),
                  "transactions": len(holds), "longest_hold": max(holds)[0] if holds else None,
                  "holds_over_150ms": sum(1 for h in holds if h[0] > 0.15), "interrupted": interrupted,
                  "longest_holds": sorted(holds, reverse=True)[:5]}  # fmt: skip
        if writer:
            summary = writer.stop()
            records = writer.records()
            during = latency_stats(records, phases.get("elide_start"), phases.get("elide_end"))
            whole = latency_stats(records, t0, t1)
            result["writer"] = {"appends": during["n"], "worst": during["max"], "p99": during["p99"],
                                "worst_run": whole["max"], "failed": summary["failed"]}  # fmt: skip
            if control:
                noise = control.records()
                result["writer"]["control_worst"] = latency_stats(
                    noise, phases.get("elide_start"), phases.get("elide_end"))["max"]  # fmt: skip
                result["writer"]["control_worst_run"] = latency_stats(noise, t0, t1)["max"]
        result["storage_after"] = storage_summary(gather_info, home)
        if restore:
            result["restore"] = restore_phase(home, profile, digest, control)
        if trace:
            Path(trace).write_text(json.dumps({"transactions": traced, "phases": dict(phases, run_start=t0, run_end=t1),
                                               "appends": writer.records() if writer else []}))  # fmt: skip
    finally:
        for proc in (writer, control):
            if proc:
                proc.kill()
    Path(out).write_text(json.dumps(result))


def one_run(code, base, home, live, limit=None, restore=False, trace=None, control=None):
    from hermes_fixtures import copy_db

    shutil.rmtree(str(home), ignore_errors=True)
    (home / "sessions").mkdir(parents=True)
    copy_db(base, home / "state.db")
    control_db = None
    if control:
        control_home = home.parent / (home.name + "-control")
        shutil.rmtree(str(control_home), ignore_errors=True)
        control_home.mkdir()
        control_db = control_home / "state.db"
        copy_db(control, control_db)
    os.sync()  # the copy's write-back would otherwise land in the run's first seconds
    out = home.parent / (home.name + ".json")
    load = "%.2f %.2f %.2f" % os.getloadavg()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(code), str(home), "live" if live else "idle", str(out)]
        + (["--time-limit", str(limit)] if limit else [])
        + (["--restore"] if restore else [])
        + (["--trace", str(trace)] if trace else [])
        + (["--control", str(control_db)] if control_db else []),
        check=False,
    )
    if proc.returncode != 0:
        sys.exit("the run of %s on %s failed (exit %d)" % (code, home, proc.returncode))
    result = json.loads(out.read_text())
    result.update(code=str(code), live=live, load=load)
    return result


def ms(value):
    return "-" if value is None else "%.0f ms" % (1000 * value)


def table(rows, made):
    lines = [
        "| file | run | engine | bodies elided (MB) | archive s | elision s | bodies/s | appends during it "
        "| worst stall during the elision (<= 250 ms) | p99 | worst stall, whole run "
        "| control worst: elision / whole run | failed writes | load before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tp, w = r["tool_payloads"], r.get("writer") or {}
        rate = tp["elided"] / r["elide_s"] if r["elide_s"] else float("nan")
        worst = w.get("worst")
        label = r["label"] + (" (stopped: %s)" % tp["stopped_early"] if tp.get("stopped_early") else "")
        verdict = ""
        if worst is not None:
            verdict = ": met" if worst <= STALL else ": missed by %.0f ms" % (1000 * (worst - STALL))
        lines.append(
            "| %.0f MB | %s | %s | %d (%.0f) | %.1f | %.1f | %.0f | %s | %s%s | %s | %s | %s / %s | %s | %s |"
            % (made["bytes"] / MB, "beside a 20 ms writer" if r["live"] else "no holder, vacuum full",
               label, tp["elided"], tp["bytes"] / MB, r["archive_s"], r["elide_s"],
               rate if not math.isnan(rate) else 0, w.get("appends", "-"), ms(worst), verdict, ms(w.get("p99")),
               ms(w.get("worst_run")), ms(w.get("control_worst")), ms(w.get("control_worst_run")),
               w.get("failed", "-"), r["load"])
        )  # fmt: skip
    return "\n".join(lines)


def storage_lines(title, st):
    lines = ["%s: file %.1f MB, free %.1f MB" % (title, st["file_bytes"] / MB, st["free_bytes"] / MB)]
    for name, nbytes in sorted(st["by_object"].items(), key=lambda kv: -kv[1]):
        lines.append("    %-40s %9.1f MB" % (name, nbytes / MB))
    lines.append("    by role: %s" % json.dumps(st["by_role"], sort_keys=True))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--sessions", type=int, default=4800, help="30 messages each (4800: 0.7 GB)")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--runs", type=int, default=1, help="live rounds per engine")
    parser.add_argument("--compare", type=Path, default=None, help="another checkout whose engine also runs")
    parser.add_argument("--no-idle", action="store_true", help="skip the run without a holder (vacuum_mode: full)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--time-limit", type=float, default=None, help="end each live elision after this many seconds (a slow engine)"
    )
    parser.add_argument(
        "--restore", action="store_true", help="after the run with no holder, the undo from its whole-file backup"
    )
    parser.add_argument(
        "--trace", type=Path, default=None,
        help="write each elision transaction (its hold, FTS5 structure before and after) and each append here "
        "(<trace>.<engine>.json; reading the structure adds a short read per transaction)",
    )  # fmt: skip
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--control", default=None, help=argparse.SUPPRESS)  # the child's control writer's file
    args = parser.parse_args(argv)
    if args.child:
        code, home, mode, out = args.child
        child(code, home, mode == "live", out, args.time_limit, args.restore, args.trace, args.control)
        return 0
    args.workdir.mkdir(parents=True, exist_ok=True)
    print("load average %s; making/using the base file ..." % ("%.2f %.2f %.2f" % os.getloadavg()), flush=True)
    base, made = build_base(args.workdir, args.sessions)
    print("base %s: %.1f MB, made in %.0f s" % (base, made["bytes"] / MB, made["seconds"]), flush=True)
    control, _made = build_base(args.workdir, CONTROL_SESSIONS)
    codes = [("this", REPO)] + ([("compare", args.compare.resolve())] if args.compare else [])
    rows = []
    for rnd in range(args.runs):
        for label, code in codes:
            trace = args.trace and args.trace.with_suffix(".%s.%d.json" % (label, rnd))
            row = one_run(code, base, args.workdir / ("elision-%s" % label), live=True, limit=args.time_limit,
                          trace=trace, control=control)  # fmt: skip
            row["label"], row["round"] = label, rnd
            rows.append(row)
            print("  %s round %d: %d bodies in %.1f s, worst %s (control writer %s); %d transactions, the longest "
                  "held %s, %s over 150 ms, %d interrupted"
                  % (label, rnd, row["tool_payloads"]["elided"], row["elide_s"],
                     ms((row.get("writer") or {}).get("worst")), ms((row.get("writer") or {}).get("control_worst")),
                     row.get("transactions", 0),
                     ms(row.get("longest_hold")), row.get("holds_over_150ms", "-"), len(row.get("interrupted", ()))),
                  flush=True)  # fmt: skip
    if not args.no_idle:
        row = one_run(REPO, base, args.workdir / "elision-idle", live=False, restore=args.restore, control=control)
        row["label"], row["round"] = "this", 0
        rows.append(row)
    print()
    print(table(rows, made))
    print()
    print(storage_lines("storage before (the base file)", rows[0]["storage_before"]))
    for row in rows:
        if row["label"] == "this" and row["round"] == 0:
            where = "beside the writer, vacuum_mode auto" if row["live"] else "no holder, vacuum_mode full"
            print(storage_lines("storage after a run with tool_payload_days 30 (%s)" % where, row["storage_after"]))
    for row in rows:
        undo = row.get("restore")
        if undo:
            w = undo["writer"]
            print(
                "undo from the run's whole-file backup (payload archive deleted), beside a 20 ms writer: check mode "
                "%d bodies (%.1f MB) in %.1f s; restored %d (%.1f MB) in %.1f s, %.0f bodies/s; %d tombstones "
                "unmatched; %d message rows identical: %s; integrity: %s; a second restore: %d; the writer: %d "
                "appends, worst %s, p99 %s, %d failed; the control writer's worst %s"
                % (undo["planned"], undo["planned_bytes"] / MB, undo["check_s"], undo["restored"], undo["bytes"] / MB,
                   undo["restore_s"], undo["restored"] / undo["restore_s"] if undo["restore_s"] else 0,
                   undo["unmatched"], undo["rows"], undo["identical"], undo["integrity"], undo["again"],
                   w["appends"], ms(w["worst"]), ms(w["p99"]), w["failed"], ms(w.get("control_worst")))
            )  # fmt: skip
    print("load average after %s" % ("%.2f %.2f %.2f" % os.getloadavg()))
    if args.json:
        args.json.write_text(json.dumps({"made": made, "rows": rows}, indent=1, default=str) + "\n")
    bad = [r for r in rows if r["status"] != "ok" or (r.get("writer") or {}).get("failed")]
    bad += [r for r in rows if r.get("restore") and not (r["restore"]["identical"] and r["restore"]["again"] == 0)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
