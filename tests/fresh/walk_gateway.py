"""The Hermes server of the operator's walk (tests/fresh/walk.sh): a real 0.22.2 gateway serving chats.

Run as the Hermes user, in the walk's container, before the walk and through it:

    python3 walk_gateway.py HERMES_HOME STATE_DIR

1. HERMES_HOME/state.db made by the release's own SessionDB (so in the journal mode that release
   chooses on this SQLite: rollback-journal on Debian 12's 3.40.1), with sessions of the last
   90 days (``make_big_rollback_home``), a CLI session left open three days ago (a zombie) and
   one Telegram session of 2026-11-12, the day getting_started's undo command restores.
2. The gateway (tests/lib/hermes_gateway.py: its config, the stub model) and a client sending a
   chat request every second, each one a new session.
3. STATE_DIR/ready once it serves; when STATE_DIR/stop appears: the client stops, the gateway is
   stopped, and STATE_DIR/result.json says how many requests there were and which failed.

The release's venv is found as the tests find it (``HERMES_VENV_DIR``).
"""

import calendar
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from hermes_gateway import Client, Gateway  # noqa: E402
from hermes_rollback import journal_mode, make_big_rollback_home  # noqa: E402

# The session getting_started's undo brings back: active on 2026-11-12 (UTC), as its command says.
RESTORE_DAY_SESSION = "walk-telegram-2026-11-12"
RESTORE_DAY = calendar.timegm((2026, 11, 12, 10, 0, 0))
ZOMBIE = "walk-cli-left-open"
CHAT_INTERVAL = 1.0


def seed(home):
    db = make_big_rollback_home(home, 60, 8, seed=51)
    conn = sqlite3.connect(str(db))
    idle = time.time() - 3 * 86400  # a CLI session left open three days ago: a zombie to close
    with conn:
        conn.execute(
            "INSERT INTO sessions (id, source, started_at, message_count) VALUES (?, 'cli', ?, 2)", (ZOMBIE, idle)
        )
        conn.executemany(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
            [(ZOMBIE, "user", "walk: left open", idle), (ZOMBIE, "assistant", "ack", idle + 1)],
        )
        conn.execute(
            "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, message_count, title) "
            "VALUES (?, 'telegram', ?, ?, 'user_exit', 4, 'walk: the day to restore')",
            (RESTORE_DAY_SESSION, RESTORE_DAY, RESTORE_DAY + 3600),
        )
        conn.executemany(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
            [(RESTORE_DAY_SESSION, ("user", "assistant")[i % 2], "walk message %d" % i, RESTORE_DAY + 60 * i)
             for i in range(4)],
        )  # fmt: skip
    conn.close()
    return db


def main(home, state_dir):
    home, state_dir = Path(home), Path(state_dir)
    db = seed(home)
    gateway = Gateway(home).start()  # its warm-up asks again on 0.22.2's start-up import race
    client = Client(gateway.port, interval=CHAT_INTERVAL, prefix="walk").start()
    (state_dir / "ready").write_text(
        json.dumps({"port": gateway.port, "pid": gateway.proc.pid, "journal_mode": journal_mode(str(db))})
    )
    try:
        while not (state_dir / "stop").exists():
            time.sleep(0.5)
    finally:
        client.stop()
        code = gateway.stop()
        gateway.close()
        attempts = client.snapshot()
        failed = [a for a in attempts if not a["ok"]]
        result = {
            "requests": len(attempts),
            "failed": len(failed),
            "failures": [{"status": a["status"], "error": a["error"]} for a in failed[:5]],
            "worst_ms": round(1000 * max((a["latency"] for a in attempts), default=0)),
            "gateway_exit": code,
        }
        (state_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: walk_gateway.py HERMES_HOME STATE_DIR")
    os.umask(0o077)
    main(*sys.argv[1:])
