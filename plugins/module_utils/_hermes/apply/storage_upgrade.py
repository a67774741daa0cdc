# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hermes's own FTS storage upgrade (``hermes sessions optimize-storage``) as a service-window step.

Hermes >= 0.20 keeps an older file's inline FTS layout (0.19 and before: ``messages_fts`` and
``messages_fts_trigram`` each hold a private copy of every message, tool payloads included) and
only flags it (``state_meta.fts_optimize_available = 1``). Its ``optimize-storage`` moves the
indexes to the external-content layout in resumable chunks (markers ``fts_rebuild_high_water`` /
``fts_rebuild_progress``, old tables renamed ``fts_v22_trash_*`` and emptied), then VACUUMs and
stamps ``state_meta.fts_storage_version``. It gave back 41% of a migrated 0.19 file here; it
refuses while another process holds the file, so it belongs in the window, run by the release's own
interpreter (``hermes_python``) as the file's owner, never as root.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import tempfile
import time
from typing import TypedDict

from ..sqlite.db import MB, sqlite_uri
from .hermes_deletes import check_python

OPTIMIZE_STORAGE = "optimize_storage"
# 0.22.2 rebuilt 50,000 messages in 115.3 s on 2 shared cores (docs/benchmarks.md): its backfill
# sleeps at least 4 times each chunk's cost, so the rate is its own throttle's, rounded up.
SECONDS_PER_MESSAGE = 0.0025
VACUUM_BYTES_PER_SECOND = 20 * MB  # as the window's full VACUUM is estimated (apply.window)
STOP_GRACE = 10.0  # after SIGINT at the bound, for Hermes to end its chunk (it resumes next time)
OUTPUT_TAIL = 300
# Runs under the release's interpreter, HERMES_HOME set: Hermes's own CLI, no --force.
_CLI = (
    "import sys\n"
    "from hermes_cli.main import main\n"
    "sys.argv = ['hermes', 'sessions', 'optimize-storage', '--yes'] + sys.argv[1:]\n"
    "sys.exit(main())\n"
)


def storage_upgrade_pending(conn: sqlite3.Connection) -> str | None:
    """Why ``optimize-storage`` has work on this file (None: it has none), read with queries only:
    the release's flag, or an interrupted run's markers or trash tables (a rerun resumes it)."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "state_meta" not in names:
        return None
    keys = {r[0]: r[1] for r in conn.execute(
        "SELECT key, value FROM state_meta WHERE key IN ('fts_optimize_available', 'fts_rebuild_high_water')"
    )}  # fmt: skip
    if keys.get("fts_optimize_available") == "1":
        return "state_meta.fts_optimize_available"
    if "fts_rebuild_high_water" in keys or any(n.startswith("fts_v22_trash_") for n in names):
        return "an interrupted optimize-storage"
    return None


def storage_upgrade_seconds(messages: int, db_bytes: int, vacuum: bool) -> float:
    """The step's expected length: the throttled rebuild per message, and Hermes's VACUUM when it runs one."""
    return messages * SECONDS_PER_MESSAGE + (db_bytes / float(VACUUM_BYTES_PER_SECOND) if vacuum else 0.0)


class StorageUpgradeReport(TypedDict):
    done: bool
    reason: str | None
    seconds: float


def run_storage_upgrade(python: str, home: str, db_path: str, deadline: float, vacuum: bool) -> StorageUpgradeReport:
    """Run ``optimize-storage`` on ``home``'s state.db as this process's user (the file's owner),
    interrupted (SIGINT, then SIGKILL) at ``deadline`` (epoch seconds); ``vacuum`` False passes
    ``--no-vacuum`` (the window's own VACUUM follows). Returns ``{"done", "reason", "seconds"}``:
    done only when the file has no upgrade work left (Hermes exits 0 also when it refused)."""
    check_python(python, "the window's optimize-storage")
    began = time.monotonic()
    env = {
        "HOME": os.environ.get("HOME", home),
        "HERMES_HOME": home,
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "NO_COLOR": "1",
    }
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            [python, "-c", _CLI] + ([] if vacuum else ["--no-vacuum"]),
            cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        interrupted = _wait_or_interrupt(proc, deadline)
        log.seek(0)
        output = " ".join(line.strip() for line in log.read().replace("\r", "\n").splitlines() if line.strip())
    left = _pending_after(db_path)
    report: StorageUpgradeReport = {"done": left is None, "reason": None, "seconds": round(time.monotonic() - began, 1)}
    # No work left is done, even when the bound cut Hermes's closing VACUUM (the window's own reclaim follows).
    if left is not None and interrupted:
        report["reason"] = "optimize-storage interrupted at the bound (max_downtime): Hermes resumes it next time"
    elif left is not None:
        tail = output[-OUTPUT_TAIL:]
        report["reason"] = "optimize-storage left work (%s), exit %s: %s" % (left, proc.returncode, tail)
    return report


def _wait_or_interrupt(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait for ``proc`` until ``deadline``; past it SIGINT (Hermes stops between chunks), then SIGKILL."""
    try:
        proc.wait(timeout=max(0.0, deadline - time.time()))
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return True


def _pending_after(db_path: str) -> str | None:
    conn = sqlite3.connect(sqlite_uri(db_path, mode="ro"), uri=True, isolation_level=None)
    try:
        return storage_upgrade_pending(conn)
    finally:
        conn.close()
