# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only selection: which sessions are zombies, which are pruned, and in what order.

The same plan drives check mode (its counts are the prediction) and the real run (its
order is the deletion order), so the two cannot drift apart. Rules: docs/architecture.md.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..sqlite.db import MaintenanceError
from ..store.catalogue import describe, ledgered_sessions, referenced_sessions
from ..store.fence import local_conversations
from ..store.fence import reasons as fence_reasons

if TYPE_CHECKING:
    from ..options import Options
    from ..store.schema import Schema, SessionTables

DAY = 86400.0
SANE_MIN = 946684800.0  # 2000-01-01: older "unix seconds" are corrupt or not seconds at all
COMPRESSION = "compression"
# Hermes's orphan sweep closes a dead process's sessions with this reason and ends them at the
# sweep, so they stay resumable for a whole retention window; its prune ages them from ended_at.
ORPHAN_REAP = "startup_orphan_reap"
# Why a routed session stays: the only reason kept that still lets old tool payloads be elided.
ROUTED = "the gateway's routing index names it (a chat resumes it)"


def is_sane(value: object, now: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and SANE_MIN <= value <= now + DAY


def sane_sql(column: str) -> str:
    return "(typeof(%s) IN ('integer', 'real') AND %s BETWEEN ? AND ?)" % (column, column)


class Session:
    """One row of ``sessions`` with its message figures (load_sessions)."""

    __slots__ = (
        "id", "source", "parent", "started", "ended", "end_reason", "last_activity", "pinned",
        "delegate_from", "prompt_hash", "messages", "last", "bad",
    )  # fmt: skip
    id: str
    source: str | None
    parent: str | None
    started: float | None
    ended: float | None
    end_reason: str | None
    last_activity: float | None
    pinned: bool
    delegate_from: str | None
    prompt_hash: str | None
    messages: int
    last: float | None  # its newest sane time (None only where ``bad``: see last_time)
    bad: bool


class Plan:
    """What a run will do to one profile."""

    def __init__(self) -> None:
        self.zombies: list[tuple[str, float]] = []  # (session id, ended_at to set = its last activity)
        self.delete_order: list[str] = []  # session ids, children before parents
        self.messages: dict[str, int] = {}  # session id -> message count, for every session in delete_order
        self.parents: dict[str, str | None] = {}  # session id -> parent id (or None), for every session in delete_order
        self.delegate_root: dict[str, str] = {}  # delegate id -> candidate it is deleted with
        self.orphaned = 0  # kept sessions whose parent is deleted
        self.bad_time_rows = 0
        self.transcripts: dict[str, list[str]] = {}  # session id -> [file paths]
        # member id -> every id of its local conversation of several, all deleted
        self.conversations: dict[str, tuple[str, ...]] = {}
        self.prompts = 0  # system_prompts rows the prune leaves unreferenced
        self.now = 0.0
        self.zombie_cutoff = 0.0
        self.prune_cutoff = 0.0  # for the sources prune_days_by_source does not name
        self.source_cutoffs: dict[str, float] = {}  # source -> its own cutoff (prune_days_by_source)
        self.sources: dict[str, str | None] = {}  # session id -> source, for every session in delete_order
        # session id -> its own cutoff where it is not prune_cutoff (the apply re-checks by it)
        self.cutoffs: dict[str, float] = {}
        self.kept: list[dict[str, str]] = []  # {"session", "reason"}: sessions old enough to go, kept for a reason
        # session id -> why no rule may touch it whatever its age (see _reasons_kept)
        self.protected: dict[str, str] = {}
        # apply.elision.PayloadPlan when tool_payload_days is set: a higher layer, so not named here
        self.payloads: Any = None

    @property
    def messages_pruned(self) -> int:
        return sum(self.messages.values())

    @property
    def transcripts_count(self) -> int:
        return sum(len(v) for v in self.transcripts.values())

    @property
    def has_changes(self) -> bool:
        return bool(self.zombies or self.delete_order or (self.payloads and self.payloads.items))


def live_leases(conn: sqlite3.Connection, schema: SessionTables, now: float) -> set[str]:
    """Session ids Hermes is working on right now (unexpired compression or turn lease)."""
    leased: set[str] = set()
    for table, column in (("compression_locks", "session_id"), ("session_turn_leases", "conversation_id")):
        if table in schema["tables"]:
            sql = "SELECT %s FROM %s WHERE expires_at > ?" % (column, table)
            leased.update(row[0] for row in conn.execute(sql, (now,)))
    return leased


def routed_sessions(conn: sqlite3.Connection, schema: SessionTables) -> set[str]:
    """Session ids the gateway's routing index names (0.19+: ``gateway_routing``).

    The gateway resumes, or starts a reset child of, the session its entry for a chat names;
    Hermes drops an entry before it deletes the session behind it, and so do we: we keep it.
    """
    if "gateway_routing" not in schema["tables"]:
        return set()
    routed: set[str] = set()
    for (entry,) in conn.execute("SELECT entry_json FROM gateway_routing"):
        try:
            sid = json.loads(entry).get("session_id")
        except (TypeError, ValueError, AttributeError):
            continue
        if isinstance(sid, str) and sid:
            routed.add(sid)
    return routed


# 0.22.2's /heartbeat and /loop keep a session's schedule in state_meta under these prefixes.
SCHEDULES = (("heartbeat:", "/heartbeat"), ("loop:", "/loop"))


def scheduled_sessions(conn: sqlite3.Connection, schema: SessionTables, sid: str | None = None) -> dict[str, str]:
    """Session id -> why: an active /heartbeat or /loop schedule (0.22.2) keeps its session, one
    ``sid`` only when given. Active as the release reads it (a missing status is ``active``); a
    value it cannot parse counts as active, as its own idle gates (store_has_active_*) count it;
    an empty value (a reset's stop) and a paused, done or cleared one keep nothing."""
    if "state_meta" not in schema["tables"]:
        return {}
    kept: dict[str, str] = {}
    for prefix, command in SCHEDULES:
        if sid is None:
            rows = conn.execute("SELECT key, value FROM state_meta WHERE substr(key, 1, ?) = ?", (len(prefix), prefix))
        else:
            rows = conn.execute("SELECT key, value FROM state_meta WHERE key = ?", (prefix + sid,))
        for key, raw in rows:
            if raw and _schedule_active(raw):
                kept.setdefault(key[len(prefix) :], "an active %s schedule (state_meta %s)" % (command, key))
    return kept


def _schedule_active(raw: Any) -> bool:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return True
    return not isinstance(value, dict) or (value.get("status") or "active") == "active"


def leased_conversation(conn: sqlite3.Connection, sid: str | None, leased: set[str]) -> bool:
    """True when ``sid`` or a compression ancestor of it holds a live lease.

    Hermes keys a turn lease by the conversation (the root of a compression lineage), so a
    lease on the root covers every continuation after it.
    """
    seen: set[str] = set()
    while leased and sid is not None and sid not in seen:
        if sid in leased:
            return True
        seen.add(sid)
        row = conn.execute(
            "SELECT p.id, p.end_reason FROM sessions c JOIN sessions p ON p.id = c.parent_session_id WHERE c.id = ?",
            (sid,),
        ).fetchone()
        if row is None or row[1] != COMPRESSION:
            return False
        sid = row[0]
    return False


def last_time(session: Session) -> float:
    """Its newest sane time: set on every session whose times are sane (``load_sessions``), the
    only ones a rule ages (a ``bad`` one is protected)."""
    return cast(float, session.last)


def prune_age(session: Session) -> float:
    """The time a session's retention counts from: its last activity, or for a session
    Hermes's orphan sweep closed, the later of that and the close."""
    if session.end_reason == ORPHAN_REAP and session.ended is not None:
        return max(last_time(session), session.ended)
    return last_time(session)


def load_sessions(
    conn: sqlite3.Connection, schema: SessionTables, now: float, short_reads: bool = False
) -> dict[str, Session]:
    """Every session with its last activity; flags rows whose times are not unix seconds.

    ``short_reads``: the per-session message figures in statements of SHORT_READ_SESSIONS
    sessions each, each its own short read transaction (rollback-journal mode beside a live
    gateway, where one scan of all messages would block its commits for the whole scan).
    """
    cols = schema["session_columns"]
    extra = [
        "last_activity_at" if "last_activity_at" in cols else "NULL",
        "pinned" if "pinned" in cols else "0",
        "CASE WHEN instr(model_config, '_delegate_from') > 0 THEN model_config END"
        if "model_config" in cols
        else "NULL",
        "system_prompt_hash" if "system_prompt_hash" in cols else "NULL",
    ]
    sql = "SELECT id, source, parent_session_id, started_at, ended_at, end_reason, %s FROM sessions" % ", ".join(extra)
    sessions: dict[str, Session] = {}
    for row in conn.execute(sql):
        s = Session()
        s.id, s.source, s.parent, s.started, s.ended, s.end_reason, s.last_activity, pinned, mc, s.prompt_hash = row
        s.pinned = bool(pinned)
        s.delegate_from = _delegate_from(mc)
        s.messages, s.last, s.bad = 0, None, False
        sessions[s.id] = s
    lo, hi = SANE_MIN, now + DAY
    sane = sane_sql("timestamp")
    msg_sql = (
        "SELECT session_id, COUNT(*), MAX(CASE WHEN %s THEN timestamp END), "
        "SUM(CASE WHEN %s THEN 0 ELSE 1 END) FROM messages GROUP BY session_id" % (sane, sane)
    )
    bad_messages = total_messages = 0
    for sid, count, newest, bad in _message_figures(conn, msg_sql, (lo, hi, lo, hi), sessions, short_reads):
        total_messages += count
        bad_messages += bad
        session = sessions.get(sid)
        if session is None:
            continue
        session.messages, session.last = count, newest
        session.bad = bad > 0
    _refuse_if_mostly_bad(conn, "messages", "timestamp", bad_messages, total_messages, now)
    for column, attr in (("started_at", "started"), ("ended_at", "ended"), ("last_activity_at", "last_activity")):
        values = [getattr(s, attr) for s in sessions.values() if getattr(s, attr) is not None]
        bad = [v for v in values if not is_sane(v, now)]
        _refuse_if_mostly_bad(conn, "sessions", column, len(bad), len(values), now, bad[:1])
        for s in sessions.values():
            value = getattr(s, attr)
            if value is not None and not is_sane(value, now):
                s.bad = True
    for s in sessions.values():
        if not s.bad:
            s.last = max(v for v in (s.started, s.last_activity, s.last) if v is not None)
    return sessions


SHORT_READ_SESSIONS = 100


def _message_figures(
    conn: sqlite3.Connection,
    msg_sql: str,
    params: Sequence[float],
    sessions: dict[str, Session],
    short_reads: bool,
) -> list[Any]:
    if not short_reads:
        return conn.execute(msg_sql, params).fetchall()
    ids, rows = sorted(sessions), []
    where = msg_sql.replace(" GROUP BY", " WHERE session_id IN (%s) GROUP BY")
    for start in range(0, len(ids), SHORT_READ_SESSIONS):
        chunk = ids[start : start + SHORT_READ_SESSIONS]
        rows += conn.execute(where % ",".join("?" * len(chunk)), tuple(params) + tuple(chunk)).fetchall()
    return rows


def _delegate_from(model_config: str | None) -> str | None:
    if not model_config:
        return None
    try:
        value = json.loads(model_config).get("_delegate_from")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def _refuse_if_mostly_bad(
    conn: sqlite3.Connection,
    table: str,
    column: str,
    bad: int,
    total: int,
    now: float,
    example: list[Any] | None = None,
) -> None:
    if not total or bad * 2 <= total:
        return
    if example is None:
        row = conn.execute(
            "SELECT %s FROM %s WHERE NOT %s LIMIT 1" % (column, table, sane_sql(column)), (SANE_MIN, now + DAY)
        ).fetchone()
        example = [row[0] if row else None]
    value = example[0]
    hint = "milliseconds?" if isinstance(value, (int, float)) and value > 1e11 else "not unix seconds"
    raise MaintenanceError(
        "%s.%s does not hold unix seconds: %d of %d values are out of range, e.g. %r (%s); nothing was changed. "
        "Hermes writes time.time() seconds: convert the column, or restore a backup"
        % (table, column, bad, total, value, hint)
    )


def build_plan(
    conn: sqlite3.Connection,
    schema: Schema,
    opts: Options,
    now: float,
    sessions_dir: str | None,
    short_reads: bool = False,
    allowed: set[str] | None = None,
) -> Plan:
    """Select zombies and the prune set for one profile (reads only); ``short_reads``: see load_sessions.

    ``allowed``: when given, only these sessions may be deleted (unknown_schema=release_rules: the
    ones the installed Hermes's own prune deletes): a subset of what the rules alone select, the
    same sessions where the two agree, and a delegate the release keeps is orphaned as it does.
    """
    plan = _empty_plan(opts, now)
    sessions = load_sessions(conn, schema, now, short_reads)
    leased = live_leases(conn, schema, now)
    plan.bad_time_rows = sum(1 for s in sessions.values() if s.bad)
    children, delegates = session_links(sessions)
    sel = Selection(plan, sessions, children, delegates, _reasons_kept(conn, schema, sessions, leased))
    _protect(sel, leased)
    conversations = _local_conversations(conn, schema)
    _select_zombies(sel, set(opts.zombie_sources))
    candidates = {s.id for s in sessions.values() if s.id not in sel.protected and _past_retention(sel, s)}
    units = {c: _delegate_closure(c, delegates) for c in candidates}
    if allowed is not None:
        candidates &= allowed
    candidates, doomed = _settle(sel, candidates, units, allowed, conversations, opts.batch_size)
    _record_deletions(sel, candidates, units, doomed, conversations)
    plan.kept = [
        {"session": s.id, "reason": sel.why[s.id]}
        for s in sorted(sessions.values(), key=lambda s: s.id)
        if s.id in sel.why and s.id not in doomed and not s.bad and _past_retention(sel, s)
    ]
    plan.orphaned = sum(1 for s in sessions.values() if s.id not in doomed and s.parent in doomed)
    plan.transcripts = transcript_files(sessions_dir, doomed)
    plan.prompts = _prompts_freed(schema, sessions, doomed)
    return plan


class Selection:
    """What ``build_plan`` works on: the plan it fills, the sessions and their links, and what it
    has decided so far (``why``: session id -> why it stays; ``protected``: no rule touches it)."""

    def __init__(
        self,
        plan: Plan,
        sessions: dict[str, Session],
        children: dict[str, list[Session]],
        delegates: dict[str, list[Session]],
        why: dict[str, str],
    ) -> None:
        self.plan, self.sessions, self.children, self.delegates, self.why = plan, sessions, children, delegates, why
        self.delegated_by = {kid.id: parent for parent, kids in delegates.items() for kid in kids}
        self.protected: set[str] = set()
        self.zombies: set[str] = set()


def _empty_plan(opts: Options, now: float) -> Plan:
    """A plan with its time and its cutoffs (zombie_days, prune_days, prune_days_by_source)."""
    plan = Plan()
    plan.now = now
    plan.zombie_cutoff = now - float(opts.zombie_days) * DAY
    plan.prune_cutoff = now - float(opts.prune_days) * DAY
    by_source = opts.prune_days_by_source or {}
    plan.source_cutoffs = {source: now - float(days) * DAY for source, days in by_source.items()}
    return plan


def _protect(sel: Selection, leased: set[str]) -> None:
    """The sessions no rule may touch whatever their age: a reason kept (``why``), the
    continuations of a pinned or leased session, and those whose times are not unix seconds."""
    sessions, why = sel.sessions, sel.why
    protected = {s.id for s in sessions.values() if s.bad} | set(why)
    for s in _continuations([s for s in sessions.values() if s.pinned or s.id in leased], sel.children):
        why.setdefault(s, "continues a pinned or leased session")
    sel.protected = protected | set(why)
    sel.plan.protected = dict(why, **{s.id: "its times are not unix seconds" for s in sessions.values() if s.bad})


def _select_zombies(sel: Selection, zombie_sources: set[str]) -> None:
    """Open sessions of the zombie sources idle since before the zombie cutoff, not protected."""
    for s in sel.sessions.values():
        if (
            s.ended is None
            and s.id not in sel.protected
            and s.source in zombie_sources
            and last_time(s) < sel.plan.zombie_cutoff
        ):
            sel.zombies.add(s.id)
            sel.plan.zombies.append((s.id, last_time(s)))


def _past_retention(sel: Selection, s: Session) -> bool:
    """Ended (or a zombie the run closes) and aged past its own prune cutoff."""
    return (s.ended is not None or s.id in sel.zombies) and prune_age(s) < _cutoff_of(
        s, sel.plan, sel.sessions, sel.delegated_by
    )


def _settle(
    sel: Selection,
    candidates: set[str],
    units: dict[str, set[str]],
    allowed: set[str] | None,
    conversations: dict[str, tuple[str, ...]],
    batch_size: int | None,
) -> tuple[set[str], set[str]]:
    """(candidates, doomed): drop the candidates whose deletion is tied to a kept session until
    none is left, each with its reason in ``why``; doomed is what the rest delete with them."""
    while True:
        doomed: set[str] = set()
        for c in candidates:
            doomed |= units[c] if allowed is None else units[c] & allowed  # a delegate it keeps is orphaned
        blocked = {
            c for c in candidates if _blocked(units[c], sel.sessions, sel.protected, sel.zombies, doomed, sel.children)
        }
        for c in candidates - blocked:
            why_not = _not_whole(conversations.get(c), doomed, sel.sessions, batch_size)
            if why_not:
                blocked.add(c)
                sel.why.setdefault(c, why_not)
        if not blocked:
            return candidates, doomed
        candidates -= blocked
        for c in blocked:
            sel.why.setdefault(c, "its deletion is tied to a kept session (its continuation, delegate or parent)")


def _record_deletions(
    sel: Selection,
    candidates: set[str],
    units: dict[str, set[str]],
    doomed: set[str],
    conversations: dict[str, tuple[str, ...]],
) -> None:
    """The plan's deletions: their order, and per session its delegate root, messages, parent,
    source and cutoff where it is not prune_cutoff; the local conversations deleted whole."""
    plan, sessions = sel.plan, sel.sessions
    for c in candidates:
        for member in (units[c] & doomed) - {c}:
            plan.delegate_root.setdefault(member, c)
    plan.delete_order = _children_first(doomed, sessions)
    plan.conversations = {sid: whole for sid, whole in conversations.items() if sid in doomed}
    for sid in plan.delete_order:
        plan.messages[sid] = sessions[sid].messages
        plan.parents[sid] = sessions[sid].parent
        plan.sources[sid] = sessions[sid].source
        cutoff = _cutoff_of(sessions[sid], plan, sessions, sel.delegated_by)
        if cutoff != plan.prune_cutoff:
            plan.cutoffs[sid] = cutoff


def _prompts_freed(schema: SessionTables, sessions: dict[str, Session], doomed: set[str]) -> int:
    """The system_prompts rows the prune leaves unreferenced (0 where the file has none)."""
    if "system_prompts" not in schema["tables"] or "system_prompt_hash" not in schema["session_columns"]:
        return 0
    kept = {s.prompt_hash for s in sessions.values() if s.id not in doomed}
    freed = {sessions[sid].prompt_hash for sid in doomed} - kept - {None}
    return len(freed)


def _local_conversations(conn: sqlite3.Connection, schema: Schema) -> dict[str, tuple[str, ...]]:
    """Member id -> every id of its local conversation, for conversations of several segments on a
    store under the deletion fence: upstream's sweep (retire_prunable, 4f64356) takes one only whole."""
    catalogue = schema.get("catalogue")
    if not (catalogue and catalogue["ledger"] and "state_meta" in schema["tables"]):
        return {}
    return {sid: whole for sid, whole in local_conversations(conn).items() if len(whole) > 1}


def _not_whole(
    whole: tuple[str, ...] | None, doomed: set[str], sessions: dict[str, Session], batch_size: int | None
) -> str | None:
    """Why a segment of the local conversation ``whole`` cannot go now (None: it goes with all of it,
    in one transaction): a segment stays, or together they exceed ``batch_size`` messages."""
    if not whole:
        return None
    if not set(whole) <= doomed:
        return "one segment of a local conversation of %d whose other segments stay (Hermes sweeps it only whole)" % (
            len(whole)
        )
    total = sum(sessions[sid].messages for sid in whole if sid in sessions)
    if batch_size and total > int(batch_size):
        return (
            "one segment of a local conversation of %d with %d messages, more than batch_size: Hermes sweeps it "
            "only whole, in one transaction" % (len(whole), total)
        )
    return None


def _reasons_kept(
    conn: sqlite3.Connection, schema: Schema, sessions: dict[str, Session], leased: set[str]
) -> dict[str, str]:
    """Session id -> why it stays whatever its age: a pin, a live lease, a route, the runtime
    ledger's work or its deletion fence, rows of a foreign key the engine does not know."""
    why: dict[str, str] = {}
    catalogue = schema.get("catalogue")
    fenced = bool(catalogue and catalogue["ledger"]) and "state_meta" in schema["tables"]
    for s in sessions.values():
        if s.pinned:
            why[s.id] = "pinned"
        elif s.id in leased:
            why[s.id] = "Hermes holds a live lease on it"
    for sid, reason in scheduled_sessions(conn, schema).items():
        why.setdefault(sid, reason)
    if not fenced:  # with the runtime ledger the deletion fence removes a deleted session's routes
        for sid in routed_sessions(conn, schema):
            why.setdefault(sid, ROUTED)
    if fenced:
        for sid, reason in fence_reasons(conn, schema["tables"]).items():
            why.setdefault(sid, reason)
    elif catalogue:
        for sid in ledgered_sessions(conn, schema):
            why.setdefault(sid, "the gateway runtime ledger holds live work for it")
    for obj in (catalogue["unknown"] if catalogue else None) or ():
        for sid in referenced_sessions(conn, [obj]):
            why.setdefault(sid, "rows of %s (unknown to this collection) reference it" % describe(obj))
    return why


def session_links(sessions: dict[str, Session]) -> tuple[dict[str, list[Session]], dict[str, list[Session]]]:
    """(children, delegates): parent id -> its child Sessions, session id -> its delegate Sessions."""
    children: dict[str, list[Session]] = {}
    delegates: dict[str, list[Session]] = {}
    for s in sessions.values():
        if s.parent in sessions:
            children.setdefault(s.parent, []).append(s)
        if s.delegate_from:
            delegates.setdefault(s.delegate_from, []).append(s)
    for parent_id, kids in children.items():
        # Hermes: a child with the marker whose parent is the doomed row is a delegate too.
        for kid in kids:
            if kid.delegate_from and kid.delegate_from != parent_id:
                delegates.setdefault(parent_id, []).append(kid)
    return children, delegates


def taken_along(chosen: Iterable[str], sessions: dict[str, Session]) -> set[str]:
    """``chosen`` session ids with what the prune deletes together with them, transitively.

    The prune deletes a session with its delegates, and a compression lineage only whole (an
    ancestor stays while a continuation stays): so a session comes back with its delegates,
    the continuations after it and the compression ancestors it continues.
    """
    children, delegates = session_links(sessions)
    found = set(sid for sid in chosen if sid in sessions)
    stack = list(found)
    while stack:
        s = sessions[stack.pop()]
        linked = _delegate_closure(s.id, delegates) | _continuations([s], children)
        parent = sessions.get(s.parent) if s.parent is not None else None
        if parent is not None and parent.end_reason == COMPRESSION:
            linked.add(parent.id)
        for sid in linked - found:
            found.add(sid)
            stack.append(sid)
    return found


def parents_first(ids: Iterable[str], sessions: dict[str, Session]) -> list[str]:
    """``ids`` in the order a restore puts them back: the reverse of the prune's delete order."""
    return list(reversed(_children_first(set(ids), sessions)))


def _cutoff_of(s: Session, plan: Plan, sessions: dict[str, Session], delegated_by: dict[str, str]) -> float:
    """The prune cutoff of a session: its source's (prune_days_by_source), else prune_days'.

    A delegate takes the retention of the session it works for (a year of telegram keeps the
    subagents of those chats a year too).
    """
    if not plan.source_cutoffs:
        return plan.prune_cutoff
    seen = {s.id}
    while delegated_by.get(s.id) in sessions and delegated_by[s.id] not in seen:
        s = sessions[delegated_by[s.id]]
        seen.add(s.id)
    return plan.source_cutoffs.get(s.source, plan.prune_cutoff) if s.source is not None else plan.prune_cutoff


def _continuations(roots: Iterable[Session], children: dict[str, list[Session]]) -> set[str]:
    """Compression continuations of ``roots``, transitively: the rest of their conversation.

    A pin covers the whole conversation, and so does a lease (Hermes keys turn leases by the
    lineage root).
    """
    kept: set[str] = set()
    stack = list(roots)
    while stack:
        s = stack.pop()
        if s.end_reason != COMPRESSION:
            continue
        for kid in children.get(s.id, ()):
            if kid.id not in kept:
                kept.add(kid.id)
                stack.append(kid)
    return kept


def _delegate_closure(root: str, delegates: dict[str, list[Session]]) -> set[str]:
    found = {root}
    stack = [root]
    while stack:
        for kid in delegates.get(stack.pop(), ()):
            if kid.id not in found:
                found.add(kid.id)
                stack.append(kid.id)
    return found


def _blocked(
    unit: set[str],
    sessions: dict[str, Session],
    protected: set[str],
    zombies: set[str],
    doomed: set[str],
    children: dict[str, list[Session]],
) -> bool:
    for sid in unit:
        s = sessions[sid]
        if sid in protected:
            return True
        if s.ended is None and sid not in zombies:
            return True  # a delegate still running: keep its parent too
        if s.end_reason == COMPRESSION and any(k.id not in doomed for k in children.get(sid, ())):
            return True  # a compression ancestor stays while a continuation stays
    return False


def _children_first(doomed: set[str], sessions: dict[str, Session]) -> list[str]:
    """Deepest first along parent links, so no row is deleted while a doomed child points at it."""
    depth: dict[str | None, int] = {}
    for sid in doomed:
        chain: list[str] = []
        cur: str | None = sid
        while cur in doomed and cur not in depth and cur not in chain:
            chain.append(cur)
            cur = sessions[cur].parent
        base = depth.get(cur, -1)  # -1 above the doomed set, and to break a parent cycle
        for member in reversed(chain):
            base += 1
            depth[member] = base
    return sorted(doomed, key=lambda sid: (-depth[sid], sid))


def transcript_files(sessions_dir: str | None, session_ids: Collection[str]) -> dict[str, list[str]]:
    """Hermes's per-session files: <id>.json, <id>.jsonl, request_dump_<id>_*.json."""
    found: dict[str, list[str]] = {}
    if not session_ids or not sessions_dir or os.path.islink(sessions_dir) or not os.path.isdir(sessions_dir):
        return found
    for name in os.listdir(sessions_dir):
        sid: str | None = None
        if name.startswith("request_dump_") and name.endswith(".json"):
            middle = name[len("request_dump_") : -len(".json")]
            for i, char in enumerate(middle):
                if char == "_" and middle[:i] in session_ids:
                    sid = middle[:i]
                    break
        elif name.endswith(".jsonl"):
            sid = name[: -len(".jsonl")]
        elif name.endswith(".json"):
            sid = name[: -len(".json")]
        if sid is not None and sid in session_ids:
            found.setdefault(sid, []).append(os.path.join(sessions_dir, name))

    return found
