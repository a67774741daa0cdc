"""Hermes 0.22.2's own cross-process locks, held by the release in a process of its own.

``hold_hermes_lock(db, which)`` takes ``state.db.repair.lock`` (``repair``),
``.quarantine.lock`` (``quarantine``) or ``.fts_rebuild.lock`` (``fts_rebuild``) with the
release's own function and keeps it until the returned process's stdin is closed
(``proc.communicate("")``).
"""

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from hermes_fixtures import hermes_python

RELEASE = "0.22.2.post1"

HOLD_HERMES_LOCK = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import hermes_state  # noqa: F401  (the release's mixins import it)
    import hermes_state_common, hermes_state_dbfile, hermes_state_repair
    db, which = sys.argv[1], sys.argv[2]
    lock = {
        "repair": lambda: hermes_state_repair._cross_process_repair_lock(Path(db)),
        "quarantine": lambda: hermes_state_dbfile.quarantine_cross_process_lock(Path(db)),
        "fts_rebuild": lambda: hermes_state_common.fts_rebuild_admission(db, timeout_seconds=0),
    }[which]()
    with lock as acquired:
        print("acquired" if acquired else "refused", flush=True)
        sys.stdin.read()
    """
)


def hold_hermes_lock(db, which, release=RELEASE):
    proc = subprocess.Popen(
        [hermes_python(release), "-c", HOLD_HERMES_LOCK, str(db), which],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, HERMES_HOME=str(Path(db).parent)),
    )
    line = proc.stdout.readline().strip()
    if line != "acquired":
        proc.kill()
        pytest.fail("Hermes did not take its %s lock: %r %s" % (which, line, proc.stderr.read()))
    return proc
