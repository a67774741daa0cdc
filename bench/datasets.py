"""The data sets: one generated state.db per mode and size (cached in the workdir), and fresh copies of it.

0.19.0's files are made by ``hermes_fixtures.make_big_home`` (the release's own schema, both FTS
indexes, rows bulk-inserted through its triggers), 0.22.2's by ``hermes_rollback.make_big_rollback_home``
(schema 31, FTS through views; the journal mode is the one the release picks on the linked SQLite).
Half of the sessions are older than the 7-day window in both.
"""

import json
import os
import shutil
import sqlite3
import sys
import time

from hermes_rollback import journal_mode, make_big_rollback_home

from bench.common import MODES, MSGS_PER_SESSION, size_label
from hermes_fixtures import make_big_home, query_one

# The control writer's small untouched file (the machine's noise floor), per mode.
CONTROL_MESSAGES = {"wal-0.19": 50000, "delete-0.22": 5000, "wal-0.22": 5000}
# 0.22.2's files are made this many messages at a time (a 5 GB file without its rows all in memory).
GENERATE_CHUNK = 800000
GENERATED = {}  # base file -> seconds its generation took in this run (the results record them)
CACHED = {}  # base file made by an earlier run -> seconds its generation took (recorded in its .done)


def base_db(workdir, mode, n_messages, incremental=False):
    """state.db of a generated home of ``mode``'s release with ``n_messages`` (made once, then cached).

    ``incremental``: a copy switched to ``auto_vacuum=INCREMENTAL`` (what one ``vacuum_mode: full``
    service-window run leaves)."""
    spec = MODES[mode]
    n_sessions = max(1, n_messages // MSGS_PER_SESSION)
    home = workdir / ("%s-%d%s" % (spec["base"], n_messages, "-inc" if incremental else ""))
    db = home / "state.db"
    if (home / ".done").exists():
        made = (home / ".done").read_text().strip()
        if made and not incremental:  # how long its generation took, when that was recorded
            CACHED[home.name] = json.loads(made)["seconds"]
        return db
    shutil.rmtree(home, ignore_errors=True)
    if incremental:
        plain = base_db(workdir, mode, n_messages)
        home.mkdir(parents=True)
        shutil.copyfile(plain, db)
        conn = sqlite3.connect(str(db))
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    else:
        t0 = time.time()
        print(
            "  generating %s messages (%d sessions, Hermes %s, %s mode) ..."
            % (size_label(n_messages), n_sessions, spec["release"], spec["journal"].upper()),
            flush=True,
        )
        if spec["release"] == "0.19.0":
            make_big_home(str(home), "hermes-0.19.0", n_sessions, MSGS_PER_SESSION, old_fraction=0.5, seed=7)
        else:
            make_big_rollback_home(
                home, n_sessions, MSGS_PER_SESSION, seed=7, release=spec["release"],
                chunk_sessions=GENERATE_CHUNK // MSGS_PER_SESSION,
            )  # fmt: skip
            if journal_mode(db) != spec["journal"]:
                sys.exit(
                    "hermes %s chose %s here, not %s: nothing to measure"
                    % (spec["release"], journal_mode(db), spec["journal"].upper())
                )
        GENERATED[home.name] = round(time.time() - t0, 1)
        print("  generated in %.0fs (%.1f MB)" % (GENERATED[home.name], os.path.getsize(str(db)) / 1e6), flush=True)
    (home / ".done").write_text(json.dumps({"seconds": GENERATED[home.name]}) if home.name in GENERATED else "")
    return db


def control_db(workdir, mode):
    return base_db(workdir, mode, CONTROL_MESSAGES[mode])


def fresh_home(workdir, name, src_db):
    """A new home ``workdir/name`` holding a copy of ``src_db`` (0600), written out to disk."""
    home = workdir / name
    shutil.rmtree(home, ignore_errors=True)
    (home / "sessions").mkdir(parents=True)
    shutil.copyfile(src_db, home / "state.db")
    os.chmod(home / "state.db", 0o600)
    # Write the copy (and the previous run's deletions) out now: left to the kernel, that
    # write-back landed a second into the next run and stalled both writers (the control one
    # too) for ~300 ms, whatever the maintenance was doing.
    os.sync()
    return home


def count_messages(db):
    return query_one(db, "SELECT COUNT(*) FROM messages")
