"""Upstream's deletion fence where the engine deletes, and the whole catalogue (docs/architecture.md,
"The catalogue decides"; docs/compatibility.md).

On a file the real Hermes 0.22.2 wrote (routes through its own save_gateway_routing_entry), given
upstream main's runtime ledger and the state_meta rows its runtime writes, in the byte form and
with the SQL of hermes_state_runtime.py / hermes_state_local.py / hermes_state_mutation_retirement.py
(NousResearch/hermes-agent at 4f64356f5e78): each settled session is deleted with the whole fence in
its transaction; sessions the fence leaves to Hermes are kept and named; a SIGKILL at any statement
of a fenced delete leaves no half-fenced session. A table no release has skips the deletes.
"""

import json
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from hermes_markers import release_module_marks

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune import PruneResult, prune
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import normalize_options
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.plan.selection import build_plan
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import (
    restore_selected,
    selection,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError, open_rw
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store import fence
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.catalogue import (
    fully_known,
    read_catalogue,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.schema import inspect_schema
from hermes_fixtures import add_runtime_ledger, build_home, open_with_release, query_one

LAYOUT = "hermes-0.22.2.post1"
pytestmark = release_module_marks("0.22.2.post1")

OLD = dict(started_days_ago=40, ended_days_ago=39, messages=3)
SPECS = [
    dict(id="settled", source="telegram", routing_key="agent:main:telegram:dm:1", **OLD),
    dict(id="settled2", source="telegram", routing_key="agent:main:telegram:dm:2", **OLD),
    dict(id="plain", **OLD),
    dict(id="queued", source="telegram", routing_key="agent:main:telegram:dm:3", **OLD),
    dict(id="running", **OLD),
    dict(id="media", **OLD),
    dict(id="recent", started_days_ago=2, ended_days_ago=1),
]
FENCED = {"settled", "settled2", "plain"}
PRUNED = FENCED | {"media"}  # its media retired as upstream's retire_media does, then deleted
KEPT = {
    "queued": "the gateway runtime ledger holds queued work for it (admission)",
    "running": "the gateway runtime ledger holds running work for it (worker)",
}
OPTS = {"prune_days": 30, "backup": False}
CLOSING = fence.admission_fingerprint("settled", {"operation": "execution.finish", "payload": {}})


def _json(value):  # hermes_state_runtime._json
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def upstream_rows(db):
    """The ledger and the state_meta rows upstream's runtime writes for these sessions."""
    add_runtime_ledger(
        db,
        admissions=[("settled", "terminal"), ("settled2", "terminal"), ("queued", "queued"), ("media", "terminal")],
        workers=[("settled", "terminal"), ("running", "running")],
    )
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    # the media admission: attachments as gateway/session_ingress_media captures them
    conn.execute(
        "UPDATE session_admissions SET payload_json = ? WHERE target_session_id = 'media'",
        (_json({"text": "see picture", "attachments_v1": {"media": [{"path": "/tmp/x.png"}]}}),),
    )
    # the settled worker: a history read, then its closing execution.finish receipt
    conn.execute(
        "UPDATE worker_receipts SET result_json = ? WHERE execution_id = 'exec-0'", (_json({"history": "SECRET"}),)
    )
    conn.execute("INSERT INTO worker_receipts VALUES ('exec-0', 2, ?, ?)", (CLOSING, _json({"finished": True})))
    # settle_session_input: the stored turn result (with its transcript copies)
    result = {
        "result": {
            "final_response": "done",
            "messages": [{"role": "user", "content": "SECRET"}],
            "last_reasoning": "SECRET",
            "tools": [{"name": "x"}],
            "usage": {"tokens": 3},
        }
    }
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", (fence.RESULT_PREFIX + "adm-0", _json(result)))
    # mutate_runtime_session (rename): its exact-retry receipt carries the title
    key = "gateway.mutation.v1." + fence.admission_fingerprint("settled", {"principal": "human", "request": "m1"})
    receipt = {
        "digest": "d",
        "result": {"session_id": "settled", "revision": 2, "operation": "rename", "title": "SECRET title"},
    }
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", (key, _json(receipt)))
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", ("gateway.api.settings.v1.settled", _json({"m": 1})))
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", ("gateway.api.settings.v1.queued", _json({"m": 1})))
    # commit_local_session: one creation policy whose route is settled2's
    entry = {"session_id": "settled2", "created_at": "2026-01-01T00:00:00", "origin": {"chat_id": "2"}}
    policy = {
        "session_id": "settled2",
        "route": "agent:main:telegram:dm:2",
        "entry": entry,
        "lineage": ["settled2"],
        "profile_id": "p",
        "principal_id": "human",
        "request_id": "r",
        "policy": {"request_json": "SECRET"},
    }
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", (fence.POLICY_PREFIX + "settled2", _json(policy)))
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", (fence.API_BINDING_PREFIX + "settled", "{}"))
    conn.execute(
        "UPDATE sessions SET session_key = 'agent:main:telegram:dm:' || substr(id, 1, 9) WHERE source = 'telegram'"
    )
    conn.execute(
        "INSERT INTO conversation_generations(source, session_key, generation) VALUES ('telegram', "
        "'agent:main:telegram:dm:settled', 4)"
    )
    conn.execute("COMMIT")
    conn.close()
    return db


@pytest.fixture(scope="module")
def release_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("release")
    build_home(str(home), LAYOUT, SPECS)
    upstream_rows(home / "state.db")
    return home


def run(home, check_mode=False, **more):
    return run_maintenance(dict(OPTS, hermes_home=[str(home)], **more), check_mode=check_mode)["profiles"][0]


def rows(db, sql, *args):
    conn = sqlite3.connect(str(db))
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def meta(db, key):
    found = rows(db, "SELECT value FROM state_meta WHERE key = ?", key)
    return json.loads(found[0][0]) if found else None


def test_a_fenced_prune_writes_exactly_upstreams_fence(home):
    db = home / "state.db"
    assert fully_known(read_catalogue(sqlite3.connect(str(db))))
    before = db.read_bytes()
    check = run(home, check_mode=True)
    assert db.read_bytes() == before  # check mode writes no byte
    real = run(home)
    for p in (check, real):
        assert p["status"] == "ok" and p["error"] is None, p["error"]
        assert p["sessions_pruned"] == 4 and p["sessions_refused"] == []
        assert {k["session"]: k["reason"] for k in p["sessions_kept"]} == KEPT  # never kept silently
    assert {r[0] for r in rows(db, "SELECT id FROM sessions")} == set(KEPT) | {"recent"}
    for sid in PRUNED:
        assert meta(db, fence.RETIRED_PREFIX + sid) == {}
    for sid in KEPT:
        assert meta(db, fence.RETIRED_PREFIX + sid) is None
    # the ledger rows moved into tombstones, the user's content stripped
    assert rows(db, "SELECT target_session_id FROM session_admissions ORDER BY 1") == [("queued",)]
    # hashlib.sha256(b"/tmp/x.png").hexdigest(): the candidate the gateway's collect_retired_media releases
    digest = "0b0532af5ed750b2c900ac3040790aaf236014702c77ed76028f23de0b80e7ca"
    media = rows(db, "SELECT key, value FROM state_meta WHERE key GLOB 'gateway.media.retired.v1.*'")
    assert media == [("gateway.media.retired.v1." + digest, '{"path": "/tmp/x.png"}')]
    assert rows(db, "SELECT session_id FROM worker_executions") == [("running",)]
    assert rows(db, "SELECT execution_id FROM worker_receipts") == [("exec-1",)]
    admission = meta(db, fence.ADMISSION_PREFIX + "adm-0")
    assert admission["target_session_id"] == "settled" and admission["status"] == "terminal"
    assert (admission["payload_json"], admission["lineage_json"], admission["payload_digest"]) == ("{}", "[]", "d0")
    assert meta(db, fence.identity_key("human", "settled", "r0")) == "adm-0"
    worker = meta(db, fence.WORKER_PREFIX + "exec-0")
    assert [(r["sequence"], r["result_json"]) for r in worker["receipts"]] == [(1, None), (2, '{"finished":true}')]
    result = meta(db, fence.RESULT_PREFIX + "adm-0")["result"]
    assert result == {"final_response": "done", "messages": [], "usage": {"tokens": 3}}
    (mutation,) = [
        json.loads(v) for (v,) in rows(db, "SELECT value FROM state_meta WHERE key GLOB 'gateway.mutation.v1.*'")
    ]
    assert mutation["result"]["title"] is None and mutation["result"]["revision"] == 2
    assert meta(db, "gateway.api.settings.v1.settled") is None and meta(db, "gateway.api.settings.v1.queued")
    assert meta(db, fence.POLICY_PREFIX + "settled2") is None and meta(db, fence.API_BINDING_PREFIX + "settled") is None
    routes = [json.loads(e)["session_id"] for (e,) in rows(db, "SELECT entry_json FROM gateway_routing")]
    assert routes == ["queued"]
    # a prune is upstream's sweep (retire_prunable): the prompt-cache counter is left alone
    assert rows(db, "SELECT session_key, generation FROM conversation_generations ORDER BY 1") == [
        ("agent:main:telegram:dm:settled", 4)]  # fmt: skip
    blob = b"".join(bytes(str(v), "utf-8") for (v,) in rows(db, "SELECT value FROM state_meta"))
    assert b"SECRET" not in blob
    seen = open_with_release(LAYOUT, db)  # the release still lists and searches the file
    assert set(seen["sessions"]) == set(KEPT) | {"recent"}


def test_a_second_run_deletes_nothing_more(home):
    run(home)
    again = run(home)
    assert again["sessions_pruned"] == 0 and again["changed"] is False
    assert {k["session"] for k in again["sessions_kept"]} == set(KEPT)


def test_a_fenced_session_is_not_restored_from_a_backup(home):
    """Hermes refuses to recreate a retired id (hermes_state_local.commit_local_session: not_found, "a
    create/cron retry must not resurrect the row"): so does the undo, naming why."""
    p = run(home, backup=True)
    assert p["sessions_pruned"] == 4 and p["backup"]
    with pytest.raises(MaintenanceError, match="deletion fence") as refused:
        restore_selected(str(home), "default", backup="newest", select=selection(sessions=["settled"]))
    assert "settled" in str(refused.value) and "nothing was restored" in str(refused.value)
    assert meta(home / "state.db", fence.RETIRED_PREFIX + "settled") == {}


def test_a_live_admission_arriving_after_the_plan_leaves_its_session_unfenced(home):
    """The gateway admits input for a planned session before its transaction: the session gets no
    fence, Hermes's guard refuses its delete, the others are fenced and deleted."""
    db = home / "state.db"
    conn, schema, plan = _planned(home)
    try:
        assert set(plan.delete_order) == PRUNED
        other = sqlite3.connect(str(db))
        with other:
            other.execute("UPDATE session_admissions SET status = 'queued' WHERE target_session_id = 'settled2'")
        other.close()
        result = prune(conn, plan, schema, batch_size=4000, pause=0, result=PruneResult())
    finally:
        conn.close()
    assert result.sessions == 3
    ((refused),) = result.refused  # the store's own guard refuses it; it got no fence
    assert (refused["session"], refused["by"]) == ("settled2", "trigger sessions_runtime_ledger_delete_guard")
    assert meta(db, fence.RETIRED_PREFIX + "settled2") is None
    assert query_one(db, "SELECT COUNT(*) FROM messages WHERE session_id = 'settled2'") == 3


def _half_fenced(db):
    """Sessions present with any fence row written, or gone without their whole fence."""
    present = {r[0] for r in rows(db, "SELECT id FROM sessions")}
    wrong = []
    for sid in FENCED:
        marker = meta(db, fence.RETIRED_PREFIX + sid) is not None
        ledger = rows(db, "SELECT 1 FROM session_admissions WHERE target_session_id = ?", sid)
        routes = [
            e for (e,) in rows(db, "SELECT entry_json FROM gateway_routing") if json.loads(e)["session_id"] == sid
        ]
        if sid in present and (marker or (sid == "settled" and not ledger) or (sid != "plain" and not routes)):
            wrong.append((sid, "present, fence written"))
        if sid not in present and (not marker or ledger or routes):
            wrong.append((sid, "gone, fence missing"))
    return wrong


def _planned(home):
    """An open connection, the schema and the plan of a run on ``home`` (as run_maintenance makes them)."""
    conn = open_rw(str(home / "state.db"))
    schema = inspect_schema(conn, str(home))
    schema["catalogue"] = read_catalogue(conn)
    opts = normalize_options(dict(OPTS, zombie_days=1, zombie_sources=["cli"]))
    return conn, schema, build_plan(conn, schema, opts, time.time(), None)


def _statements(home, schema, plan):
    """The SQL statements the prune of ``plan`` runs on ``home``."""
    conn = open_rw(str(home / "state.db"))
    seen = []
    conn.set_trace_callback(lambda sql: None if _inner(sql, seen[-1:]) else seen.append(sql))
    try:
        prune(conn, plan, schema, batch_size=100, pause=0, result=PruneResult())
    finally:
        conn.close()
    return seen


def _inner(sql, last):
    """SQLite traces each trigger program a statement fires (as ``--`` text, or the statement's own text
    again): those are part of the statement, which SQLite applies whole."""
    return sql.startswith("--") or last == [sql]


def _killed_at(db, step, schema, plan):
    """Prune ``plan`` in a forked child that SIGKILLs itself at its ``step``-th statement."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            conn = open_rw(str(db))
            count, last = [0], []

            def trace(statement):
                if not _inner(statement, last):
                    last[:] = [statement]
                    count[0] += 1
                    if count[0] == step:
                        os.kill(os.getpid(), signal.SIGKILL)

            conn.set_trace_callback(trace)
            prune(conn, plan, schema, batch_size=100, pause=0, result=PruneResult())
        finally:
            os._exit(0)
    status = os.waitpid(pid, 0)[1]
    return os.WIFSIGNALED(status)


def test_a_sigkill_at_every_statement_leaves_no_half_fenced_session(home, tmp_path):
    """One fenced transaction (two sessions with ledger, routes, receipts and a local policy, and one
    without), killed at each of its statements in turn: each session is either untouched or gone
    with its whole fence, the file intact; a later run finishes the work."""
    template = tmp_path / "template"
    shutil.copytree(home, template)
    conn, schema, plan = _planned(template)
    conn.close()
    assert set(plan.delete_order) == PRUNED
    probe = tmp_path / "probe"
    shutil.copytree(template, probe)
    statements = _statements(probe, schema, plan)
    assert statements.count("COMMIT") == 1  # one transaction holds the three fenced deletes
    commit = statements.index("COMMIT") + 1
    for step in range(1, len(statements) + 1):
        shutil.copy(str(template / "state.db"), str(probe / "state.db"))
        assert _killed_at(probe / "state.db", step, schema, plan), "the prune ended before statement %d" % step
        db = probe / "state.db"
        assert rows(db, "PRAGMA integrity_check") == [("ok",)]
        assert _half_fenced(db) == [], "killed at statement %d: %s" % (step, statements[step - 1])
        present = {r[0] for r in rows(db, "SELECT id FROM sessions")}
        assert PRUNED & present == (PRUNED if step <= commit else set()), "killed at statement %d" % step
    p = run(probe)  # after the last kill: a run finishes the work
    assert p["status"] == "ok" and {r[0] for r in rows(probe / "state.db", "SELECT id FROM sessions")} == set(KEPT) | {
        "recent"
    }
    assert _half_fenced(probe / "state.db") == []


BOOKMARKS = "CREATE TABLE session_bookmarks(session_id TEXT, note TEXT);"


def test_a_table_no_release_has_skips_the_deletes_naming_it(home):
    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    with conn:
        conn.executescript(BOOKMARKS)
        conn.executemany("INSERT INTO session_bookmarks VALUES (?, 'keep')", [("settled",), ("plain",), ("media",)])
    conn.close()
    catalogue = read_catalogue(sqlite3.connect(str(db)))
    assert not fully_known(catalogue)
    assert [(o["kind"], o["name"]) for o in catalogue["unknown"]] == [("table", "session_bookmarks")]
    for check_mode in (True, False):
        p = run(home, check_mode=check_mode)
        assert p["status"] == "failed" and "table session_bookmarks" in p["error"], p["error"]
        assert "no session was deleted" in p["error"]
        assert p["catalogue"]["unknown"] == ["table session_bookmarks"] and p["sessions_pruned"] == 0
    assert len(rows(db, "SELECT id FROM sessions")) == len(SPECS)
    assert rows(db, "SELECT COUNT(*) FROM session_bookmarks") == [(3,)]


def test_a_state_meta_key_family_naming_sessions_skips_the_deletes(home):
    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("INSERT INTO state_meta VALUES ('gateway.bookmark.v9.plain', '{}')")
        conn.execute("INSERT INTO state_meta VALUES ('newer_marker_v1', '1')")  # names no session: Hermes's own
    conn.close()
    p = run(home)
    assert p["status"] == "failed" and p["sessions_pruned"] == 0
    assert p["catalogue"]["unknown"] == ["state_meta key family gateway.bookmark.v9.* (1 rows naming sessions)"]


# What upstream's sweep leaves on an identical copy of this file, read from its code at 4f64356f5e78
# (hermes_state_mutation_retirement.retire_prunable: the idle candidates settled, settled2, plain and
# media are fenced, queued and running skipped; retire_terminal_receipts with hermes_state_media.
# retire_media; retire_mutation_receipts; retire_routes; hermes_state_local.retire_local_receipts;
# then the raw prune deletes their messages and rows, no generation bump): written out row by row.
SWEPT_STATE_META = {
    "gateway.admission.result.v1.adm-0": '{"result":{"final_response":"done","messages":[],"usage":{"tokens":3}}}',
    "gateway.api.settings.v1.queued": '{"m":1}',
    "gateway.media.retired.v1.0b0532af5ed750b2c900ac3040790aaf236014702c77ed76028f23de0b80e7ca": (
        '{"path": "/tmp/x.png"}'
    ),
    "gateway.mutation.v1.79d4abd84c71580735d30361dfc05a97010344ba297769db3601199f98cf6441": (
        '{"digest":"d","result":{"operation":"rename","revision":2,"session_id":"settled","title":null}}'
    ),
    "gateway.retired_session.v1.media": "{}",
    "gateway.retired_session.v1.plain": "{}",
    "gateway.retired_session.v1.settled": "{}",
    "gateway.retired_session.v1.settled2": "{}",
    "gateway.terminal_admission.v1.adm-0": (
        '{"admission_id":"adm-0","generation":1,"intent":"queue","lineage_json":"[]","outcome":"completed",'
        '"owner_epoch":1,"payload_digest":"d0","payload_json":"{}","principal_id":"human","request_id":"r0",'
        '"seq":1,"status":"terminal","target_session_id":"settled"}'
    ),
    "gateway.terminal_admission.v1.adm-1": (
        '{"admission_id":"adm-1","generation":1,"intent":"queue","lineage_json":"[]","outcome":"completed",'
        '"owner_epoch":1,"payload_digest":"d1","payload_json":"{}","principal_id":"human","request_id":"r1",'
        '"seq":2,"status":"terminal","target_session_id":"settled2"}'
    ),
    "gateway.terminal_admission.v1.adm-3": (
        '{"admission_id":"adm-3","generation":1,"intent":"queue","lineage_json":"[]","outcome":"completed",'
        '"owner_epoch":1,"payload_digest":"d3","payload_json":"{}","principal_id":"human","request_id":"r3",'
        '"seq":4,"status":"terminal","target_session_id":"media"}'
    ),
    "gateway.terminal_identity.v1.2356b49f6b552c3f4d67301174acc5585fd76934ed80ccfecbf545a855b017d9": '"adm-0"',
    "gateway.terminal_identity.v1.61652528ee2bb4ff37d723c461c9a341993b85128ff8cd5208bba3d648f5d6a0": '"adm-3"',
    "gateway.terminal_identity.v1.85798c9a19f7711f804f1617b970b4f8966285ebca7ff8fada44f5f5ef540c91": '"adm-1"',
    "gateway.terminal_worker.v1.exec-0": (
        '{"adoption_digest":"digest","execution_id":"exec-0","generation":1,"kind":"child","last_sequence":1,'
        '"owner_epoch":1,"receipts":[{"payload_digest":"digest","result_json":null,"sequence":1},'
        '{"payload_digest":"%s","result_json":"{\\"finished\\":true}","sequence":2}],"session_id":"settled",'
        '"status":"terminal"}' % CLOSING
    ),
}
SWEPT_ROWS = {
    "sessions": [("queued",), ("recent",), ("running",)],
    "session_admissions": [("adm-2", "queued", "queued")],
    "worker_executions": [("exec-1", "running", "running")],
    "worker_receipts": [("exec-1", 1)],
    "gateway_routing": [("agent:main:telegram:dm:3", "queued")],
    "conversation_generations": [("telegram", "agent:main:telegram:dm:settled", 4)],
}
SWEPT_SQL = {
    "sessions": "SELECT id FROM sessions ORDER BY 1",
    "session_admissions": "SELECT admission_id, target_session_id, status FROM session_admissions ORDER BY 1",
    "worker_executions": "SELECT execution_id, session_id, status FROM worker_executions ORDER BY 1",
    "worker_receipts": "SELECT execution_id, sequence FROM worker_receipts ORDER BY 1, 2",
    "gateway_routing": "SELECT session_key, json_extract(entry_json, '$.session_id') FROM gateway_routing ORDER BY 1",
    "conversation_generations": "SELECT * FROM conversation_generations ORDER BY 1, 2",
}


def test_a_prune_leaves_what_upstreams_sweep_leaves(home):
    """The differential: every gateway.* state_meta row, the ledger, the routes, the sessions and the
    generation counters after our prune equal what upstream's sweep leaves (the rows above); the
    other state_meta rows (the store's own) are untouched."""
    db = home / "state.db"
    own = rows(db, "SELECT key, value FROM state_meta WHERE key NOT GLOB 'gateway.*' ORDER BY 1")
    p = run(home)
    assert p["status"] == "ok" and p["sessions_pruned"] == 4
    ours = dict(rows(db, "SELECT key, value FROM state_meta WHERE key GLOB 'gateway.*'"))
    lines = []
    for key in sorted(set(ours) | set(SWEPT_STATE_META)):
        same = ours.get(key) == SWEPT_STATE_META.get(key)
        lines.append("%-5s state_meta %s" % ("same" if same else "DIFF", key[:60]))
    for table, sql in SWEPT_SQL.items():
        got = rows(db, sql)
        lines.append("%-5s %s %s" % ("same" if got == SWEPT_ROWS[table] else "DIFF", table, got))
    print("\n".join(lines))  # the differential, for the record (pytest -s)
    assert ours == SWEPT_STATE_META
    assert {t: rows(db, sql) for t, sql in SWEPT_SQL.items()} == SWEPT_ROWS
    assert rows(db, "SELECT key, value FROM state_meta WHERE key NOT GLOB 'gateway.*' ORDER BY 1") == own


def test_a_family_naming_sessions_in_its_json_anywhere_skips_the_deletes(home):
    """A state_meta family naming a session as target_session_id, nested in objects and lists, or as
    its whole value makes the store not fully known, as upstream's output-cleanup records would."""
    db = home / "state.db"
    nested = {"state": "pending", "binding": {"admission": {"target_session_id": "plain"}}}
    listed = {"items": [{"kind": "x", "session_ids": ["settled"]}]}
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("INSERT INTO state_meta VALUES ('gateway.output.v9:a', ?)", (_json(nested),))
        conn.execute("INSERT INTO state_meta VALUES ('gateway.batch.v9.a', ?)", (_json(listed),))
        conn.execute("INSERT INTO state_meta VALUES ('gateway.current.v9.a', ?)", (_json("settled2"),))
        conn.execute("INSERT INTO state_meta VALUES ('gateway.note.v9.a', ?)", (_json({"text": "plain"}),))
    conn.close()
    p = run(home)
    assert p["status"] == "failed" and p["sessions_pruned"] == 0, p
    assert p["catalogue"]["unknown"] == [
        "state_meta key family gateway.batch.v9.* (1 rows naming sessions)",
        "state_meta key family gateway.current.v9.* (1 rows naming sessions)",
        "state_meta key family gateway.output.v9:* (1 rows naming sessions)",
    ]  # the note names no session: its text is not a session key


def test_a_ledger_without_state_meta_deletes_nothing_and_says_why(home):
    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("DROP TABLE state_meta")
    conn.close()
    for check_mode in (True, False):
        p = run(home, check_mode=check_mode)
        assert p["status"] == "failed" and p["sessions_pruned"] == 0
        assert "runtime ledger without a state_meta table" in p["error"] and "no session was deleted" in p["error"]
    assert len(rows(db, "SELECT id FROM sessions")) == len(SPECS)
    assert rows(db, "SELECT COUNT(*) FROM session_admissions") == [(4,)]


def test_a_ledger_of_an_unknown_shape_keeps_the_sessions_it_names_and_prunes_the_rest(home):
    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("ALTER TABLE worker_executions RENAME COLUMN execution_id TO worker_id")
    conn.close()
    for check_mode in (True, False):
        p = run(home, check_mode=check_mode)
        assert p["status"] == "ok" and p["error"] is None, p["error"]
        assert p["sessions_pruned"] == 1  # plain: no ledger row names it
        kept = {k["session"]: k["reason"] for k in p["sessions_kept"]}
        assert set(kept) == {"settled", "settled2", "queued", "running", "media"}
        assert all("worker_executions has no execution_id" in reason for reason in kept.values()), kept
    assert {r[0] for r in rows(db, "SELECT id FROM sessions")} == set(SPECS_IDS) - {"plain"}
    assert meta(db, fence.RETIRED_PREFIX + "plain") == {}


SPECS_IDS = [s["id"] for s in SPECS]


def test_a_store_shaped_as_upstreams_0_23_is_not_fully_known_and_auto_deletes_nothing(home):
    """Upstream main's logical-attempt index (tests/lib/schemas/logical_attempts.sql) adds tables and
    triggers on the ledger's deletes and on state_meta inserts, which the fence's writes would fire:
    without an installed Hermes whose delete publishes the fence, delete_with auto deletes nothing and
    names every object (docs/compatibility.md, "Hermes 0.23 on paper")."""
    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    with conn:
        conn.executescript((Path(__file__).parents[3] / "lib" / "schemas" / "logical_attempts.sql").read_text())
    conn.close()
    before = rows(db, "SELECT id FROM sessions ORDER BY 1")
    p = run(home)
    assert p["status"] == "failed" and p["sessions_pruned"] == 0
    assert sorted(p["catalogue"]["unknown"]) == [
        "table logical_attempts",
        "trigger logical_attempt_live_delete on session_admissions DELETE",
        "trigger logical_attempt_terminal_insert on state_meta INSERT",
    ]
    assert "delete_with auto: no hermes_python to hand the deletes to" in p["error"]
    assert rows(db, "SELECT id FROM sessions ORDER BY 1") == before
    assert rows(db, "SELECT COUNT(*) FROM logical_attempt_dirty") == [(0,)]


def _conversation(db, lineage):
    """A local reset/compression conversation: its creation policy names every segment (upstream's
    commit_local_session receipt; _local_conversations reads session_id, lineage and entry)."""
    receipt = {
        "session_id": lineage[0],
        "route": "agent:main:local:1",
        "entry": {"session_id": lineage[-1], "created_at": "2026-01-01T00:00:00", "origin": {"chat_id": "1"}},
        "lineage": lineage,
        "profile_id": "p",
        "principal_id": "human",
        "request_id": "local-1",
        "policy": {"request_json": "{}"},
    }
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute("INSERT INTO state_meta VALUES (?, ?)", (fence.POLICY_PREFIX + lineage[0], _json(receipt)))
    conn.close()


def test_a_local_conversation_goes_whole_in_one_transaction(home):
    """Upstream's sweep takes a local conversation only whole (retire_prunable at 4f64356): its two
    segments, both due, go together in one statement group, with their fence and its policy receipt."""
    db = home / "state.db"
    _conversation(db, ["plain", "settled"])
    conn, schema, plan = _planned(home)
    try:
        assert plan.conversations == {"plain": ("plain", "settled"), "settled": ("plain", "settled")}
        deletes = []
        conn.set_trace_callback(lambda sql: deletes.append(sql) if sql.startswith("DELETE FROM sessions") else None)
        result = prune(conn, plan, schema, batch_size=4000, pause=0, result=PruneResult())
    finally:
        conn.close()
    assert result.sessions == 4 and result.refused == []
    assert any("'plain'" in sql and "'settled'" in sql for sql in deletes), deletes  # one statement for both
    for sid in ("plain", "settled"):
        assert meta(db, fence.RETIRED_PREFIX + sid) == {}
    assert meta(db, fence.POLICY_PREFIX + "plain") is None


def test_a_local_conversation_with_a_segment_that_stays_is_kept_whole_and_named(home):
    db = home / "state.db"
    _conversation(db, ["plain", "settled", "recent"])
    p = run(home)
    assert p["status"] == "ok" and p["sessions_pruned"] == 2  # settled2 and media
    kept = {k["session"]: k["reason"] for k in p["sessions_kept"]}
    why = "one segment of a local conversation of 3 whose other segments stay (Hermes sweeps it only whole)"
    assert kept["plain"] == why and kept["settled"] == why
    assert {"plain", "settled", "recent"} <= {r[0] for r in rows(db, "SELECT id FROM sessions")}
    assert meta(db, fence.RETIRED_PREFIX + "plain") is None and meta(db, fence.POLICY_PREFIX + "plain")
