"""A live Hermes writer: the REAL ``SessionDB`` of a release appending on a schedule.

Two sides in one file:

* the **process** (run under a Hermes release's venv python)::

      <venv>/bin/python hermes_writer.py --db STATE_DB --out OUT.jsonl [--interval 0.02]
          [--prefix live-a] [--sessions 1] [--source telegram] [--read-hold SECONDS]
          [--duration SECONDS] [--stop-file PATH] [--keep-hermes-optimize]

  creates its own session(s) through ``SessionDB.create_session`` and appends one
  message every ``--interval`` seconds through ``SessionDB.append_message`` (so
  Hermes's own ``BEGIN IMMEDIATE`` + 1 s busy timeout + 15 jittered retries are what is
  measured), until ``--stop-file`` appears, ``--duration`` passes, or SIGTERM. Every
  attempt is one JSON line in OUT: ``{"k", "t" (unix start), "lat" (seconds), "id"
  (message id or null), "err" (null or the exception text)}``; the first line is
  ``{"ready": ...}`` after the first append succeeded, the last ``{"summary": ...}``.
  In WAL mode an attempt also has ``"ckpt"``: the frames its own commit's checkpoint
  (SQLite's wal_autocheckpoint, which Hermes keeps) copied into the file, read from the
  -shm's header before and after it (0: none).
  The summary also says whether the file the writer holds open was replaced or
  unlinked under it (state.db inode changed, a ``(deleted)`` state.db / -wal / -shm in
  ``/proc/self/fd``): the conditions that make a newer Hermes refuse all writes; for
  a release with file-identity guards (0.21+) also ``guards``: its sticky flags, WAL or
  not, and the result of its own identity probe just before close(); and the
  ``sqlite_version`` the process linked.

  ``--read-hold S`` adds a second connection in the same process (like the gateway's
  reader threads) that keeps a read transaction open for S seconds at a time, back to
  back, for the whole run.

  Hermes 0.19.0 runs a full FTS ``'optimize'`` inside every 1000th write
  (``_OPTIMIZE_EVERY_N_WRITES``), 0.22.2 FTS ``'merge'`` passes (``_FTS_MERGE_EVERY_N_WRITES``);
  both stall its own writer (for seconds on a large index) whatever else happens, so they are
  switched off here unless ``--keep-hermes-optimize``: the latencies measured are then the
  ones maintenance causes.

* the **harness** (imported by tests and ``bench/run.py`` under the dev venv):
  ``WriterProcess(python, db_path, out_path, **options)`` (``env``: variables added to
  the writer's environment, e.g. ``LD_LIBRARY_PATH``) with ``start()``
  (returns once the first append succeeded), ``stop()`` -> summary dict, and
  ``records()``; ``latency_stats(records, t0, t1)`` for a window.
"""

import argparse
import json
import math
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
MARK = "livemark"  # one FTS token every appended message carries


# ------------------------------------------------------------------ the process


def _db_fds(db_path):
    """(fd, target) of every open fd of this process on state.db or a sidecar."""
    real = os.path.realpath(db_path)
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/%s" % fd)
        except OSError:
            continue
        if target.startswith(real):
            found.append((int(fd), target))
    return found


def _file_condition(db_path, start_ino):
    problems = []
    try:
        ino = os.stat(db_path).st_ino
    except OSError as exc:
        problems.append("state.db cannot be stat'ed: %s" % exc)
        ino = None
    if ino is not None and ino != start_ino:
        problems.append("state.db was replaced (inode %s -> %s)" % (start_ino, ino))
    for fd, target in _db_fds(db_path):
        if target.endswith("(deleted)"):
            problems.append("fd %d points at a deleted file: %s" % (fd, target))
        else:
            path = target
            try:
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    problems.append("fd %d: %s was replaced under the writer" % (fd, path))
            except OSError as exc:
                problems.append("fd %d: %s: %s" % (fd, path, exc))
    return problems


def _identity_guard_state(db):
    """What a release with file-identity guards (0.21+) decided about its file, before close().

    ``replaced`` / ``wal_generation_lost`` are the sticky flags behind StateDbReplacedError and
    DeletedWalGenerationError, ``quarantined`` the one behind StateDbCorruptError; ``wal`` says
    whether the handle runs in WAL mode. Empty for releases without the guards.
    """
    if not hasattr(db, "_db_file_identity"):
        return {}
    state = {
        "replaced": bool(getattr(db, "_db_replaced", False)),
        "wal_generation_lost": bool(getattr(db, "_db_wal_generation_lost", False)),
        "quarantined": bool(getattr(db, "_db_corrupt", False)),
        "wal": bool(getattr(db, "_wal_active", False)),
        "application_id": getattr(db, "_db_file_application_id", None),
    }
    try:  # the live probe the release runs before every write
        db._halt_if_db_generation_changed()
        state["probe"] = "ok"
    except Exception as exc:
        state["probe"] = "%s: %s" % (type(exc).__name__, exc)
    return state


def _reader(db_path, hold, stop, out):
    """Hold a read transaction open ``hold`` seconds at a time until ``stop``."""
    conn = sqlite3.connect(db_path, timeout=5.0, isolation_level=None, check_same_thread=False)
    held = 0
    try:
        while not stop.is_set():
            conn.execute("BEGIN")
            conn.execute("SELECT COUNT(*) FROM messages").fetchone()
            stop.wait(hold)
            conn.execute("COMMIT")
            held += 1
    except Exception as exc:  # reported, the test fails on it
        out["reader_error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        conn.close()
    out["read_transactions"] = held


class CheckpointWatch:
    """Frames the -shm's header says were checkpointed (nBackfill) between ``before()`` and
    ``after()``. The -shm is opened once and never closed: closing any descriptor of a file drops
    every POSIX lock this process holds on it, SQLite's included."""

    HEADER = 136  # two 48-byte WAL-index headers, then nBackfill at 96

    def __init__(self, db_path):
        self.fd = None
        if os.path.exists(db_path + "-shm"):
            self.fd = os.open(db_path + "-shm", os.O_RDONLY)
        self.mark = None

    def _read(self):
        head = os.pread(self.fd, self.HEADER, 0)
        if len(head) < self.HEADER:
            return None
        (mx_frame,) = struct.unpack_from("=I", head, 16)
        (backfill,) = struct.unpack_from("=I", head, 96)
        return mx_frame, backfill

    def before(self):
        self.mark = self._read() if self.fd is not None else None

    def after(self):
        """Frames checkpointed since ``before()`` (0 when none, or the -wal restarted meanwhile)."""
        if self.mark is None:
            return 0
        now = self._read()
        if now is None or now[1] <= self.mark[1]:
            return 0
        return now[1] - self.mark[1]


def run_process(args):
    os.environ.setdefault("HERMES_HOME", os.path.dirname(os.path.abspath(args.db)))
    import hermes_state  # the release's own module

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = open(args.out, "a", buffering=1)
    db = hermes_state.SessionDB(db_path=Path(args.db))
    if not args.keep_hermes_optimize:
        # 0.19.0: a full FTS 'optimize' every 1000th write; 0.22.2: 'merge' passes every 1000th write
        # (up to 4 x 500 pages per index, 1-2 s on an 800k-message index). Either stalls the writer by itself.
        for knob in ("_OPTIMIZE_EVERY_N_WRITES", "_FTS_MERGE_EVERY_N_WRITES"):
            if hasattr(db, knob):
                setattr(db, knob, 10**12)
    start_ino = os.stat(args.db).st_ino
    sids = ["%s-%d" % (args.prefix, i) for i in range(args.sessions)]
    for sid in sids:
        db.create_session(sid, args.source)
    watch = CheckpointWatch(args.db)  # after the first write: a WAL file has its -shm by now
    reader_out = {}
    reader = None
    if args.read_hold:
        reader = threading.Thread(target=_reader, args=(args.db, args.read_hold, stop, reader_out), daemon=True)
        reader.start()
    deadline = time.time() + args.duration if args.duration else None
    k = failed = 0
    ok_ids = []
    lats = []
    ready = False
    next_at = time.perf_counter()
    while not stop.is_set():
        if args.stop_file and os.path.exists(args.stop_file):
            break
        if deadline and time.time() >= deadline:
            break
        sid = sids[k % len(sids)]
        role = "user" if k % 2 == 0 else "assistant"
        content = "%s %s k%d %s" % (MARK, args.prefix, k, "deploy zebra nightly")
        t_wall = time.time()
        watch.before()
        t0 = time.perf_counter()
        rec = {"k": k, "t": round(t_wall, 6), "sid": sid}
        try:
            rec["id"] = db.append_message(sid, role, content)
            rec["err"] = None
            ok_ids.append(rec["id"])
        except Exception as exc:
            rec["id"] = None
            rec["err"] = "%s: %s" % (type(exc).__name__, exc)
            failed += 1
        rec["lat"] = round(time.perf_counter() - t0, 6)
        if watch.fd is not None:
            rec["ckpt"] = watch.after()
        lats.append(rec["lat"])
        out.write(json.dumps(rec) + "\n")
        if not ready and rec["id"] is not None:
            out.write(json.dumps({"ready": True, "pid": os.getpid(), "sessions": sids}) + "\n")
            ready = True
        k += 1
        next_at += args.interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            stop.wait(delay)
        else:  # late: no burst to catch up, keep the cadence from now
            next_at = time.perf_counter()
    stop.set()
    if reader is not None:
        reader.join(timeout=args.read_hold + 10)
    problems = _file_condition(args.db, start_ino)
    # The SessionDB must still read what it wrote, through Hermes's own API.
    try:
        seen = sum(db.message_count(sid) for sid in sids)
    except Exception as exc:
        seen = None
        problems.append("message_count failed: %s" % exc)
    guards = _identity_guard_state(db)
    db.close()
    lats_sorted = sorted(lats)
    summary = {
        "attempts": k,
        "appended": len(ok_ids),
        "failed": failed,
        "ids": ok_ids,
        "sessions": sids,
        "message_count_seen": seen,
        "max": lats_sorted[-1] if lats_sorted else None,
        "p99": _pct(lats_sorted, 99),
        "p50": _pct(lats_sorted, 50),
        "file_problems": problems,
        "hermes_optimize": bool(args.keep_hermes_optimize),
        "sqlite_version": sqlite3.sqlite_version,
        "guards": guards,
    }
    summary.update(reader_out)
    out.write(json.dumps({"summary": summary}) + "\n")
    out.close()
    return 0


def _pct(sorted_values, pct):
    if not sorted_values:
        return None
    index = max(0, int(math.ceil(pct / 100.0 * len(sorted_values))) - 1)
    return sorted_values[index]


# ------------------------------------------------------------------ the harness


def latency_stats(records, t0=None, t1=None):
    """worst / p99 / p50 latency (seconds) and failures of the appends started in [t0, t1]."""
    window = [r for r in records if (t0 is None or r["t"] >= t0) and (t1 is None or r["t"] <= t1)]
    lats = sorted(r["lat"] for r in window)
    return {
        "n": len(window),
        "failed": sum(1 for r in window if r["err"]),
        "max": lats[-1] if lats else None,
        "p99": _pct(lats, 99),
        "p50": _pct(lats, 50),
    }


class WriterProcess:
    """Start / stop one writer process under a release's venv python."""

    def __init__(
        self,
        python,
        db_path,
        out_path,
        prefix="live-a",
        interval=0.02,
        sessions=1,
        source="telegram",
        read_hold=None,
        keep_hermes_optimize=False,
        env=None,
    ):
        self.python = python
        self.db_path = str(db_path)
        self.out_path = str(out_path)
        self.stop_file = self.out_path + ".stop"
        self.cmd = [
            python,
            str(HERE),
            "--db",
            self.db_path,
            "--out",
            self.out_path,
            "--interval",
            str(interval),
            "--prefix",
            prefix,
            "--sessions",
            str(sessions),
            "--source",
            source,
            "--stop-file",
            self.stop_file,
        ]
        if read_hold:
            self.cmd += ["--read-hold", str(read_hold)]
        if keep_hermes_optimize:
            self.cmd.append("--keep-hermes-optimize")
        self.extra_env = dict(env or {})
        self.proc = None
        self._summary = None

    def start(self, timeout=60):
        for path in (self.out_path, self.stop_file):
            if os.path.exists(path):
                os.unlink(path)
        env = dict(os.environ)
        env["HERMES_HOME"] = os.path.dirname(os.path.abspath(self.db_path))
        env.pop("PYTHONPATH", None)
        env.update(self.extra_env)
        self._stderr = open(self.out_path + ".stderr", "w")
        self.proc = subprocess.Popen(
            self.cmd, env=env, cwd=env["HERMES_HOME"], stdout=self._stderr, stderr=subprocess.STDOUT
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any("ready" in line for line in self._lines()):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("writer did not become ready: %s" % self._tail())

    def _lines(self):
        try:
            with open(self.out_path) as fh:
                return [json.loads(line) for line in fh if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def _tail(self):
        try:
            with open(self.out_path + ".stderr") as fh:
                return fh.read()[-3000:]
        except OSError:
            return "(no stderr)"

    def records(self):
        return [r for r in self._lines() if "k" in r]

    def stop(self, timeout=60):
        """Ask the writer to finish; return its summary (raises if it died)."""
        if self._summary is not None:
            return self._summary
        with open(self.stop_file, "w"):
            pass
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("writer did not stop within %ss" % timeout) from None
        finally:
            self._stderr.close()
        summaries = [r["summary"] for r in self._lines() if "summary" in r]
        if rc != 0 or not summaries:
            raise RuntimeError("writer exited %s without a summary: %s" % (rc, self._tail()))
        self._summary = summaries[-1]
        return self._summary

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--prefix", default="live-a")
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--source", default="telegram")
    parser.add_argument("--read-hold", type=float, default=None)
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--stop-file", default=None)
    parser.add_argument("--keep-hermes-optimize", action="store_true")
    return run_process(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
