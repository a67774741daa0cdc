# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""FTS5's automatic merging held back for the length of one write transaction.

Every write transaction that changes an FTS5 index writes its pending changes out as a new
segment, and FTS5 then does merge work in that same transaction on any level of the index that
has ``automerge`` segments (4 unless the file says otherwise: sqlite.org/fts5.html). A prune cut
into short transactions paid that in each of them, also on the large old levels its new segments
tipped to 4, and the optimize after the prune merges every level again anyway: on a 0.22.2 file of
200,000 messages, 100,000 deleted in 25 transactions took 2.0-2.5 s, against 1.6-1.9 s with
merging held back and 1.6 s for the release's own prune in one transaction.

Held back, not off: inside our transaction ``automerge`` is HELD_AUTOMERGE (8). With it off, our
segments piled up on level 0 to 15 between commits, one short of FTS5's ``crisismerge`` (16), whose
merge takes the whole level at once, in whichever transaction writes the 16th segment: beside a
prune of 800,000 messages one of the gateway's appends took 727 ms. With ``crisismerge`` held at 8
as well, one of our own transactions held the lock 704 ms. At 8 the merge stays FTS5's bounded,
incremental one (worst append 248 ms there).

The setting is Hermes's, stored in the index's ``_config`` table: it is changed after BEGIN and
put back, as it was, in the same transaction before COMMIT, so that no other connection ever
reads it changed and a transaction rolled back (an interrupt, a crash) rolls it back too.
Putting it back is itself a write to the index, so FTS5 writes the pending segment out just
before it, with the held value; the COMMIT then has nothing left to write.

Standard library only, Python 3.8+, no Ansible imports.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence

AUTOMERGE = "automerge"
HELD_AUTOMERGE = 8  # a level's segments before FTS5 merges it, inside our transaction
FTS5_DEFAULT_AUTOMERGE = 4  # where _config has no automerge row (0: the index never merges by itself)


def _quoted(name: str) -> str:
    return '"%s"' % name.replace('"', '""')


def _stored(conn: sqlite3.Connection, table: str, key: str) -> int | None:
    """The index's stored value of ``key``, None where it keeps FTS5's default."""
    row = conn.execute("SELECT v FROM %s WHERE k = ?" % _quoted(table + "_config"), (key,)).fetchone()
    return None if row is None else int(row[0])


def _set(conn: sqlite3.Connection, table: str, key: str, value: int) -> None:
    name = _quoted(table)
    conn.execute("INSERT INTO %s(%s, rank) VALUES(?, ?)" % (name, name), (key, value))


@contextlib.contextmanager
def automerge_held_off(conn: sqlite3.Connection, tables: Sequence[str]) -> Iterator[None]:
    """Inside a write transaction: ``tables`` (FTS5 indexes this connection can open) merge only
    levels of at least HELD_AUTOMERGE segments until the block ends, then have their setting back
    as it was. On an error the block leaves it to the transaction's rollback."""
    if not conn.in_transaction:
        raise RuntimeError("automerge_held_off needs a write transaction already begun")
    changed: list[tuple[str, int | None, int]] = []  # (table, stored, in effect)
    for table in tables:
        stored = _stored(conn, table, AUTOMERGE)
        effect = FTS5_DEFAULT_AUTOMERGE if stored is None else stored
        if 0 < effect < HELD_AUTOMERGE:  # an index that merges less already is left as it is
            changed.append((table, stored, effect))
            _set(conn, table, AUTOMERGE, HELD_AUTOMERGE)
    yield
    for table, stored, _effect in changed:
        _set(conn, table, AUTOMERGE, FTS5_DEFAULT_AUTOMERGE if stored is None else stored)
        if stored is None:  # FTS5's default again, as a missing row says it: the file as Hermes left it
            conn.execute("DELETE FROM %s WHERE k = ?" % _quoted(table + "_config"), (AUTOMERGE,))
