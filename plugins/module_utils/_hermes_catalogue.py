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

import re

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
    **{t: _DELETE for t in ("session_admissions", "worker_executions", "worker_receipts")},
)
REFERENCED = ("sessions", "messages")


class Known:
    """One object of the catalogue the engine knows. For a foreign key ``name`` is
    ``<column> -> <table>``; for a trigger, its name."""

    def __init__(self, kind, table, name, rule, releases):
        self.kind, self.table, self.name, self.rule, self.releases = kind, table, name, rule, releases


_ALL = "all releases"
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
    Known(TRIGGER, "sessions", "sessions_runtime_ledger_delete_guard", RUNTIME_LEDGER, "upstream main (PR #106742)"),
)
# fmt: on
_BY_KEY = {(k.kind, k.table, k.name): k for k in KNOWN}

_TRIGGER_HEAD = re.compile(
    r"CREATE\s+(?:TEMP\w*\s+)?TRIGGER\s+(?:IF\s+NOT\s+EXISTS\s+)?\S+\s+(?:BEFORE\s+|AFTER\s+|INSTEAD\s+OF\s+)?"
    r"(DELETE|INSERT|UPDATE)\b",
    re.IGNORECASE,
)
_RAISE = re.compile(r"RAISE\s*\(\s*(ABORT|FAIL|ROLLBACK)\s*,\s*'((?:[^']|'')*)'", re.IGNORECASE)


def read_catalogue(conn):
    """What the file's catalogue says about the tables a run writes.

    Returns ``{"known": [...], "unknown": [...], "raises": {message: trigger}, "ledger": bool}``:
    each object a dict ``kind``, ``table``, ``name`` and, for known ones, ``rule``; ``unknown``
    objects also say ``affects`` (``deletes`` or ``zombie closes and deletes``) and, for a
    foreign key, ``column`` and ``parent`` (to find the sessions it references).
    """
    known, unknown, raises = [], [], {}
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        for row in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (table,)):
            parent, column = row[2], row[3]
            if parent not in REFERENCED:
                continue
            name = "%s -> %s" % (column, parent)
            entry = {"kind": FK, "table": table, "name": name, "on_delete": row[6]}
            hit = _BY_KEY.get((FK, table, name))
            if hit:
                known.append(dict(entry, rule=hit.rule))
            else:
                unknown.append(dict(entry, column=column, parent=parent, affects="deletes"))
    for name, table, sql in conn.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger'"):
        head = _TRIGGER_HEAD.match(sql or "")
        event = head.group(1).upper() if head else "an event this engine cannot read"
        for _kind, message in _RAISE.findall(sql or ""):
            raises[message.replace("''", "'")] = name
        if table not in WRITES or (head and event not in WRITES[table]):
            continue
        entry = {"kind": TRIGGER, "table": table, "name": name, "event": event}
        hit = _BY_KEY.get((TRIGGER, table, name))
        if hit:
            known.append(dict(entry, rule=hit.rule))
        else:
            affects = "zombie closes and deletes" if table == "sessions" and event != "DELETE" else "deletes"
            unknown.append(dict(entry, affects=affects))
    ledger = any(k["rule"] == RUNTIME_LEDGER for k in known)
    return {"known": known, "unknown": unknown, "raises": raises, "ledger": ledger}


def describe(obj):
    """``trigger sessions_audit on sessions DELETE`` / ``foreign key audit.session_id -> sessions``."""
    if obj["kind"] == TRIGGER:
        return "trigger %s on %s %s" % (obj["name"], obj["table"], obj["event"])
    return "foreign key %s.%s" % (obj["table"], obj["name"])


def refusal(unknown):
    """The error text for objects the engine does not know: what was refused and what to do."""
    if any(o["affects"] != "deletes" for o in unknown):
        held = "no zombie was closed and no session deleted"
    elif any(o["kind"] == TRIGGER for o in unknown):
        held = "no session was deleted (zombies were still closed)"
    else:
        held = "the sessions their rows reference were kept"
    return (
        "this state.db has %s, which this collection does not know (a newer Hermes?): %s. Upgrade "
        "hermes_agent.ops to a release that knows it" % ("; ".join(describe(o) for o in unknown), held)
    )


def refuses_deletes(unknown):
    """An unknown trigger on a delete (or a sessions UPDATE) could touch any session."""
    return any(o["kind"] == TRIGGER for o in unknown)


def refuses_zombie_closes(unknown):
    return any(o["affects"] != "deletes" for o in unknown)


def summary(catalogue):
    """What a result shows of the catalogue."""
    return {
        "unknown": [describe(o) for o in catalogue["unknown"]],
        "known": sorted(describe(o) for o in catalogue["known"]),
        "runtime_ledger": catalogue["ledger"],
    }


def referenced_sessions(conn, unknown):
    """Sessions an unknown foreign key's rows point at (directly, or through their messages)."""
    found = set()
    for obj in unknown:
        if obj["kind"] != FK:
            continue
        table, column = '"%s"' % obj["table"].replace('"', '""'), '"%s"' % obj["column"].replace('"', '""')
        if obj["parent"] == "sessions":
            sql = "SELECT DISTINCT %s FROM %s" % (column, table)
        else:
            sql = "SELECT DISTINCT m.session_id FROM messages m JOIN %s t ON t.%s = m.id" % (table, column)
        found.update(r[0] for r in conn.execute(sql))
    return found


# The runtime ledger (upstream hermes_state_runtime.py): rows of these statuses are work in flight.
LIVE_ADMISSION = ("queued", "started", "unknown")
LIVE_WORKER = ("registered", "running", "unknown")


def ledgered_sessions(conn, schema):
    """Sessions the gateway runtime is working on: a live admission (as its target or in its
    lineage) or a live worker execution. Hermes keeps them; so do we."""
    found = set()
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


def retire_ledger(conn, schema, sid):
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


def fully_known(catalogue):
    """Whether every object of the file is one this collection knows (delete_with: auto)."""
    return not catalogue["unknown"]
