"""SIGKILL in the middle of a tool-payload elision (``tool_payload_days``) on a file Hermes 0.22.2 wrote.

The release builds the home and appends the tool output itself (its own ``append_message``: its
rows, triggers and both FTS indexes). Each trial runs ``run_maintenance`` in its own process (the
real engine from build/collections), waits until its payload archive is finished (renamed into
the backup directory: the elision starts right after), and SIGKILLs it right then, or once a
given share of the bodies an uninterrupted run elides hold their tombstone in state.db (read by
the test as the gateway reads: progress, not elapsed time, so a loaded machine moves no kill past
the end of the run): before the first transaction, and between or inside the later ones.

After each kill:

* state.db passes ``integrity_check`` and both FTS5 ``integrity-check``;
* no payload is lost: every row is as it was, except tool bodies that hold their tombstone, and
  each of those has its original bytes in a finished payload archive;
* a rerun completes and leaves the file where an uninterrupted run leaves it (the same bodies
  elided), and check mode then predicts no elision;
* restoring every payload archive puts every row back exactly as it was.
"""

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from collection_paths import COLLECTIONS_ROOT
from hermes_markers import release_module_marks

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.elision import list_payload_archives
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import restore_tool_payloads
from hermes_fixtures import (
    APPEND_MESSAGES,
    build_home,
    check_integrity,
    copy_db,
    hermes_python,
    message_rows,
    run_release_code,
    terminal_dump,
)

RELEASE = "hermes-0.22.2.post1"
pytestmark = [*release_module_marks(RELEASE), pytest.mark.crash, pytest.mark.timing]
DAY = 86400.0
SESSIONS, BODIES, BYTES = 10, 60, 12000
# Shares of the bodies an uninterrupted run elides that hold their tombstone when the run is killed
# (0: right after the archive, before the first transaction).
KILL_AT = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
TOMBSTONES = "SELECT COUNT(*) FROM messages WHERE role = 'tool' AND substr(content, 1, 20) = '[elided: tool output'"

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
profile = run_maintenance(json.loads(sys.argv[2]))["profiles"][0]
print(json.dumps({"status": profile["status"], "error": profile["error"]}))
"""


def _opts(home):
    return {"hermes_home": [str(home)], "prune_days": 365, "tool_payload_days": 30, "vacuum_mode": "never"}


def _archived(backups):
    """{message id: original bytes} over every finished payload archive."""
    found = {}
    for path, _stamp in list_payload_archives(str(backups), "default"):
        conn = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
        try:
            found.update(dict(conn.execute("SELECT id, body FROM payloads")))
        finally:
            conn.close()
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("elision-crash")
    now = time.time()
    sids = ["crash-%d" % i for i in range(SESSIONS)]
    specs = [dict(id=sid, started_days_ago=200, ended_days_ago=100, messages=2) for sid in sids]
    db = build_home(base / "home", RELEASE, specs, now=now)
    rows = [
        [sid, "tool", terminal_dump(sid, i, BYTES), "terminal", now - (150 - i / 10.0) * DAY]
        for sid in sids
        for i in range(BODIES)
    ]
    (base / "append.json").write_text(json.dumps(rows))
    proc = run_release_code(hermes_python(RELEASE), APPEND_MESSAGES, db, str(base / "append.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return db


def _fresh(built, path):
    path.mkdir(parents=True)
    (path / "sessions").mkdir()
    copy_db(built, path / "state.db")
    return path


def _tombstones(db):
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=30)
    try:
        return conn.execute(TOMBSTONES).fetchone()[0]
    finally:
        conn.close()


def _run_and_kill(home, after):
    """Start the run; SIGKILL it once its payload archive has appeared and ``after`` bodies hold their
    tombstone (None: let it finish). Returns (seconds from the archive to the end of the process, killed?)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(COLLECTIONS_ROOT), json.dumps(_opts(home))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    backups, seen = home / "backups", None
    while proc.poll() is None and seen is None:
        if backups.is_dir() and list_payload_archives(str(backups), "default"):
            seen = time.monotonic()
            break
        time.sleep(0.0005)
    killed = False
    if seen is not None and after is not None:
        while after and proc.poll() is None and _tombstones(home / "state.db") < after:
            time.sleep(0.002)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
    out, err = proc.communicate(timeout=120)
    if not killed:
        assert proc.returncode == 0, err.decode()[-3000:]
        assert json.loads(out.decode().strip().splitlines()[-1])["status"] == "ok", out
    return (time.monotonic() - seen if seen else 0.0), killed


def test_a_kill_in_the_middle_of_the_elision_loses_no_payload_and_a_rerun_converges(built, tmp_path):
    original = message_rows(built)
    clean = _fresh(built, tmp_path / "clean")
    took, _killed = _run_and_kill(clean, None)
    expected = message_rows(clean / "state.db")
    elided = {mid for mid, row in expected.items() if row != original[mid]}
    assert len(elided) == SESSIONS * BODIES
    kills, seen = 0, []
    for n, share in enumerate(KILL_AT):
        home = _fresh(built, tmp_path / ("trial-%d" % n))
        _took, killed = _run_and_kill(home, math.ceil(share * len(elided)))
        kills += killed
        db = home / "state.db"
        check_integrity(db)
        now, archived = message_rows(db), _archived(home / "backups")
        assert now.keys() == original.keys()
        seen.append((share, killed, sum(1 for mid, row in now.items() if row != original[mid])))
        for mid, row in now.items():
            if row != original[mid]:  # elided: its tombstone in place, its bytes in a finished archive
                assert mid in elided and row[3].startswith(b"[elided: tool output"), (share, mid)
                assert archived.get(mid) == original[mid][3], (share, mid)
        _run_and_kill(home, None)  # the rerun, uninterrupted
        check_integrity(db)
        assert message_rows(db) == expected, share
        again = run_maintenance(_opts(home), check_mode=True)["profiles"][0]["tool_payloads"]
        assert again["elided"] == 0, (share, again)
        restored = restore_tool_payloads(str(home), "default")
        assert restored["changed"], restored
        check_integrity(db)
        assert message_rows(db) == original, share
    print("\nelision of %d bodies (%.2f s uninterrupted) killed at (share, killed, bodies elided then): %s"
          % (len(elided), took, seen))  # fmt: skip
    assert kills >= len(KILL_AT) - 1, "most trials must kill the run before it ends (%d of %d)" % (kills, len(KILL_AT))
    assert any(0 < done < len(elided) for _share, killed, done in seen if killed), seen  # one inside the elision
