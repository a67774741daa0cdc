# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Upstream Hermes's deletion fence, written in the transaction that deletes each session.

On a store with the gateway runtime ledger, upstream says every delete path "must publish the
whole fence" (hermes_state_mutation_retirement.py, read at commit 4f64356f5e78 of
NousResearch/hermes-agent; 7014f5521876 for the pending output cleanup), or "a late
accounting/constructor backfill recreates the deleted row, and the same request is then admitted
a second time". For each deleted id, before its rows go:

* the media its admissions own are retired as upstream's ``retire_media`` does (a
  ``gateway.media.retired.v1.<sha256 of the path>`` candidate each, which the gateway's
  ``collect_retired_media`` releases);
* its terminal ledger rows move into ``state_meta`` tombstones with the user's content stripped
  (admission payload ``{}``, lineage ``[]``; a stored turn result loses its transcript copies; a
  worker receipt keeps its result only for the closing ``execution.finish``);
* the content fields of ``gateway.mutation.v1.*`` receipts naming it are nulled;
* the retired marker ``gateway.retired_session.v1.<id>`` is written, ``gateway.api.settings.v1.<id>``
  and the ``gateway_routing`` entries naming it are deleted, and so are its local receipts
  (creation policy, API binding, declared conversation key);
* its ``conversation_generations`` counter is left alone, and its children lose their parent without
  a ``runtime_revision`` bump: a prune is upstream's sweep (``retire_prunable``), not its explicit
  ``delete_in_transaction``, which alone bumps both (and 0.22.2's own ``prune_sessions`` neither).
  Hermes 0.22.2 derives a chat's prompt-cache scope from that counter: a bump would reset the
  cache of a live chat sharing the deleted session's key.

What the engine cannot do faithfully it does not half do: a session whose ledger is at work,
whose ledger payload upstream's retire_media could not read, or that carries a hosted-room request
(its documents are named by prompt text under the gateway's retained root), whose output cleanup
is pending, is kept and named with the reason (``reasons``,
read by the plan, so check mode predicts it; ``check`` again inside the deleting transaction). A
local conversation of several segments (reset, compression) goes only whole, in one transaction,
as upstream's sweep takes it (the plan keeps it whole or not at all; ``check`` refuses a segment
deleted without the others).

Standard library only, Python 3.8+, no Ansible imports.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ..sqlite.db import quoted

RETIRED_PREFIX = "gateway.retired_session.v1."
RESULT_PREFIX = "gateway.admission.result.v1."
ADMISSION_PREFIX = "gateway.terminal_admission.v1."
IDENTITY_PREFIX = "gateway.terminal_identity.v1."
WORKER_PREFIX = "gateway.terminal_worker.v1."
MUTATION_GLOB = "gateway.mutation.v1.*"
SETTINGS_PREFIX = "gateway.api.settings.v1."
POLICY_PREFIX = "gateway.local_policy.v1:"
API_BINDING_PREFIX = "gateway.api.binding.v1."
API_DECLARED_PREFIX = "gateway.api.conversation.v1."
MEDIA_RETIRED_PREFIX = "gateway.media.retired.v1."
OUTPUT_CLEANUP_LIKE = "gateway.hosted.output_cleanup.v1:%"

_TRANSCRIPT_FIELDS = ("messages", "last_reasoning", "tools")
_MUTATION_TRANSCRIPT_FIELDS = ("target_message", "summary", "title")
_RECEIPT_SESSION_PATHS = (
    "$.result.session_id",
    "$.result.target_message.session_id",
    "$.result.target_session_id",
    "$.result.previous_target_session_id",
)


class FenceRefused(Exception):
    """A session the fence cannot retire as upstream does: it stays, named with ``reason``."""


def _json(value: Any) -> str:
    """Upstream's hermes_state_runtime._json: the byte form its readers compare."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def admission_fingerprint(canonical_target: str, payload: Any) -> str:
    """Upstream's admission_fingerprint (hermes_state_identity / gateway.session_admission)."""
    encoded = json.dumps(
        {"target": canonical_target, "payload": payload},
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
        allow_nan=False,
    ).encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(encoded).hexdigest()


def identity_key(principal_id: Any, session_id: str, request_id: Any) -> str:
    return IDENTITY_PREFIX + admission_fingerprint(session_id, {"principal": principal_id, "request": request_id})


def media_references(raw: Any) -> list[dict[str, Any]]:
    """The media an admission's payload owns, as upstream's retire_media reads them (hermes_state_media,
    called by retire_terminal_receipts at 4f64356): ``attachments_v1.media``, ``native_text_v1.media``
    (gateway.session_ingress_media.admission_media_references) and ``api_turn_v1.media``, each a
    reference with its ``path``. Raises ValueError for a payload upstream's code could not read
    (it would fail the delete): the session is then kept, named."""
    try:
        payload = json.loads(raw)
    except (TypeError, ValueError):
        raise ValueError("its ledger payload is not JSON") from None
    if not isinstance(payload, dict):
        raise ValueError("its ledger payload is not a JSON object")
    references: list[dict[str, Any]] = []
    for holder in ("attachments_v1", "native_text_v1", "api_turn_v1"):
        held = payload.get(holder, {})
        media = held.get("media", ()) if isinstance(held, dict) else None
        if not isinstance(media, (list, tuple)):
            raise ValueError("its ledger payload's %s is not a media list" % holder)
        references += media
    for reference in references:
        if not isinstance(reference, dict) or not isinstance(reference.get("path"), str):
            raise ValueError("its ledger payload names media without a path")
    return references


def _media_problem(raw: Any) -> str | None:
    """Why upstream's retire_media could not retire this payload's media (None: it can)."""
    try:
        media_references(raw)
    except ValueError as exc:
        return "%s (upstream's retire_media could not retire it)" % exc
    return None


def _retire_media(conn: sqlite3.Connection, raw: Any) -> None:
    """Upstream retire_media: a ``gateway.media.retired.v1.<sha256 of the path>`` candidate per
    reference, whose value is the reference (``json.dumps``, its default separators), so the
    gateway's collect_retired_media releases the files once no row holds them."""
    for reference in media_references(raw):
        key = MEDIA_RETIRED_PREFIX + hashlib.sha256(reference["path"].encode("utf-8", "surrogatepass")).hexdigest()
        conn.execute("INSERT OR IGNORE INTO state_meta(key, value) VALUES (?, ?)", (key, json.dumps(reference)))


# The ledger columns the fence reads and writes (hermes_state_runtime.py at 4f64356): a table
# without one of them has a shape this engine does not know.
LEDGER_COLUMNS = {
    "session_admissions": ("admission_id", "request_id", "principal_id", "target_session_id", "lineage_json",
                           "payload_json", "status"),
    "worker_executions": ("execution_id", "session_id", "status"),
    "worker_receipts": ("execution_id", "sequence", "payload_digest", "result_json"),
}  # fmt: skip


def ledger_shape(conn: sqlite3.Connection, tables: Collection[str]) -> str | None:
    """Why the ledger's shape is not one the fence knows (None: it is): the columns it lacks."""
    missing = []
    for table, needed in LEDGER_COLUMNS.items():
        if table in tables:
            have = {r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))}
            lacks = [c for c in needed if c not in have]
            if lacks:
                missing.append("%s has no %s" % (table, ", ".join(lacks)))
    if not missing:
        return None
    return "the runtime ledger is of a shape this collection does not know (%s): its fence cannot be written" % (
        "; ".join(missing)
    )


def _ledger_holders(conn: sqlite3.Connection, tables: Collection[str]) -> set[Any]:
    """Session id -> True for every session a ledger row names, by the ledger's foreign keys to sessions."""
    held: set[Any] = set()
    for table in LEDGER_COLUMNS:
        if table not in tables:
            continue
        for fk in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (table,)).fetchall():
            if fk[2] == "sessions":
                column = quoted(fk[3])
                held.update(r[0] for r in conn.execute('SELECT DISTINCT %s FROM "%s"' % (column, table)))
    return held


_HOSTED = "a hosted-room request of its ledger: Hermes checks its output cleanup first"
_CLEANUP = "its hosted output cleanup is pending"
_SEGMENT = "one segment of a local conversation of %d, not deleted with all of it (Hermes sweeps it only whole)"


def local_conversations(conn: sqlite3.Connection) -> dict[str, tuple[str, ...]]:
    """Member id -> every id of its local conversation (upstream _local_conversations)."""
    members: dict[str, tuple[str, ...]] = {}
    for (raw,) in conn.execute("SELECT value FROM state_meta WHERE key GLOB ?", (POLICY_PREFIX + "*",)):
        try:
            receipt = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if not isinstance(receipt, dict):
            continue
        entry, lineage = receipt.get("entry"), receipt.get("lineage")
        named: list[Any] = [receipt.get("session_id")] + (lineage if isinstance(lineage, list) else [])
        named.append(entry.get("session_id") if isinstance(entry, dict) else None)
        ids = tuple(dict.fromkeys(x for x in named if isinstance(x, str)))
        members.update(dict.fromkeys(ids, ids))
    return members


def reasons(conn: sqlite3.Connection, tables: Collection[str]) -> dict[Any, str]:
    """Session id -> why the fence keeps it, for every session the ledger, the hosted-room
    bookkeeping or a local conversation holds back. Reads only."""
    kept: dict[Any, str] = {}
    shape = ledger_shape(conn, tables)
    if shape:  # what it holds cannot be read: every session it names stays, the others are pruned
        kept.update(dict.fromkeys(_ledger_holders(conn, tables), shape))
        tables = [t for t in tables if t not in LEDGER_COLUMNS]
    if "session_admissions" in tables:
        for sid, status, request_id, payload in conn.execute(
            "SELECT target_session_id, status, request_id, payload_json FROM session_admissions"
        ):
            if status != "terminal":
                kept.setdefault(sid, "the gateway runtime ledger holds %s work for it (admission)" % status)
            elif str(request_id).startswith("hosted:"):
                kept.setdefault(sid, _HOSTED)
            else:
                problem = _media_problem(payload)
                if problem:
                    kept.setdefault(sid, problem)
        for (sid,) in conn.execute(
            "SELECT DISTINCT j.value FROM session_admissions a, json_each(a.lineage_json) j "
            "WHERE a.status != 'terminal' AND json_valid(a.lineage_json)"
        ):
            kept.setdefault(sid, "the gateway runtime ledger holds live work in its lineage")
    if "worker_executions" in tables:
        for sid, status in conn.execute("SELECT session_id, status FROM worker_executions WHERE status != 'terminal'"):
            kept.setdefault(sid, "the gateway runtime ledger holds %s work for it (worker)" % status)
    if "state_meta" in tables:
        for (sid,) in conn.execute(
            "SELECT json_extract(value, '$.binding.admission.target_session_id') FROM state_meta "
            "WHERE key LIKE ? AND json_valid(value) AND json_extract(value, '$.state') IS NOT 'completed'",
            (OUTPUT_CLEANUP_LIKE,),
        ):
            if sid:
                kept.setdefault(sid, _CLEANUP)
    return kept


def check(
    conn: sqlite3.Connection,
    sid: str,
    conversations: Mapping[str, tuple[str, ...]],
    guarded: bool,
    together: Iterable[str] = (),
) -> bool:
    """Inside the deleting transaction: True when ``sid`` has live ledger work (gained since the plan):
    it gets no fence, and the store's own guard trigger (``guarded``) refuses its delete, naming
    itself; without that trigger the fence refuses it. Raises FenceRefused for a session the fence
    leaves to Hermes (``conversations``: ``local_conversations`` of this transaction; a segment of
    one goes only with all of it in ``together``, the ids deleted with it)."""
    tables = _tables(conn)
    shape = ledger_shape(conn, tables)
    if shape and sid in _ledger_holders(conn, tables):
        raise FenceRefused(shape)
    if not shape and _check_ledger(conn, sid, guarded):
        return True
    if conn.execute(
        "SELECT 1 FROM state_meta WHERE key LIKE ? AND json_valid(value) "
        "AND json_extract(value, '$.state') IS NOT 'completed' "
        "AND json_extract(value, '$.binding.admission.target_session_id') = ? LIMIT 1",
        (OUTPUT_CLEANUP_LIKE, sid),
    ).fetchone():
        raise FenceRefused(_CLEANUP)
    whole = conversations.get(sid, (sid,))
    if len(whole) > 1 and not set(whole) <= set(together):
        raise FenceRefused(_SEGMENT % len(whole))
    return False


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _check_ledger(conn: sqlite3.Connection, sid: str, guarded: bool) -> bool:
    live = conn.execute(
        "SELECT status FROM session_admissions WHERE target_session_id = ? AND status != 'terminal' "
        "UNION ALL SELECT status FROM worker_executions WHERE session_id = ? AND status != 'terminal'",
        (sid, sid),
    ).fetchall()
    if live and guarded:
        return True
    if live:  # upstream's explicit delete refuses with these words; its sweep skips the session
        raise FenceRefused("unknown_execution" if "unknown" in {r[0] for r in live} else "session_busy")
    for request_id, payload in conn.execute(
        "SELECT request_id, payload_json FROM session_admissions WHERE target_session_id = ?", (sid,)
    ):
        if str(request_id).startswith("hosted:"):
            raise FenceRefused(_HOSTED)
        problem = _media_problem(payload)
        if problem:
            raise FenceRefused(problem)
    return False


def _compact_result(conn: sqlite3.Connection, admission_id: str) -> None:
    saved = conn.execute("SELECT value FROM state_meta WHERE key = ?", (RESULT_PREFIX + admission_id,)).fetchone()
    if saved is None:
        return
    value = json.loads(saved[0])
    result = value.get("result")
    if isinstance(result, dict):
        result = {k: v for k, v in result.items() if k not in _TRANSCRIPT_FIELDS}
        value["result"] = dict(result, messages=[])
    conn.execute("UPDATE state_meta SET value = ? WHERE key = ?", (_json(value), RESULT_PREFIX + admission_id))


def _columns(cursor: sqlite3.Cursor, row: Sequence[Any]) -> dict[str, Any]:
    return dict(zip([d[0] for d in cursor.description], row))


def _retire_ledger(conn: sqlite3.Connection, sid: str) -> None:
    """Upstream retire_terminal_receipts for one session whose ledger rows are all terminal."""
    cur = conn.execute("SELECT * FROM session_admissions WHERE target_session_id = ? ORDER BY seq", (sid,))
    admissions = [_columns(cur, r) for r in cur.fetchall()]
    cur = conn.execute("SELECT * FROM worker_executions WHERE session_id = ?", (sid,))
    workers = [_columns(cur, r) for r in cur.fetchall()]
    for row in admissions:
        _retire_media(conn, row["payload_json"])
        row["payload_json"] = "{}"  # keep the digest for exact retries, not the user's input
        row["lineage_json"] = "[]"
        _compact_result(conn, row["admission_id"])
        conn.execute(
            "INSERT INTO state_meta(key, value) VALUES (?, ?)", (ADMISSION_PREFIX + row["admission_id"], _json(row))
        )
        conn.execute(
            "INSERT INTO state_meta(key, value) VALUES (?, ?)",
            (identity_key(row["principal_id"], sid, row["request_id"]), json.dumps(row["admission_id"])),
        )
    closing = admission_fingerprint(sid, {"operation": "execution.finish", "payload": {}})
    for row in workers:
        receipts = [
            {"sequence": seq, "payload_digest": digest, "result_json": result if digest == closing else None}
            for seq, digest, result in conn.execute(
                "SELECT sequence, payload_digest, result_json FROM worker_receipts WHERE execution_id = ? "
                "ORDER BY sequence",
                (row["execution_id"],),
            )
        ]
        row["receipts"] = receipts
        conn.execute(
            "INSERT INTO state_meta(key, value) VALUES (?, ?)", (WORKER_PREFIX + row["execution_id"], _json(row))
        )
        conn.execute("DELETE FROM worker_receipts WHERE execution_id = ?", (row["execution_id"],))
    conn.execute("DELETE FROM worker_executions WHERE session_id = ?", (sid,))
    conn.execute("DELETE FROM session_admissions WHERE target_session_id = ?", (sid,))


def _retire_mutation_receipts(conn: sqlite3.Connection, sids: Iterable[str]) -> None:
    named = " OR ".join(
        "json_extract(value, '%s') IN (SELECT value FROM json_each(?1))" % path for path in _RECEIPT_SESSION_PATHS
    )
    rows = conn.execute(
        "SELECT key, value FROM state_meta WHERE key GLOB ? AND CASE WHEN json_valid(value) THEN (%s) END"
        % named.replace("?1", "?2"),
        (MUTATION_GLOB, json.dumps(list(sids))),
    ).fetchall()
    for key, raw in rows:
        receipt = json.loads(raw)
        result = receipt.get("result")
        if isinstance(result, dict) and any(f in result for f in _MUTATION_TRANSCRIPT_FIELDS):
            receipt["result"] = {k: (None if k in _MUTATION_TRANSCRIPT_FIELDS else v) for k, v in result.items()}
            conn.execute("UPDATE state_meta SET value = ? WHERE key = ?", (_json(receipt), key))


def _entry_session_id(raw: Any) -> Any:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return value.get("session_id") if isinstance(value, dict) else None


def _retire_routes(conn: sqlite3.Connection, sids: Iterable[str], tables: Collection[str]) -> None:
    for sid in sids:
        conn.execute("INSERT OR IGNORE INTO state_meta(key, value) VALUES (?, '{}')", (RETIRED_PREFIX + sid,))
        conn.execute("DELETE FROM state_meta WHERE key = ?", (SETTINGS_PREFIX + sid,))
    for scope, key in routes_naming(conn, tables, sids):
        conn.execute("DELETE FROM gateway_routing WHERE scope = ? AND session_key = ?", (scope, key))


def routes_naming(conn: sqlite3.Connection, tables: Collection[str], sids: Iterable[str]) -> list[tuple[Any, Any]]:
    """(scope, session_key) of the ``gateway_routing`` entries naming any of ``sids``."""
    if "gateway_routing" not in tables:
        return []
    targets = set(sids)
    return [
        (scope, key)
        for scope, key, entry in conn.execute("SELECT scope, session_key, entry_json FROM gateway_routing").fetchall()
        if _entry_session_id(entry) in targets
    ]


def _policy_target(raw: Any) -> Any:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    entry = value.get("entry") if isinstance(value, dict) else None
    return entry.get("session_id") if isinstance(entry, dict) else None


def _retire_local_receipts(conn: sqlite3.Connection, sids: Sequence[str]) -> None:
    targets = set(sids)
    gone = [
        key
        for key, value in conn.execute("SELECT key, value FROM state_meta WHERE key GLOB ?", (POLICY_PREFIX + "*",))
        if _policy_target(value) in targets
    ]
    gone += [
        key
        for key, value in conn.execute(
            "SELECT key, value FROM state_meta WHERE key GLOB ?", (API_DECLARED_PREFIX + "*",)
        )
        if value in targets
    ]
    gone += [API_BINDING_PREFIX + sid for sid in sids]
    conn.executemany("DELETE FROM state_meta WHERE key = ?", [(key,) for key in gone])


def retire(conn: sqlite3.Connection, tables: Collection[str], sids: Sequence[str]) -> None:
    """The whole fence for ``sids``, in the caller's transaction, before their rows are deleted.
    Each id must have passed ``check`` in this transaction."""
    if not ledger_shape(conn, tables):  # else ``check`` let through only sessions no ledger row names
        for sid in sids:
            _retire_ledger(conn, sid)
    _retire_mutation_receipts(conn, sids)
    _retire_routes(conn, sids, tables)
    _retire_local_receipts(conn, sids)


def retired(conn: sqlite3.Connection, sids: Sequence[str]) -> list[str]:
    """The ids among ``sids`` that carry upstream's retired marker (deleted under the fence)."""
    if not sids:
        return []
    try:
        return [
            r[0][len(RETIRED_PREFIX) :]
            for r in conn.execute(
                "SELECT key FROM state_meta WHERE key IN (%s)" % ",".join("?" * len(sids)),
                [RETIRED_PREFIX + s for s in sids],
            )
        ]
    except Exception as exc:  # no state_meta (v2 files): nothing retired
        if "no such table" in str(exc):
            return []
        raise
