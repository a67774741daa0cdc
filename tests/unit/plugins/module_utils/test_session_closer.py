"""A run as the Hermes user leaves out that user's ``(sd-pam)`` only when it is what its name says.

systemd's user manager (kept running by linger, which ``hermes gateway install`` turns on) forks
``(sd-pam)`` to close the PAM session at its end; the helper is not dumpable, so its owner cannot
read its descriptors, and counting it as a possible holder kept every run of that user from
finding state.db alone (the fleet's systemd host proves the real one is left out). Here the other
side: a process of the owner that only calls itself ``(sd-pam)`` (not dumpable either, but not
a child of a systemd manager) is still a possible holder.
"""

import ctypes
import os
import shutil
import sqlite3
import subprocess
import time

import pytest
from hermes_reliability import answer_as, user_with_dir

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite import db as hermes_sqlite_db

PR_SET_DUMPABLE, PR_SET_NAME = 4, 15
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")  # the test user can run it (not a venv under /root)
IMPOSTOR = (
    "import ctypes, sys, time\n"
    "libc = ctypes.CDLL(None)\n"
    "libc.prctl(%d, b'(sd-pam)'); libc.prctl(%d, 0)\n"
    "print('ready', flush=True); time.sleep(60)\n"
) % (PR_SET_NAME, PR_SET_DUMPABLE)


@pytest.mark.root
def test_a_process_that_only_calls_itself_sd_pam_is_still_a_possible_holder():
    assert ctypes.CDLL(None).prctl  # Linux
    with user_with_dir("hermes-ops-t1", "sd-pam-") as (uid, gid, base):
        db = os.path.join(str(base), "state.db")
        sqlite3.connect(db).close()
        os.chown(db, uid, gid)
        os.chmod(db, 0o600)

        def become():
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

        impostor = subprocess.Popen([SYSTEM_PYTHON, "-c", IMPOSTOR], preexec_fn=become, stdout=subprocess.PIPE)
        try:
            assert impostor.stdout.readline().strip() == b"ready"
            deadline = time.monotonic() + 10
            while hermes_sqlite_db._comm(impostor.pid) != "(sd-pam)" and time.monotonic() < deadline:
                time.sleep(0.05)
            found, hidden = answer_as(uid, gid, lambda: hermes_sqlite_db._scan_proc(db, set()))
            closer = answer_as(uid, gid, lambda: hermes_sqlite_db._session_closer(impostor.pid))
        finally:
            impostor.kill()
            impostor.wait()
    assert not found
    assert {"pid": impostor.pid, "command": "(sd-pam)", "evidence": "unreadable"} in hidden, hidden
    assert closer is False
