"""Find the closes that drop SQLite's locks in an ``strace`` of the engine.

The kernel's rule (fcntl(2), "Advisory record locking"): closing ANY descriptor of a file
releases every POSIX record lock the *process* holds on that file, whichever descriptor took
it. SQLite never does that to itself: it unlocks before it closes, and while another of the
process's connections holds a lock on the file it keeps a closing connection's descriptor
open (os_unix.c, the inode's pending list). Its one close of a locked file is the last
connection's ``-shm`` descriptor, through which those locks were taken. So a close is
*lock-dropping* when the process holds a lock on the file that was taken through another
descriptor: one that SQLite did not take its locks with, i.e. not SQLite's.

Input: ``strace -f -y -o FILE -e trace=TRACED cmd``. ``-y`` prints each descriptor with its
path (``close(7</h/state.db>)``), ``-f -o`` prefixes each line with the pid. The parser keeps,
per process and file, the byte ranges locked with ``F_SETLK``/``F_SETLKW`` (``F_UNLCK``
subtracts; OFD locks are not the process's and are left out) and the descriptor that took
each; a ``clone`` without ``CLONE_THREAD`` starts a process with none (locks are not
inherited), a thread shares its process's. ``openat`` of a path containing ``/@@`` (it fails:
the directory does not exist) is the traced program's step marker: lines after it count
toward that step.
"""

import os
import re

TRACED = "openat,open,close,close_range,fcntl,dup,dup2,dup3,clone,clone3,fork,vfork"
WATCHED = ("state.db", "state.db-shm")
INFINITY = float("inf")

_LINE = re.compile(r"^(\d+) +(.*)$")
_FD = r"(\d+)<([^>]*)>"
_CLOSE = re.compile(r"^close\(%s\) += (-?\d+)" % _FD)
_LOCK = re.compile(
    r"^fcntl\(%s, F_SETLKW?, \{l_type=(F_RDLCK|F_WRLCK|F_UNLCK), l_whence=SEEK_SET, l_start=(\d+), l_len=(\d+)"
    r"\}\) += 0" % _FD
)
_CLONE = re.compile(r"^(?:clone3?|v?fork)\(.*\) += (\d+)")
_MARK = re.compile(r'^openat\([^,]*, "[^"]*/@@([^"]*)"')
_OPEN = re.compile(r"^(?:open|openat|dup[23]?)\(.* = %s$" % _FD)


def _watched(path):
    return os.path.basename(path.replace(" (deleted)", "")) in WATCHED


def _subtract(ranges, start, end):
    """``ranges`` ([(start, end, fd)]) without [start, end)."""
    kept = []
    for a, b, fd in ranges:
        if b <= start or a >= end:
            kept.append((a, b, fd))
            continue
        if a < start:
            kept.append((a, start, fd))
        if b > end:
            kept.append((end, b, fd))
    return kept


def _lines(text):
    """(pid, call) of each finished call, an ``<unfinished ...>`` joined with its ``resumed``."""
    pending = {}
    for raw in text.splitlines():
        match = _LINE.match(raw)
        if not match:
            continue
        pid, call = int(match.group(1)), match.group(2)
        if call.endswith("<unfinished ...>"):
            pending[pid] = call[: -len("<unfinished ...>")].rstrip()
            continue
        resumed = re.match(r"^<\.\.\. \w+ resumed>(.*)$", call)
        if resumed:
            call = pending.pop(pid, "") + resumed.group(1)
        yield pid, call


def check_trace(text):
    """{"steps": {step: {"closes": n, "closes_while_locked": n, "dropping": [trace lines]}}}.

    ``closes``: close() of a descriptor of a watched file; ``closes_while_locked``: of those,
    the ones while the process held a lock on it (SQLite's own last ``-shm`` close);
    ``dropping``: the lock-dropping ones (see the module's docstring).
    """
    process = {}  # tid -> tgid
    locks = {}  # (tgid, path) -> [(start, end, fd)]
    opened = {}  # (tgid, fd) -> the call that made it
    steps, step = {}, "start"
    for pid, call in _lines(text):
        tgid = process.setdefault(pid, pid)
        mark = _MARK.match(call)
        if mark:
            step = mark.group(1)
            continue
        clone = _CLONE.match(call)
        if clone:
            child = int(clone.group(1))
            process[child] = tgid if "CLONE_THREAD" in call else child
            continue
        made = _OPEN.match(call)
        if made:
            opened[(tgid, int(made.group(1)))] = call
            continue
        lock = _LOCK.match(call)
        if lock:
            fd, path, kind, start, length = lock.groups()
            start = int(start)
            end = start + int(length) if int(length) else INFINITY
            key = (tgid, path.replace(" (deleted)", ""))
            held = _subtract(locks.get(key, []), start, end)
            locks[key] = held + ([] if kind == "F_UNLCK" else [(start, end, int(fd))])
            continue
        close = _CLOSE.match(call)
        if close and _watched(close.group(2)):
            fd, path = int(close.group(1)), close.group(2).replace(" (deleted)", "")
            counts = steps.setdefault(step, {"closes": 0, "closes_while_locked": 0, "dropping": []})
            held = locks.pop((tgid, path), [])
            counts["closes"] += 1
            counts["closes_while_locked"] += bool(held)
            if any(owner != fd for _a, _b, owner in held):
                ranges = ", ".join("%s-%s (fd %d)" % (a, b, owner) for a, b, owner in held)
                why = "opened by: %s; drops the locks on %s" % (opened.get((tgid, fd), "?"), ranges)
                counts["dropping"].append("%d %s  <- %s" % (pid, call, why))
        elif call.startswith("close_range(") and any(k[0] == tgid and v for k, v in locks.items()):
            counts = steps.setdefault(step, {"closes": 0, "closes_while_locked": 0, "dropping": []})
            counts["dropping"].append("%d %s (while the process holds SQLite locks)" % (pid, call))
    return {"steps": steps}
