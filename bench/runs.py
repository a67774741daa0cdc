"""The runs: the release's own prune and ours, side by side on identical copies, under the live writer.

Per size, every round runs each kind on its own fresh copy of the same base file, in its own
process, while the writers of ``bench.writer`` append:

* ``hermes`` (0.19.0): ``SessionDB.prune_sessions(older_than_days=7)`` then ``SessionDB.vacuum()``
  (optimize + VACUUM): what ``hermes sessions prune`` and auto-maintenance do;
* ``hermes-0.22`` (0.22.2): ``prune_sessions(older_than_days=7, exclude_active_write_guards=True)``
  (one transaction; its VACUUM refuses while another process holds the file);
* ``ours``: ``run_maintenance`` with the engine's defaults (backup on, vacuum_mode auto);
* ``ours-inc`` (0.19.0 only): the same on a copy already in ``auto_vacuum=INCREMENTAL``.

Measured: wall time of the maintenance process, its phases, prune rows/s, the writer's latencies
(worst / p99 / failed, per phase, every append), bytes given back, the process's peak RSS
(its VmHWM; ``wait4`` ru_maxrss too), our backup against ``cp`` (+ fsync) of the same file.
"""

import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

from bench import report
from bench.common import MB, MODES, collections_root, load_average, machine, parse_size, size_label
from bench.datasets import CACHED, GENERATED, base_db, control_db, count_messages, fresh_home
from bench.writer import appended, longest_lock, transactions, with_writer
from hermes_fixtures import hermes_python

HERMES_CODE = r"""
import json, sys, time
from pathlib import Path
import hermes_state
home, release = sys.argv[1], sys.argv[2]
db = hermes_state.SessionDB(db_path=Path(home) / "state.db")
kwargs = {} if release == "0.19.0" else {"exclude_active_write_guards": True}
t0 = time.time()
n = db.prune_sessions(older_than_days=7, sessions_dir=Path(home) / "sessions", **kwargs)
t1 = time.time()
phases = {"prune": [t0, t1]}
if release == "0.19.0":  # 0.22's vacuum() refuses while another process holds the file
    db.vacuum()
    phases["vacuum"] = [t1, time.time()]
t2 = time.time()
db.close()
with open("/proc/self/status") as fh:
    hwm = [int(l.split()[1]) for l in fh if l.startswith("VmHWM:")][0]
print(json.dumps({"sessions_pruned": n, "phases": phases, "start": t0, "end": t2, "vmhwm_kb": hwm}))
"""

OURS_CODE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run as E
phases = {}
def wrap(name, module=E, label=None):
    real = getattr(module, name)
    def timed(*a, **k):
        t0 = time.time()
        try:
            return real(*a, **k)
        finally:
            key = label or name
            phases[key if key not in phases else key + "-2"] = [t0, time.time()]
    setattr(module, name, timed)
# Each name where the engine calls it: maintain.run, or the module of the step that calls it (a name two
# steps call, in both: stats before and after, the run's archive and a sliced session's).
STEPS = [E] + [sys.modules[m] for m in (E.__package__ + "." + s for s in ("inspection", "decision", "execution",
                                                                          "deleter")) if m in sys.modules]
for name in ("preflight_check", "quick_check", "stats", "build_plan", "take_backup", "take_archive",
             "close_zombies", "prune", "reclaim"):
    for module in STEPS:
        if hasattr(module, name):
            wrap(name, module)
import ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.whole_file as B
for name, label in (("_copy_files", "backup.copy"), ("_copy_snapshot", "backup.copy_api"), ("verify", "backup.verify")):
    wrap(name, B, label)
import sqlite3
LOCKS = []  # [start, end, what, commit s]: our transactions on state.db, and autocommit statements >= 20 ms
class Traced(sqlite3.Connection):
    # Times what holds a lock on state.db: each transaction (BEGIN..COMMIT) and autocommit statement.
    begun = None
    def _timed(self, call, sql, *a):
        was = self.in_transaction
        t0 = time.time()
        try:
            return call(sql, *a)
        finally:
            t1 = time.time()
            if not was and self.in_transaction:  # the lock is ours once BEGIN (IMMEDIATE) returns
                self.begun, self.longest = t1, (0.0, "")
            if self.in_transaction and t1 - t0 > self.longest[0]:
                self.longest = (t1 - t0, " ".join(sql.split())[:90])
            if was and not self.in_transaction and self.begun is not None:
                if sql.lstrip().upper().startswith("COMMIT"):
                    LOCKS.append([self.begun, t1, "txn, longest: %s" % self.longest[1], t1 - t0])
                else:  # SQLite rolled it back: the hard bound interrupted this statement (no COMMIT)
                    LOCKS.append([self.begun, t1, "txn rolled back in: %s" % " ".join(sql.split())[:80], 0.0])
                self.begun = None
            elif not was and not self.in_transaction and t1 - t0 >= 0.02:
                LOCKS.append([t0, t1, " ".join(sql.split())[:90], 0.0])
    def execute(self, sql, *a):
        return self._timed(super().execute, sql, *a)
    def executemany(self, sql, *a):
        return self._timed(super().executemany, sql, *a)
    def executescript(self, sql):
        return self._timed(super().executescript, sql)
real_connect = sqlite3.connect
def connect(database, *a, **k):
    if str(database).endswith("state.db") and "factory" not in k:
        k["factory"] = Traced
    return real_connect(database, *a, **k)
sqlite3.connect = connect
opts = json.loads(sys.argv[2])
if len(sys.argv) > 3:  # the ceiling: the engine's own transactions, each within this bound, back to back
    import ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune as P
    ceiling = float(sys.argv[3])
    assert callable(P._gateway_turn) and callable(P.IdlePacing.bound), "the pacing the ceiling takes out moved"
    P._gateway_turn = lambda run, held: None
    P.IdlePacing.bound = lambda self: ceiling
t0 = time.time()
result = E.run_maintenance(opts)
t1 = time.time()
p = result["profiles"][0]
with open("/proc/self/status") as fh:
    hwm = [int(l.split()[1]) for l in fh if l.startswith("VmHWM:")][0]
print(json.dumps({"status": p["status"], "error": p["error"], "sessions_pruned": p["sessions_pruned"],
                  "messages_pruned": p["messages_pruned"], "backup": p["backup"], "reclaim": p["reclaim"],
                  "phases": phases, "start": t0, "end": t1, "vmhwm_kb": hwm, "locks": LOCKS}))
"""

# Our options per mode beyond the run's own (0.22's schema is newer than the engine's table of known ones).
EXTRA_OPTS = {"wal-0.19": {}, "delete-0.22": {"allow_unknown_schema": True}, "wal-0.22": {"allow_unknown_schema": True}}
WAL_GRID = "500:0.03:0,2000:0.03:0,2000:0.02,2000:0.03:0.04,2000:0.03,2000:0.03:0.1"
ROLLBACK_GRID = "2000:0.03:0.04,2000:0.03:0.06,2000:0.01:0.06,4000:0.03:0.1"
# The ceiling's bound (run_ours): a live writer's whole budget is 250 ms, and transactions of 100 to 1000 ms
# back to back all cost about the same (0.61-0.71x of one transaction on a 0.7 GB 0.22.2 file here).
CEILING_BOUND = 0.2
WRITING_PHASES = ("close_zombies", "prune", "reclaim")  # the 0.19.0 bench's "through prune and reclaim"
REFUSAL_MARGIN = 256 * MB  # free space beside the file on the refusal disk (at most a quarter of the file)


def run_child(cmd, env=None, cwd=None):
    """Run a maintenance process; return (parsed JSON of its last line, its peak RSS in MB)."""
    with tempfile.TemporaryFile() as out_fh, tempfile.TemporaryFile() as err_fh:
        proc = subprocess.Popen(cmd, stdout=out_fh, stderr=err_fh, env=env, cwd=cwd)
        status, usage = os.wait4(proc.pid, 0)[1:]
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_fh.seek(0)
        err_fh.seek(0)
        out, err = out_fh.read().decode(), err_fh.read().decode()
    if proc.returncode != 0:
        raise RuntimeError("%s failed (rc %d): %s" % (cmd[:3], proc.returncode, err[-3000:]))
    result = json.loads(out.strip().splitlines()[-1])
    # ru_maxrss of a fork+exec child starts at the parent's size (Linux keeps the pre-exec
    # high-water mark), so the child's own VmHWM is the figure; ru_maxrss is kept for reference.
    result["ru_maxrss_mb"] = usage.ru_maxrss / 1024.0
    return result, result["vmhwm_kb"] / 1024.0


def run_hermes(mode, workdir, home, interval=0.02):
    """The release's own prune on ``home`` beside the live writer."""
    release = MODES[mode]["release"]
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("PYTHONPATH", None)
    msgs = count_messages(home / "state.db")
    cmd = [hermes_python(release), "-c", HERMES_CODE, str(home), release]
    result, rss, stats = with_writer(home, release, control_db(workdir, mode), lambda: run_child(cmd, env), interval)
    result["messages_pruned"] = msgs - count_messages(home / "state.db") + appended(home)
    return result, rss, stats


def run_ours(mode, workdir, home, opts=None, interval=0.02, ceiling=None):
    """``run_maintenance`` on ``home`` beside the live writer (the engine's defaults, then ``opts``).

    ``ceiling`` (seconds): the reference a paced prune is measured against, the same engine's
    prune with its pacing taken out: every transaction within that bound, the next one begun as
    soon as it commits (no gateway's turn, no pause), no backup and no VACUUM. A writer may wait
    through many such transactions: it is a measure of cost, not a way to run beside a gateway."""
    # The retention of the release's prune it is compared with (older_than_days=7), not the engine's
    # default (90 days, as Hermes's own auto-prune), under which the bench file has nothing to prune.
    options = dict(EXTRA_OPTS[mode], hermes_home=[str(home)], prune_days=7)
    options.update(opts or {})
    if ceiling:
        options.update(backup=False, vacuum_mode="never")
    cmd = [sys.executable, "-c", OURS_CODE, collections_root(), json.dumps(options)]
    cmd += [str(ceiling)] if ceiling else []
    control = control_db(workdir, mode)
    result, rss, stats = with_writer(home, MODES[mode]["release"], control, lambda: run_child(cmd), interval)
    if result["status"] != "ok":
        raise RuntimeError("our run failed: %s" % result["error"])
    return result, rss, stats


def span(result, name):
    s = result["phases"].get(name)
    return (s[1] - s[0]) if s else None


def row_for(kind, result, rss, stats, size):
    prune_s = span(result, "prune")
    return {
        "size": size,
        "kind": kind,
        "wall": result["end"] - result["start"],
        "prune_s": prune_s,
        "messages": result["messages_pruned"],
        "rows_s": result["messages_pruned"] / prune_s if prune_s else None,
        "worst": stats["max"],
        "p99": stats["p99"],
        "failed": stats["failed"],
        "n_writes": stats["n"],
        "control_worst": stats["control"]["max"],
        "control_p99": stats["control"]["p99"],
        "reclaimed": result["bytes_reclaimed"],
        "reclaimed_settled": result["bytes_reclaimed_settled"],
        "rss": rss,
        "phases": {
            k: dict(
                zip(("lock_s", "lock"), longest_lock(result.get("locks") or [], result["phases"][k])),
                s=span(result, k),
                max=v["max"],
                p99=v["p99"],
                failed=v["failed"],
            )
            for k, v in stats["phases"].items()
        },
        "worst_appends": stats["worst_appends"],
        "slow_appends": stats["slow_appends"],
        "prune_txns": transactions(result.get("locks") or [], result["phases"].get("prune")),
        "file_problems": stats["file_problems"],
        "backup": result.get("backup"),
        "reclaim": result.get("reclaim"),
        "series": stats["series"],
    }


def writing_worst(row):
    """The writer's worst append that started during one of our writing phases."""
    return max([row["phases"][p]["max"] for p in WRITING_PHASES if row["phases"].get(p, {}).get("max")] or [0.0])


def worst_of(values):
    """The largest of ``values`` that are figures (None: no append started in that window, as
    beside a gateway that does not write); None when there is none."""
    values = [v for v in values if v is not None]
    return max(values) if values else None


def combine(reps):
    """The run with the median rows/s stands for its kind; stalls are the worst over all runs."""
    reps = sorted(reps, key=lambda r: r["rows_s"] or 0)
    row = dict(reps[len(reps) // 2])
    row["runs"] = len(reps)
    row["rows_s_all"] = [r["rows_s"] for r in reps]
    row["worst"] = worst_of(r["worst"] for r in reps)
    row["failed"] = sum(r["failed"] for r in reps)
    row["file_problems"] = [p for r in reps for p in r["file_problems"]]
    row["writing_worst"] = max(writing_worst(r) for r in reps)
    row["control_worst"] = worst_of(r["control_worst"] for r in reps)
    row["rss"] = max(r["rss"] for r in reps)
    # Every round's phases: the worst stall may fall in a round other than the median one.
    kept = ("rows_s", "worst", "phases", "worst_appends", "slow_appends", "prune_txns", "messages", "prune_s")
    row["rounds"] = [{k: r[k] for k in kept} for r in reps]
    return row


def bench_size(mode, workdir, n, runs=3, include_inc=True, opts=None, interval=0.02, ceiling=CEILING_BOUND):
    """``runs`` rounds of the release's prune / ours (/ ours-inc) / the ceiling (``run_ours``; 0: none),
    alternating; then the backup against cp."""
    spec = MODES[mode]
    size = size_label(n)
    base = base_db(workdir, mode, n)
    inc = base_db(workdir, mode, n, incremental=True) if include_inc and mode == "wal-0.19" else None
    reps = {spec["hermes"]: [], "ours": [], "ours-inc": [], "ceiling": []}
    for round_ in range(1, runs + 1):
        print("[%s %s] round %d/%d: %s's own prune ..." % (size, mode, round_, runs, spec["release"]), flush=True)
        res = run_hermes(mode, workdir, fresh_home(workdir, "run-hermes", base), interval)
        reps[spec["hermes"]].append(row_for(spec["hermes"], *res, size))
        print("[%s %s] round %d/%d: ours (defaults) ..." % (size, mode, round_, runs), flush=True)
        res = run_ours(mode, workdir, fresh_home(workdir, "run-ours", base), opts, interval)
        reps["ours"].append(row_for("ours", *res, size))
        if inc:
            print("[%s %s] round %d/%d: ours on an auto_vacuum=INCREMENTAL copy ..." % (size, mode, round_, runs))
            res = run_ours(mode, workdir, fresh_home(workdir, "run-ours-inc", inc), opts, interval)
            reps["ours-inc"].append(row_for("ours-inc", *res, size))
        if ceiling:
            print("[%s %s] round %d/%d: the ceiling (transactions of <= %.0f ms back to back) ..."
                  % (size, mode, round_, runs, ceiling * 1000), flush=True)  # fmt: skip
            res = run_ours(mode, workdir, fresh_home(workdir, "run-ceiling", base), opts, interval, ceiling)
            reps["ceiling"].append(row_for("ceiling", *res, size))
        for name in ("run-hermes", "run-ours", "run-ours-inc", "run-ceiling"):
            shutil.rmtree(workdir / name, ignore_errors=True)
    rows = [dict(combine(r), journal=spec["journal"]) for r in reps.values() if r]
    print("[%s %s] whole-file backup (no holder) against cp ..." % (size, mode), flush=True)
    reps = 5 if os.path.getsize(str(base)) < 1024 * MB else 2  # a multi-GB copy is long and steady enough
    rows[1]["backup_cmp"] = backup_vs_cp(workdir, base, reps=reps, wal=spec["journal"] == "wal")
    return rows


def time_cp(src, dst):
    t0 = time.time()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    t1 = time.time()
    fd = os.open(str(dst), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    t2 = time.time()
    os.unlink(str(dst))
    return t1 - t0, t2 - t0


def backup_vs_cp(workdir, base, reps=5, wal=True):
    """``take_backup`` of a copy of ``base`` with no holder (the service-window path), switched to
    WAL mode unless ``wal`` is false, against cp and cp + fsync, interleaved; medians."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.whole_file import take_backup

    home = workdir / "backup-src"
    shutil.rmtree(home, ignore_errors=True)
    (home / "backups").mkdir(parents=True, mode=0o700)
    db = str(home / "state.db")
    shutil.copyfile(str(base), db)
    conn = sqlite3.connect(db, isolation_level=None)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    times = {"backup": [], "cp": [], "cp_fsync": []}
    for _rep in range(reps):
        cp_s, cp_sync_s = time_cp(db, workdir / "cp-target.db")
        t0 = time.time()
        result = take_backup(conn, db, str(home / "backups"), "bench", False, {})
        times["backup"].append(time.time() - t0)
        os.unlink(result["path"])
        times["cp"].append(cp_s)
        times["cp_fsync"].append(cp_sync_s)
    conn.close()
    shutil.rmtree(home, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "bytes": os.path.getsize(str(base)),
        "reps": reps,
        "copied_by": result["copied_by"],
        "backup_s": med["backup"],
        "cp_s": med["cp"],
        "cp_fsync_s": med["cp_fsync"],
        "ratio": med["cp"] / med["backup"],
        "ratio_fsync": med["cp_fsync"] / med["backup"],
        "all": times,
    }


def sha256(path):
    digest = hashlib.sha256()
    with open(str(path), "rb") as fh:
        for block in iter(lambda: fh.read(8 * MB), b""):
            digest.update(block)
    return digest.hexdigest()


def disk_refusals(workdir, base):
    """The refusal before any write on a disk that cannot hold the backup or a VACUUM: a copy
    of ``base`` on a tmpfs only REFUSAL_MARGIN (or a quarter of the file) larger than it (mounted here: root), then
    ``run_maintenance`` twice, with no holder: the defaults (a backup beside the home), and with no
    backup and ``vacuum_mode: full`` (nothing old enough to prune, so the VACUUM is all it would do).
    Each must say why it refused, and leave state.db byte for byte as it was, with no journal."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance

    if os.geteuid() != 0:
        return {"tried": False, "why": "needs root to mount a tmpfs of a chosen size"}
    mount = workdir / "refusal-disk"
    mount.mkdir(parents=True, exist_ok=True)
    size = os.path.getsize(str(base))
    room = size + min(REFUSAL_MARGIN, size // 4)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d,mode=0700" % room, "tmpfs", str(mount)], check=True)
    cases = []
    try:
        home = mount / "home"
        (home / "sessions").mkdir(parents=True)
        db = home / "state.db"
        shutil.copyfile(str(base), str(db))
        before = sha256(db)
        free_mb = shutil.disk_usage(str(mount)).free // MB
        for what, extra in (
            ("backup", {}),
            ("VACUUM", {"backup": False, "vacuum_mode": "full", "prune_days": 36500, "zombie_days": 36500}),
        ):
            opts = dict(EXTRA_OPTS["delete-0.22"], hermes_home=[str(home)], **extra)
            t0 = time.time()
            profile = run_maintenance(opts)["profiles"][0]
            reason = profile["error"] or (profile.get("reclaim") or {}).get("skipped_reason")
            unchanged = sha256(db) == before and not any(os.path.exists(str(db) + sfx) for sfx in ("-journal", "-wal"))
            refused = bool(reason) and "free" in reason and profile["sessions_pruned"] == 0
            cases.append(
                {
                    "what": what,
                    "status": profile["status"],
                    "reason": reason,
                    "unchanged": unchanged,
                    "met": refused and unchanged,
                    "seconds": round(time.time() - t0, 2),
                }
            )
            print("[refusal] %s: %s: %s (state.db unchanged: %s)" % (what, profile["status"], reason, unchanged))
    finally:
        subprocess.run(["umount", str(mount)], check=False)
    return {"tried": True, "file_bytes": size, "disk_free_mb": free_mb, "cases": cases}


def parse_grid(text, default_time):
    """``batch_size:batch_pause[:batch_time],...`` -> [(size, pause, time)]."""
    grid = []
    for item in text.split(","):
        fields = item.split(":") + [str(default_time)]
        grid.append((int(fields[0]), float(fields[1]), float(fields[2])))
    return grid


def sweep_point(batch_size, pause, batch_time, runs):
    """One grid point: medians of its runs (max = the worst single stall)."""

    def med(key):
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    return {
        "batch_size": batch_size,
        "batch_pause": pause,
        "batch_time": batch_time,
        "reps": len(runs),
        "rows_s": med("rows_s"),
        "hermes_rows_s": med("hermes_rows_s"),
        "ratio": med("ratio"),
        "prune_s": med("prune_s"),
        "worst": med("worst"),
        "worst_max": worst_of(r["worst"] for r in runs),
        "p99": med("p99"),
        "failed": sum(r["failed"] for r in runs),
        "control_worst": med("control_worst"),
        "control_p99": med("control_p99"),
    }


def sweep(mode, workdir, n, grid, reps=1, interval=0.02):
    """Each grid point ``reps`` times, round robin (so load swings hit every point alike); medians.
    Prune phase only, backup off; the release's prune on its own copy right before each point."""
    base = base_db(workdir, mode, n)
    raw = {point: [] for point in grid}
    for rep in range(reps):
        for batch_size, pause, batch_time in grid:
            print(
                "[sweep %s %s rep %d] batch_size=%d batch_pause=%s batch_time=%s ..."
                % (size_label(n), mode, rep + 1, batch_size, pause, batch_time),
                flush=True,
            )
            res = run_hermes(mode, workdir, fresh_home(workdir, "run-sweep-hermes", base), interval)
            hermes = row_for("hermes", *res, "")
            opts = {"batch_size": batch_size, "batch_pause": pause, "batch_time": batch_time, "backup": False}
            res = run_ours(mode, workdir, fresh_home(workdir, "run-sweep", base), opts, interval)
            row = row_for("ours", *res, "")
            pr = row["phases"].get("prune", {})
            one = {
                "rows_s": row["rows_s"],
                "hermes_rows_s": hermes["rows_s"],
                "ratio": row["rows_s"] / hermes["rows_s"],
                "prune_s": row["prune_s"],
                "worst": pr.get("max"),
                "p99": pr.get("p99"),
                "failed": pr.get("failed") or 0,
                "control_worst": row["control_worst"],
                "control_p99": row["control_p99"],
            }
            raw[(batch_size, pause, batch_time)].append(one)
            print(report.sweep_line(sweep_point(batch_size, pause, batch_time, [one])), flush=True)
    for name in ("run-sweep", "run-sweep-hermes"):
        shutil.rmtree(workdir / name, ignore_errors=True)
    return [dict(sweep_point(*point, runs), runs=runs) for point, runs in raw.items()]


def measure(mode, args, argv, name=None):
    """The whole bench of ``mode`` as its results document (what bench/results/<name>.json holds)."""
    sys.path.insert(0, collections_root())
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import DEFAULTS

    workdir = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    doc = {
        "mode": mode,
        "name": name or mode,
        "writer_interval": args.writer_interval,
        "command": ("python bench/run.py " + " ".join(argv)).strip(),
        "machine": machine(),
        "load_before": load_average(),
        "started": time.time(),
        "defaults": {k: DEFAULTS[k] for k in ("batch_size", "batch_time", "batch_pause")},
    }
    print("machine: %s, load average %s" % (doc["machine"], doc["load_before"]), flush=True)
    opts = json.loads(args.opts) if args.opts else None
    rows = []
    for text in [t for t in args.sizes.split(",") if t.strip()]:
        rows += bench_size(mode, workdir, parse_size(text), args.runs, not args.no_inc, opts, args.writer_interval,
                           args.ceiling)  # fmt: skip
        print("\n".join(report.targets_table([dict(doc, rows=rows)])), flush=True)
    sweep_rows = []
    if args.sweep:
        grid = parse_grid(args.grid or (WAL_GRID if mode == "wal-0.19" else ROLLBACK_GRID), DEFAULTS["batch_time"])
        sweep_rows = sweep(mode, workdir, parse_size(args.sweep_size), grid, args.reps, args.writer_interval)
    if args.refusals:
        largest = max(parse_size(t) for t in args.sizes.split(",") if t.strip())
        doc["refusals"] = disk_refusals(workdir, base_db(workdir, mode, largest))
    doc.update(finished=time.time(), load_after=load_average(), rows=rows, sweep=sweep_rows)
    doc.update(generated=dict(GENERATED), made_earlier=dict(CACHED))
    return doc
