"""The file's own catalogue decides what may be deleted (docs/architecture.md, "The catalogue decides").

On files a real Hermes 0.22.2 wrote: upstream main's gateway runtime ledger (its tables, RESTRICT
foreign keys and delete guard, schema_version still 31), objects this collection does not know,
a delete Hermes's own guard refuses in the middle of a prune, and a home whose sessions live in
PostgreSQL.
"""

import hashlib
import sqlite3
import time

import pytest
from hermes_markers import release_module_marks

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune import PruneResult, prune
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import normalize_options
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.plan.selection import build_plan
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import open_rw
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.catalogue import read_catalogue
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.schema import inspect_schema
from hermes_fixtures import (
    RUNTIME_GUARD,
    add_runtime_ledger,
    build_home,
    older_release_delete,
    open_with_release,
    query_one,
)

LAYOUT = "hermes-0.22.2.post1"
pytestmark = release_module_marks("0.22.2.post1")

OLD = dict(started_days_ago=40, ended_days_ago=39, messages=3)
SPECS = [
    dict(id="plain", **OLD),
    dict(id="settled", **OLD),  # only terminal ledger rows: they are retired, the session goes
    dict(id="queued", **OLD),  # a live admission: Hermes will run it
    dict(id="unknown", **OLD),  # an admission whose outcome Hermes does not know
    dict(id="working", **OLD),  # a running worker execution
    dict(id="recent", started_days_ago=2, ended_days_ago=1),
    dict(id="zombie", started_days_ago=5, messages=2, last_message_days_ago=4),
]
LEDGER = dict(
    admissions=[("settled", "terminal"), ("queued", "queued"), ("unknown", "unknown")],
    workers=[("settled", "terminal"), ("working", "running")],
)
OPTS = {"prune_days": 30, "backup": False}


@pytest.fixture(scope="module")
def release_home(tmp_path_factory):
    """One home the real 0.22.2 wrote, copied for each test."""
    home = tmp_path_factory.mktemp("release")
    build_home(str(home), LAYOUT, SPECS)
    return home


def run(home, check_mode=False, **more):
    result = run_maintenance(dict(OPTS, hermes_home=[str(home)], **more), check_mode=check_mode)
    return result["profiles"][0]


def ids(db):
    return {r[0] for r in sqlite3.connect(str(db)).execute("SELECT id FROM sessions")}


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_runtime_ledger_as_upstream_prunes_it(home):
    """Terminal ledger rows let a session go (retired first); live ones keep it; the guard stays armed."""
    db = add_runtime_ledger(home / "state.db", **LEDGER)
    assert query_one(db, "SELECT version FROM schema_version") == 31  # the same number as 0.22.2
    check = run(home, check_mode=True)
    real = run(home)
    for p in (check, real):
        assert p["status"] == "ok" and p["error"] is None, p["error"]
        assert (p["sessions_pruned"], p["zombies_closed"], p["sessions_refused"]) == (2, 1, [])
        assert p["catalogue"]["runtime_ledger"] and p["catalogue"]["unknown"] == []
        assert "trigger %s on sessions DELETE" % RUNTIME_GUARD in p["catalogue"]["known"]
    assert ids(db) == {"queued", "unknown", "working", "recent", "zombie"}
    assert query_one(db, "SELECT COUNT(*) FROM session_admissions WHERE target_session_id = 'settled'") == 0
    assert query_one(db, "SELECT COUNT(*) FROM worker_executions WHERE session_id = 'settled'") == 0
    assert query_one(db, "SELECT COUNT(*) FROM worker_receipts") == 1  # the running worker's receipt stays
    assert query_one(db, "SELECT COUNT(*) FROM messages WHERE session_id IN ('plain', 'settled')") == 0
    assert query_one(db, "SELECT COUNT(*) FROM sqlite_master WHERE name = '%s'" % RUNTIME_GUARD) == 1
    with pytest.raises(sqlite3.IntegrityError, match="newer Hermes"):
        older_release_delete(db, "queued")  # the guard still refuses an older release's delete
    seen = open_with_release(LAYOUT, db)  # and the release still lists and searches the file
    assert set(seen["sessions"]) == {"queued", "unknown", "working", "recent", "zombie"}


@pytest.mark.parametrize("kind", ["ABORT", "FAIL"])
def test_a_delete_the_guard_refuses_skips_that_session(home, kind):
    """The gateway admits input for a planned session before its transaction: Hermes's guard aborts
    that delete, which is undone alone and named; the rest of the batch commits."""
    db = add_runtime_ledger(home / "state.db")
    conn = sqlite3.connect(str(db))
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (RUNTIME_GUARD,)).fetchone()[0]
    conn.executescript("DROP TRIGGER %s; %s;" % (RUNTIME_GUARD, sql.replace("RAISE(ABORT", "RAISE(%s" % kind)))
    conn.close()
    conn = open_rw(str(db))
    try:
        schema = inspect_schema(conn, str(home))
        schema["catalogue"] = read_catalogue(conn)
        plan = build_plan(
            conn, schema, normalize_options(dict(OPTS, zombie_days=1, zombie_sources=["cli"])), time.time(), None
        )
        assert set(plan.delete_order) == {"plain", "settled", "queued", "unknown", "working"}
        add_runtime_ledger_rows(db, "settled")
        result = prune(conn, plan, schema, batch_size=4000, pause=0, result=PruneResult())
    finally:
        conn.close()
    assert result.sessions == 4 and result.left_alone == {"settled"}
    (refused,) = result.refused
    assert refused["session"] == "settled" and refused["by"] == "trigger %s" % RUNTIME_GUARD
    assert "newer Hermes" in refused["message"]
    assert ids(db) == {"settled", "recent", "zombie"}
    assert query_one(db, "SELECT COUNT(*) FROM messages WHERE session_id = 'settled'") == 3  # nothing of it lost


def add_runtime_ledger_rows(db, sid):
    conn = sqlite3.connect(str(db))
    with conn:
        conn.execute(
            "INSERT INTO session_admissions(admission_id, request_id, principal_id, target_session_id, lineage_json, "
            "payload_json, payload_digest, intent, status, owner_epoch) "
            "VALUES ('late', 'late', 'human', ?, json_array(?), '{}', 'late', 'queue', 'queued', 1)",
            (sid, sid),
        )
    conn.close()


UNKNOWN = {
    "delete trigger": (
        "CREATE TABLE audit(session_id TEXT); CREATE TRIGGER audit_session_delete BEFORE DELETE ON sessions "
        "BEGIN INSERT INTO audit VALUES (OLD.id); END;",
        "trigger audit_session_delete on sessions DELETE",
        {"recent", "plain", "settled", "queued", "unknown", "working", "zombie"},
        1,
    ),
    "update trigger": (
        "CREATE TABLE audit(session_id TEXT); CREATE TRIGGER audit_session_close AFTER UPDATE ON sessions "
        "BEGIN INSERT INTO audit VALUES (NEW.id); END;",
        "trigger audit_session_close on sessions UPDATE",
        {"recent", "plain", "settled", "queued", "unknown", "working", "zombie"},
        0,
    ),
    "cascade trigger": (
        "CREATE TABLE audit(session_id TEXT); CREATE TRIGGER usage_gone AFTER DELETE ON session_model_usage "
        "BEGIN INSERT INTO audit VALUES (OLD.session_id); END;",
        "trigger usage_gone on session_model_usage DELETE",
        {"recent", "plain", "settled", "queued", "unknown", "working", "zombie"},
        1,
    ),
    "trigger name it cannot parse": (
        'CREATE TABLE audit(session_id TEXT); CREATE TRIGGER "audit close" AFTER UPDATE ON sessions '
        "BEGIN INSERT INTO audit VALUES (NEW.id); END;",
        "trigger audit close on sessions an event this engine cannot read",
        {"recent", "plain", "settled", "queued", "unknown", "working", "zombie"},
        0,
    ),
    "foreign key": (
        "CREATE TABLE session_notes(session_id TEXT REFERENCES sessions(id) ON DELETE CASCADE, note TEXT); "
        "INSERT INTO session_notes VALUES ('plain', 'keep me');",
        "foreign key session_notes.session_id -> sessions",
        {"recent", "plain", "zombie"},
        1,
    ),
}


@pytest.mark.parametrize("case", sorted(UNKNOWN))
def test_an_object_it_does_not_know_refuses_what_it_could_affect(home, case):
    ddl, named, kept, zombies = UNKNOWN[case]
    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    conn.executescript(ddl)
    conn.close()
    before = digest(db)
    check = run(home, check_mode=True)
    assert digest(db) == before
    real = run(home)
    for p in (check, real):
        assert p["status"] == "failed" and named in p["error"] and "Upgrade hermes_agent.ops" in p["error"]
        assert p["catalogue"]["unknown"] == [named]
        assert p["zombies_closed"] == zombies
        assert p["sessions_pruned"] == len(SPECS) - len(kept)
    assert ids(db) == kept
    if case == "foreign key":
        assert query_one(db, "SELECT note FROM session_notes") == "keep me"
    else:
        assert query_one(db, "SELECT COUNT(*) FROM audit") == 0  # the trigger never fired


def test_sessions_kept_in_postgres_skip_the_profile_untouched(home):
    (home / "config.yaml").write_text(
        "model: x\ndatabase:\n  # Hermes 0.22+: sessions in PostgreSQL (HERMES_DATABASE_URL)\n  backend: 'postgres'\n"
    )
    db = home / "state.db"
    before, listing = digest(db), sorted(p.name for p in home.iterdir())
    for check_mode in (True, False):
        p = run(home, check_mode=check_mode, backup=True)
        assert p["status"] == "skipped", p
        assert "database.backend: postgres" in p["error"] and str(home / "config.yaml") in p["error"]
        assert p["database_backend"] == {"backend": "postgres", "source": str(home / "config.yaml")}
        assert p["sessions_pruned"] == p["zombies_closed"] == 0
    assert digest(db) == before and sorted(p.name for p in home.iterdir()) == listing  # no lock, no backup
    (info,) = gather_info({"prune_days": 7, "hermes_home": [str(home)]})["profiles"]
    assert info["database_backend"]["backend"] == "postgres" and info["status"] == "ok"
