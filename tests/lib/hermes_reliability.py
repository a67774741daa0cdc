"""Helpers for the reliability tests (crash, full disk, permissions, contention, restore).

Plain Python 3.8+ standard library. Import with ``tests/lib`` on ``sys.path``::

    from hermes_reliability import check_db, tiny_fs, test_user, ...
"""

import contextlib
import gzip
import hashlib
import json
import os
import pwd
import re
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest

# Re-exported for the tests: the real layout under ansible-test too.
from collection_paths import COLLECTIONS_ROOT  # noqa: F401  # pylint: disable=unused-import

REPO_ROOT = Path(__file__).resolve().parents[2]

ENGINE = "ansible_collections.hermes_agent.ops.plugins.module_utils"

# What the crash tests' children start with. mark(text) writes "@@ <step> <text> <monotonic
# time>" on stderr (the clock compares across processes) and, at step KILL_AT (0: never), kills
# the child there by SIGKILL; around(name, real) marks "<name> start" and "<name> end" of each
# call; marked(real_transaction) marks a write transaction's open, about to commit, committed.
MARKS = r"""
import contextlib, os, signal, time
KILL_AT, step = 0, [0]

def mark(text):
    step[0] += 1
    os.write(2, ("@@ %d %s %.6f\n" % (step[0], text, time.monotonic())).encode())
    if step[0] == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)

def around(name, real):
    def wrapper(*args, **kwargs):
        mark(name + " start")
        try:
            return real(*args, **kwargs)
        finally:
            mark(name + " end")
    return wrapper

def marked(real_transaction):
    @contextlib.contextmanager
    def transaction(conn):
        with real_transaction(conn) as inside:
            mark("transaction open")
            yield inside
            mark("transaction about to commit")
        mark("transaction committed")
    return transaction
"""

MARK_LINE = re.compile(r"^@@ (\d+) (.+) (\d+\.\d+)$")


def parse_mark(line):
    """(step, text, time) of a line that mark() wrote, else None."""
    match = MARK_LINE.match(line.strip())
    return (int(match.group(1)), match.group(2), float(match.group(3))) if match else None


# The child: the real engine, with each phase marked by a wrapper that only adds the mark.
CHILD = (
    MARKS
    + r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import deleter, execution
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import run as engine

for name, steps, attr in (("backup", execution, "take_backup"), ("zombies", execution, "close_zombies"),
                          ("prune", deleter, "prune"), ("reclaim", execution, "reclaim")):
    setattr(steps, attr, around(name, getattr(steps, attr)))
mark("run start")
result = engine.run_maintenance(json.loads(sys.argv[2]))
mark("run end")
print(json.dumps(result))
"""
)


def record_fdatasync(monkeypatch):
    """A list that gets (the descriptor's file, its size then) of each ``os.fdatasync`` from now on;
    each call still syncs."""
    flushed, real = [], os.fdatasync

    def recording(fd):
        flushed.append((os.readlink("/proc/self/fd/%d" % fd), os.fstat(fd).st_size))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return flushed


def fts_tables(conn):
    rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall()
    return [name for name, sql in rows if "using fts5" in sql.lower()]


def query(path, sql, *args):
    """All rows of one statement, on a connection opened and closed for it."""
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def db_problems(path):
    """Everything wrong with a database: integrity_check, FTS integrity-check, foreign keys."""
    problems = []
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        rows = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        if rows != ["ok"]:
            problems.append("integrity_check: %s" % "; ".join(rows[:5]))
        for table in fts_tables(conn):
            try:
                conn.execute('INSERT INTO "%s"("%s") VALUES(\'integrity-check\')' % (table, table))
            except sqlite3.DatabaseError as exc:
                problems.append("%s integrity-check: %s" % (table, exc))
        bad_fk = conn.execute("PRAGMA foreign_key_check").fetchall()
        if bad_fk:
            problems.append("foreign_key_check: %s" % (bad_fk[:5],))
    finally:
        conn.close()
    return problems


def session_rows(path, columns_left_out=("ended_at", "end_reason", "parent_session_id")):
    """{session id: (row without the columns maintenance may change, digest of its messages)}."""
    conn = sqlite3.connect(str(path))
    try:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(sessions)")]
        keep = [c for c in cols if c not in columns_left_out]
        sessions = {r[0]: r[1:] for r in conn.execute("SELECT id, %s FROM sessions" % ", ".join(keep))}
        digests = {}
        for sid, role, content, ts in conn.execute(
            "SELECT session_id, role, content, timestamp FROM messages ORDER BY session_id, id"
        ):
            digests.setdefault(sid, hashlib.sha256()).update(repr((role, content, ts)).encode())
    finally:
        conn.close()
    return {sid: (row, digests[sid].hexdigest() if sid in digests else None) for sid, row in sessions.items()}


def full_rows(path):
    """Every session row and a digest of every session's messages: the whole visible state."""
    return session_rows(path, columns_left_out=())


def digest(path):
    with open(str(path), "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def open_backup(path, workdir):
    """A plain .db path for a backup (a .gz is decompressed into workdir)."""
    path = str(path)
    if not path.endswith(".gz"):
        return path
    out = os.path.join(str(workdir), os.path.basename(path)[:-3])
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def backup_problems(path, workdir, sessions=None):
    """A finished backup must be a complete database: quick_check ok, the expected sessions."""
    try:
        plain = open_backup(path, workdir)
        conn = sqlite3.connect("file:%s?mode=ro" % plain, uri=True)
        try:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
            count = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
        finally:
            conn.close()
    except (OSError, EOFError, sqlite3.DatabaseError) as exc:
        return ["%s: %s: %s" % (path, type(exc).__name__, exc)]
    problems = []
    if rows != ["ok"]:
        problems.append("%s: quick_check %s" % (path, rows[:3]))
    if sessions is not None and count != sessions:
        problems.append("%s: %d sessions, expected %d" % (path, count, sessions))
    return problems


# --------------------------------------------------------------------------- root-only set-up


def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root (CI runs as root): mounts a tiny filesystem / switches users")


@contextlib.contextmanager
def tiny_fs(size_kb):
    """A real tmpfs of size_kb KiB, mounted on a fresh directory; skip when mounting is not allowed."""
    need_root()
    mnt = tempfile.mkdtemp(prefix="hermes-ops-tinyfs-")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=%dk,mode=0755" % size_kb, "tmpfs", mnt],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        os.rmdir(mnt)
        pytest.skip("cannot mount a tmpfs here: %s" % proc.stderr.strip())
    try:
        yield Path(mnt)
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)
        os.rmdir(mnt)


def ensure_user(name):
    """(uid, gid) of a system user made for the tests (created when absent; root only)."""
    need_root()
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        proc = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode not in (0, 9):  # 9: created meanwhile by a parallel run
            pytest.skip("cannot create test user %s: %s" % (name, proc.stderr.strip()))
        pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


@contextlib.contextmanager
def init_script(name, text):
    """/etc/init.d/NAME holding text (mode 0755) for the test's duration; root only.

    A minimal Debian 13 has no /etc/init.d at all (no package there ships an init script):
    the directory is then made for the test and removed after it, unless another test's
    script is still in it."""
    need_root()
    init_d = Path("/etc/init.d")
    try:
        init_d.mkdir(mode=0o755)
        made = True
    except FileExistsError:
        made = False
    script = init_d / name
    script.write_text(text)
    script.chmod(0o755)
    try:
        yield script
    finally:
        script.unlink()
        if made:
            with contextlib.suppress(OSError):
                init_d.rmdir()


def world_traversable_dir(prefix):
    """A fresh directory that other users can traverse (pytest's tmp_path is root-only)."""
    path = tempfile.mkdtemp(prefix=prefix)
    os.chmod(path, 0o755)
    return Path(path)


@contextlib.contextmanager
def user_with_dir(user, prefix):
    """(uid, gid, base): the test user ``user`` (created when absent; root only) and a fresh
    directory it can traverse, removed afterwards."""
    need_root()
    uid, gid = ensure_user(user)
    base = world_traversable_dir(prefix)
    try:
        yield uid, gid, base
    finally:
        shutil.rmtree(str(base), ignore_errors=True)


def answer_as(uid, gid, func):
    """``func()``'s answer (JSON-able) from a forked child switched to ``uid``/``gid`` (root only):
    what that user sees, and root never runs that user's code in its own process."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.write(write, json.dumps(func()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    return json.loads(text)


def chown_tree(root, uid, gid):
    for dirpath, dirnames, filenames in os.walk(str(root)):
        os.lchown(dirpath, uid, gid)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def files_not_owned_by(root, uid):
    """Paths under root (root itself included) whose owner is not uid."""
    wrong = []
    for dirpath, dirnames, filenames in os.walk(str(root)):
        for path in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
            st = os.lstat(path)
            if st.st_uid != uid:
                wrong.append("%s (uid %d)" % (path, st.st_uid))
    return sorted(set(wrong))
