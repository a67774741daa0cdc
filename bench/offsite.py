"""Time and bytes of off-site pushes of a large backup: the first, and a second after a
maintenance-like change (deduplication at work).

    sudo .venv/bin/python bench/offsite.py [--mb 700] [--workdir /var/tmp/hermes-offsite-bench]

Builds a state.db-like SQLite file of about --mb MB (sessions and messages of word text, as
chat is), backs it up with SQLite's backup API under the engine's backup name, and pushes it
with the engine's own push (offsite.push) to a fresh local restic repository. Then
deletes the oldest 3% of the messages and adds 1% new ones (a prune without VACUUM: the freed
pages are reused), backs up again and pushes the second backup. Prints one JSON document:
seconds, bytes read and bytes the repository grew by, per push. Runs as root (the push
refuses anyone else's run), with the files owned by nobody as the Hermes user's would be.
"""

import argparse
import json
import os
import random
import shutil
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import collections_root  # noqa: E402

collections_root()
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build" / "collections"))

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes import offsite  # noqa: E402
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import whole_file as backup  # noqa: E402

OWNER = 65534
MB = 1024 * 1024
WORDS = (
    "the a to of and in is it you that for on with this be are as was have not but at can what "
    "file session message tool call result error hermes agent model token context user assistant "
    "python sqlite backup restore prune vacuum gateway telegram discord cron job script output "
    "please thanks sure here is the code let me check run test again done works fails because"
).split()


def text_pool(rng, size):
    out = []
    total = 0
    while total < size:
        word = rng.choice(WORDS)
        out.append(word)
        total += len(word) + 1
    return " ".join(out)


def build(db, target_mb, rng):
    pool = text_pool(rng, 8 * MB)
    conn = sqlite3.connect(db)
    conn.executescript(
        "PRAGMA journal_mode=WAL; PRAGMA auto_vacuum=INCREMENTAL;"
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, started_at REAL);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT, role TEXT, content TEXT, timestamp REAL);"
        "CREATE INDEX idx_messages_session ON messages(session_id, timestamp);"
    )
    session = 0
    msg = 0
    while os.path.getsize(db) + (os.path.getsize(db + "-wal") if os.path.exists(db + "-wal") else 0) < target_mb * MB:
        rows = []
        for _round in range(50):
            session += 1
            sid = "s%08d" % session
            conn.execute("INSERT INTO sessions VALUES (?, ?)", (sid, session * 60.0))
            for _session in range(100):
                msg += 1
                start = rng.randrange(len(pool) - 4000)
                length = rng.choice((200, 600, 1500, 3500))
                rows.append((sid, rng.choice(("user", "assistant", "tool")), pool[start : start + length], msg))
        conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)", rows)
        conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return session, msg


def change(db, rng, sessions):
    """A prune of the oldest 3% of sessions and 1% new ones, without VACUUM."""
    pool = text_pool(rng, MB)
    conn = sqlite3.connect(db)
    cut = "s%08d" % int(sessions * 0.03)
    conn.execute("DELETE FROM messages WHERE session_id <= ?", (cut,))
    conn.execute("DELETE FROM sessions WHERE id <= ?", (cut,))
    rows = []
    for n in range(int(sessions * 0.01)):
        sid = "n%08d" % n
        conn.execute("INSERT INTO sessions VALUES (?, ?)", (sid, 1e9 + n))
        for _session in range(100):
            start = rng.randrange(len(pool) - 4000)
            rows.append((sid, "assistant", pool[start : start + rng.choice((200, 600, 1500, 3500))], 1e9 + n))
    conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)", rows)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def take_backup(db, backups, when):
    path = backups / backup.backup_name("default", when)
    src = sqlite3.connect(db)
    dst = sqlite3.connect(path)
    src.backup(dst)
    dst.close()
    src.close()
    os.chown(path, OWNER, OWNER)
    os.chmod(path, 0o600)
    return path


def du(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=700)
    parser.add_argument("--workdir", default="/var/tmp/hermes-offsite-bench")
    args = parser.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    backups = work / "home" / "backups"
    backups.mkdir(parents=True)
    os.chown(backups, OWNER, OWNER)
    password = work / "password"
    password.write_text("bench\n")
    password.chmod(0o600)
    repo, cache = work / "repo", work / "cache"
    tool = offsite.Restic(str(repo), str(password), cache_dir=str(cache))
    offsite.init_repository(tool)
    rng = random.Random(40)
    db = str(work / "state.db")
    t0 = time.time()
    sessions, messages = build(db, args.mb, rng)
    out = {"restic": tool.run(["version"]).strip(), "build_seconds": round(time.time() - t0, 1)}
    out.update(db_bytes=os.path.getsize(db), sessions=sessions, messages=messages, pushes=[])
    now = time.time()
    for step, when in (("first", now - 86400), ("second", now)):
        if step == "second":
            change(db, rng, sessions)
        path = take_backup(db, backups, when)
        before = du(repo)
        result = offsite.push(str(repo), str(password), [str(backups)], OWNER, "hermes", "bench", cache_dir=str(cache))
        assert result["status"] == "ok", result
        [pushed] = result["pushed"]
        out["pushes"].append(
            {
                "push": step,
                "backup_bytes": path.stat().st_size,
                "backup_seconds": pushed["seconds"],
                "push_seconds_total": result["seconds"],
                "restic_data_added": pushed["bytes_added"],
                "repository_growth_bytes": du(repo) - before,
                "repository_bytes": result["repository_bytes"],
            }
        )
        print(json.dumps(out["pushes"][-1]), file=sys.stderr)
    print(json.dumps(out, indent=2))
    if os.environ.get("HERMES_BENCH_KEEP") != "1":
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
