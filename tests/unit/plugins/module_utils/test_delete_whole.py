"""A session whose delete spans several transactions goes whole or not at all, while a gateway works
(docs/safety.md, "Deleting while the gateway works").

On a file the real Hermes 0.22.2 wrote, given upstream main's runtime ledger (as test_fence.py
builds it), a session of 400 messages is deleted with ``batch_size`` 100: three slices, then its row.
A gateway stand-in, a second connection of its own, works between two of the prune's transactions
(the prune's ``stop`` hook, asked before each transaction, times it): one admits new work for the
session as upstream's gateway does unless the session carries the retired marker, one admits it
whatever the marker says, one appends a message. Each time the session ends exactly as it was
before the run (its messages, ledger rows, routes and state_meta rows, byte for byte) or gone with
its whole fence; never in between.
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from hermes_markers import release_module_marks
from hermes_reliability import COLLECTIONS_ROOT
from hermes_reliability import query as rows

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune import PruneResult, prune
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.undo import SLICED_SUFFIX
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import normalize_options
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.plan.selection import build_plan
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import open_rw
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store import fence
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.catalogue import read_catalogue
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.fence import _json
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.schema import inspect_schema
from hermes_fixtures import add_runtime_ledger, build_home, hermes_python, open_with_release, run_release_code

LAYOUT = "hermes-0.22.2.post1"
pytestmark = release_module_marks("0.22.2.post1")

OLD = dict(started_days_ago=40, ended_days_ago=39)
SPECS = [
    dict(id="big", source="telegram", routing_key="agent:main:telegram:dm:1", messages=400, **OLD),
    dict(id="small", source="telegram", routing_key="agent:main:telegram:dm:2", messages=3, **OLD),
    dict(id="recent", started_days_ago=2, ended_days_ago=1),
]
OPTS = {"prune_days": 30, "backup": False}
BATCH = 100  # big: slices before transactions 1, 2 and 3; its row in transaction 4


@pytest.fixture(scope="module")
def release_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("whole")
    build_home(str(home), LAYOUT, SPECS)
    db = home / "state.db"
    add_runtime_ledger(db, admissions=[("big", "terminal"), ("small", "terminal")], workers=[("big", "terminal")])
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    result = {"result": {"final_response": "done", "messages": [{"role": "user", "content": "hi"}], "usage": {}}}
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", (fence.RESULT_PREFIX + "adm-0", _json(result)))
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", ("gateway.api.settings.v1.big", _json({"m": 1})))
    key = "gateway.mutation.v1." + fence.admission_fingerprint("big", {"principal": "human", "request": "m1"})
    receipt = {"digest": "d", "result": {"session_id": "big", "revision": 2, "operation": "rename", "title": "T"}}
    conn.execute("INSERT INTO state_meta(key,value) VALUES(?,?)", (key, _json(receipt)))
    conn.execute("UPDATE sessions SET session_key = 'agent:main:telegram:dm:' || id WHERE source = 'telegram'")
    conn.execute(
        "INSERT INTO conversation_generations(source, session_key, generation) VALUES "
        "('telegram', 'agent:main:telegram:dm:big', 4), ('telegram', 'agent:main:telegram:dm:small', 2)"
    )
    conn.execute("COMMIT")
    conn.close()
    return home


def snapshot(db, sid):
    """Every row of ``sid`` a delete touches (and the generation counters, which none may)."""
    mine = "(key LIKE '%' || ?1 || '%' OR value LIKE '%' || ?1 || '%' OR value IN (SELECT json_quote(admission_id) "
    mine += "FROM session_admissions WHERE target_session_id = ?1) OR key IN ('gateway.admission.result.v1.adm-0'))"
    return {
        "session": rows(db, "SELECT * FROM sessions WHERE id = ?", sid),
        "messages": rows(db, "SELECT * FROM messages WHERE session_id = ? ORDER BY id", sid),
        "fts": rows(
            db,
            "SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'zebra' "
            "AND rowid IN (SELECT id FROM messages WHERE session_id = ?) ORDER BY rowid",
            sid,
        ),
        "admissions": rows(db, "SELECT * FROM session_admissions WHERE target_session_id = ? ORDER BY seq", sid),
        "workers": rows(db, "SELECT * FROM worker_executions WHERE session_id = ?", sid),
        "receipts": rows(db, "SELECT * FROM worker_receipts WHERE execution_id = 'exec-0' ORDER BY 1, 2"),
        "routes": rows(db, "SELECT * FROM gateway_routing WHERE json_extract(entry_json, '$.session_id') = ?", sid),
        "state_meta": rows(db, "SELECT key, value FROM state_meta WHERE %s ORDER BY 1" % mine, sid),
        "generations": rows(db, "SELECT * FROM conversation_generations ORDER BY 1, 2"),
    }


class Gateway:
    """A stand-in for upstream's gateway admitting a queued turn for ``sid`` through its own
    connection, before the prune's ``at``-th transaction (hermes_state_runtime.admit_session_input's
    row; ``honours_marker``: not to a retired session, as upstream's admission checks first)."""

    def __init__(self, db, sid, at, honours_marker, work="admission"):
        self.db, self.sid, self.at, self.honours, self.work = str(db), sid, at, honours_marker, work
        self.calls = 0
        self.admitted = self.saw_marker = False

    def __call__(self):  # the prune's stop hook: asked before each of its transactions
        self.calls += 1
        if self.calls != self.at:
            return None
        conn = sqlite3.connect(self.db, timeout=5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            retired = conn.execute("SELECT 1 FROM state_meta WHERE key = ?", (fence.RETIRED_PREFIX + self.sid,))
            self.saw_marker = retired.fetchone() is not None
            if self.saw_marker and self.honours:
                conn.execute("ROLLBACK")
                return None
            if self.work == "admission":
                conn.execute(
                    "INSERT INTO session_admissions(admission_id, request_id, principal_id, target_session_id, "
                    "lineage_json, payload_json, payload_digest, intent, status, outcome, owner_epoch, generation) "
                    "VALUES ('adm-late', 'r-late', 'human', ?, ?, ?, ?, 'queue', 'queued', NULL, 1, NULL)",
                    (self.sid, _json([self.sid]), _json({"text": "where were we?"}), "d-late"),
                )
            else:  # the user writes again (a resumed chat): a message of now
                conn.execute(
                    "INSERT INTO messages(session_id, role, content, timestamp) VALUES (?, 'user', 'again', ?)",
                    (self.sid, time.time()),
                )
            conn.execute("COMMIT")
            self.admitted = True
        finally:
            conn.close()
        return None


def planned(home):
    conn = open_rw(str(home / "state.db"))
    schema = inspect_schema(conn, str(home))
    schema["catalogue"] = read_catalogue(conn)
    opts = normalize_options(dict(OPTS, zombie_days=1, zombie_sources=["cli"]))
    return conn, schema, build_plan(conn, schema, opts, time.time(), None)


def pruned(home, gateway):
    conn, schema, plan = planned(home)
    try:
        assert plan.delete_order == ["big", "small"]
        result = prune(conn, plan, schema, batch_size=BATCH, pause=0, result=PruneResult(), stop=gateway)
        assert conn.execute("SELECT name FROM sqlite_temp_master").fetchall() == []  # its records dropped
        return result
    finally:
        conn.close()


def gone_with_fence(db, sid):
    return (
        rows(db, "SELECT COUNT(*) FROM sessions WHERE id = ?", sid) == [(0,)]
        and rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = ?", sid) == [(0,)]
        and rows(db, "SELECT value FROM state_meta WHERE key = ?", fence.RETIRED_PREFIX + sid) == [("{}",)]
        and rows(db, "SELECT COUNT(*) FROM session_admissions WHERE target_session_id = ?", sid) == [(0,)]
        and rows(db, "SELECT COUNT(*) FROM worker_executions WHERE session_id = ?", sid) == [(0,)]
        and not [e for (e,) in rows(db, "SELECT entry_json FROM gateway_routing") if json.loads(e)["session_id"] == sid]
    )


def report(label, before, after):
    """The race's before/after, printed for the record (pytest -s)."""
    for name in ("session", "messages", "admissions", "workers", "routes", "state_meta", "generations"):
        print("%s %-11s before %4d rows, after %4d rows" % (label, name, len(before[name]), len(after[name])))


@pytest.mark.parametrize("at", [2, 4], ids=["after-first-slice", "before-its-row"])
def test_a_gateway_honouring_the_marker_admits_nothing_and_the_session_goes_with_its_fence(home, at):
    db = home / "state.db"
    before = snapshot(db, "big")
    gateway = Gateway(db, "big", at, honours_marker=True)
    result = pruned(home, gateway)
    assert gateway.saw_marker and not gateway.admitted  # the fence was published in the first transaction
    assert result.sessions == 2 and result.refused == [] and result.kept == []
    assert result.messages == 403
    assert gone_with_fence(db, "big") and gone_with_fence(db, "small")
    after = snapshot(db, "big")
    assert after["generations"] == before["generations"]  # a prune is a sweep: no counter bump
    report("honouring-%d" % at, before, after)


@pytest.mark.parametrize("at", [2, 3, 4], ids=["after-first-slice", "after-second-slice", "before-its-row"])
def test_work_admitted_mid_delete_by_a_gateway_ignoring_the_marker_puts_the_session_back_whole(home, at):
    """The admission lands on a session already fenced and partly deleted: the slice or the final
    delete is refused (the ledger check before each slice, or the store's own guard trigger at the
    row) and everything the earlier transactions did is undone, the fence with it."""
    db = home / "state.db"
    before = snapshot(db, "big")
    gateway = Gateway(db, "big", at, honours_marker=False)
    result = pruned(home, gateway)
    assert gateway.admitted and gateway.saw_marker
    assert result.sessions == 1 and gone_with_fence(db, "small")
    after = snapshot(db, "big")
    late = after["admissions"].pop()
    assert late[1:5] == ("adm-late", "r-late", "human", "big") and late[9] == "queued"
    assert after == before, "big is not as it was"
    assert rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = 'big'") == [(400,)]
    ((refused),) = result.refused
    assert refused["session"] == "big"
    by = "trigger sessions_runtime_ledger_delete_guard" if at == 4 else "the deletion fence"
    assert refused["by"] == by
    assert "were put back" in refused["message"]
    assert [k["session"] for k in result.kept] == ["big"]
    assert "%d messages" % (100 * (at - 1)) in result.kept[0]["reason"]
    assert result.messages == 3  # the slices put back are not counted as pruned
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    seen = open_with_release(LAYOUT, db)  # the release lists it and its search finds it again
    assert "big" in seen["sessions"]
    report("ignoring-%d" % at, before, after)


def test_a_message_written_mid_delete_puts_the_session_back_whole(home):
    db = home / "state.db"
    before = snapshot(db, "big")
    gateway = Gateway(db, "big", 3, honours_marker=False, work="message")
    result = pruned(home, gateway)
    assert gateway.admitted and result.sessions == 1
    after = snapshot(db, "big")
    assert after["messages"][-1][3] == "again"
    after["messages"].pop()
    assert after == before
    assert result.refused == [] and [k["session"] for k in result.kept] == ["big"]
    assert "200 messages" in result.kept[0]["reason"]


def test_a_run_stopped_between_two_slices_leaves_the_session_whole(home):
    db = home / "state.db"
    before = snapshot(db, "big")
    calls = []

    def stop():
        calls.append(1)
        return "WAL budget reached" if len(calls) == 3 else None

    conn, schema, plan = planned(home)
    try:
        result = prune(conn, plan, schema, batch_size=BATCH, pause=0, result=PruneResult(), stop=stop)
    finally:
        conn.close()
    assert result.stopped == "WAL budget reached" and result.sessions == 0 and result.messages == 0
    assert snapshot(db, "big") == before
    assert "WAL budget reached" in result.kept[0]["reason"]


def test_a_whole_run_beside_a_gateway_admitting_mid_delete_names_the_session_put_back(home):
    """Through run_maintenance: a thread with its own connection watches big's messages go, then
    admits a queued turn for it (ignoring the marker); the run puts big back whole and names it in
    sessions_kept and sessions_refused, and prunes the rest."""
    db = home / "state.db"
    before = snapshot(db, "big")
    gateway = Gateway(db, "big", 1, honours_marker=False)
    seen = threading.Event()

    def watch():
        conn = sqlite3.connect(str(db), timeout=5)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = 'big'").fetchone()[0] < 400:
                    seen.set()
                    gateway()  # between two of the run's transactions: the first slice has committed
                    return
                time.sleep(0.002)
        finally:
            conn.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    p = run_maintenance(dict(OPTS, hermes_home=[str(home)], batch_size=BATCH, batch_pause=0.2), check_mode=False)[
        "profiles"
    ][0]
    watcher.join()
    assert seen.is_set() and gateway.admitted and gateway.saw_marker
    assert p["status"] == "ok" and p["sessions_pruned"] == 1 and p["messages_pruned"] == 3, p["error"]
    kept = {k["session"]: k["reason"] for k in p["sessions_kept"]}
    assert list(kept) == ["big"] and "were put back, and its fence removed" in kept["big"]
    assert [r["session"] for r in p["sessions_refused"]] == ["big"]
    after = snapshot(db, "big")
    after["admissions"].pop()  # the turn the gateway admitted
    assert after == before


def test_a_run_failing_between_two_slices_puts_the_session_back_before_it_fails(home):
    db = home / "state.db"
    before = snapshot(db, "big")
    calls = []

    def stop():
        calls.append(1)
        if len(calls) == 3:
            raise OSError("No space left on device")  # what a failed step between two transactions raises
        return None

    conn, schema, plan = planned(home)
    result = PruneResult()
    try:
        with pytest.raises(OSError, match="No space left"):
            prune(conn, plan, schema, batch_size=BATCH, pause=0, result=result, stop=stop)
    finally:
        conn.close()
    assert snapshot(db, "big") == before and result.messages == 0
    assert "the run failed before its last slice" in result.kept[0]["reason"]


# The real engine in a process of its own, announcing on stderr each slice's committed transaction
# and then waiting there (nothing else changed), so that a SIGKILL lands between two slices.
KILLED_BETWEEN_SLICES = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import prune as apply
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
real = apply._prune_batch

def batch_then_wait(conn, plan, schema, batch, *args):
    out = real(conn, plan, schema, batch, *args)
    if batch and batch[0][1]:
        os.write(2, b"@@ slice committed\n")
        time.sleep(60)
    return out

apply._prune_batch = batch_then_wait
run_maintenance(json.loads(sys.argv[2]))
"""

# The user resumes the conversation with the real 0.22.2 release (it knows no fence: as a gateway
# ignoring the retired marker, or `hermes --resume`), and writes to it.
RESUME = r"""
import sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
db.reopen_session("big")
db.append_message("big", "user", "back to this conversation")
db.close()
"""


def kill_between_slices(home, opts):
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_BETWEEN_SLICES, str(COLLECTIONS_ROOT), json.dumps(opts)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stderr:
            if line.startswith("@@ slice committed"):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("backup", [False, True], ids=["no-backup", "whole-file-backup"])
def test_a_sigkill_between_two_slices_then_a_resume_loses_nothing(home, backup):
    """A real SIGKILL of a real engine process between two slices leaves big with its fence and 300
    of its 400 messages, listed durably with a copy of its rows (without a backup, an archive of
    its own; else the run's backup); the user resumes it with 0.22.2 and writes; the next run puts
    it back whole (every message, ledger row, route and state_meta row as before, plus the new
    message) and names it in sessions_kept."""
    db = home / "state.db"
    before = snapshot(db, "big")
    opts = dict(OPTS, hermes_home=[str(home)], batch_size=BATCH, batch_pause=0.01, backup=backup)
    kill_between_slices(home, opts)
    assert rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = 'big'") == [(300,)]
    assert fence.retired(sqlite3.connect(str(db)), ["big"]) == ["big"]
    listed = json.loads((home / ("state.db" + SLICED_SUFFIX)).read_text())
    copy = listed["big"]["archive"]
    assert list(listed) == ["big"] and listed["big"]["owned"] is not backup
    assert os.path.basename(copy).startswith("hermes-ops_" if backup else "hermes-ops-archive_")
    assert oct(os.stat(copy).st_mode & 0o777) == "0o600"

    proc = run_release_code(hermes_python(LAYOUT), RESUME, db)
    assert proc.returncode == 0, proc.stderr[-3000:]

    p = run_maintenance(opts)["profiles"][0]
    assert p["status"] == "ok", p["error"]
    kept = {k["session"]: k["reason"] for k in p["sessions_kept"]}
    assert "put back whole" in kept["big"]
    after = snapshot(db, "big")
    new = after["messages"].pop()
    assert new[1:4] == ("big", "user", "back to this conversation")
    after.pop("session"), before.pop("session")  # reopened by the release: ended_at, end_reason
    assert after == before
    assert not (home / ("state.db" + SLICED_SUFFIX)).exists() and os.path.exists(copy) is backup
    seen = open_with_release(LAYOUT, db)
    assert "big" in seen["sessions"]


def test_a_sigkill_between_two_slices_then_a_run_finishes_a_session_that_still_qualifies(home):
    """Nobody resumes big after the kill: the next run puts it back whole, plans it again and
    deletes it with its whole fence; the list and the archive go."""
    db = home / "state.db"
    opts = dict(OPTS, hermes_home=[str(home)], batch_size=BATCH, batch_pause=0.01)
    kill_between_slices(home, opts)
    listed = json.loads((home / ("state.db" + SLICED_SUFFIX)).read_text())
    p = run_maintenance(opts)["profiles"][0]
    assert p["status"] == "ok" and p["sessions_pruned"] == 2 and p["messages_pruned"] == 403, p["error"]
    assert "big" not in {k["session"] for k in p["sessions_kept"]}
    assert rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = 'big'") == [(0,)]
    assert fence.retired(sqlite3.connect(str(db)), ["big"]) == ["big"]
    assert rows(db, "SELECT COUNT(*) FROM session_admissions WHERE target_session_id = 'big'") == [(0,)]
    assert not (home / ("state.db" + SLICED_SUFFIX)).exists() and not os.path.exists(listed["big"]["archive"])


def test_a_fence_that_changed_since_its_listing_refuses_the_first_slice(home, tmp_path):
    """Between the list (what big's fence changes) and its first slice, the gateway changes big's API
    settings (a row its fence removes): the list would not put that value back, so the first slice
    is refused, big stays whole and unfenced, and no list is left."""
    db = home / "state.db"
    archive = tmp_path / "big-archive.db"

    def keep_copy(order, counts):
        archive.write_bytes(b"")  # a stand-in path: this run puts nothing back from it
        gateway = sqlite3.connect(str(db))
        bound = "UPDATE state_meta SET value = 'conv-2' WHERE key = 'gateway.api.settings.v1.big'"
        assert gateway.execute(bound).rowcount == 1
        gateway.commit()
        gateway.close()
        return str(archive), True

    before = snapshot(db, "big")
    conn, schema, plan = planned(home)
    try:
        result = prune(conn, plan, schema, batch_size=BATCH, pause=0, result=PruneResult(), keep_copy=keep_copy)
    finally:
        conn.close()
    assert [(r["session"], r["by"]) for r in result.refused] == [("big", "the deletion fence")]
    assert "its fence changed between its listing and its first slice" in result.refused[0]["message"]
    after = snapshot(db, "big")
    assert ("gateway.api.settings.v1.big", "conv-2") in after["state_meta"]
    assert [row for row in after["state_meta"] if row[1] != "conv-2"] == [
        row for row in before["state_meta"] if row[0] != "gateway.api.settings.v1.big"
    ]
    after.pop("state_meta"), before.pop("state_meta")
    assert after == before
    assert not (home / ("state.db" + SLICED_SUFFIX)).exists() and not archive.exists()
