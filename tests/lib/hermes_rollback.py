"""Big state.db files of a current Hermes release (0.20+), as that release leaves them here:
in rollback-journal mode (``journal_mode=DELETE``), because the linked SQLite 3.40.1 has the
WAL-reset bug and Hermes >= 0.20 then refuses WAL.

The schema is the release's own: its ``SessionDB`` creates the file (tests/lib/
_hermes_release_writer.py in init mode, under the release's venv python); the rows are then
bulk INSERTed here through the release's own triggers (FTS, message_uid, display order).
Half the sessions (by default) ended 8..90 days ago, so a 7-day prune takes them.

Used by tests/unit/plugins/module_utils/test_live_rollback.py and bench/datasets.py.
"""

import atexit
import json
import os
import random
import shutil
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

from hermes_fixtures import bulk_rows, hermes_python, query_one, run_release_code

HERE = Path(__file__).resolve().parent
RELEASE = "0.22.2.post1"
WORDS = (
    "deploy backup kubernetes zebra widget nightly cron schedule database vacuum index search message "
    "telegram agent session compress summary tool result python ansible install verify restore profile "
    "gateway token model prompt"
).split()


def init_schema(release, home, db_path):
    """Let the release's own SessionDB create an empty state.db; returns its schema_version."""
    py = hermes_python(release)
    if py is None:
        raise RuntimeError("no venv for hermes %s (tests/setup_hermes_venvs.sh)" % release)
    fd, plan = tempfile.mkstemp(prefix="hermes-plan-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump({"home": str(home), "db_path": str(db_path), "mode": "init", "sessions": []}, fh)
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run(
            [py, str(HERE / "_hermes_release_writer.py"), plan],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(home),
            timeout=300,
            check=False,
        )
    finally:
        os.unlink(plan)
    if proc.returncode != 0:
        raise RuntimeError("hermes %s init failed: %s" % (release, proc.stderr[-3000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])["schema_version"]


def journal_mode(db_path):
    return query_one(db_path, "PRAGMA journal_mode")


def make_big_rollback_home(
    home, n_sessions, msgs_per_session, old_fraction=0.5, seed=0, now=None, release=RELEASE, chunk_sessions=None
):
    """HOME/state.db written with ``release``'s schema, in the journal mode that release chose.

    ``chunk_sessions``: rows made and inserted that many sessions at a time (a multi-GB file
    without its rows all in memory); None: all in one transaction."""
    now = time.time() if now is None else float(now)
    home = Path(home)
    (home / "sessions").mkdir(parents=True, exist_ok=True)
    db_path = home / "state.db"
    init_schema(release, home, db_path)
    conn = sqlite3.connect(str(db_path), timeout=30)
    try:
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=OFF")
        rng, step = random.Random(seed), chunk_sessions or n_sessions
        for first in range(0, n_sessions, step):
            count = min(step, n_sessions - first)
            sessions, messages = bulk_rows(rng, count, msgs_per_session, old_fraction, now, WORDS, first=first)
            with conn:
                conn.executemany(
                    "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, message_count) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    sessions,
                )
                conn.executemany(
                    "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)", messages
                )
    finally:
        conn.close()
    os.chmod(str(db_path), 0o600)
    return db_path


_TEMPLATES = {}  # (n_sessions, msgs_per_session, seed, release): a built home, for this process


def copy_of_big_rollback_home(home, n_sessions, msgs_per_session, seed=0, release=RELEASE):
    """HOME/state.db as ``make_big_rollback_home`` writes it (its ``now``: the first call's time),
    copied from a home built once per process for these arguments: the tests that start each
    from the same big file pay its build (seconds of bulk INSERTs through the release's
    triggers) once. Each caller gets a file of its own, the copy's mode and contents the
    template's."""
    key = (n_sessions, msgs_per_session, seed, release)
    if key not in _TEMPLATES:
        root = Path(tempfile.mkdtemp(prefix="hermes-big-home-"))
        atexit.register(shutil.rmtree, str(root), True)
        make_big_rollback_home(root / "home", n_sessions, msgs_per_session, seed=seed, release=release)
        _TEMPLATES[key] = root / "home"
    shutil.copytree(str(_TEMPLATES[key]), str(home))
    return Path(home) / "state.db"


RELEASE_VIEW = r"""
import json, sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    sid, query = sys.argv[2], sys.argv[3]
    messages = db.get_messages(sid)
    hits = db.search_messages(query, limit=1000)
    print(json.dumps({"messages": len(messages), "hits": sum(1 for h in hits if h.get("session_id") == sid),
                      "total_hits": len(hits)}))
finally:
    db.close()
"""


def release_view(db_path, session_id, query, release=RELEASE):
    """What the release's own SessionDB sees of one session: its messages, and search hits in it."""
    proc = run_release_code(hermes_python(release), RELEASE_VIEW, db_path, session_id, query)
    if proc.returncode != 0:
        raise RuntimeError("hermes %s could not read %s: %s" % (release, db_path, proc.stderr[-3000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])
