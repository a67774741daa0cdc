# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""FTS5's automatic merging held back inside a prune transaction, on files the real 0.22.2 builds:
the transaction merges no level of fewer than 8 segments, no other connection ever reads the
setting changed, a rolled-back transaction leaves it as it was, an index that merges less already
is left alone, and a whole prune in many transactions leaves each index's ``_config`` exactly as
Hermes wrote it and intact. What it is for (the prune's rows/s, the gateway's stalls) is measured
by ``make bench-rollback``."""

import sqlite3
import time

import pytest
from hermes_reliability import db_problems

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import (
    fts_automerge_held_back,
    open_rw,
    write_transaction,
)
from hermes_fixtures import copy_db, hermes_python, make_big_home

RELEASE = "hermes-0.22.2.post1"
INDEXES = ["messages_fts", "messages_fts_trigram"]

pytestmark = [
    pytest.mark.releases,
    pytest.mark.skipif(hermes_python(RELEASE) is None, reason="no %s venv (tests/setup_hermes_venvs.sh)" % RELEASE),
]


@pytest.fixture(scope="module")
def big_db(tmp_path_factory):
    """300 sessions of 30 messages, half of them ended 8 to 90 days ago, inserted through 0.22.2's
    own FTS triggers, each index then optimized."""
    home = tmp_path_factory.mktemp("fts-merge")
    db = str(make_big_home(str(home), RELEASE, n_sessions=300, msgs_per_session=30, now=time.time()))
    conn = sqlite3.connect(db)
    for index in INDEXES:  # one segment each, as our run leaves them: the bulk insert left 8 and 10 on level 0
        conn.execute('INSERT INTO "%s"("%s") VALUES (\'optimize\')' % (index, index))
    conn.commit()
    conn.close()
    return db


def copy_of(big_db, path):
    copy_db(big_db, path)
    return str(path)


def segments(conn, index):
    return {row[0] for row in conn.execute('SELECT DISTINCT segid FROM "%s_idx"' % index)}


def config(conn, index):
    return sorted(conn.execute('SELECT k, v FROM "%s_config"' % index).fetchall())


def delete_sessions(conn, sids, group=20):
    """As the prune deletes: a group of sessions a statement, so FTS5 writes a segment out at each."""
    for start in range(0, len(sids), group):
        part = sids[start : start + group]
        marks = ",".join("?" * len(part))
        conn.execute("DELETE FROM messages WHERE session_id IN (%s)" % marks, part)
        conn.execute("DELETE FROM sessions WHERE id IN (%s)" % marks, part)


def first_sessions(conn, n=200):
    return [row[0] for row in conn.execute("SELECT id FROM sessions ORDER BY id LIMIT ?", (n,))]


def test_a_transaction_with_automerge_held_back_merges_no_level_of_fewer_than_8_segments(big_db, tmp_path):
    db = copy_of(big_db, tmp_path / "state.db")
    conn = open_rw(db)
    before = {index: segments(conn, index) for index in INDEXES}
    configs = {index: config(conn, index) for index in INDEXES}
    with write_transaction(conn), fts_automerge_held_back(conn, INDEXES):
        delete_sessions(conn, first_sessions(conn, 150), group=25)  # 6 segments on level 0 of each
    after = {index: segments(conn, index) for index in INDEXES}
    assert {index: before[index] - after[index] for index in INDEXES} == {index: set() for index in INDEXES}
    assert all(len(after[index]) > len(before[index]) for index in INDEXES)  # its deletes are new segments
    assert {index: config(conn, index) for index in INDEXES} == configs
    for index in INDEXES:
        conn.execute('INSERT INTO "%s"("%s") VALUES (\'integrity-check\')' % (index, index))
    conn.close()
    assert db_problems(db) == []


def test_no_other_connection_reads_the_setting_changed(big_db, tmp_path):
    db = copy_of(big_db, tmp_path / "state.db")
    setup = sqlite3.connect(db, isolation_level=None)
    assert setup.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)  # a reader beside the writer
    setup.close()
    conn, reader = open_rw(db), sqlite3.connect(db, isolation_level=None)
    seen = []
    with write_transaction(conn), fts_automerge_held_back(conn, INDEXES):
        assert conn.execute("SELECT v FROM messages_fts_config WHERE k = 'automerge'").fetchone() == (8,)
        delete_sessions(conn, first_sessions(conn, 40))
        seen = [config(reader, index) for index in INDEXES]
    assert seen == [[("version", 4)], [("version", 4)]]
    assert [config(reader, index) for index in INDEXES] == [[("version", 4)], [("version", 4)]]
    conn.close()
    reader.close()


def test_a_rolled_back_transaction_leaves_the_setting_as_it_was(big_db, tmp_path):
    db = copy_of(big_db, tmp_path / "state.db")
    conn = open_rw(db)
    conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('automerge', 2)")  # a file that set its own
    sids = first_sessions(conn)
    with (
        pytest.raises(RuntimeError, match="a step after the deletes"),
        write_transaction(conn),
        fts_automerge_held_back(conn, INDEXES),
    ):
        delete_sessions(conn, sids)
        raise RuntimeError("a step after the deletes failed")
    assert config(conn, "messages_fts") == [("automerge", 2), ("version", 4)]
    assert config(conn, "messages_fts_trigram") == [("version", 4)]
    assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone() == (300,)
    with write_transaction(conn), fts_automerge_held_back(conn, INDEXES):  # and one that commits keeps the 2
        delete_sessions(conn, sids)
    assert config(conn, "messages_fts") == [("automerge", 2), ("version", 4)]
    conn.close()
    assert db_problems(db) == []


def assert_own_value_left_alone(conn, own):
    """messages_fts keeps ``own`` inside a held-back prune transaction and after it; the trigram index is held at 8."""
    with write_transaction(conn), fts_automerge_held_back(conn, INDEXES):
        inside = [config(conn, index) for index in INDEXES]
        delete_sessions(conn, first_sessions(conn, 20))
    assert inside == [[("automerge", own), ("version", 4)], [("automerge", 8), ("version", 4)]]
    assert [config(conn, index) for index in INDEXES] == [[("automerge", own), ("version", 4)], [("version", 4)]]


@pytest.mark.parametrize("own", [0, 10])
def test_an_index_that_merges_less_already_is_left_as_it_is(big_db, tmp_path, own):
    conn = open_rw(copy_of(big_db, tmp_path / "state.db"))
    conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('automerge', ?)", (own,))
    assert_own_value_left_alone(conn, own)
    conn.close()


@pytest.mark.parametrize("own", ["abc", 2.5, b"\x02", "99999999999"])
def test_a_value_fts5_cannot_read_as_an_integer_is_left_as_it_is(big_db, tmp_path, own):
    """A hand-edited ``automerge`` FTS5 ignores (it merges as by default): neither an error nor a rewrite."""
    db = copy_of(big_db, tmp_path / "state.db")
    conn = open_rw(db)
    conn.execute("INSERT INTO messages_fts_config(k, v) VALUES ('automerge', ?)", (own,))
    assert_own_value_left_alone(conn, own)
    conn.close()
    assert db_problems(db) == []


def test_a_value_written_as_text_is_held_and_written_back_as_text(big_db, tmp_path):
    conn = open_rw(copy_of(big_db, tmp_path / "state.db"))
    conn.execute("INSERT INTO messages_fts_config(k, v) VALUES ('automerge', '3')")
    with write_transaction(conn), fts_automerge_held_back(conn, INDEXES):
        inside = config(conn, "messages_fts")
        delete_sessions(conn, first_sessions(conn, 20))
    assert inside == [("automerge", 8), ("version", 4)]
    stored = conn.execute("SELECT v, typeof(v) FROM messages_fts_config WHERE k = 'automerge'").fetchone()
    assert stored == ("3", "text")
    conn.close()


def test_outside_a_transaction_it_refuses(big_db, tmp_path):
    conn = open_rw(copy_of(big_db, tmp_path / "state.db"))
    with pytest.raises(RuntimeError, match="write transaction"), fts_automerge_held_back(conn, INDEXES):
        pass
    conn.close()


def test_a_prune_in_many_transactions_leaves_the_fts_config_as_hermes_wrote_it(big_db, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    db = copy_of(big_db, home / "state.db")
    conn = sqlite3.connect(db)
    configs = {index: config(conn, index) for index in INDEXES}
    messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    conn.close()
    result = run_maintenance(
        {
            "hermes_home": [str(home)],
            "prune_days": 7,
            "batch_size": 300,
            "backup": False,
            "vacuum_mode": "never",
            "allow_unknown_schema": True,
        }  # fmt: skip
    )
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["messages_pruned"] > 3000  # about half of 9,000, in transactions of at most 300
    conn = sqlite3.connect(db)
    assert {index: config(conn, index) for index in INDEXES} == configs
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == messages - profile["messages_pruned"]
    for index in INDEXES:
        conn.execute('INSERT INTO "%s"("%s") VALUES (\'integrity-check\')' % (index, index))
    conn.close()
    assert db_problems(db) == []
