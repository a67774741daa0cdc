"""SIGKILL trials on the archive path: rollback-journal mode, beside a live Hermes 0.22.2.

The file is written by the real Hermes 0.22.2 (``journal_mode=DELETE`` on this SQLite) and
held by a real 0.22.2 ``SessionDB`` appending a message every 50 ms to a session of its own
(tests/lib/hermes_writer.py), so the run archives what it prunes instead of copying the whole
file. Its sessions include two larger than an archive read (``ARCHIVE_CHUNK``) and larger than
a prune transaction (``batch_size``), so both are read by id ranges and deleted in slices.

Each trial runs ``run_maintenance`` in a separate ``python -c`` process (the real engine from
build/collections) and SIGKILLs it:

* **at an exact point**: the child numbers every step of the archive and the prune (each
  archive read, the verification, each fsync before and after the rename, each write
  transaction opened, about to commit and committed, each transcript removal) and kills
  itself with SIGKILL at the step the trial names. An uninterrupted run counts the steps;
  the default kills at every step of the archive and at every tenth of the prune,
  ``HERMES_ARCHIVE_KILL_POINTS=all`` (``make crash-trials-archive``) at every step of both;
* **at a random moment** (``HERMES_ARCHIVE_CRASH_TRIALS``, seeded, default 4): SIGKILL from
  outside, a seeded fraction into the archive or the prune.

After each kill:

* state.db passes ``integrity_check``, every FTS5 ``integrity-check`` and ``foreign_key_check``;
* no message is lost: every session of the file is still there with all its messages, or
  is, whole, in a finished archive; every finished archive passes the restore's own check;
  a left-over ``.partial`` is never listed and is refused by the restore;
* the 0.22.2 writer kept writing through the kill (no failed append after it);
* a second, uninterrupted run completes, leaves what an uninterrupted run leaves, and its
  archive holds exactly what it pruned; no partial is left;
* restoring every archive into a copy of the file brings every pruned session back exactly
  as it was, and a fresh 0.22.2 ``SessionDB`` opens the file, writes and searches.

The restore of archived sessions (``restore_from_archive``, beside the same writer) is killed
at its transaction steps too (every seventh by default, every one with
``HERMES_ARCHIVE_KILL_POINTS=all``): the file passes every check, check mode then predicts
exactly what the next restore does, that restore ends where an uninterrupted one ends, and a
third changes nothing.
"""

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from hermes_reliability import COLLECTIONS_ROOT, MARKS, db_problems, full_rows, parse_mark, query, session_rows
from hermes_rollback import RELEASE, journal_mode, make_big_rollback_home
from hermes_writer import WriterProcess

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.archive import (
    ARCHIVE_CHUNK,
    list_archives,
    restore_sessions,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import (
    check_archive,
    resolve_archive,
    restore_from_archive,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import hermes_python, reopen_as_zombies, run_release_code

# `slow`: the default trials take about two minutes, so the Python and SQLite matrix legs
# leave them to `make unit` and `make units` (the engine code they kill is the same there).
pytestmark = [
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.releases,
    pytest.mark.skipif(
        hermes_python(RELEASE) is None, reason="no hermes-%s venv (tests/setup_hermes_venvs.sh)" % RELEASE
    ),
]

WRITER_PREFIX = "crash-gw"
BIG_SESSIONS = 2
BIG_MESSAGES = ARCHIVE_CHUNK * 2 + 137  # read in three ranges, deleted in slices
# batch_time 0: transactions end by batch_size alone, so the steps of a run are the same on a
# busy machine as on an idle one (a time bound ends them earlier when the machine is slow, and
# step N of the reference run would then be another step, or none, in the trial).
OPTIONS = {"allow_unknown_schema": True, "prune_days": 7, "batch_size": 300, "batch_pause": 0.002, "batch_time": 0}
NOT_KILLED = "the child was not killed (rc 0)"
ALL_POINTS = os.environ.get("HERMES_ARCHIVE_KILL_POINTS") == "all"
EVERY = 1 if ALL_POINTS else 10  # of the prune's steps
RESTORE_EVERY = 1 if ALL_POINTS else 7  # of the restore's steps
RANDOM_TRIALS = int(os.environ.get("HERMES_ARCHIVE_CRASH_TRIALS", "4"))

# The child: the real engine; every step of the archive and the prune is numbered on stderr,
# and at step KILL_AT (0: never) the process SIGKILLs itself, so the kill lands exactly there.
CHILD = (
    MARKS
    + r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import prune as apply_
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import archive
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import deleter, execution
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import run as engine
KILL_AT = int(sys.argv[3])

apply_.write_transaction = marked(apply_.write_transaction)
apply_.remove_files = around("remove_files", apply_.remove_files)
for name in ("_archive_chunk", "_archive_messages", "verify_archive", "fsync_path"):
    setattr(archive, name, around(name, getattr(archive, name)))
for steps in (execution, deleter):  # the run's archive, and a sliced session's own (deleter.slice_copy)
    steps.take_archive = around("take_archive", steps.take_archive)
deleter.prune = around("prune", deleter.prune)
result = engine.run_maintenance(json.loads(sys.argv[2]))
print(json.dumps(result))
"""
)

OPEN_AND_WRITE = r"""
import json, sys, time
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    db.create_session("after-crash", "cli")
    db.append_message("after-crash", "user", "quokka after the crash")
    hits = db.search_messages("quokka", limit=10)
    print(json.dumps({"hits": len(hits), "messages": len(db.get_messages("after-crash"))}))
finally:
    db.close()
"""


def run_child(home, kill_at=0, kill_in=None, rng=None, spans=None, timeout=180):
    """Maintenance in a child; returns (steps [(n, text, t)], returncode, result or None).

    ``kill_at``: the step at which it kills itself. ``kill_in``: a phase (``take_archive`` or
    ``prune``) into which it is SIGKILLed from here, a seeded fraction of that phase's length.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(COLLECTIONS_ROOT), json.dumps(dict(OPTIONS, hermes_home=[str(home)])),
         str(kill_at)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    steps, other, entered = [], [], threading.Event()

    def reader():
        for line in proc.stderr:
            mark = parse_mark(line)
            if mark:
                steps.append(mark)
                if kill_in and mark[1] == kill_in + " start":
                    entered.set()
            else:
                other.append(line)
        entered.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    if kill_in:
        entered.wait(timeout)
        if proc.poll() is None:
            time.sleep(rng.random() * spans[kill_in] * 0.95)
            proc.send_signal(signal.SIGKILL)
    stdout = proc.stdout.read()  # not communicate(): it would read stderr too, under the reader's feet
    proc.wait(timeout)
    thread.join(10)
    result = json.loads(stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    if not kill_at and not kill_in:
        assert proc.returncode == 0, "".join(other)
    return steps, proc.returncode, result


def ours(rows):
    """The sessions of the file, without the writer's own."""
    return {sid: row for sid, row in rows.items() if not sid.startswith(WRITER_PREFIX)}


def build_template(root):
    home = root / "template"
    now = time.time()
    db = make_big_rollback_home(home, 80, 12, seed=21, now=now)
    assert journal_mode(db) == "delete", "the release chose WAL here: these trials are about rollback-journal mode"
    reopen_as_zombies(db, now, 6, 3)
    conn = sqlite3.connect(str(db))
    with conn:
        big = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE ended_at < ? ORDER BY id LIMIT ?",
                                          (now - 10 * 86400, BIG_SESSIONS))]  # fmt: skip
        for sid in big:
            start = conn.execute("SELECT MAX(timestamp) FROM messages WHERE session_id = ?", (sid,)).fetchone()[0]
            conn.executemany(
                "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                [(sid, "user", "long session %s line %d wombat" % (sid, i), start - 1 - i * 1e-3)
                 for i in range(BIG_MESSAGES)],
            )  # fmt: skip
        # Rows of another table tied to each session (ON DELETE CASCADE): archived and restored with it.
        conn.executemany(
            "INSERT INTO session_model_usage (session_id, model, api_call_count, input_tokens) VALUES (?, ?, ?, ?)",
            [(sid, model, n + 1, 100 * n) for n, (sid,) in enumerate(conn.execute("SELECT id FROM sessions").fetchall())
             for model in ("model-a", "model-b")],
        )  # fmt: skip
    conn.close()
    assert len(big) == BIG_SESSIONS
    return home


def usage_rows(path):
    """{session id: its session_model_usage rows}, of the sessions that are not the writer's."""
    rows = {}
    for row in query(path, "SELECT * FROM session_model_usage ORDER BY session_id, model"):
        if not row[0].startswith(WRITER_PREFIX):
            rows.setdefault(row[0], []).append(row)
    return rows


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The template, and an uninterrupted run of it beside the writer: final state, steps, phase lengths."""
    root = tmp_path_factory.mktemp("archive-crash")
    template = build_template(root)
    home = root / "reference"
    shutil.copytree(str(template), str(home))
    with live_writer(home, root / "reference-writer.jsonl"):
        steps, _rc, result = run_child(home)
    profile = result["profiles"][0]
    assert profile["status"] == "ok" and profile["backup"]["kind"] == "archive", profile
    assert profile["sessions_pruned"] >= 40 and profile["messages_pruned"] > 2 * BIG_MESSAGES, profile
    times = {text: t for _n, text, t in steps}
    spans = {phase: times[phase + " end"] - times[phase + " start"] for phase in ("take_archive", "prune")}
    names = [text for _n, text, _t in steps]
    assert names.count("_archive_messages end") == BIG_SESSIONS and "fsync_path start" in names
    return {
        "template": template,
        "root": root,
        "before": ours(session_rows(template / "state.db")),
        "usage": usage_rows(template / "state.db"),
        "final": ours(full_rows(home / "state.db")),
        "steps": steps,
        "spans": spans,
    }


class live_writer:
    """A real Hermes 0.22.2 SessionDB holding state.db open and appending every 50 ms."""

    def __init__(self, home, out):
        self.writer = WriterProcess(hermes_python(RELEASE), home / "state.db", str(out), prefix=WRITER_PREFIX,
                                    interval=0.05)  # fmt: skip

    def __enter__(self):
        self.writer.start()
        return self.writer

    def __exit__(self, *exc):
        self.writer.kill()


def lost_and_kept(home, ref):
    """Problems: each session of the template is in state.db whole, or whole in a finished archive."""
    problems = []
    now_rows = ours(session_rows(home / "state.db"))
    archived = {}
    backups = home / "backups"
    for path, _stamp in list_archives(str(backups), "default"):
        try:
            check_archive(path)
        except MaintenanceError as exc:
            problems.append("a finished archive fails the restore's check: %s" % exc)
            continue
        for sid, row in session_rows(path).items():
            archived.setdefault(sid, []).append(row)
    for sid, row in ref["before"].items():
        if now_rows.get(sid) == row:
            continue
        if row not in archived.get(sid, []):
            where = "partly in state.db" if sid in now_rows else "not in state.db"
            problems.append("session %s is %s and in no finished archive whole: lost" % (sid, where))
    for name in os.listdir(str(backups)) if backups.is_dir() else []:
        if name.endswith(".partial"):
            try:
                resolve_archive(str(backups / name), str(backups))
                problems.append("the restore accepts the unfinished %s" % name)
            except MaintenanceError:
                pass
    return problems


def restore_everything(home, ref, workdir):
    """Every archive restored into a copy of state.db: each session as it was before the run."""
    copy = workdir / "restored.db"
    if copy.exists():
        copy.unlink()
    src, dst = sqlite3.connect(str(home / "state.db")), sqlite3.connect(str(copy))
    src.backup(dst)
    src.close()
    dst.close()
    for path, _stamp in list_archives(str(home / "backups"), "default"):
        restore_sessions(str(copy), path, pause=0)
    rows, usage = ours(session_rows(copy)), usage_rows(copy)
    problems = ["restored %s differs from before the run" % sid for sid, row in ref["before"].items()
                if rows.get(sid) != row or usage.get(sid) != ref["usage"].get(sid)]  # fmt: skip
    return problems + ["restored copy: %s" % p for p in db_problems(copy)]


def after_kill(home, ref, writer, killed_at):
    problems = ["after the kill: %s" % p for p in db_problems(home / "state.db")]
    problems += ["after the kill: %s" % p for p in lost_and_kept(home, ref)]
    time.sleep(0.3)  # the writer's next appends, after the kill
    later = [r for r in writer.records() if r["t"] >= killed_at]
    if any(r["err"] for r in later) or not any(r["id"] for r in later):
        problems.append("the 0.22.2 writer did not keep writing after the kill: %s" % later[:3])
    return problems


def second_run(home, ref, workdir):
    problems = []
    archives_before = {p for p, _s in list_archives(str(home / "backups"), "default")}
    profile = run_maintenance(dict(OPTIONS, hermes_home=[str(home)]))["profiles"][0]
    if profile["status"] != "ok":
        return ["the next run: %s: %s" % (profile["status"], profile["error"])]
    backup = profile["backup"]
    if profile["sessions_pruned"]:
        new = {p for p, _s in list_archives(str(home / "backups"), "default")} - archives_before
        if backup["kind"] != "archive" or backup["path"] not in new:
            problems.append("the next run took no new archive: %s" % backup)
        else:
            held = check_archive(backup["path"])
            if (held["sessions"], held["messages"]) != (profile["sessions_pruned"], profile["messages_pruned"]):
                problems.append("the next run's archive holds %s, it pruned %s" % (held, profile))
    if ours(full_rows(home / "state.db")) != ref["final"]:
        problems.append("the next run leaves another state than an uninterrupted run")
    partials = [n for n in os.listdir(str(home / "backups")) if n.startswith(".")]
    if partials:
        problems.append("partials left after the next run: %s" % partials)
    problems += ["after the next run: %s" % p for p in db_problems(home / "state.db")]
    problems += ["after the next run: %s" % p for p in lost_and_kept(home, ref)]
    problems += restore_everything(home, ref, workdir)
    return problems


def hermes_opens_and_writes(home):
    proc = run_release_code(hermes_python(RELEASE), OPEN_AND_WRITE, str(home / "state.db"))
    if proc.returncode != 0:
        return ["Hermes 0.22.2 cannot open and write: %s" % proc.stderr[-800:]]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    return [] if seen == {"hits": 1, "messages": 1} else ["Hermes 0.22.2 after the crash saw %s" % seen]


def trial(ref, tmp_path, label, **kill):
    home = tmp_path / label
    shutil.copytree(str(ref["template"]), str(home))
    with live_writer(home, tmp_path / (label + ".jsonl")) as writer:
        started = time.time()
        steps, rc, _result = run_child(home, **kill)
        killed_at = time.time() if rc != 0 else None
        where = steps[-1][1] if steps else "before the first step"
        problems = []
        if rc != -signal.SIGKILL:
            problems.append(NOT_KILLED if rc == 0 else "the child was not killed (rc %s)" % rc)
        else:
            problems += after_kill(home, ref, writer, killed_at or started)
        problems += second_run(home, ref, tmp_path)
        summary = writer.stop()
        if summary["failed"]:
            problems.append("the 0.22.2 writer had %d failed appends" % summary["failed"])
    problems += hermes_opens_and_writes(home)
    shutil.rmtree(str(home))
    return where, problems


def test_sigkill_at_every_step_of_the_archive_and_the_prune(reference, tmp_path):
    steps = reference["steps"]
    first = next(n for n, text, _t in steps if text == "take_archive start")
    archived = next(n for n, text, _t in steps if text == "take_archive end")
    # Every step of the archive (reads, verification, the fsyncs around the rename); of the prune, every EVERY-th.
    points = [n for n, _text, _t in steps if first <= n <= archived or (n > archived and n % EVERY == 0)]
    print("\narchive-path kill points: %d of %d steps" % (len(points), len(steps) - first + 1))
    failures, landed = [], {}
    for n in points:
        where, problems = trial(reference, tmp_path, "step-%d" % n, kill_at=n)
        landed[where] = landed.get(where, 0) + 1
        print("step %d (%s): %s" % (n, where, "ok" if not problems else "; ".join(problems)), flush=True)
        if problems:
            failures.append("step %d (%s):\n    %s" % (n, where, "\n    ".join(problems)))
    print("kills by step kind: %s" % sorted(landed.items()))
    assert not failures, "\n".join(failures)


def test_sigkill_at_random_moments_of_the_archive_and_the_prune(reference, tmp_path):
    base = int(os.environ.get("HERMES_CRASH_SEED") or random.SystemRandom().randrange(10**6))
    print("\narchive-path random kills: %d, base seed %d" % (RANDOM_TRIALS, base))
    failures = []
    for i in range(RANDOM_TRIALS):
        seed = base + i
        phase = ("take_archive", "prune")[seed % 2]
        # The delay is a fraction of the phase's length in the reference run; a child that ran
        # faster than that finished first: the same fraction of half the length, up to 4 times.
        for attempt in range(4):
            spans = {name: span * 0.5**attempt for name, span in reference["spans"].items()}
            where, problems = trial(reference, tmp_path, "seed-%d-%d" % (seed, attempt), kill_in=phase,
                                    rng=random.Random(seed), spans=spans)  # fmt: skip
            if problems[:1] != [NOT_KILLED]:
                break
            print("seed %d: the child finished before the kill; again with the delay halved" % seed, flush=True)
        print("seed %d: into %s -> last step %s: %s" % (seed, phase, where, "ok" if not problems else problems),
              flush=True)  # fmt: skip
        if problems:
            failures.append("seed %d (%s, %s):\n    %s" % (seed, phase, where, "\n    ".join(problems)))
    assert not failures, "base seed %d\n%s" % (base, "\n".join(failures))


# ------------------------------------------------------------------ the restore of archived sessions

RESTORE_CHILD = (
    MARKS
    + r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import archive
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import restore_from_archive
home, name, sessions, KILL_AT = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])

archive.write_transaction = marked(archive.write_transaction)
result = restore_from_archive(home, "default", name, sessions, pause=0)
print(json.dumps({k: result[k] for k in ("sessions_restored", "messages_restored", "rows_restored", "changed")}))
"""
)
RESTORED_SESSIONS = 10  # the two big ones among them: their messages go in several transactions


def run_restore_child(home, archive, sessions, kill_at=0):
    proc = subprocess.run(
        [sys.executable, "-c", RESTORE_CHILD, str(COLLECTIONS_ROOT), str(home), os.path.basename(archive),
         json.dumps(sessions), str(kill_at)],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    steps = [mark[1] for mark in map(parse_mark, proc.stderr.splitlines()) if mark]
    if not kill_at:
        assert proc.returncode == 0, proc.stderr
    return steps, proc.returncode


@pytest.fixture(scope="module")
def restore_reference(reference):
    """The pruned reference home, and one uninterrupted restore of some of its archived sessions."""
    pruned = reference["root"] / "reference"
    ((archive, _stamp),) = list_archives(str(pruned / "backups"), "default")
    held = [r[0] for r in sqlite3.connect(archive).execute("SELECT id FROM archive_sessions ORDER BY seq")]
    big = [sid for sid in held if reference["before"][sid][1] and
           sqlite3.connect(archive).execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (sid,)).fetchone()[0]
           > ARCHIVE_CHUNK]  # fmt: skip
    sessions = big + [sid for sid in held if sid not in big][: RESTORED_SESSIONS - len(big)]
    home = reference["root"] / "restore-reference"
    shutil.copytree(str(pruned), str(home))
    steps, _rc = run_restore_child(home, archive, sessions)
    restored = ours(full_rows(home / "state.db"))
    assert all(reference["usage"][sid] == usage_rows(home / "state.db")[sid] for sid in sessions)
    return {"home": pruned, "archive": archive, "sessions": sessions, "steps": steps, "restored": restored,
            "usage": usage_rows(home / "state.db")}  # fmt: skip


def test_sigkill_at_every_step_of_a_session_restore(restore_reference, reference, tmp_path):
    ref = restore_reference
    points = list(range(1, len(ref["steps"]) + 1, RESTORE_EVERY))
    print("\nsession-restore kill points: %d of %d steps" % (len(points), len(ref["steps"])))
    failures = []
    for n in points:
        home = tmp_path / ("restore-%d" % n)
        shutil.copytree(str(ref["home"]), str(home))
        with live_writer(home, tmp_path / ("restore-%d.jsonl" % n)) as writer:
            _steps, rc = run_restore_child(home, ref["archive"], ref["sessions"], kill_at=n)
            problems = [] if rc == -signal.SIGKILL else ["the restore was not killed (rc %s)" % rc]
            problems += ["after the kill: %s" % p for p in db_problems(home / "state.db")]
            name = os.path.basename(ref["archive"])
            predicted = restore_from_archive(str(home), "default", name, ref["sessions"], check_mode=True)
            done = restore_from_archive(str(home), "default", name, ref["sessions"], pause=0)
            again = restore_from_archive(str(home), "default", name, ref["sessions"], pause=0)
            for key in ("sessions_restored", "messages_restored", "rows_restored"):
                if predicted[key] != done[key]:
                    problems.append("check mode predicted %s=%s, the restore did %s" % (key, predicted[key], done[key]))
                if again[key] or again["changed"]:
                    problems.append("restoring again changed something: %s=%s" % (key, again[key]))
            if ours(full_rows(home / "state.db")) != ref["restored"] or usage_rows(home / "state.db") != ref["usage"]:
                problems.append("the completed restore differs from an uninterrupted one")
            problems += ["after the restore: %s" % p for p in db_problems(home / "state.db")]
            summary = writer.stop()
            if summary["failed"]:
                problems.append("the 0.22.2 writer had %d failed appends" % summary["failed"])
        where = ref["steps"][n - 1]
        print("step %d (%s): %s" % (n, where, "ok" if not problems else "; ".join(problems)), flush=True)
        if problems:
            failures.append("step %d (%s):\n    %s" % (n, where, "\n    ".join(problems)))
        shutil.rmtree(str(home))
    assert not failures, "\n".join(failures)
