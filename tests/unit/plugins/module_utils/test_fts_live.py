# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""FTS5's optimize beside a live writer: after a prune beside a real release's writer, each FTS index
ends no larger than 1.1x the same run's on a twin copy nobody holds, with the same number of FTS5
levels, in steps that keep within the prune's bound; a run with nothing to prune leaves the index
alone. On a 0.22.2 file in rollback-journal mode and on a 0.19.0 file in WAL mode, both as the
releases write them."""

import os
import sqlite3
import time

import pytest
from hermes_markers import release_module_marks
from hermes_reliability import db_problems
from hermes_rollback import RELEASE as ROLLBACK_RELEASE
from hermes_rollback import make_big_rollback_home
from hermes_writer import WriterProcess

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.prune import hard_bound, turn_after_commit
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.reclaim import fts_optimize_live
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.plan.estimate import read_index_levels
from hermes_fixtures import copy_db, hermes_python, make_big_home

WAL_RELEASE = "0.19.0"
INDEXES = ("messages_fts", "messages_fts_trigram")
SIZE = (500, 60)  # sessions, messages each: half of them ended 8..90 days ago, which prune_days 7 takes
STEP_LIMIT = 0.25  # seconds a step may hold the write lock, its COMMIT included: the prune's promise

pytestmark = [pytest.mark.slow, pytest.mark.releases, pytest.mark.timing]


def releases():
    return [  # each with the skip where its venv is missing
        pytest.param(release, marks=release_module_marks(release)[2:], id=release)
        for release in (ROLLBACK_RELEASE, WAL_RELEASE)
    ]


def build(release, home):
    """A state.db as ``release`` writes it: 0.22.2 in rollback-journal mode, 0.19.0 in WAL mode."""
    if release == ROLLBACK_RELEASE:
        return str(make_big_rollback_home(home, SIZE[0], SIZE[1], seed=7))
    db = str(make_big_home(str(home), "hermes-" + release, SIZE[0], SIZE[1], old_fraction=0.5, seed=7))
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db


def index_state(db):
    """{index: (bytes of its segments, FTS5 levels)}."""
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=30)
    try:
        return {
            name: (
                conn.execute("SELECT SUM(LENGTH(block)) FROM %s_data" % name).fetchone()[0],
                len(read_index_levels(conn, name)),
            )
            for name in INDEXES
        }
    finally:
        conn.close()


def twin_of(db, tmp_path):
    twin = tmp_path / "twin"
    twin.mkdir()
    return str(copy_db(db, twin / "state.db"))


@pytest.mark.parametrize("release", releases())
def test_a_prune_beside_a_writer_leaves_each_fts_index_as_small_as_a_run_with_no_holder(release, tmp_path):
    db = build(release, tmp_path / "home")
    twin = twin_of(db, tmp_path)
    options = dict(allow_unknown_schema=True, prune_days=7, vacuum_mode="never")
    levels_before = {name: levels for name, (_bytes, levels) in index_state(db).items()}
    writer = WriterProcess(hermes_python(release), db, str(tmp_path / "writer.jsonl"), prefix="fts-live")
    writer.start()
    try:
        time.sleep(0.5)
        predicted = run_maintenance(dict(options, hermes_home=[os.path.dirname(db)]), check_mode=True)["profiles"][0]
        live = run_maintenance(dict(options, hermes_home=[os.path.dirname(db)]))["profiles"][0]
        again = run_maintenance(dict(options, hermes_home=[os.path.dirname(db)]))["profiles"][0]
        time.sleep(0.3)
        summary = writer.stop()
    finally:
        writer.kill()
    alone_predicted = run_maintenance(dict(options, hermes_home=[os.path.dirname(twin)]), check_mode=True)
    alone = run_maintenance(dict(options, hermes_home=[os.path.dirname(twin)]))["profiles"][0]
    assert live["status"] == alone["status"] == "ok", (live["error"], alone["error"])
    assert live["sessions_pruned"] == alone["sessions_pruned"] > 0
    assert summary["failed"] == 0 and summary["appended"] == summary["message_count_seen"], summary
    # one plan, whoever holds the file: check mode predicts what it predicts with no holder (give or take
    # the pages of what the writer appended between the two)
    live_pages = predicted["reclaim"]["free_pages_predicted"]
    alone_pages = alone_predicted["profiles"][0]["reclaim"]["free_pages_predicted"]
    assert abs(live_pages - alone_pages) <= 0.01 * alone_pages, (live_pages, alone_pages)
    after, alone_after = index_state(db), index_state(twin)
    for name in INDEXES:
        (size, levels), (alone_size, alone_levels) = after[name], alone_after[name]
        assert size <= 1.1 * alone_size, (name, size, alone_size)
        # the optimize's two levels, as with no holder, never one a step (FTS5 stops at 2,000)
        assert levels == alone_levels <= levels_before[name] + 2, (name, levels, alone_levels, levels_before)
    # nothing pruned in the run after it: the index is left as it is
    assert again["sessions_pruned"] == 0 and again["reclaim"]["fts_merge_steps"] == 0
    assert db_problems(db) == []
    print(
        "\n%s beside a writer: FTS %s; with no holder %s; %d optimize steps, the writer's worst append %.0f ms"
        % (release, after, alone_after, live["reclaim"]["fts_merge_steps"], 1000 * summary["max"])
    )


def delete_old_sessions(db, batch=5):
    """What a prune leaves in the FTS indexes: the old sessions deleted in short transactions beside the
    writer, through the release's own delete triggers."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        old = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE ended_at < ?", (time.time() - 7 * 86400,))]
        for first in range(0, len(old), batch):
            ids = old[first : first + batch]
            marks = ",".join("?" * len(ids))
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM messages WHERE session_id IN (%s)" % marks, ids)
            conn.execute("DELETE FROM sessions WHERE id IN (%s)" % marks, ids)
            conn.execute("COMMIT")
            time.sleep(0.02)
        return len(old)
    finally:
        conn.close()


@pytest.mark.parametrize("release", releases())
def test_each_optimize_step_beside_a_writer_holds_the_lock_within_the_bound(release, tmp_path):
    """The prune's bound (batch_time 0.06 s, plus 0.04 s for a rollback-journal COMMIT): each step is
    sized to it at the last step's rate, and one still running at the hard bound is rolled back."""
    db = build(release, tmp_path / "home")
    fts = [{"name": name, "error": None} for name in INDEXES]
    writer = WriterProcess(hermes_python(release), db, str(tmp_path / "writer.jsonl"), prefix="fts-steps")
    held = []
    writer.start()
    try:
        assert delete_old_sessions(db) > 0
        conn = sqlite3.connect(db, timeout=30, isolation_level=None)
        try:
            bound = 0.06 + (0.0 if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal" else 0.04)
            turn = turn_after_commit(conn, 0.05)

            def wait(took, paused=None):
                held.append(took)
                turn(took, paused)

            steps, stopped = fts_optimize_live(conn, fts, wait, bound=bound)
            levels = {name: read_index_levels(conn, name) for name in INDEXES}
        finally:
            conn.close()
        summary = writer.stop()
    finally:
        writer.kill()
    assert summary["failed"] == 0, summary
    # every step, and every one cut at the hard bound, gives the writer its turn
    assert stopped == [] and len(held) >= steps >= len(INDEXES), (steps, stopped)
    assert max(held) < max(STEP_LIMIT, hard_bound(bound)), sorted(held)[-5:]
    for name, index in levels.items():  # finished: no merge under way, the writer's new segments aside
        assert not any(merging for merging, _leaves in index), (name, index)
    assert db_problems(db) == []
    print("\n%s: %d optimize steps beside a writer, the longest %.0f ms" % (release, steps, 1000 * max(held)))
