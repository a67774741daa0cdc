# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The file's own catalogue decides what may be deleted, not its ``schema_version``.

Hermes adds tables, foreign keys and triggers without moving ``schema_version`` (the gateway
runtime ledger of upstream main stamps 31, as 0.22.2 does). So at preflight every foreign key
to ``sessions`` or ``messages`` and every trigger on a DELETE or UPDATE the engine runs is
matched against ``KNOWN``, one row per object with the rule that handles it. An object not in
the table makes the profile refuse what it could affect, naming it; nothing is half done.

Standard library only, Python 3.8+, no Ansible imports.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from ..sqlite.db import quoted

if TYPE_CHECKING:
    from .schema import SessionTables

# The rules (docs/architecture.md, "The catalogue decides").
DELETED_FIRST = "deleted before their session (children first, messages before the session)"
CASCADE = "rows go with their session (ON DELETE CASCADE), archived with it in rollback-journal mode"
FTS_INDEX = "keeps Hermes's full-text index in step with the messages deleted"
DISPLAY_INDEX = "keeps Hermes's display bookkeeping in step with the messages deleted"
RUNTIME_LEDGER = (
    "gateway runtime ledger: a session with ledger rows that are not terminal stays (Hermes is working on it); "
    "the terminal rows of a session to delete are retired first, as Hermes's own delete_session does"
)

FK = "foreign key"
TRIGGER = "trigger"
# The writes of a maintenance run, per table (a cascade deletes too): a trigger on any other
# event cannot fire.
_DELETE = ("DELETE",)
WRITES = dict(
    {"sessions": ("DELETE", "UPDATE"), "messages": _DELETE, "system_prompts": _DELETE},
    **{t: _DELETE for t in ("session_model_usage", "telegram_dm_topic_bindings")},
    **{t: _DELETE for t in ("session_admissions", "worker_executions", "worker_receipts", "gateway_routing")},
    state_meta=("INSERT", "UPDATE", "DELETE"),  # the deletion fence writes its tombstones and marker there
)
REFERENCED = ("sessions", "messages")


class Known:
    """One object of the catalogue the engine knows. For a foreign key ``name`` is
    ``<column> -> <table>``; for a trigger, its name."""

    def __init__(self, kind: str, table: str, name: str, rule: str, releases: str) -> None:
        self.kind, self.table, self.name, self.rule, self.releases = kind, table, name, rule, releases


_ALL = "all releases"
LEDGER_GUARD = "sessions_runtime_ledger_delete_guard"
_FTS_TRIGGERS = ("messages_fts_delete", "messages_fts_trigram_delete")

# fmt: off
KNOWN = (
    Known(FK, "sessions", "parent_session_id -> sessions", DELETED_FIRST, _ALL),
    Known(FK, "messages", "session_id -> sessions", DELETED_FIRST, _ALL),
    Known(FK, "session_model_usage", "session_id -> sessions", CASCADE, "0.19+"),
    Known(FK, "telegram_dm_topic_bindings", "session_id -> sessions", CASCADE, "upstream schema 30"),
    Known(FK, "session_admissions", "target_session_id -> sessions", RUNTIME_LEDGER, "upstream main (PR #106742)"),
    Known(FK, "worker_executions", "session_id -> sessions", RUNTIME_LEDGER, "upstream main (PR #106742)"),
) + tuple(
    Known(TRIGGER, "messages", name, FTS_INDEX, _ALL if "trigram" not in name else "0.13+") for name in _FTS_TRIGGERS
) + (
    Known(TRIGGER, "messages", "messages_display_identity_delete", DISPLAY_INDEX, "0.21.3+"),
    Known(TRIGGER, "sessions", LEDGER_GUARD, RUNTIME_LEDGER, "upstream main (PR #106742)"),
)
# fmt: on
_BY_KEY = {(k.kind, k.table, k.name): k for k in KNOWN}

# The whole catalogue: every table and view of the file, and every state_meta key family that
# names sessions, each with its rule. Anything else makes the store not fully known, and the
# engine then deletes nothing there by itself (docs/compatibility.md has a row per object).
TABLE = "table"
VIEW = "view"
KEY_FAMILY = "state_meta key family"
SHAPE = "shape"  # a store whose objects are all known but do not fit together as any Hermes writes them
NO_FENCE = (
    "the gateway runtime ledger without a state_meta table (upstream's deletion fence, its retired marker "
    "and tombstones, has nowhere to go)"
)

SUBJECT = "what the prune deletes (sessions and their messages, children first)"
LEFT_AS_HERMES = "holds no row Hermes's own delete touches: left as Hermes's delete leaves it"
FTS_TABLE = "Hermes's full-text index (and its shadow tables), kept in step by its triggers"
LEASE = "a live lease keeps its session (read at the plan and again in each transaction)"
ROUTING = (
    "a session an entry names is kept where there is no runtime ledger; with the ledger, the deletion "
    "fence removes the entries naming the deleted session, as upstream's retire_routes does"
)
FENCE = "written and removed by the deletion fence in the deleting transaction (upstream retire_sessions)"
GENERATIONS = (
    "a (source, session_key) counter: upstream's explicit delete bumps it, its sweep and a prune leave it alone"
)
SCHEDULE = (
    "the %s schedule of a session: an active one (or one that cannot be read) keeps its session; "
    "otherwise left as Hermes's prune leaves it"
)
LEDGER_EPOCH = "the gateway runtime's owner epoch: no session rows"
SQLITE_INTERNAL = "SQLite's own bookkeeping"
LITESTREAM = "Litestream's replication bookkeeping: no session rows (Litestream owns the checkpoints: host.hazards)"


class KnownName:
    """A table, view or key family the engine knows: ``releases`` says where it was verified."""

    def __init__(self, kind: str, name: str, rule: str, releases: str) -> None:
        self.kind, self.name, self.rule, self.releases = kind, name, rule, releases


_LEDGER = "upstream main (hermes_state_runtime.py)"
# fmt: off
KNOWN_NAMES = (
    KnownName(TABLE, "sessions", SUBJECT, _ALL),
    KnownName(TABLE, "messages", SUBJECT, _ALL),
    KnownName(TABLE, "schema_version", LEFT_AS_HERMES, _ALL),
    KnownName(TABLE, "state_meta", "key/value store: each key family below has its rule", _ALL),
    KnownName(TABLE, "messages_fts", FTS_TABLE, _ALL),
    KnownName(TABLE, "messages_fts_trigram", FTS_TABLE, "0.13+"),
    KnownName(TABLE, "telegram_dm_topic_bindings", CASCADE, "0.13+"),
    KnownName(TABLE, "telegram_dm_topic_mode", LEFT_AS_HERMES + " (keyed by chat)", "0.13+"),
    KnownName(TABLE, "compression_locks", LEASE, "0.16+"),
    KnownName(TABLE, "session_model_usage", CASCADE, "0.19+"),
    KnownName(TABLE, "gateway_routing", ROUTING, "0.19+"),
    KnownName(TABLE, "async_delegations", LEFT_AS_HERMES, "0.19+"),
    KnownName(TABLE, "system_prompts", "a prompt no kept session references is collected, as Hermes does", "0.20+"),
    KnownName(TABLE, "session_turn_leases", LEASE, "0.20.1+"),
    KnownName(TABLE, "gateway_hygiene_state", LEFT_AS_HERMES + " (keyed by session_key)", "0.20.1+"),
    KnownName(TABLE, "gateway_heartbeats", LEFT_AS_HERMES + " (gateway processes)", "0.21+"),
    KnownName(TABLE, "conversation_generations", GENERATIONS, "0.21.3+"),
    KnownName(TABLE, "delivery_obligations", LEFT_AS_HERMES + " (keyed by session_key, prunes itself)",
              "upstream main (gateway/delivery_ledger.py)"),
    KnownName(TABLE, "runtime_epoch", LEDGER_EPOCH, _LEDGER),
    KnownName(TABLE, "session_admissions", RUNTIME_LEDGER, _LEDGER),
    KnownName(TABLE, "worker_executions", RUNTIME_LEDGER, _LEDGER),
    KnownName(TABLE, "worker_receipts", RUNTIME_LEDGER, _LEDGER),
    KnownName(TABLE, "sqlite_sequence", SQLITE_INTERNAL, _ALL),
    KnownName(TABLE, "_litestream_seq", LITESTREAM, "Litestream beside any release"),
    KnownName(TABLE, "_litestream_lock", LITESTREAM, "Litestream beside any release"),
    KnownName(VIEW, "messages_fts_src", FTS_TABLE, "0.21.5+"),
    KnownName(VIEW, "messages_fts_trigram_src", FTS_TABLE, "0.20+"),
)
# The state_meta key families that name sessions (by id, or in their JSON), with the prefix
# that marks them. Keys of no family that name no session are Hermes's own markers.
_FENCE_AT = "upstream main (hermes_state_mutation_retirement.py at 4f64356)"
KEY_FAMILIES = (
    KnownName(KEY_FAMILY, "goal:", LEFT_AS_HERMES + " (the /goal of a session)", "0.19+"),
    KnownName(KEY_FAMILY, "heartbeat:", SCHEDULE % "/heartbeat", "0.22.2 (hermes_cli/heartbeat.py)"),
    KnownName(KEY_FAMILY, "loop:", SCHEDULE % "/loop", "0.22.2 (hermes_cli/loops.py)"),
    KnownName(KEY_FAMILY, "gateway.retired_session.v1.", FENCE + ": the retired marker, written", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.terminal_admission.v1.", FENCE + ": an admission's tombstone, written", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.terminal_identity.v1.", FENCE + ": its retry identity, written", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.terminal_worker.v1.", FENCE + ": a worker's tombstone, written", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.admission.result.v1.", FENCE + ": the transcript copies are stripped", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.mutation.v1.", FENCE + ": the content fields are nulled", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.api.settings.v1.", FENCE + ": deleted", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.api.binding.v1.", FENCE + ": deleted", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.api.conversation.v1.", FENCE + ": deleted when it resolves to the id", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.local_policy.v1:", FENCE + ": deleted with its route; a conversation of "
              "several segments goes only whole, in one transaction, as Hermes sweeps it", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.media.retired.v1.", "retired media: written by the deletion fence for each "
              "media reference of a deleted session's admissions, as upstream's retire_media does", _FENCE_AT),
    KnownName(KEY_FAMILY, "gateway.hosted.output_cleanup.v1:", "a pending output cleanup keeps its session",
              "upstream main (hermes_state_mutation_retirement.py at 7014f55)"),
)
# fmt: on
_NAMES = {(k.kind, k.name): k for k in KNOWN_NAMES}
_FTS_SHADOW = ("_data", "_idx", "_content", "_docsize", "_config")
_FTS5 = re.compile(r"CREATE\s+VIRTUAL\s+TABLE\s+.*\bUSING\s+fts5\b", re.IGNORECASE | re.DOTALL)

_TRIGGER_HEAD = re.compile(
    r"CREATE\s+(?:TEMP\w*\s+)?TRIGGER\s+(?:IF\s+NOT\s+EXISTS\s+)?\S+\s+(?:BEFORE\s+|AFTER\s+|INSTEAD\s+OF\s+)?"
    r"(DELETE|INSERT|UPDATE)\b",
    re.IGNORECASE,
)
_RAISE = re.compile(r"RAISE\s*\(\s*(ABORT|FAIL|ROLLBACK)\s*,\s*'((?:[^']|'')*)'", re.IGNORECASE)


class CatalogueObject(TypedDict, total=False):
    """A foreign key, trigger, table, view, key family or shape of the file's catalogue
    (``kind``, ``table`` and ``name`` always; the others as ``read_catalogue`` says)."""

    kind: str
    table: str
    name: str
    rule: str
    affects: str
    on_delete: str
    column: str
    parent: str
    event: str
    sql: str
    rows: int


class Catalogue(TypedDict):
    """``read_catalogue``'s answer."""

    known: list[CatalogueObject]
    unknown: list[CatalogueObject]
    raises: dict[str, str]
    ledger: bool


def read_catalogue(conn: sqlite3.Connection) -> Catalogue:
    """What the file's catalogue says about the tables a run writes.

    Returns ``{"known": [...], "unknown": [...], "raises": {message: trigger}, "ledger": bool}``:
    each object a dict ``kind``, ``table``, ``name`` and, for known ones, ``rule``; ``unknown``
    objects also say ``affects`` (``deletes`` or ``zombie closes and deletes``) and, for a
    foreign key, ``column`` and ``parent`` (to find the sessions it references).
    """
    known: list[CatalogueObject] = []
    unknown: list[CatalogueObject] = []
    raises: dict[str, str] = {}
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        for row in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (table,)):
            parent, column = row[2], row[3]
            if parent not in REFERENCED:
                continue
            name = "%s -> %s" % (column, parent)
            entry: CatalogueObject = {"kind": FK, "table": table, "name": name, "on_delete": row[6]}
            hit = _BY_KEY.get((FK, table, name))
            if hit:
                known.append({**entry, "rule": hit.rule})
            else:
                unknown.append({**entry, "column": column, "parent": parent, "affects": "deletes"})
    for name, table, sql in conn.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger'"):
        head = _TRIGGER_HEAD.match(sql or "")
        event = head.group(1).upper() if head else "an event this engine cannot read"
        for _kind, message in _RAISE.findall(sql or ""):
            raises[message.replace("''", "'")] = name
        if table not in WRITES or (head and event not in WRITES[table]):
            continue
        trigger: CatalogueObject = {"kind": TRIGGER, "table": table, "name": name, "event": event}
        hit = _BY_KEY.get((TRIGGER, table, name))
        if hit:
            known.append({**trigger, "rule": hit.rule})
        else:
            affects = "zombie closes and deletes" if table == "sessions" and event != "DELETE" else "deletes"
            unknown.append({**trigger, "affects": affects, "sql": sql or ""})
    ledger = any(k["rule"] == RUNTIME_LEDGER for k in known)
    unknown += _unknown_names(conn, unknown)
    if ledger and "state_meta" not in tables:
        unknown.append({"kind": SHAPE, "table": "state_meta", "name": NO_FENCE, "affects": "deletes"})
    return {"known": known, "unknown": unknown, "raises": raises, "ledger": ledger}


def _known_table(name: str, fts_indexes: set[str]) -> bool:
    """``fts_indexes``: the file's FTS5 tables named messages_fts* (Hermes's indexes, the CJK
    extension's messages_fts_cjk among them; a missing tokenizer is refused by its own check)."""
    if (TABLE, name) in _NAMES or name.startswith("sqlite_stat") or name in fts_indexes:
        return True
    return any(name == base + shadow for base in fts_indexes for shadow in _FTS_SHADOW)


def _unknown_names(conn: sqlite3.Connection, unknown: list[CatalogueObject]) -> list[CatalogueObject]:
    """Tables, views and state_meta key families the engine does not know.

    A table an unknown foreign key or trigger already names is not listed again (what refuses
    there is that object's rule)."""
    found: list[CatalogueObject] = []
    named = " ".join("%s %s" % (o["table"], o.get("sql", "")) for o in unknown)
    objects = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
    fts_indexes = {
        name for _kind, name, sql in objects if name.startswith("messages_fts") and _FTS5.match(sql or "")
    } | {"messages_fts", "messages_fts_trigram"}
    for kind, name, _sql in objects:
        if kind == TABLE and _known_table(name, fts_indexes) or kind == VIEW and (VIEW, name) in _NAMES:
            continue
        if re.search(r"\b%s\b" % re.escape(name), named):
            continue
        found.append({"kind": kind, "table": name, "name": name, "affects": "deletes"})
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'state_meta'").fetchone():
        found += _unknown_families(conn)
    return found


_FAMILY = re.compile(r"^(.*[.:])([^.:]+)$")


def _unknown_families(conn: sqlite3.Connection) -> list[CatalogueObject]:
    """state_meta keys of no known family that name a session: by the id they end with, by their
    value (the id itself, as a string or a JSON string), or anywhere in their JSON value under a key
    ending in ``session_id`` or ``session_ids`` (``session_id``, ``target_session_id``, nested in
    objects and lists). Listed per family (the key up to its last ``.`` or ``:``)."""
    ids = {r[0] for r in conn.execute("SELECT id FROM sessions")}
    families: dict[str, int] = {}
    for key, value in conn.execute("SELECT key, value FROM state_meta"):
        key = str(key)
        if any(key.startswith(f.name) for f in KEY_FAMILIES):
            continue
        head = _FAMILY.match(key)
        prefix, tail = (head.group(1), head.group(2)) if head else (key, None)
        if tail in ids or value in ids or _names_session(value, ids):
            families.setdefault(prefix, 0)
            families[prefix] += 1
    return [
        {"kind": KEY_FAMILY, "table": "state_meta", "name": prefix + "*", "rows": rows, "affects": "deletes"}
        for prefix, rows in sorted(families.items())
    ]


def _names_session(raw: Any, ids: set[Any]) -> bool:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return False
    return value in ids if isinstance(value, str) else any(_session_values(value, ids))


def _session_values(value: Any, ids: set[Any], named: bool = False) -> Iterator[str]:
    """The session ids a JSON value holds where a key names a session (``named``: under such a key)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _session_values(item, ids, str(key).endswith(("session_id", "session_ids")))
    elif isinstance(value, list):
        for item in value:
            yield from _session_values(item, ids, named)
    elif named and isinstance(value, str) and value in ids:
        yield value


def fully_known(catalogue: Catalogue) -> bool:
    """Every object of the file is one the engine knows: it may delete there by itself."""
    return not catalogue["unknown"]


def describe(obj: CatalogueObject) -> str:
    """``trigger sessions_audit on sessions DELETE`` / ``foreign key audit.session_id -> sessions``."""
    if obj["kind"] == TRIGGER:
        return "trigger %s on %s %s" % (obj["name"], obj["table"], obj["event"])
    if obj["kind"] in (TABLE, VIEW):
        return "%s %s" % (obj["kind"], obj["name"])
    if obj["kind"] == SHAPE:
        return obj["name"]
    if obj["kind"] == KEY_FAMILY:
        return "state_meta key family %s (%d rows naming sessions)" % (obj["name"], obj["rows"])
    return "foreign key %s.%s" % (obj["table"], obj["name"])


def refusal(unknown: Sequence[CatalogueObject]) -> str:
    """The error text for objects the engine does not know: what was refused and what to do."""
    if any(o["affects"] != "deletes" for o in unknown):
        held = "no zombie was closed and no session deleted"
    elif refuses_deletes(unknown):
        held = "no session was deleted (zombies were still closed)"
    else:
        held = "the sessions their rows reference were kept"
    return (
        "this state.db has %s, which this collection does not know (a newer Hermes?): %s. Upgrade "
        "hermes_agent.ops to a release that knows it" % ("; ".join(describe(o) for o in unknown), held)
    )


def refuses_deletes(unknown: Iterable[CatalogueObject]) -> bool:
    """An unknown trigger on a delete (or a sessions UPDATE) could touch any session; an unknown
    table, view or key family may hold rows about any session that no foreign key points out."""
    return any(o["kind"] != FK for o in unknown)


def refuses_zombie_closes(unknown: Iterable[CatalogueObject]) -> bool:
    return any(o["affects"] != "deletes" for o in unknown)


def summary(catalogue: Catalogue) -> dict[str, Any]:
    """What a result shows of the catalogue."""
    return {
        "unknown": [describe(o) for o in catalogue["unknown"]],
        "known": sorted(describe(o) for o in catalogue["known"]),
        "runtime_ledger": catalogue["ledger"],
    }


def referenced_sessions(conn: sqlite3.Connection, unknown: Iterable[CatalogueObject]) -> set[Any]:
    """Sessions an unknown foreign key's rows point at (directly, or through their messages)."""
    found: set[Any] = set()
    for obj in unknown:
        if obj["kind"] != FK:
            continue
        table, column = quoted(obj["table"]), quoted(obj["column"])
        if obj["parent"] == "sessions":
            sql = "SELECT DISTINCT %s FROM %s" % (column, table)
        else:
            sql = "SELECT DISTINCT m.session_id FROM messages m JOIN %s t ON t.%s = m.id" % (table, column)
        found.update(r[0] for r in conn.execute(sql))
    return found


# The runtime ledger (upstream hermes_state_runtime.py): rows of these statuses are work in flight.
LIVE_ADMISSION = ("queued", "started", "unknown")
LIVE_WORKER = ("registered", "running", "unknown")


def ledgered_sessions(conn: sqlite3.Connection, schema: SessionTables) -> set[Any]:
    """Sessions the gateway runtime is working on: a live admission (as its target or in its
    lineage) or a live worker execution. Hermes keeps them; so do we."""
    found: set[Any] = set()
    if "session_admissions" in schema["tables"]:
        marks = ",".join("?" * len(LIVE_ADMISSION))
        found.update(
            r[0]
            for r in conn.execute(
                "SELECT target_session_id FROM session_admissions WHERE status IN (%s) UNION "
                "SELECT j.value FROM session_admissions a, json_each(a.lineage_json) j WHERE a.status IN (%s)"
                % (marks, marks),
                LIVE_ADMISSION + LIVE_ADMISSION,
            )
        )
    if "worker_executions" in schema["tables"]:
        sql = "SELECT session_id FROM worker_executions WHERE status IN (%s)" % ",".join("?" * len(LIVE_WORKER))
        found.update(r[0] for r in conn.execute(sql, LIVE_WORKER))
    return found


def retire_ledger(conn: sqlite3.Connection, schema: SessionTables, sid: str) -> None:
    """Remove a session's terminal ledger rows before its delete, as Hermes's delete_session does.

    Rows in flight are left: Hermes's guard trigger (or the RESTRICT foreign key) then refuses
    the delete, and the prune skips the session.
    """
    if "worker_executions" in schema["tables"]:
        if "worker_receipts" in schema["tables"]:
            conn.execute(
                "DELETE FROM worker_receipts WHERE execution_id IN "
                "(SELECT execution_id FROM worker_executions WHERE session_id = ? AND status = 'terminal')",
                (sid,),
            )
        conn.execute("DELETE FROM worker_executions WHERE session_id = ? AND status = 'terminal'", (sid,))
    if "session_admissions" in schema["tables"]:
        conn.execute("DELETE FROM session_admissions WHERE target_session_id = ? AND status = 'terminal'", (sid,))
