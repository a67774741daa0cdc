# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``unknown_schema: release_rules``: ask the Hermes installed on the host which sessions its own
``prune_sessions`` would delete, on a private scratch copy; the engine then prunes only the
sessions both that answer and its own rules select.

Runs the Hermes user's interpreter, so never as root (a root run reaches here in the child
switched to the file's owner). Standard library only, Python 3.8+, no Ansible imports.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from typing import Any

from ..sqlite.db import MaintenanceError

RELEASE_TIMEOUT = 300
# Runs under the release's interpreter: argv = scratch state.db, days. Prints one JSON line.
_ASK = r"""
import inspect, json, sqlite3, sys
from pathlib import Path
def ids():
    conn = sqlite3.connect(sys.argv[1])
    try:
        return {r[0] for r in conn.execute("SELECT id FROM sessions")}
    finally:
        conn.close()
before = ids()
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    kwargs = {}
    if "exclude_active_write_guards" in inspect.signature(db.prune_sessions).parameters:
        kwargs["exclude_active_write_guards"] = True  # as its auto-maintenance calls it
    db.prune_sessions(older_than_days=float(sys.argv[2]), **kwargs)
finally:
    db.close()
release = None
try:
    from importlib import metadata
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith("hermes-agent"):
            release = "%s %s" % (name, dist.version)
            break
except Exception:
    pass
print(json.dumps({"deleted": sorted(before - ids()), "release": release, "guards": bool(kwargs)}))
"""


def release_prune_set(conn: sqlite3.Connection, python: str, prune_days: float) -> dict[str, Any]:
    """The session ids the installed Hermes's own prune deletes from a copy of ``conn``'s file.

    The copy (SQLite's backup API: one consistent snapshot) sits in a 0700 directory as a 0600
    file and is removed afterwards; the interpreter runs with that directory as HOME and cwd, so
    nothing of the real home is touched. Returns ``{"deleted": set, "release", "python", "guards"}``.
    """
    if os.geteuid() == 0:
        raise MaintenanceError(
            "unknown_schema=release_rules runs the Hermes user's interpreter %s, and this run is root on a "
            "root-owned state.db: refused (root never runs code from the Hermes account)" % python
        )
    if not (os.path.isabs(python) and os.access(python, os.X_OK)):
        raise MaintenanceError(
            "hermes_python %r is not an executable absolute path: point it at the python of Hermes" % python
        )
    scratch = tempfile.mkdtemp(prefix="hermes-ops-release-")  # mkdtemp: mode 0700
    try:
        copy = os.path.join(scratch, "state.db")
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        target = sqlite3.connect(copy)
        try:
            conn.backup(target)
        finally:
            target.close()
        env = {"HOME": scratch, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            proc = subprocess.run(
                [python, "-c", _ASK, copy, repr(float(prune_days))],
                cwd=scratch, env=env, capture_output=True, text=True, timeout=RELEASE_TIMEOUT, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MaintenanceError("unknown_schema=release_rules: %s could not answer: %s" % (python, exc)) from None
        if proc.returncode != 0:
            tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
            raise MaintenanceError(
                "unknown_schema=release_rules: the Hermes at %s failed on a copy of the file (%s); nothing was "
                "pruned" % (python, tail[0])
            )
        try:
            answer = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise MaintenanceError("unknown_schema=release_rules: %s gave no answer" % python) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "deleted": set(answer["deleted"]),
        "release": answer.get("release") or "unknown Hermes",
        "python": python,
        "guards": answer.get("guards"),
    }
