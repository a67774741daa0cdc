# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a session's delete has changed while it spans several transactions, so that a refusal
appearing between two of them puts the session back exactly as it was.

A session with more messages than ``batch_size`` is deleted in slices, one transaction each, its
fence (on a store with the runtime ledger) in the first and its row in the last. Between two of
them the gateway may resume it, admit new work for it, lease it, or its store's guard may refuse
the final delete. The user's history must then be whole again: Hermes loads it as context.

Temporary triggers of the maintenance connection (no other connection sees them) copy each row
the delete removes or changes, and name each row it adds, into temporary tables, while the
switch row in ``hermes_ops_undo_session`` is on. Those tables take part in each transaction and
savepoint like the file's own, so an interrupted or refused transaction leaves no record of what
it never did. ``put_back`` applies the records in reverse, in the caller's transaction: the
messages return with their ids (Hermes's own triggers index them again), the ledger rows, the
``state_meta`` receipts and routes the fence moved or removed return, the tombstones and the
retired marker go. The archive is not needed for this (a run may take none), and nothing of it
is written to disk beyond SQLite's private temporary files.

A SIGKILL between two slices loses the records with the connection: the session keeps its fence
and its newest messages, and the next run, which plans it again, finishes its delete.

Standard library only, Python 3.8+, no Ansible imports.
"""

from __future__ import annotations

# The tables a session's delete changes before its own row goes (messages, then the fence's).
RECORDED = ("messages", "session_admissions", "worker_executions", "worker_receipts", "state_meta", "gateway_routing")
SWITCH = "temp.hermes_ops_undo_session"


def _quote(name):
    return '"%s"' % name.replace('"', '""')


def _has_rowid(conn, table):
    try:
        conn.execute("SELECT rowid FROM main.%s LIMIT 0" % _quote(table))
        return True
    except Exception:  # a WITHOUT ROWID table: no store of Hermes's has one among RECORDED
        return False


class SessionUndo:
    """The records of one session's delete in progress (at most one at a time: slices of a session
    follow each other in the prune's order)."""

    def __init__(self, conn, tables):
        self.conn = conn
        self.columns = {}
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS hermes_ops_undo_session (session_id TEXT, active INTEGER)")
        for table in RECORDED:
            if table in tables and _has_rowid(conn, table):
                self.columns[table] = [r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))]
                self._record(table)

    def _record(self, table):
        log = "temp.%s" % _quote("hermes_ops_undo_" + table)
        cols = self.columns[table]
        names = ", ".join(_quote(c) for c in cols)
        self.conn.execute(
            "CREATE TEMP TABLE IF NOT EXISTS %s AS SELECT '' AS undo_op, rowid AS undo_rowid, %s FROM main.%s WHERE 0"
            % (log, names, _quote(table))
        )
        # A trigger's statements name tables unqualified: these temporary names are ours alone.
        on = "WHEN EXISTS (SELECT 1 FROM hermes_ops_undo_session WHERE active)"
        for event, op, row in (("INSERT", "insert", None), ("UPDATE", "update", "old"), ("DELETE", "delete", "old")):
            values = "'%s', %s.rowid" % (op, row or "new")
            targets = "undo_op, undo_rowid"
            if row:
                values += ", " + ", ".join("%s.%s" % (row, _quote(c)) for c in cols)
                targets += ", " + names
            self.conn.execute(
                "CREATE TEMP TRIGGER IF NOT EXISTS %s AFTER %s ON main.%s %s BEGIN INSERT INTO %s (%s) VALUES (%s); END"
                % (_quote("hermes_ops_undo_%s_%s" % (table, op)), event, _quote(table), on, log[5:], targets, values)
            )

    def close(self):
        """Drop the temporary triggers and tables (the steps after the prune write messages too)."""
        for table in self.columns:
            for op in ("insert", "update", "delete"):
                self.conn.execute("DROP TRIGGER IF EXISTS temp.%s" % _quote("hermes_ops_undo_%s_%s" % (table, op)))
            self.conn.execute("DROP TABLE IF EXISTS temp.%s" % _quote("hermes_ops_undo_" + table))
        self.conn.execute("DROP TABLE IF EXISTS %s" % SWITCH)

    def recording(self):
        """The session whose delete is in progress (its earlier transactions committed), or None."""
        row = self.conn.execute("SELECT session_id FROM %s" % SWITCH).fetchone()
        return row[0] if row else None

    def start(self, sid):
        self.conn.execute("INSERT INTO %s VALUES (?, 0)" % SWITCH, (sid,))

    def active(self, on):
        """Record (``on``) the statements that follow, or not (another session's in the same transaction)."""
        self.conn.execute("UPDATE %s SET active = ?" % SWITCH, (1 if on else 0,))

    def finish(self):
        """The session is gone whole (or back whole): forget its records, in this transaction."""
        self.conn.execute("DELETE FROM %s" % SWITCH)
        for table in self.columns:
            self.conn.execute("DELETE FROM temp.%s" % _quote("hermes_ops_undo_" + table))

    def put_back(self):
        """Undo every recorded change, newest first, in the caller's transaction; returns the
        number of messages put back."""
        self.active(False)
        back = 0
        for table in reversed(list(self.columns)):  # the fence's changes first, the messages last
            cols = self.columns[table]
            names = ", ".join(_quote(c) for c in cols)
            log = "temp.%s" % _quote("hermes_ops_undo_" + table)
            for row in self.conn.execute(
                "SELECT undo_op, undo_rowid, %s FROM %s ORDER BY rowid DESC" % (names, log)
            ).fetchall():
                op, rowid, values = row[0], row[1], list(row[2:])
                if op == "insert":
                    self.conn.execute("DELETE FROM main.%s WHERE rowid = ?" % _quote(table), (rowid,))
                    continue
                if op == "delete":
                    back += table == "messages"
                    self.conn.execute(
                        "INSERT INTO main.%s (rowid, %s) VALUES (?, %s)"
                        % (_quote(table), names, ", ".join("?" * len(cols))),
                        [rowid] + values,
                    )
                # An update's old values, or what Hermes's insert triggers filled in (0.22.2 sets a
                # message's display_order and message_uid when NULL) set back as they were.
                self.conn.execute(
                    "UPDATE main.%s SET %s WHERE rowid = ? AND NOT (%s)"
                    % (
                        _quote(table),
                        ", ".join("%s = ?" % _quote(c) for c in cols),
                        " AND ".join("%s IS ?" % _quote(c) for c in cols),
                    ),
                    values + [rowid] + values,
                )
        self.finish()
        return back
