# Copyright: Contributors to the hermes_agent.ops collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Create a demo Hermes Agent home with generated sessions, using plain sqlite3.

    hermes_demo_home.py HOME [--profiles default,work,research] [--sessions 60]
                        [--seed 7] [--force]

The schema is the one Hermes Agent 0.19.0 creates (schema_version 22, inline FTS5
indexes ``messages_fts`` and, where SQLite has the trigram tokenizer,
``messages_fts_trigram``, kept in sync by triggers). Each profile gets a mix of:
old ended sessions (prunable), recent ones, idle open CLI sessions (zombies), open
messaging sessions (never closed), a pinned-by-nobody delegate child, and
transcript files under ``sessions/``. Profile ``default`` is ``HOME/state.db``;
others are ``HOME/profiles/<name>/state.db``.

Used by ``playbooks/demo.yml`` and the molecule scenario. Needs nothing but python3.
Prints one JSON line describing what it made. Exit 0 also when the home already
exists and ``--force`` is not given (it is then left untouched, "changed": false).
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import random
import sqlite3
import sys
import time

SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, session_key TEXT, chat_id TEXT,
    chat_type TEXT, thread_id TEXT, display_name TEXT, origin_json TEXT,
    expiry_finalized INTEGER DEFAULT 0, model TEXT, model_config TEXT, system_prompt TEXT,
    parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL, end_reason TEXT,
    message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0, cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0, cwd TEXT, git_branch TEXT, git_repo_root TEXT,
    billing_provider TEXT, billing_base_url TEXT, billing_mode TEXT, estimated_cost_usd REAL,
    actual_cost_usd REAL, cost_status TEXT, cost_source TEXT, pricing_version TEXT, title TEXT,
    api_call_count INTEGER DEFAULT 0, handoff_state TEXT, handoff_platform TEXT,
    handoff_error TEXT, compression_failure_cooldown_until REAL, compression_failure_error TEXT,
    compression_fallback_streak INTEGER NOT NULL DEFAULT 0, profile_name TEXT,
    rewind_count INTEGER NOT NULL DEFAULT 0, archived INTEGER NOT NULL DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
    effect_disposition TEXT, timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT,
    reasoning TEXT, reasoning_content TEXT, reasoning_details TEXT, codex_reasoning_items TEXT,
    codex_message_items TEXT, platform_message_id TEXT, observed INTEGER DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1, compacted INTEGER NOT NULL DEFAULT 0, api_content TEXT
);
CREATE TABLE session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '', billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '', task TEXT NOT NULL DEFAULT '',
    api_call_count INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0, cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0, reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0, actual_cost_usd REAL NOT NULL DEFAULT 0,
    cost_status TEXT, cost_source TEXT, first_seen REAL, last_seen REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)
);
CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE gateway_routing (
    scope TEXT NOT NULL DEFAULT '', session_key TEXT NOT NULL, entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL, PRIMARY KEY (scope, session_key)
);
CREATE TABLE compression_locks (
    session_id TEXT PRIMARY KEY, holder TEXT NOT NULL, acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX idx_sessions_source ON sessions(source);
CREATE INDEX idx_sessions_source_id ON sessions(source, id);
CREATE INDEX idx_sessions_parent ON sessions(parent_session_id);
CREATE INDEX idx_sessions_started ON sessions(started_at DESC);
CREATE INDEX idx_messages_session ON messages(session_id, timestamp);
CREATE INDEX idx_compression_locks_expires ON compression_locks(expires_at);
CREATE INDEX idx_session_model_usage_session ON session_model_usage(session_id);
CREATE INDEX idx_messages_session_active ON messages(session_id, active, timestamp);
CREATE INDEX idx_sessions_session_key ON sessions(session_key, started_at DESC);
CREATE UNIQUE INDEX idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL;
"""

FTS_TEMPLATE = """
CREATE VIRTUAL TABLE {t} USING fts5(content{tok});
CREATE TRIGGER {t}_insert AFTER INSERT ON messages BEGIN
    INSERT INTO {t}(rowid, content) VALUES (new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, ''));
END;
CREATE TRIGGER {t}_delete AFTER DELETE ON messages BEGIN
    DELETE FROM {t} WHERE rowid = old.id;
END;
CREATE TRIGGER {t}_update AFTER UPDATE ON messages BEGIN
    DELETE FROM {t} WHERE rowid = old.id;
    INSERT INTO {t}(rowid, content) VALUES (new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, ''));
END;
"""

WORDS = (
    "deploy rollback invoice kubernetes sqlite backup gateway telegram retry token "
    "schedule cron profile vacuum index migration report latency budget weather "
    "calendar meeting summary translate draft review patch release ticket alert"
).split()

DAY = 86400.0


def has_trigram():
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(c, tokenize='trigram')")
        return True
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for dummy in range(n)).capitalize() + "."


def make_profile(home, name, sessions, rng, now, trigram):
    os.makedirs(os.path.join(home, "sessions"), exist_ok=True)
    path = os.path.join(home, "state.db")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.executescript(SCHEMA)
    conn.executescript(FTS_TEMPLATE.format(t="messages_fts", tok=""))
    if trigram:
        conn.executescript(FTS_TEMPLATE.format(t="messages_fts_trigram", tok=", tokenize='trigram'"))
    conn.execute("INSERT INTO schema_version(version) VALUES (22)")

    counts = {"sessions": 0, "messages": 0, "open": 0}
    parents = []
    for i in range(sessions):
        kind = rng.random()
        sid = "{}_{}_{:04d}".format(time.strftime("%Y%m%d", time.gmtime(now)), name[:8], i)
        if kind < 0.45:  # old, ended: prune candidates
            start = now - rng.uniform(100, 400) * DAY
            source = rng.choice(["cli", "telegram", "discord", "cron"])
            open_ = False
        elif kind < 0.75:  # recent, ended
            start = now - rng.uniform(0.5, 60) * DAY
            source = rng.choice(["cli", "telegram", "api_server"])
            open_ = False
        elif kind < 0.88:  # idle open CLI / cron sessions: zombies
            start = now - rng.uniform(3, 200) * DAY
            source = rng.choice(["cli", "cron", "api_server"])
            open_ = True
        elif kind < 0.95:  # open messaging chats: never closed by maintenance
            start = now - rng.uniform(2, 300) * DAY
            source = rng.choice(["telegram", "discord", "slack"])
            open_ = True
        else:  # active right now
            start = now - rng.uniform(60, 3600)
            source = "cli"
            open_ = True
        nmsg = rng.randint(3, 24)
        t = start
        msgs = []
        for j in range(nmsg):
            t += rng.uniform(5, 600)
            role = "user" if j % 2 == 0 else "assistant"
            msgs.append((sid, role, sentence(rng, rng.randint(6, 40)), min(t, now - 1)))
        last = msgs[-1][3]
        ended = None if open_ else last + rng.uniform(1, 120)
        reason = None if open_ else rng.choice(["user_exit", "agent_close", "idle_timeout"])
        parent = None
        model_config = json.dumps({"temperature": 0.3})
        if parents and not open_ and rng.random() < 0.15:  # a delegate subagent child
            parent = rng.choice(parents)
            source = "subagent"
            model_config = json.dumps({"_delegate_from": parent})
        conn.execute(
            "INSERT INTO sessions(id, source, model, model_config, parent_session_id, started_at,"
            " ended_at, end_reason, message_count, title) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                sid,
                source,
                "demo-model",
                model_config,
                parent,
                start,
                ended,
                reason,
                nmsg,
                None if rng.random() < 0.5 else f"{name} {rng.choice(WORDS)} #{i}",
            ),
        )
        conn.executemany("INSERT INTO messages(session_id, role, content, timestamp) VALUES (?,?,?,?)", msgs)
        if not open_ and parent is None:
            parents.append(sid)
        counts["sessions"] += 1
        counts["messages"] += nmsg
        counts["open"] += 1 if open_ else 0
        if rng.random() < 0.5:
            with open(os.path.join(home, "sessions", sid + ".jsonl"), "w") as handle:
                for m in msgs:
                    handle.write(json.dumps({"role": m[1], "content": m[2], "timestamp": m[3]}) + "\n")
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.chmod(path + suffix, 0o600)
    counts["path"] = path
    counts["name"] = name
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("home")
    parser.add_argument("--profiles", default="default,work,research")
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--force", action="store_true", help="recreate an existing home")
    args = parser.parse_args(argv)

    home = os.path.abspath(os.path.expanduser(args.home))
    names = [n.strip() for n in args.profiles.split(",") if n.strip()]
    if os.path.exists(os.path.join(home, "state.db")) and not args.force:
        print(json.dumps({"changed": False, "home": home, "profiles": []}))
        return 0
    if args.force:
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    os.makedirs(home, exist_ok=True)
    os.chmod(home, 0o700)
    rng = random.Random(args.seed)
    now = time.time()
    trigram = has_trigram()
    made = []
    for name in names:
        phome = home if name == "default" else os.path.join(home, "profiles", name)
        os.makedirs(phome, exist_ok=True)
        made.append(make_profile(phome, name, args.sessions, rng, now, trigram))
    print(json.dumps({"changed": True, "home": home, "trigram": trigram, "profiles": made}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
