"""Ranged reads sized by their own time (``timed_ranges``): beside a rollback-journal gateway each
read statement blocks its commits while it runs, and the same rowid range costs a few ms on a file
in the OS cache and hundreds on a 5 GB one that is not.

On a real 0.22.2 file: the counts by ranges equal COUNT(*) whatever the ranges' sizes; the ranges
cover every rowid once; a slow read shrinks the next range and a fast one grows it, at most twice,
within the smallest and largest sizes.
"""

import sqlite3
import time

from hermes_markers import release_module_marks
from hermes_rollback import RELEASE, make_big_rollback_home

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_db import RANGE_MIN, timed_ranges
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_inspect import count_by_ranges

pytestmark = release_module_marks(RELEASE)


def test_counts_by_timed_ranges_equal_count_and_the_ranges_follow_the_reads(tmp_path):
    db = make_big_rollback_home(tmp_path / "home", 30, 200, seed=5)
    conn = sqlite3.connect(str(db))
    try:
        assert count_by_ranges(conn, "messages") == conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        top = conn.execute("SELECT MAX(id) FROM messages").fetchone()[0]
        spans, counted, end_before = [], 0, 1
        for start, end in timed_ranges(1, top, 1000, 4000, target=0.01):
            assert start == end_before, (start, end_before)  # every rowid once
            sql = "SELECT COUNT(*) FROM messages WHERE id >= ? AND id < ?"
            counted += conn.execute(sql, (start, end)).fetchone()[0]
            if len(spans) < 3:
                time.sleep(0.05)  # slow reads: the next range shrinks
            spans.append(end - start)
            end_before = end
        assert end_before > top and counted == conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    finally:
        conn.close()
    assert spans[0] == 1000
    assert spans[1] <= 1000 * 0.01 / 0.05 + 1 and spans[3] <= spans[2] and min(spans) >= RANGE_MIN, spans
    later = spans[3:]
    assert all(b <= 2 * a for a, b in zip(later, later[1:])) and max(spans) <= 4000, spans
    assert max(later) > spans[3], spans  # fast reads: the ranges grow back
