# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``delete_with``: who deletes the sessions the plan selected, the engine or the installed Hermes.

With the installed Hermes, the release's own delete code does each delete: a long-lived child
of its interpreter (``hermes_python``, run as the file's owner, never as root; a root run reaches
here in the child switched to the owner) takes one batch per request over a pipe and answers
what went; the engine keeps the pacing, as its own prune does (batches bounded in messages and in
time, WriterTurn between them). Check mode runs the same loop on a private scratch copy.

Standard library only, Python 3.8+, no Ansible imports.
"""

from __future__ import annotations

import collections
import json
import os
import select
import shutil
import sqlite3
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Callable, cast

from ..plan.selection import live_leases, routed_sessions
from ..sqlite.db import MaintenanceError, commits_durable, write_transaction, writer_probe
from ..store.fence import routes_naming
from . import prune as engine_prune  # the engine's own re-check, looked up at each call
from .prune import PruneResult, Stop, WriterTurn, close_zombies, poll_gap, removals_durable, remove_files

if TYPE_CHECKING:
    from ..plan.selection import Plan
    from ..store.catalogue import Catalogue
    from ..store.schema import Schema

ENGINE, HERMES = "engine", "hermes"
ANSWER_TIMEOUT = 300

# Runs under the release's interpreter: which Hermes it is (its package's metadata, a release or a
# git install's pyproject version, else hermes_cli's __version__); both scripts below start with it.
_FIND_RELEASE = r"""
release, version = None, None
try:
    from importlib import metadata
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith("hermes-agent") or name.lower() == "hermes_agent":
            release, version = "%s %s" % (name, dist.version), dist.version
            break
except Exception:
    pass
if version is None:
    try:
        import hermes_cli
        version = str(hermes_cli.__version__)
        release = "hermes_cli %s" % version
    except Exception:
        pass
"""

# Runs under the release's interpreter: argv = state.db. First line out: who it is. Then one JSON
# list of session ids per line in, one JSON answer per line out. Each request is one transaction
# of the release's bulk delete (delete_sessions) where it has one, else one delete_session.
_SERVER = (
    _FIND_RELEASE
    + r"""
import json, sqlite3, sys, time
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
bulk = hasattr(db, "delete_sessions")
look = sqlite3.connect(sys.argv[1], timeout=30)
def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
def tables():
    return {r[0] for r in look.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
def facts(family):
    fm = ",".join("?" * len(family)) or "NULL"
    msgs = look.execute("SELECT COUNT(*) FROM messages WHERE session_id IN (%s)" % fm, family).fetchone()[0]
    prompts = look.execute("SELECT COUNT(*) FROM system_prompts").fetchone()[0] if "system_prompts" in tables() else 0
    return msgs, prompts
reply({"release": release, "version": version, "bulk": bulk})
for line in sys.stdin:
    ids = json.loads(line)
    marks = ",".join("?" * len(ids))
    family = [r[0] for r in look.execute(
        "SELECT id FROM sessions WHERE id IN (%s) OR parent_session_id IN (%s)" % (marks, marks), ids + ids)]
    msgs, prompts = facts(family)
    started = time.monotonic()
    try:
        if bulk and len(ids) > 1:
            db.delete_sessions(ids)
        else:
            for sid in ids:
                if not db.delete_session(sid):
                    raise LookupError("delete_session(%r) deleted nothing" % sid)
        error = None
    except Exception as exc:
        error = "%s: %s" % (type(exc).__name__, exc)
    seconds = time.monotonic() - started
    marks = ",".join("?" * len(family)) or "NULL"
    left = {r[0]: r[1] for r in look.execute(
        "SELECT id, parent_session_id FROM sessions WHERE id IN (%s)" % marks, family)}
    gone = [sid for sid in family if sid not in left]
    msgs_after, prompts_after = facts(family)
    orphaned = sum(1 for sid in family if sid in left and sid not in ids and left[sid] is None)
    reply({"deleted": gone, "error": error, "messages": msgs - msgs_after, "orphaned": orphaned,
           "prompts": max(0, prompts - prompts_after), "seconds": seconds})
look.close()
db.close()
"""
)


def check_python(python: str | None, what: str) -> None:
    if os.geteuid() == 0:
        raise MaintenanceError(
            "%s runs the Hermes user's interpreter %s, and this run is root on a root-owned state.db: refused "
            "(root never runs code from the Hermes account)" % (what, python)
        )
    if not (python and os.path.isabs(python) and os.access(python, os.X_OK)):
        raise MaintenanceError(
            "hermes_python %r is not an executable absolute path: point it at the python of Hermes" % (python,)
        )


class ReleaseDeleter:
    """The installed Hermes's interpreter, serving deletes on ``db_path`` one batch per request."""

    def __init__(self, python: str, db_path: str, hermes_home: str, what: str = "delete_with=hermes") -> None:
        check_python(python, what)
        self.python, self.what = python, what
        env = {
            "HOME": os.environ.get("HOME", hermes_home),
            "HERMES_HOME": hermes_home,
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        # Its log goes to an unlinked file, never a pipe nobody drains: a release that logs a
        # traceback per refused delete would fill a pipe and block there, mid-run.
        self.log = tempfile.TemporaryFile(mode="w+")
        try:
            self.proc = subprocess.Popen(
                [python, "-c", _SERVER, db_path],
                cwd=hermes_home, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                text=True, bufsize=1,
            )  # fmt: skip
        except OSError as exc:
            self.log.close()
            raise MaintenanceError("%s: %s could not start: %s" % (what, python, exc)) from None
        # both pipes exist: stdin and stdout are PIPE above
        self.requests, self.answers = cast(IO[str], self.proc.stdin), cast(IO[str], self.proc.stdout)
        hello = self._answer()
        self.release = hello.get("release") or "unknown Hermes"
        self.version = hello.get("version")
        self.bulk = bool(hello.get("bulk"))

    def _answer(self) -> dict[str, Any]:
        # One line per request, so nothing waits in the reader's buffer while select() looks.
        ready = select.select([self.answers], [], [], ANSWER_TIMEOUT)[0]
        line = self.answers.readline() if ready else ""
        if not line:
            self.proc.kill()
            self.proc.wait()
            self.log.seek(0)
            tail = (self.log.read() or "").strip().splitlines()[-1:] or ["no output"]
            raise MaintenanceError("%s: the Hermes at %s stopped: %s" % (self.what, self.python, tail[0]))
        try:
            answer: dict[str, Any] = json.loads(line)
            return answer
        except ValueError:
            raise MaintenanceError("%s: %s answered %r" % (self.what, self.python, line[:200])) from None

    def delete(self, ids: list[str]) -> dict[str, Any]:
        """Delete ``ids`` in one transaction of the release (or one delete_session): its answer."""
        self.requests.write(json.dumps(list(ids)) + "\n")
        self.requests.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.requests.close()
                self.proc.wait(timeout=ANSWER_TIMEOUT)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.answers.close()
        self.log.close()

    def info(self) -> dict[str, Any]:
        return {"release": self.release, "version": self.version, "python": self.python, "bulk": self.bulk}


class TransactionCost:
    """What one of the release's transactions costs: a fixed part (0.22.2's bulk delete also sweeps
    unreferenced system prompts, 35-40 ms here whatever the batch) and a part per message, fitted
    from the last two transactions of different sizes. Until there are two, a batch takes one
    session more than the last."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []  # (messages, seconds) of the last transactions, newest last
        self.sessions = 0  # sessions in the last transaction
        self.fixed: float | None = None
        self.per_row: float | None = None

    def measured(self, rows: float, seconds: float, sessions: int) -> None:
        self.sessions = sessions
        self.points = [p for p in self.points if p[0] != rows][-1:] + [(rows, seconds)]
        if len(self.points) == 2:
            (r1, s1), (r2, s2) = self.points
            slope = (s2 - s1) / (r2 - r1)
            if slope <= 0:  # noise (a loaded machine): take it all as per message, as a rate would
                self.per_row, self.fixed = s2 / max(r2, 1), 0.0
            else:
                self.per_row, self.fixed = slope, max(s2 - slope * r2, 0.0)

    def allows(self, sessions: int) -> bool:
        """Whether a batch of ``sessions`` may be tried: at most twice the last transaction's (one more
        until the cost is fitted), so that a fit from small batches is checked before it is trusted far."""
        if self.per_row is None:
            return sessions <= self.sessions + 1
        return sessions <= max(2 * self.sessions, self.sessions + 1)

    def fits(self, rows: float, bound: float) -> bool:
        if self.per_row is None or self.fixed is None:  # both are fitted together
            return True
        return not bound or self.fixed + self.per_row * rows <= bound


def release_prune(
    conn: sqlite3.Connection, plan: Plan, schema: Schema, deleter: ReleaseDeleter, *, batch_size: int,
    batch_time: float, pause: float, result: PruneResult, remove: bool = True, stop: Stop | None = None,
) -> PruneResult:  # fmt: skip
    """Delete ``plan.delete_order`` through ``deleter``, paced like the engine's own prune.

    A request is one transaction of the release: its bulk delete takes whole sessions up to
    ``batch_size`` messages, as many as fit in ``batch_time`` at the cost fitted so far
    (TransactionCost; one session, then two, to measure); without one, one session per request. Before each request its
    sessions are checked again on ``conn`` (resumed, leased, routed since the plan: left alone);
    after it, WriterTurn lets a waiting writer of the gateway in. A batch the release refuses
    whole is retried a session at a time, so that only the refused one stays (``result.refused``).
    ``remove`` false (check mode, on a copy): transcripts are counted, not removed.
    """
    db_path = conn.execute("PRAGMA database_list").fetchone()[2]
    wal = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    writing = writer_probe(db_path, wal=wal) if remove else None
    turn = WriterTurn(writing, pause) if writing else None
    queue = collections.deque((sid, False) for sid in plan.delete_order)  # (session, to be deleted alone)
    cost = TransactionCost()
    run = _ReleaseRun(conn, plan, schema, deleter, result, engine_prune.is_fenced(schema), remove, db_path)
    while queue:
        result.stopped = stop() if stop else None
        if result.stopped:
            break
        ids = _still_to_delete(run, _next_request(queue, plan, deleter.bulk, cost, batch_size, batch_time))
        if not ids:
            continue
        began = time.monotonic()
        answer = deleter.delete(ids)
        if answer["error"] and len(ids) > 1 and not answer["deleted"]:
            queue.extendleft((sid, True) for sid in reversed(ids))  # one at a time: only the refused one stays
            continue
        _count_answer(run, ids, answer)
        cost.measured(answer["messages"], answer["seconds"], len(ids))
        held = time.monotonic() - began
        if turn:
            turn.wait(held)
        elif remove:
            time.sleep(max(pause, poll_gap(held) + 0.005))
    return result


@dataclass
class _ReleaseRun:
    """What ``release_prune``'s steps share."""

    conn: sqlite3.Connection
    plan: Plan
    schema: Schema
    deleter: ReleaseDeleter
    result: PruneResult
    fenced: bool  # the store has upstream's deletion fence (the runtime ledger)
    remove: bool  # transcripts removed (the run), else counted (check mode, on a copy)
    db_path: str


def _next_request(
    queue: collections.deque[tuple[str, bool]], plan: Plan, bulk: bool, cost: TransactionCost, batch_size: int,
    batch_time: float,
) -> list[str]:  # fmt: skip
    """The sessions of the next request: one, or with a bulk delete as many as fit (``cost``)."""
    first, alone = queue.popleft()
    batch = [first]
    if bulk and not alone:  # grow it to what fits
        rows = plan.messages.get(first, 0)
        while queue and not queue[0][1] and cost.allows(len(batch) + 1):
            more = plan.messages.get(queue[0][0], 0)
            if rows + more > batch_size or not cost.fits(rows + more, batch_time):
                break
            batch.append(queue.popleft()[0])
            rows += more
    return batch


def _still_to_delete(run: _ReleaseRun, batch: list[str]) -> list[str]:
    """The sessions of ``batch`` that still qualify (the engine's own re-check); the others, and what
    depends on them, are left alone."""
    conn, plan, schema, skipped = run.conn, run.plan, run.schema, run.result.left_alone
    leased = live_leases(conn, schema, time.time())
    # on a fenced store a route goes with its session, as with the engine (drop_routes below)
    routed = set() if run.fenced else routed_sessions(conn, schema)
    ids = []
    for sid in batch:
        if sid in skipped or sid in routed or not engine_prune.still_prunable(conn, sid, plan, schema, leased):
            engine_prune.skip_with_ancestors(sid, plan, skipped)
            continue
        ids.append(sid)
    return ids


def _count_answer(run: _ReleaseRun, ids: list[str], answer: dict[str, Any]) -> None:
    """What the release deleted of ``ids``: the refused ones left alone, its routes dropped, the
    counts, the transcripts of the sessions gone (removed once their deletion is durable)."""
    result, plan = run.result, run.plan
    gone = set(answer["deleted"])
    if answer["error"]:
        for sid in ids:
            if sid not in gone:
                result.refused.append({"session": sid, "by": run.deleter.release, "message": answer["error"]})
                engine_prune.skip_with_ancestors(sid, plan, result.left_alone)
    if run.fenced and gone:
        drop_routes(run.conn, run.schema["tables"], sorted(gone))  # a release whose delete left them
    result.sessions += len(gone)
    result.messages += answer["messages"]
    result.orphaned += answer["orphaned"]
    result.prompts += answer["prompts"]
    files = [path for sid in gone for path in plan.transcripts.get(sid, ())]
    if run.remove and files:  # the release's commit may be only in the page cache: durable first
        commits_durable(run.db_path)
        result.transcripts += remove_files(files)
        removals_durable(files)
    elif not run.remove:
        result.transcripts += len(files)


def drop_routes(conn: sqlite3.Connection, tables: Any, sids: list[str]) -> None:
    """The ``gateway_routing`` entries still naming sessions the release deleted, removed in a short
    transaction of the engine's, as upstream's retire_routes does in its own delete."""
    with write_transaction(conn):
        for scope, key in routes_naming(conn, tables, sids):
            conn.execute("DELETE FROM gateway_routing WHERE scope = ? AND session_key = ?", (scope, key))


def release_prune_on_copy(
    conn: sqlite3.Connection,
    plan: Plan,
    schema: Schema,
    python: str,
    *,
    batch_size: int,
    batch_time: float,
    end_reason: str,
) -> tuple[PruneResult, dict[str, Any]]:
    """Check mode: the run's zombie closes, then the same loop, on a private copy (SQLite's backup
    API) in a fresh 0700 directory, removed afterwards. Returns (PruneResult, the deleter's info)."""
    check_python(python, "delete_with=hermes")
    scratch = tempfile.mkdtemp(prefix="hermes-ops-delete-")
    copy_conn = None
    try:
        copy = os.path.join(scratch, "state.db")
        os.close(os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        copy_conn = sqlite3.connect(copy, isolation_level=None)
        conn.backup(copy_conn)
        close_zombies(copy_conn, plan, schema, end_reason=end_reason, pause=0.0, closed=[])  # as the run does first
        deleter = ReleaseDeleter(python, copy, scratch)
        try:
            result = release_prune(
                copy_conn, plan, schema, deleter,
                batch_size=batch_size, batch_time=batch_time, pause=0.0, result=PruneResult(), remove=False,
            )  # fmt: skip
        finally:
            deleter.close()
        return result, deleter.info()
    finally:
        if copy_conn is not None:
            copy_conn.close()
        shutil.rmtree(scratch, ignore_errors=True)


# Runs under the release's interpreter: who it is, and whether its own delete publishes upstream's
# deletion fence: the module upstream keeps it in (hermes_state_mutation_retirement, read at 4f64356)
# with retire_sessions and retire_prunable, called by SessionDB's delete_session, delete_sessions and
# prune_sessions or by the functions they call (upstream's hermes_state_raw_delete at 0860dc1f).
_CAPABILITY = (
    _FIND_RELEASE
    + r"""
import importlib, inspect, json, sys
FENCE = ("retire_sessions", "retire_prunable")
def calls_fence(fn, depth=3):
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    if any(name in fn.__code__.co_names for name in FENCE):
        return True
    if depth == 0:
        return False
    names = fn.__code__.co_names
    scope = dict(vars(sys.modules[fn.__module__]))
    for n in names:  # a module its body imports (Hermes's own only: nothing else is loaded for the probe)
        if n not in scope and n.startswith("hermes_state"):
            try:
                scope[n] = importlib.import_module(n)
            except Exception:
                pass
    for name in names:
        target = scope.get(name)
        found = [getattr(target, n, None) for n in names] if inspect.ismodule(target) else [target]
        if any(inspect.isfunction(f) and f is not fn and calls_fence(f, depth - 1) for f in found):
            return True
    return False
why = None
try:
    fence = importlib.import_module("hermes_state_mutation_retirement")
    missing = [n for n in FENCE if not callable(getattr(fence, n, None))]
    if missing:
        why = "its hermes_state_mutation_retirement has no %s" % ", ".join(missing)
except Exception as exc:
    why = "it has no hermes_state_mutation_retirement module (%s)" % type(exc).__name__
if why is None:
    try:
        import hermes_state
        for name in ("delete_session", "delete_sessions", "prune_sessions"):
            method = getattr(hermes_state.SessionDB, name, None)
            if method is not None and not calls_fence(method):
                why = "its SessionDB.%s (%s) does not call the fence" % (name, method.__module__)
                break
    except Exception as exc:
        why = "its delete code could not be read (%s: %s)" % (type(exc).__name__, exc)
print(json.dumps({"release": release, "version": version, "why": why}))
"""
)


def installed_capability(python: str) -> dict[str, Any]:
    """{"release", "version", "why"} of the Hermes at ``python``: ``why`` None when its own delete
    publishes upstream's deletion fence, else what it lacks."""
    check_python(python, "delete_with auto")
    scratch = tempfile.mkdtemp(prefix="hermes-ops-version-")
    try:
        env = {"HOME": scratch, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run(
            [python, "-c", _CAPABILITY], cwd=scratch, env=env, capture_output=True, text=True,
            timeout=ANSWER_TIMEOUT, check=False,
        )  # fmt: skip
        answer = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        answer = {}
    if not answer:
        answer = {"why": "it could not be asked (%s)" % python}
    shutil.rmtree(scratch, ignore_errors=True)
    return answer


def choose_deleter(
    mode: str, catalogue: Catalogue, python: str | None, fully_known: Callable[[Catalogue], bool]
) -> tuple[str, str | None]:
    """(ENGINE or HERMES, why): who deletes on this file. ``auto`` on a file with objects the engine
    does not know: the installed Hermes when its own delete publishes upstream's deletion fence
    (``installed_capability``: by what it ships, not by its version, which a git install may not
    even report), else the engine (whose catalogue rules then refuse what those objects could
    affect, naming them) and why."""
    if mode in (ENGINE, HERMES):
        return mode, None
    if fully_known(catalogue):
        return ENGINE, None
    if not python:
        return ENGINE, "no hermes_python to hand the deletes to"
    try:
        answer = installed_capability(python)
    except MaintenanceError as exc:  # root on a root-owned file: never the Hermes user's code
        return ENGINE, str(exc)
    if answer.get("why") is None:
        return HERMES, None
    return ENGINE, "the installed Hermes (%s) does not publish upstream's deletion fence in its delete: %s" % (
        answer.get("release") or "release unreadable",
        answer["why"],
    )
