# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""While the live FTS optimize runs beside a gateway, the gateway's appends leave its merge alone:
FTS5's automerge is paused in every connection for that time and put back after it, exactly as it
was; a run killed midway leaves a mark the next run recognises, reports in check mode and puts
back; an index that has an automerge setting of its own is never touched. On files that Hermes
0.22.2 builds, beside its own SessionDB appending every 20 ms."""

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from hermes_markers import release_module_marks
from hermes_reliability import db_problems
from hermes_rollback import RELEASE, make_big_rollback_home
from hermes_writer import WriterProcess

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.plan.estimate import read_index_levels
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import fts_automerge_paused
from hermes_fixtures import copy_db, hermes_python

INDEX = "messages_fts_trigram"
OTHER = "messages_fts"
SIZE = (300, 60)  # sessions, messages each: an index of several segments, a merge of many pages
APPENDS = 150  # the writer's appends while the merge is under way: two automerge turns at least (one per 64 leaves)

pytestmark = release_module_marks(RELEASE)


def config(db, table):
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT k, v, typeof(v) FROM %s_config ORDER BY k" % table).fetchall()
    finally:
        conn.close()


def merge_under_way(conn, table):
    """The levels of the merge under way: the one it reads (its input segments, how many it is
    merging) and the one above, which it writes; each as (segments merging, leaves of each segment).
    None: no merge under way."""
    levels = read_index_levels(conn, table)
    for number, (merging, _leaves) in enumerate(levels):
        if merging:
            return levels[number : number + 2]
    return None


def appends_beside(db, tmp_path, name):
    """The real release's SessionDB appends APPENDS messages, one every 20 ms; returns its summary."""
    writer = WriterProcess(hermes_python(RELEASE), db, str(tmp_path / ("%s.jsonl" % name)), prefix=name)
    writer.start()
    try:
        deadline = time.monotonic() + 60
        while writer_appended(tmp_path / ("%s.jsonl" % name)) < APPENDS and time.monotonic() < deadline:
            time.sleep(0.2)
        return writer.stop()
    finally:
        writer.kill()


def writer_appended(path):
    try:
        with open(str(path)) as f:
            return sum(1 for _line in f)
    except FileNotFoundError:
        return 0


def test_the_gateways_appends_leave_the_optimizes_merge_alone_and_the_setting_comes_back_as_it_was(tmp_path):
    db = str(make_big_rollback_home(tmp_path / "home", *SIZE, seed=3))
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    control = str(copy_db(db, control_dir / "state.db"))
    before = config(db, INDEX)
    assert [k for k, _v, _t in before] == ["version"], before  # as Hermes makes it: FTS5's default automerge
    moved = {}
    for path, pause in ((db, fts_automerge_paused), (control, None)):
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            # the optimize's first step: every segment moved to a new top level, a merge under way there
            conn.execute("INSERT INTO %s(%s, rank) VALUES('merge', -16)" % (INDEX, INDEX))
            assert merge_under_way(conn, INDEX), read_index_levels(conn, INDEX)
            with pause(conn, [INDEX]) if pause else contextlib.nullcontext(None) as paused:
                assert paused in ([INDEX], None)
                if paused:  # what every other connection now reads: FTS5's automerge off
                    assert config(path, INDEX) == [("automerge", "00", "text"), ("version", 4, "integer")]
                started = merge_under_way(conn, INDEX)
                summary = appends_beside(path, tmp_path, "paused" if pause else "control")
                moved[path] = (started, merge_under_way(conn, INDEX))
            if pause:  # put back, the gateway's appends carry the merge on again
                again = appends_beside(path, tmp_path, "resumed")
                assert again["failed"] == 0 and merge_under_way(conn, INDEX) != moved[path][1]
        finally:
            conn.close()
        assert summary["failed"] == 0 and summary["appended"] >= 2 * 64, summary  # two automerge turns
    # paused, none of the writer's appends did any of our merge's work; the same appends on a copy
    # with FTS5's automerge on carried it on, or finished it (the negative control)
    paused, control_moved = moved[db], moved[control]
    print("\nthe merge under way before and after %d appends: paused %s; on %s" % (APPENDS, paused, control_moved))
    assert moved[db][0] == moved[db][1], moved[db]
    assert moved[control][0] != moved[control][1], moved[control]
    assert config(db, INDEX) == before  # put back as it was: no automerge row
    assert db_problems(db) == []


CHILD = """
import sqlite3, sys, time
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.reclaim import fts_optimize_live

conn = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)


def wait(_held, _paused=None):  # between two steps, the merge under way: killed here
    print("between steps", flush=True)
    time.sleep(600)


fts_optimize_live(conn, [{"name": name, "error": None} for name in sys.argv[2:]], wait, bound=0.1)
"""


def test_a_run_killed_during_the_optimize_leaves_a_mark_the_next_run_reports_and_puts_back(tmp_path):
    home = tmp_path / "home"
    db = str(make_big_rollback_home(home, *SIZE, seed=5))
    conn = sqlite3.connect(db, isolation_level=None)
    # an index with a setting of its own (0: FTS5 never merges it by itself) is left as it is
    conn.execute("INSERT INTO %s(%s, rank) VALUES('automerge', 0)" % (OTHER, OTHER))
    conn.close()
    before = {name: config(db, name) for name in (INDEX, OTHER)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, db, INDEX, OTHER],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "between steps"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert config(db, INDEX) == [("automerge", "00", "text"), ("version", 4, "integer")]
    assert config(db, OTHER) == before[OTHER]
    # nothing to prune: the mark is all the runs find to do
    options = dict(hermes_home=[str(home)], allow_unknown_schema=True, prune_days=3650, vacuum_mode="never")
    predicted = run_maintenance(options, check_mode=True)["profiles"][0]
    done = run_maintenance(options)["profiles"][0]
    again = run_maintenance(options)["profiles"][0]
    for result in (predicted, done, again):
        assert result["status"] == "ok", result["error"]
    assert predicted["reclaim"]["fts_automerge_restored"] == done["reclaim"]["fts_automerge_restored"] == [INDEX]
    assert predicted["changed"] and done["changed"] and done["sessions_pruned"] == 0
    assert {name: config(db, name) for name in (INDEX, OTHER)} == before
    assert again["reclaim"]["fts_automerge_restored"] == [] and not again["changed"]
    assert db_problems(db) == []


@pytest.mark.parametrize("setting", [0, 4, "4"], ids=["off", "four", "text"])
def test_an_index_with_a_setting_of_its_own_is_not_paused(setting, tmp_path):
    db = str(make_big_rollback_home(tmp_path / "home", 20, 10, seed=1))
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("INSERT INTO %s(%s, rank) VALUES('automerge', ?)" % (INDEX, INDEX), (setting,))
        before = config(db, INDEX)
        with fts_automerge_paused(conn, [INDEX]) as paused:
            assert paused == []
            assert config(db, INDEX) == before
    finally:
        conn.close()
    assert config(db, INDEX) == before
