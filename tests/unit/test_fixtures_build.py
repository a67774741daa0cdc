"""Checks of the test-data builders in tests/lib/hermes_fixtures.py (not of the engine)."""

import hashlib
import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

import hermes_fixtures as hf  # noqa: E402

NOW = time.time()


def _need(layout):
    if not hf.layout_available(layout):
        pytest.skip(hf.missing_venv_message(layout))


def _reader_release(layout):
    """The real release used to open a file of ``layout``."""
    if layout.startswith("hermes-") or layout in hf.UPGRADES:
        return hf.release_for(layout)
    # v2: the oldest release migrates it the way a real upgrade would;
    # v30: no v30 release on PyPI, the newest one must still cope with the file.
    order = ("hermes-0.13.0", "hermes-0.19.0") if layout == "v2" else ("hermes-0.19.0",)
    for rel in order:
        if hf.layout_available(rel):
            return rel
    pytest.skip("no Hermes release venv to open a %s file; run tests/setup_hermes_venvs.sh" % layout)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(layout):
        if layout not in cache:
            _need(layout)
            home = tmp_path_factory.mktemp(layout.replace(".", "_"))
            specs, expected = hf.standard_scenario(layout)
            db = hf.build_home(home, layout, specs, now=NOW)
            cache[layout] = (home, db, specs, expected)
        return cache[layout]

    return get


def _objects(conn, kind):
    return {r[0]: (r[1] or "") for r in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = ?", (kind,))}


@pytest.mark.parametrize("layout", hf.LAYOUTS)
def test_layout_schema_and_fts(built, layout):
    home, db, specs, _expected = built(layout)
    feats = hf.LAYOUT_FEATURES[layout]
    assert db == home / "state.db"
    conn = sqlite3.connect(str(db))
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(feats["schema_version"],)]
        tables = _objects(conn, "table")
        triggers = _objects(conn, "trigger")
        views = _objects(conn, "view")
        for name in hf.LAYOUT_FTS_TABLES[feats["fts"]]:
            assert name in tables, name
        for name in hf.LAYOUT_FTS_TRIGGERS[feats["fts"]]:
            assert name in triggers, name
        fts_sql = tables["messages_fts"].replace('"', "'")
        if feats["fts"] == "external":
            assert "content=messages" in fts_sql.replace(" ", "")
            assert "'delete'" in triggers["messages_fts_delete"]
            assert "messages_fts_trigram" not in tables
        elif feats["fts"] == "mixed":  # 0.20.1: messages_fts on messages, the trigram index over a view
            assert "content='messages'" in fts_sql
            assert "content='messages_fts_trigram_src'" in tables["messages_fts_trigram"]
            assert "messages_fts_trigram_src" in views
            assert "'delete'" in triggers["messages_fts_delete"]
        elif feats["fts"] == "inline":
            assert "content=" not in fts_sql.replace(" ", "")
            assert "DELETE FROM messages_fts WHERE rowid = old.id" in triggers["messages_fts_delete"]
            assert "trigram" in tables["messages_fts_trigram"]
        else:
            assert "content='messages_fts_src'" in fts_sql
            assert "content='messages_fts_trigram_src'" in tables["messages_fts_trigram"]
            assert {"messages_fts_src", "messages_fts_trigram_src"} <= set(views)
            assert "'delete'" in triggers["messages_fts_delete"]
        for col, table in (("pinned", "sessions"), ("last_activity_at", "sessions"), ("archived", "sessions")):
            cols = {r[1] for r in conn.execute("PRAGMA table_info(%s)" % table)}
            want = {
                "pinned": feats["pinned"],
                "last_activity_at": feats["last_activity"],
                "archived": feats["archived"],
            }[col]
            assert (col in cols) == bool(want), col
        assert ("compression_locks" in tables) == feats["compression_locks"]
        assert ("session_turn_leases" in tables) == feats["turn_leases"]
        assert ("system_prompts" in tables) == feats["system_prompts"]
        if feats["application_id"]:
            assert conn.execute("PRAGMA application_id").fetchone()[0] != 0
            fks = conn.execute("PRAGMA foreign_key_list(session_model_usage)").fetchall()
            assert any(r[2] == "sessions" and r[6] == "CASCADE" for r in fks)

        # every spec became a row with its messages; the triggers filled the indexes
        n_msgs = sum(int(s.get("messages", 2)) for s in specs)
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == len(specs)
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == n_msgs
        hits = conn.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'zebra'").fetchone()[0]
        assert hits == n_msgs
        for name in hf.LAYOUT_FTS_TABLES[feats["fts"]]:
            conn.execute("INSERT INTO %s(%s) VALUES('integrity-check')" % (name, name))
        counts = dict(conn.execute("SELECT id, message_count FROM sessions"))
        for s in specs:
            assert counts[s["id"]] == int(s.get("messages", 2)), s["id"]
    finally:
        conn.close()


@pytest.mark.parametrize("layout", hf.LAYOUTS)
def test_times_and_markers(built, layout):
    _home, db, specs, _expected = built(layout)
    conn = sqlite3.connect(str(db))
    conn.row_factory = sqlite3.Row
    try:
        rows = {r["id"]: r for r in conn.execute("SELECT * FROM sessions")}
        for s in specs:
            r = rows[s["id"]]
            bad = s.get("bad_time")
            if bad == "iso":
                assert isinstance(r["started_at"], str)
            elif bad == "ms":
                assert r["started_at"] > NOW * 100
            else:
                assert abs(r["started_at"] - (NOW - s["started_days_ago"] * hf.DAY)) < 1e-3
            if s.get("ended_days_ago") is None:
                assert r["ended_at"] is None and r["end_reason"] is None
            else:
                assert abs(r["ended_at"] - (NOW - s["ended_days_ago"] * hf.DAY)) < 1e-3
                assert r["end_reason"] == (s.get("end_reason") or "user_exit")
            assert r["parent_session_id"] == s.get("parent")
            if s.get("delegate"):
                assert json.loads(r["model_config"])["_delegate_from"] == s["parent"]
            newest = conn.execute("SELECT max(timestamp) FROM messages WHERE session_id = ?", (s["id"],)).fetchone()[0]
            if s.get("last_message_days_ago") is not None and bad != "msg_ms":
                assert abs(newest - (NOW - s["last_message_days_ago"] * hf.DAY)) < 1e-3
            if bad == "msg_ms":
                assert newest > NOW * 100
            if s.get("pinned"):
                assert r["pinned"] == 1
            if s.get("lease") == "compression":
                exp = conn.execute(
                    "SELECT expires_at FROM compression_locks WHERE session_id = ?", (s["id"],)
                ).fetchone()[0]
                assert exp > time.time()
            if s.get("lease") == "turn":
                exp = conn.execute(
                    "SELECT expires_at FROM session_turn_leases WHERE conversation_id = ?", (s["id"],)
                ).fetchone()[0]
                assert exp > time.time()
    finally:
        conn.close()


@pytest.mark.releases
@pytest.mark.parametrize("layout", hf.LAYOUTS)
def test_real_release_opens_built_file(built, layout, tmp_path):
    _home, db, specs, _expected = built(layout)
    release = _reader_release(layout)
    copy = hf.copy_db(db, tmp_path / "state.db")  # a release may migrate on open
    seen = hf.open_with_release(release, copy, "zebra")
    assert set(seen["sessions"]) >= {s["id"] for s in specs}
    assert seen["hits"] > 0


@pytest.mark.parametrize("layout", hf.LAYOUTS)
def test_standard_scenario_is_consistent(layout):
    specs, exp = hf.standard_scenario(layout)
    feats = hf.LAYOUT_FEATURES[hf.writer_of(layout)]
    hf._validate_specs(layout, specs)  # only features the layout supports
    by_id = {s["id"]: s for s in specs}
    ids = set(by_id)
    assert len(ids) == len(specs)
    assert exp["kept"] == ids - exp["pruned"]
    assert exp["pruned"] <= ids and exp["zombies"] <= ids and exp["orphaned"] <= exp["kept"]
    assert exp["bad_time"] <= exp["kept"]
    for z in exp["zombies"]:
        s = by_id[z]
        assert s.get("ended_days_ago") is None
        assert s.get("source", "cli") in hf.DEFAULT_ZOMBIE_SOURCES
        assert not s.get("pinned") and not s.get("lease")
    for sid in exp["pruned"]:
        s = by_id[sid]
        assert s.get("ended_days_ago") is not None or sid in exp["zombies"]
        if s.get("delegate"):
            assert s["parent"] in exp["pruned"]
        assert not s.get("pinned") and not s.get("lease") and not s.get("bad_time")
    for sid in exp["orphaned"]:
        assert by_id[sid]["parent"] in exp["pruned"]
    for s in specs:  # every pruned parent's surviving child is orphaned
        if s.get("parent") in exp["pruned"] and s["id"] not in exp["pruned"]:
            assert s["id"] in exp["orphaned"]
    # messaging sessions are never zombies
    assert "open-telegram-idle" in exp["kept"] and "open-telegram-idle" not in exp["zombies"]
    assert {"old-zombie"} <= exp["zombies"] & exp["pruned"]
    assert {"chain-recent-root", "chain-recent-cont"} <= exp["kept"]
    assert {"chain-old-root", "chain-old-mid", "chain-old-tip"} <= exp["pruned"]
    assert exp["messages_pruned"] == sum(int(by_id[i].get("messages", 2)) for i in exp["pruned"])
    assert exp["transcripts_removed"] == 3 * sum(1 for i in exp["pruned"] if by_id[i].get("transcripts"))
    assert exp["bad_time_rows"] == len(exp["bad_time"]) > 0
    if feats["delegate"]:
        assert "deleg-child" in exp["pruned"]
    if feats["pinned"]:
        assert {"pinned-old", "pinned-root", "pinned-cont"} <= exp["kept"]
    if feats["system_prompts"] or hf.LAYOUT_FEATURES[layout]["system_prompts"]:
        assert exp["prompts_collected"] > 0
    else:
        assert exp["prompts_collected"] == 0


def test_profile_and_transcripts(tmp_path):
    specs = [
        {"id": "a", "started_days_ago": 10, "ended_days_ago": 9, "transcripts": True},
        {"id": "b", "started_days_ago": 1},
    ]
    db = hf.build_home(tmp_path, "v30", specs, now=NOW, profile="work")
    assert db == tmp_path / "profiles" / "work" / "state.db"
    for p in hf.transcript_files(tmp_path, "a", profile="work"):
        assert p.is_file(), p
    assert not any(p.exists() for p in hf.transcript_files(tmp_path, "b", profile="work"))


def test_unsupported_features_are_refused(tmp_path):
    specs = [
        {"id": "p", "started_days_ago": 3, "ended_days_ago": 2},
        {"id": "c", "parent": "p", "delegate": True, "started_days_ago": 1},
    ]
    with pytest.raises(ValueError):
        hf.build_home(tmp_path / "a", "v2", specs)
    with pytest.raises(ValueError):
        hf.build_home(tmp_path / "b", "hermes-0.19.0", [{"id": "x", "started_days_ago": 1, "pinned": True}])
    with pytest.raises(ValueError):
        hf.build_home(tmp_path / "c", "v30", [{"id": "c", "parent": "missing", "started_days_ago": 1}])


@pytest.mark.parametrize("layout", ["v2", "v30", "hermes-0.19.0"])
def test_make_big_home_small(layout, tmp_path):
    _need(layout)
    db = hf.make_big_home(tmp_path, layout, 40, 10, old_fraction=0.5, seed=3, now=NOW)
    conn = sqlite3.connect(str(db))
    try:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 40
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 400
        old = conn.execute("SELECT count(*) FROM sessions WHERE ended_at < ?", (NOW - 8 * hf.DAY + 1,)).fetchone()[0]
        assert old == 20
        assert conn.execute("SELECT count(*) FROM messages_fts").fetchone()[0] == 400
        assert (
            conn.execute("SELECT version FROM schema_version").fetchone()[0]
            == hf.LAYOUT_FEATURES[layout]["schema_version"]
        )
    finally:
        conn.close()


# sha256 of the catalogue (type, name, tbl_name, sql, in creation order) the fixture DDL
# creates: v30's is upstream's SCHEMA_SQL / FTS_SQL / FTS_TRIGRAM_SQL at the commit v30.sql
# names, expanded; the DDL is composed from shared clauses, and this pins that the result
# stays the same to the byte.
SCHEMA_CATALOGUE_SHA256 = {
    "v2": "af958788632fbd03539042e6611d8d3fe9fc863744c6aac2810da95f28571a8f",
    "v30": "cd94c04f7fbbe33d07dec174bf66252bb65253f599e95f7f488e065b5fc86d7e",
}


@pytest.mark.parametrize("layout", sorted(SCHEMA_CATALOGUE_SHA256))
def test_composed_schema_is_the_pinned_catalogue(layout):
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(hf.schema_sql(layout))
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid").fetchall()
    finally:
        conn.close()
    assert "{" not in hf.schema_sql(layout), "a clause of the template was left unfilled"
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == SCHEMA_CATALOGUE_SHA256[layout]
