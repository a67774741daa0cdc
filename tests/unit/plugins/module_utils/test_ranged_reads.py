"""Ranged reads sized by their own time (``ranged_rows``): beside a rollback-journal gateway each
read statement blocks its commits while it runs, and the same rowid range costs a few ms on a file
in the OS cache and hundreds on a 5 GB one that is not.

On a real 0.22.2 file: the counts by ranges equal COUNT(*); the ranges cover every rowid once; a
slow statement shrinks the next range and fast ones grow it back, at most four times a step,
within the largest size. (A statement cut at the bound and read again in halves: test_storage.py.)
The ends of the rowid range are read from the ends of the b-tree, not by a scan of the table.
"""

import sqlite3

from hermes_markers import release_module_marks
from hermes_rollback import RELEASE, make_big_rollback_home

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import ranged_rows, rowid_span
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.store.schema import count_by_ranges

pytestmark = release_module_marks(RELEASE)
# The range's rows, and a statement made slow while ``slow`` says so (a real one: SQLite computes it).
SQL = (
    "SELECT id FROM messages WHERE id >= ? AND id < ? AND (? = 0 OR "
    "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) SELECT COUNT(*) FROM n) > 0)"
)


def test_ranges_follow_the_statements_time_and_every_row_is_read_once(tmp_path):
    db = make_big_rollback_home(tmp_path / "home", 30, 200, seed=5)
    conn = sqlite3.connect(str(db))
    try:
        total = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        assert count_by_ranges(conn, "messages") == total
        low, top = conn.execute("SELECT MIN(id), MAX(id) FROM messages").fetchone()
        slow = {"on": 1}
        spans, ids = [], []
        reads = ranged_rows(conn, SQL, low, top, first=1000, most=4000, target=0.002, bound=None, args=(slow["on"],))
        for rows in reads:
            ids += [r[0] for r in rows]
            spans.append(len(rows))
            if len(spans) == 2:
                break
        # a slow statement (a 300,000-row recursive count) made the second range smaller than the first
        assert spans[1] < spans[0] == 1000, spans
        rest = ranged_rows(conn, SQL, ids[-1] + 1, top, first=100, most=4000, target=0.05, bound=None, args=(0,))
        sizes = []
        for rows in rest:
            ids += [r[0] for r in rows]
            sizes.append(len(rows))
        # fast statements: each range up to four times the last, never over the most
        assert max(sizes) <= 4000 and max(sizes) > sizes[0], sizes
        assert all(b <= 4 * a for a, b in zip(sizes[:-1], sizes[1:-1])), sizes
        assert ids == sorted(ids) and len(ids) == len(set(ids)) == total  # every row, once

    finally:
        conn.close()


def vm_steps(conn, call):
    """SQLite VM instructions ``call`` runs on ``conn`` (its progress handler, every instruction)."""
    steps = [0]

    def count():
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 1)
    try:
        result = call()
    finally:
        conn.set_progress_handler(None, 0)
    return result, steps[0]


def test_the_ends_of_the_rowid_range_are_read_without_a_scan(tmp_path):
    db = make_big_rollback_home(tmp_path / "home", 30, 200, seed=5)
    conn = sqlite3.connect(str(db))
    try:
        both = "SELECT MIN(id), MAX(id) FROM messages"
        expected, scan_steps = vm_steps(conn, lambda: conn.execute(both).fetchone())
        span, steps = vm_steps(conn, lambda: rowid_span(conn, "messages"))
        assert span == expected and span[0] < span[1]
        total = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        assert scan_steps > total  # one statement for both ends visits every row
        assert steps < 100  # one end of the b-tree each, whatever the table's size
        conn.execute("CREATE TABLE empty (x)")
        assert rowid_span(conn, "empty") == (None, None)
    finally:
        conn.close()
