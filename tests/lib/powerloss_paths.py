"""The engine's file protocols under power loss: each path recorded once, then every crash state checked.

A path is a small Hermes home (``build``), the engine call made on it in a child under strace
(``CHILD``, ``job``) and the invariants every crash state must keep (``checker``). See
tests/lib/crash_states.py for the model and docs/safety.md ("Power loss") for what is claimed.

Negative controls (``CONTROLS``): the child turns one named durability step of the engine into a
no-op before the run (in this harness only); the explorer must then report violations.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

import crash_states
from hermes_reliability import COLLECTIONS_ROOT, db_problems, full_rows

from hermes_fixtures import build_home, hermes_python, standard_scenario

DAY = 86400.0
PROFILE = "default"
ZIP_OLD = (b"PK old zip 1" * 300, b"PK old zip 2" * 300)
ZIP_NEW = b"PK newest zip, written by Hermes without an fsync" * 300
METRICS = ("hermes_ops_old 1\n", "hermes_ops_new 2\n")
LOG = ("=== Session Maintenance Start old\nold run\n", "=== Session Maintenance Start new\nnew run\n")

CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import importlib
for module in ("apply.prune", "backup.whole_file", "sqlite.db", "maintain.run", "apply.files", "report.metrics",
               "restore.whole_file", "runner", "restore.sessions"):  # as hermes_apply_prune, ... (the patches' names)
    globals()["hermes_" + module.replace(".", "_")] = importlib.import_module(
        "ansible_collections.hermes_agent.ops.plugins.module_utils._hermes." + module)
job = json.loads(sys.argv[2])
for patch in job["disable"]:
    exec(patch)
home = job["home"]
if job["kind"] == "maintenance":
    for name, data in job.get("hermes_writes", {}).items():  # Hermes writing a file, no fsync
        with open(os.path.join(home, name), "wb") as handle:
            handle.write(bytes.fromhex(data))
    result = hermes_maintain_run.run_maintenance(job["options"])
    bad = [p for p in result["profiles"] if p.get("status") != "ok"]
    assert not bad, bad
elif job["kind"] == "restore":
    plan = hermes_restore_whole_file.plan_restore(home, "default")
    hermes_restore_whole_file.restore(plan)
elif job["kind"] == "session_restore":
    import sqlite3  # a live holder (the gateway): our connection's close cannot checkpoint
    holder = sqlite3.connect(os.path.join(home, "state.db"))
    holder.execute("SELECT count(*) FROM sessions").fetchall()
    chosen = hermes_restore_sessions.selection(sessions=job["gone"])
    hermes_restore_sessions.restore_selected(home, "default", backup="newest", select=chosen)
elif job["kind"] == "metrics_log":
    hermes_report_metrics.write_atomically(os.path.join(home, "metrics"), "hermes_ops_x.prom", job["metrics"])
    hermes_runner.append_log(os.path.join(home, "logs", "maintenance.log"), job["log"], 12)
print("done")
"""

HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT count(*) FROM sessions").fetchall()
print("ready", flush=True)
time.sleep(600)
"""

# name: (path it shows on, what the child does to the engine first)
CONTROLS = {
    "backup_dir_created_durably": (
        "prune-wal-no-transcripts", "hermes_backup_whole_file.makedirs_durable = lambda p, m: os.makedirs(p, m)"),
    "transcripts_after_durable_commit": ("prune-wal-frames", "hermes_apply_prune.commits_durable = lambda p: None"),
    "transcript_list_durable": ("prune-wal-frames", "hermes_apply_prune.pending_durable = lambda p: None"),
    "transcript_removals_durable": ("prune-wal-frames", "hermes_apply_prune.removals_durable = lambda p: None"),
    "rollback_synchronous_extra": ("prune-rollback-vacuum", "hermes_sqlite_db.ROLLBACK_SYNCHRONOUS = 'FULL'"),
    "restore_aside_durable": ("restore", "hermes_restore_whole_file.aside_durable = lambda a, d: None"),
    "restore_settles_the_old_file": ("restore", "hermes_restore_whole_file.settle = lambda db: 'not settled'"),
    "session_restore_pending_after_commits": (
        "session-restore", "hermes_restore_sessions.commits_durable = lambda p: None"),
    "retention_newest_durable": ("file-retention", "hermes_apply_files.newest_durable = lambda item: None"),
    "metrics_rename_durable": ("metrics-log", "hermes_report_metrics.fsync_path = lambda p: None"),
    "runner_log_durable": ("metrics-log", "hermes_runner.fsync_path = lambda p: None"),
}  # fmt: skip
# The same, for every fsync at once: the child run under eatmydata (fsync a no-op in the libc).
EATMYDATA_PATHS = ("prune-wal-frames", "restore")


# --------------------------------------------------------------------------- homes


def close_leaving_the_wal(conn, db):
    """Close ``conn`` and leave its committed frames in the -wal, as a killed writer does: the
    pair copied while the connection holds them (closing checkpoints and deletes the -wal)."""
    shutil.copyfile(str(db), str(db) + ".keep")
    shutil.copyfile(str(db) + "-wal", str(db) + "-wal.keep")
    conn.close()
    os.replace(str(db) + ".keep", str(db))
    os.replace(str(db) + "-wal.keep", str(db) + "-wal")


def _wal_with_frames(db):
    """Leave committed frames in the -wal."""
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("UPDATE sessions SET title = 'in the wal' WHERE id = (SELECT max(id) FROM sessions)")
    conn.commit()
    close_leaving_the_wal(conn, db)


def messages_only_in_the_wal(db, count):
    """``count`` messages committed to the -wal only (the file never checkpointed: a gateway killed)."""
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA wal_autocheckpoint=0")
    sid = conn.execute("SELECT max(id) FROM sessions").fetchone()[0]
    for i in range(count):
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', ?, ?)",
            (sid, "only in the wal %d: the zebra widget" % i, time.time()),
        )
    conn.commit()
    close_leaving_the_wal(conn, db)


HOT_JOURNAL = r"""
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size=1")  # the changed pages spill into the file before the commit
conn.execute("BEGIN")
conn.execute("UPDATE messages SET content = content || ' never committed'")
os._exit(0)  # killed inside the transaction: the file half changed, its hot journal beside it
"""


def hot_journal(db):
    """A rollback-journal file a writer was killed in: pages of an uncommitted transaction in it."""
    before = open(str(db), "rb").read()
    subprocess.run([sys.executable, "-c", HOT_JOURNAL, str(db)], check=True)
    assert os.path.getsize(str(db) + "-journal") > 0 and open(str(db), "rb").read() != before


def restore_home(home, layout, now):
    """40 sessions, 240 messages in a release's file, a backup of it a day old, then the file
    changed after the backup (every title); returns state.db's path."""
    specs = [
        {"id": "s%02d" % i, "source": "cli", "started_days_ago": 1 + i, "ended_days_ago": 0.5 + i, "messages": 6}
        for i in range(40)
    ]
    db = build_home(home, layout, specs, now=now)
    backups = os.path.join(home, "backups")
    os.mkdir(backups, 0o700)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now - DAY))
    shutil.copyfile(str(db), os.path.join(backups, "hermes-ops_%s_%s.db" % (PROFILE, stamp)))
    os.chmod(os.path.join(backups, "hermes-ops_%s_%s.db" % (PROFILE, stamp)), 0o600)
    conn = sqlite3.connect(str(db))  # the current file differs from the backup
    conn.execute("UPDATE sessions SET title = 'after the backup ' || id")
    conn.commit()
    conn.close()
    return db


def _journal_mode(db, mode):
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA journal_mode=%s" % mode)
    conn.close()


def build(path, root):
    """Make root/home for ``path``; returns the job the child runs (without ``disable``)."""
    home = os.path.join(root, "home")
    now = time.time()
    options = {"hermes_home": [home], "prune_days": 7, "batch_size": 4, "batch_pause": 0.0, "backup_compress": False}
    if path == "restore":  # 0.19.0's WAL file, 5 committed messages only in its -wal
        db = restore_home(home, "hermes-0.19.0", now)
        messages_only_in_the_wal(db, 5)
        return {"home": home, "kind": "restore", "options": options}
    if path == "restore-rollback":  # 0.22.2's file in rollback-journal mode, a hot journal beside it
        db = restore_home(home, "hermes-0.22.2.post1", now)
        _journal_mode(db, "DELETE")
        hot_journal(db)
        return {"home": home, "kind": "restore", "options": options}
    db = build_home(home, "v30", standard_scenario("v30")[0], now=now)
    job = {"home": home, "kind": "maintenance", "options": options}
    if path in ("prune-wal-frames", "prune-wal-no-transcripts"):  # a first run: no backup directory yet
        _wal_with_frames(db)
        if path == "prune-wal-no-transcripts":  # nothing fsyncs the home before the first delete but the backup's steps
            shutil.rmtree(os.path.join(home, "sessions"))
    elif path == "prune-wal-gz-vacuum":
        os.mkdir(os.path.join(home, "backups"), 0o700)
        options.update(backup_compress=True, vacuum_mode="full")
    elif path == "prune-rollback-vacuum":
        _journal_mode(db, "DELETE")
        os.mkdir(os.path.join(home, "backups"), 0o700)
        options.update(vacuum_mode="full")
    elif path == "prune-archive-holder":  # rollback journal beside a live holder: archive, not a whole-file copy
        _journal_mode(db, "DELETE")
        os.mkdir(os.path.join(home, "backups"), 0o700)
        job["holder"] = True
    elif path == "file-retention":
        for i, data in enumerate(ZIP_OLD):
            name = os.path.join(home, "hermes-backup-2026-01-0%d.zip" % (i + 1))
            with open(name, "wb") as handle:
                handle.write(data)
            os.utime(name, (now - (10 - i) * DAY,) * 2)
        job["hermes_writes"] = {"hermes-backup-2026-12-01.zip": ZIP_NEW.hex()}
        options.update(file_retention={"hermes_backup_zip": {"keep": 1}})
    elif path == "session-restore":
        backups = os.path.join(home, "backups")
        os.mkdir(backups, 0o700)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now - DAY))
        shutil.copyfile(str(db), os.path.join(backups, "hermes-ops_%s_%s.db" % (PROFILE, stamp)))
        os.chmod(os.path.join(backups, "hermes-ops_%s_%s.db" % (PROFILE, stamp)), 0o600)
        conn = sqlite3.connect(str(db))  # sessions the backup holds and state.db lost
        conn.execute("PRAGMA foreign_keys=ON")
        gone = [
            r[0]
            for r in conn.execute("SELECT id FROM sessions WHERE ended_at IS NOT NULL AND parent_session_id IS NULL")
        ]
        gone = [
            sid
            for sid in gone
            if not conn.execute("SELECT 1 FROM sessions WHERE parent_session_id = ?", (sid,)).fetchone()
        ][:4]
        for sid in gone:
            conn.execute("DELETE FROM messages WHERE session_id = ?", (sid,))
            conn.execute("DELETE FROM sessions WHERE id = ?", (sid,))
        conn.commit()
        conn.close()
        job = {"home": home, "kind": "session_restore", "gone": gone}
    elif path == "metrics-log":
        for sub, name, text in (("metrics", "hermes_ops_x.prom", METRICS[0]), ("logs", "maintenance.log", LOG[0])):
            os.makedirs(os.path.join(home, sub), 0o700, exist_ok=True)
            with open(os.path.join(home, sub, name), "w") as handle:
                handle.write(text)
        job = {"home": home, "kind": "metrics_log", "metrics": METRICS[1], "log": LOG[1]}
    return job


PATHS = (
    "prune-wal-frames", "prune-wal-no-transcripts", "prune-archive-holder", "prune-wal-gz-vacuum",
    "prune-rollback-vacuum", "restore", "restore-rollback", "session-restore", "file-retention", "metrics-log",
)  # fmt: skip


# --------------------------------------------------------------------------- deeper, per state

RELEASE = "hermes-0.22.2.post1"  # opens a rollback-journal state.db
WAL_RELEASE = "hermes-0.19.0"  # opens a WAL one (0.22.2 may switch a WAL file's journal mode)
SEARCH_WORD = "zebra"  # in every fixture message (hermes_fixtures)
READER = r"""
import json, os, sys
from pathlib import Path
import hermes_state
for line in sys.stdin:
    ask = json.loads(line)
    child = os.fork()  # each state read by a process of its own: 0.22.2 keeps a descriptor after close()
    if child:
        os.waitpid(child, 0)
        continue
    try:
        db = hermes_state.SessionDB(db_path=Path(ask["db"]))
        try:
            hits = db.search_messages(ask["word"], limit=1000)
            counts = [db._conn.execute("SELECT count(*) FROM %s" % t).fetchone()[0] for t in ("sessions", "messages")]
        finally:
            db.close()
        out = {"sessions": sorted({hit["session_id"] for hit in hits}), "counts": counts}
    except Exception as exc:  # noqa: BLE001  # reported as the state's violation
        out = {"error": "%s: %s" % (type(exc).__name__, exc)}
    print(json.dumps(out), flush=True)
    os._exit(0)
"""


class Deep:
    """Per-state checks beyond the invariants, on every ``every``-th distinct state that keeps them:
    the real release (its own ``SessionDB``: 0.22.2 on a rollback-journal file, 0.19.0 on a WAL
    one) opens the state's state.db, counts its sessions and messages (a restore's: the old
    database's or the backup's) and its search finds a session the run keeps; and a rerun on the
    state converges: on the maintenance paths the maintenance ends without an error with the
    uninterrupted run's sessions, on the restore paths the restore ends with the backup's rows and
    a maintenance run after it without an error, and a second maintenance run changes nothing; on
    the session-restore path restoring the sessions again ends with the uninterrupted run's rows,
    and a third restore changes nothing.

    One reader process per release answers every state (a process per state would cost a second
    each). ``counts``: what was checked, per model (``reset`` between models)."""

    def __init__(self, every=1):
        self.every, self.seen = max(1, int(every)), 0
        self.readers, self.scratch = {}, None
        self.reset()

    def reset(self):
        self.seen = 0
        self.counts = {"release_opened": 0, "release_found_kept": 0, "reruns": 0, "converged": 0}

    def due(self):
        self.seen += 1
        return (self.seen - 1) % self.every == 0

    def _ask(self, release, python, db):
        reader = self.readers.get(release)
        if reader is None:
            if self.scratch is None:
                self.scratch = tempfile.mkdtemp(prefix="powerloss-release-")  # HERMES_HOME: outlives each state
            env = dict(os.environ, HERMES_HOME=self.scratch)
            env.pop("PYTHONPATH", None)  # the release imports only its own packages
            reader = self.readers[release] = subprocess.Popen(
                [python, "-c", READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, env=env, cwd="/",
            )  # fmt: skip
        reader.stdin.write(json.dumps({"db": db, "word": SEARCH_WORD}) + "\n")
        reader.stdin.flush()
        line = reader.stdout.readline()
        if not line:
            raise RuntimeError("the %s reader ended" % release)
        return json.loads(line)

    def release_reads(self, db, kept, counts=None):
        """Violations: the release cannot open ``db``, counts other sessions and messages than one
        of ``counts`` (when given), or its search finds none of ``kept``."""
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import is_wal_file

        release = WAL_RELEASE if is_wal_file(db) else RELEASE
        python = hermes_python(release)
        if python is None:
            return []
        answer = self._ask(release, python, db)
        if "error" in answer:
            return ["%s cannot open state.db: %s" % (release, answer["error"])]
        self.counts["release_opened"] += 1
        if counts and tuple(answer["counts"]) not in counts:
            return ["%s sees %d sessions, %d messages: neither %s" % ((release,) + tuple(answer["counts"]) + (
                " nor ".join("%d/%d" % pair for pair in sorted(counts)),))]  # fmt: skip
        if not set(answer["sessions"]) & kept:
            return ["%s's search finds no session the run keeps (%d hits)" % (release, len(answer["sessions"]))]
        self.counts["release_found_kept"] += 1
        return []

    def rerun_converges(self, shome, options, end_sessions, recorded_home):
        """Violations: a rerun fails, or keeps other sessions than the uninterrupted run, or leaves
        the list of a sliced delete, or a second rerun changes anything."""
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.undo import SLICED_SUFFIX
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import (
            run as hermes_maintain_run,
        )

        _moved_archives(os.path.join(shome, "state.db" + SLICED_SUFFIX), recorded_home, shome)
        options = dict(options, hermes_home=[shome])
        self.counts["reruns"] += 1
        first = hermes_maintain_run.run_maintenance(options)
        bad = ["rerun: %s" % p.get("error") for p in first["profiles"] if p.get("status") != "ok"]
        if bad:
            return bad
        db = os.path.join(shome, "state.db")
        sessions, _messages = _rows(db)
        if sessions != end_sessions:
            bad.append(
                "rerun: sessions differ from the uninterrupted run (extra %s, missing %s)"
                % (sorted(sessions - end_sessions)[:3], sorted(end_sessions - sessions)[:3])
            )
        if os.path.exists(db + ".hermes-ops-transcripts"):
            bad.append("rerun: the transcript list is left")
        if os.path.exists(db + SLICED_SUFFIX):
            bad.append("rerun: the list of a sliced delete is left")
        bad += self._second_run_changes_nothing(db, options)
        if not bad:
            self.counts["converged"] += 1
        return bad

    def rerun_restore_converges(self, shome, options, new):
        """Violations: restoring again on the state fails or does not end with the backup's rows
        (``new``), the maintenance after it fails, or a second maintenance run changes anything."""
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import (
            run as hermes_maintain_run,
        )
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import (
            whole_file as hermes_restore_whole_file,
        )
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError

        options = dict(options, hermes_home=[shome])
        self.counts["reruns"] += 1
        db = os.path.join(shome, "state.db")
        try:
            hermes_restore_whole_file.restore(hermes_restore_whole_file.plan_restore(shome, PROFILE))
        except MaintenanceError as exc:
            return ["restoring again: %s" % exc]
        if full_rows(db) != new:
            return ["restoring again does not end with the backup's rows"]
        first = hermes_maintain_run.run_maintenance(options)
        bad = [
            "maintenance after the restore: %s" % p.get("error") for p in first["profiles"] if p.get("status") != "ok"
        ]
        bad = bad or self._second_run_changes_nothing(db, options)
        if not bad:
            self.counts["converged"] += 1
        return bad

    def rerun_session_restore_converges(self, shome, recorded_home, gone, end_rows):
        """Violations: restoring the sessions again on the state fails or does not end with the
        uninterrupted run's rows (``end_rows``), or a third restore changes anything."""
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import (
            sessions as hermes_restore_sessions,
        )
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError

        self.counts["reruns"] += 1
        db = os.path.join(shome, "state.db")
        _moved_home(os.path.join(shome, "backups", ".hermes-ops-restore_%s.pending" % PROFILE), recorded_home, shome)
        chosen = hermes_restore_sessions.selection(sessions=gone)
        try:
            hermes_restore_sessions.restore_selected(shome, PROFILE, backup="newest", select=chosen)
            if full_rows(db) != end_rows:
                return ["restoring the sessions again does not end with the uninterrupted run's rows"]
            hermes_restore_sessions.restore_selected(shome, PROFILE, backup="newest", select=chosen)
        except MaintenanceError as exc:
            return ["restoring the sessions again: %s" % exc]
        if full_rows(db) != end_rows:
            return ["a third restore of the sessions changed something"]
        self.counts["converged"] += 1
        return []

    @staticmethod
    def _second_run_changes_nothing(db, options):
        from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import (
            run as hermes_maintain_run,
        )

        before = full_rows(db)
        second = hermes_maintain_run.run_maintenance(options)
        if second["changed"] or full_rows(db) != before:
            return ["a second rerun changed something: %s" % second.get("summary")]
        return []

    def close(self):
        for reader in self.readers.values():
            reader.stdin.close()
            reader.wait()
        self.readers = {}
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


# --------------------------------------------------------------------------- invariants


def _rows(db):
    conn = sqlite3.connect(db)  # a throwaway copy: a -wal beside it is replayed
    try:
        sessions = {r[0] for r in conn.execute("SELECT id FROM sessions")}
        messages = set(conn.execute("SELECT session_id, id FROM messages").fetchall())
    finally:
        conn.close()
    return sessions, messages


def _takes_a_write(db):
    conn = sqlite3.connect(db, isolation_level=None, timeout=1)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE powerloss_probe (x)")
        conn.execute("DROP TABLE powerloss_probe")
        conn.execute("COMMIT")
    finally:
        conn.close()


def _db_violations(db):
    if not os.path.exists(db):
        return ["state.db is missing"]
    try:
        conn = sqlite3.connect(db)  # a throwaway copy
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
        if "sessions" not in tables:  # an empty file passes integrity_check
            return ["state.db holds no sessions table (%d bytes)" % os.path.getsize(db)]
        problems = db_problems(db)
        if not problems:
            _takes_a_write(db)
        return problems
    except sqlite3.DatabaseError as exc:
        return ["state.db: %s" % exc]


def _finished_copies(home):
    """Rows of every finished backup or archive the restore's own checks accept."""
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import (
        sessions as hermes_restore_sessions,
    )
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import (
        whole_file as hermes_restore_whole_file,
    )
    from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError

    sessions, messages = set(), set()
    backups = os.path.join(home, "backups")
    for name in sorted(os.listdir(backups)) if os.path.isdir(backups) else ():
        path = os.path.join(backups, name)
        if name.startswith(".") or ".partial" in name:
            continue
        try:
            if name.startswith("hermes-ops-archive_"):
                hermes_restore_sessions.check_archive(path)
                plain = path
            elif name.startswith("hermes-ops_"):
                hermes_restore_whole_file.verify_backup(path)
                plain = path
                if name.endswith(".gz"):
                    plain = os.path.join(backups, ".check.db")
                    hermes_restore_whole_file.unpack_backup(path, plain)
            else:
                continue
            s, m = _rows(plain)
        except (MaintenanceError, sqlite3.DatabaseError, OSError, EOFError):
            continue
        sessions |= s
        messages |= m
    return sessions, messages


def _transcripts(home):
    found = {}
    sessions = os.path.join(home, "sessions")
    for name in os.listdir(sessions) if os.path.isdir(sessions) else ():
        sid = (
            name.split(".")[0].replace("request_dump_", "").rsplit("_", 1)[0]
            if name.startswith("request_dump_")
            else name.split(".")[0]
        )
        found.setdefault(sid, []).append(name)
    return found


def _pending_list(path):
    """Session ids the prune's transcript list names (what the next run's finish_pending reads)."""
    try:
        with open(path) as handle:
            return set(json.load(handle))
    except (OSError, ValueError):
        return set()


def checker(path, job, home, final_home, deep=None):
    """check(state_root, final) for ``path``: the violations of one crash state.

    ``home``: a copy of the home as it was before the run; a state's home is state_root/home.
    ``deep`` (a Deep): the release's read and the rerun's convergence too, on its sample."""
    invariants = _checker(job, home, final_home)
    if job["kind"] == "metrics_log":
        deep = None  # no state.db
    else:
        kept, _messages = _rows(os.path.join(final_home, "state.db"))

    def check(state_root, final):
        bad = invariants(state_root, final)
        if bad or deep is None or not deep.due():
            return bad
        shome = os.path.join(state_root, "home")
        bad = deep.release_reads(os.path.join(shome, "state.db"), kept, getattr(invariants, "counts", None))
        if not bad and job["kind"] == "maintenance":
            bad = deep.rerun_converges(shome, job["options"], kept, job["home"])
        elif not bad and job["kind"] == "restore":
            bad = deep.rerun_restore_converges(shome, job["options"], full_rows(os.path.join(final_home, "state.db")))
        elif not bad and job["kind"] == "session_restore":
            bad = deep.rerun_session_restore_converges(
                shome, job["home"], job["gone"], full_rows(os.path.join(final_home, "state.db"))
            )
        return bad

    check.deep = deep
    return check


def _checker(job, home, final_home):
    rel = "home"
    if job["kind"] == "maintenance":
        start_sessions, start_messages = _rows_of_copy(home)
        end_sessions, end_messages = _rows(os.path.join(final_home, "state.db"))
        transcripts = _transcripts(home)

        def check(state_root, final):
            shome = os.path.join(state_root, rel)
            bad = _db_violations(os.path.join(shome, "state.db"))
            if bad:
                return bad
            sessions, messages = _rows(os.path.join(shome, "state.db"))
            lost = (start_sessions - sessions) & end_sessions
            lost_messages = (start_messages - messages) & end_messages
            if lost or lost_messages:
                bad.append("rows the run keeps are missing: %d sessions, %d messages" % (len(lost), len(lost_messages)))
            saved_s, saved_m = _finished_copies(shome)
            unsaved = (start_sessions - sessions) - saved_s
            unsaved_m = (start_messages - messages) - saved_m
            if unsaved or unsaved_m:
                bad.append(
                    "deleted without a finished backup or archive: %d sessions, %d messages"
                    % (len(unsaved), len(unsaved_m))
                )
            now = _transcripts(shome)
            gone = sorted(sid for sid in sessions if set(transcripts.get(sid, ())) - set(now.get(sid, ())))
            if gone:
                bad.append("transcripts missing for sessions still present: %s" % ", ".join(gone[:3]))
            # a deleted session's transcript left behind must be on the list the next run finishes
            listed = _pending_list(os.path.join(shome, "state.db.hermes-ops-transcripts"))
            stranded = sorted(
                sid
                for sid in start_sessions - sessions
                if set(transcripts.get(sid, ())) & set(now.get(sid, ())) and sid not in listed
            )
            if stranded:
                bad.append("transcripts of deleted sessions left behind, on no list: %s" % ", ".join(stranded[:3]))
            if "file_retention" in job["options"]:
                zips = [n for n in os.listdir(shome) if n.startswith("hermes-backup-") and n.endswith(".zip")]
                contents = {open(os.path.join(shome, n), "rb").read() for n in zips}
                if not contents & (set(ZIP_OLD) | {ZIP_NEW}):
                    bad.append("no complete Hermes backup zip left (%d names)" % len(zips))
            return bad

        return check
    if job["kind"] == "restore":
        old = full_rows(_copy_of(home, "state.db"))
        backup = [os.path.join(home, "backups", n) for n in os.listdir(os.path.join(home, "backups"))][0]
        new = full_rows(backup)

        def check(state_root, final):
            """What Hermes opening the home sees at its own paths: the old database with every
            committed row, or the backup (and then the old database whole in the aside directory)."""
            shome = os.path.join(state_root, rel)
            bad = _db_violations(os.path.join(shome, "state.db"))
            if bad:
                return bad
            rows = full_rows(os.path.join(shome, "state.db"))
            if rows == old:
                return []
            if rows != new:
                sessions, messages = _rows(os.path.join(shome, "state.db"))
                return [
                    "state.db is neither the old database nor the backup: %d sessions, %d messages"
                    % (len(sessions), len(messages))
                ]
            asides = [n for n in os.listdir(shome) if n.startswith("state.db.pre-restore-")]
            for name in asides:
                kept = os.path.join(shome, name, "state.db")
                if os.path.isdir(os.path.join(shome, name)) and os.path.exists(kept):
                    try:
                        if full_rows(kept) == old:
                            return []
                    except sqlite3.DatabaseError:
                        continue
            return ["the backup is in place and the old database (with its -wal) is nowhere: %s" % asides]

        check.counts = {_counts(_copy_of(home, "state.db")), _counts(backup)}
        return check
    if job["kind"] == "session_restore":
        backup = [os.path.join(home, "backups", n) for n in os.listdir(os.path.join(home, "backups"))][0]
        want = {sid: m for sid, m in _messages_by_session(backup).items() if sid in job["gone"]}

        def check(state_root, final):
            shome = os.path.join(state_root, rel)
            bad = _db_violations(os.path.join(shome, "state.db"))
            if bad:
                return bad
            have = _messages_by_session(os.path.join(shome, "state.db"))
            pending_path = os.path.join(shome, "backups", ".hermes-ops-restore_%s.pending" % PROFILE)
            try:
                with open(pending_path) as handle:
                    pending = set(json.load(handle).get("sessions") or ())
            except (OSError, ValueError):
                pending = set()
            present, _messages = _rows(os.path.join(shome, "state.db"))
            partial = sorted(
                sid for sid in want if sid in present and have.get(sid) != want[sid] and sid not in pending
            )
            return ["partly restored and not listed as pending: %s" % partial] if partial else []

        return check
    if job["kind"] == "metrics_log":

        def check(state_root, final):
            shome = os.path.join(state_root, rel)
            bad = []
            for sub, name, texts in (("metrics", "hermes_ops_x.prom", METRICS), ("logs", "maintenance.log", LOG)):
                try:
                    with open(os.path.join(shome, sub, name)) as handle:
                        text = handle.read()
                except OSError:
                    text = None
                wanted = [texts[1] if sub == "metrics" else texts[0] + texts[1]]
                if not final:
                    wanted.append(texts[0])
                if text not in wanted:
                    bad.append(
                        "%s/%s: %s"
                        % (
                            sub,
                            name,
                            "missing"
                            if text is None
                            else "neither old nor new"
                            if not final
                            else "the run's text is not durable",
                        )
                    )
            return bad

        return check
    raise ValueError(job["kind"])


def _moved_home(pending, recorded_home, shome):
    """The pending list names its backup by the path the recorded run saw: the state's home is
    elsewhere (a rerun in place would see the same path)."""
    try:
        with open(pending) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return
    data["source"] = shome + data["source"][len(recorded_home) :]
    with open(pending, "w") as handle:
        json.dump(data, handle)


def _moved_archives(listed, recorded_home, shome):
    """The list of a sliced delete names its archives by the paths the recorded run saw (as above)."""
    try:
        with open(listed) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return
    for entry in data.values():
        entry["archive"] = shome + entry["archive"][len(recorded_home) :]
    with open(listed, "w") as handle:
        json.dump(data, handle)


def _counts(db):
    """(sessions, messages) in ``db``."""
    sessions, messages = _rows(db)
    return len(sessions), len(messages)


def _messages_by_session(db):
    conn = sqlite3.connect(db)
    try:
        out = {}
        for sid, role, content in conn.execute(
            "SELECT session_id, role, content FROM messages ORDER BY session_id, id"
        ):
            out.setdefault(sid, []).append((role, content))
        return out
    finally:
        conn.close()


def _copy_of(home, name):
    """A private copy of home/name with its -wal (reading must not checkpoint the original)."""
    scratch = os.path.join(os.path.dirname(home), "scratch-%d" % time.monotonic_ns())
    os.mkdir(scratch)
    for suffix in ("", "-wal", "-journal"):
        if os.path.exists(os.path.join(home, name + suffix)):
            shutil.copyfile(os.path.join(home, name + suffix), os.path.join(scratch, name + suffix))
    return os.path.join(scratch, name)


def _rows_of_copy(home):
    return _rows(_copy_of(home, "state.db"))


# --------------------------------------------------------------------------- one path


def record_path(path, workdir, disable=(), eatmydata=False, deep=None):
    """Build the home, record the run; returns (recording, check).

    ``eatmydata``: the child runs under eatmydata, so no fsync of the run reaches the kernel.
    ``deep``: a Deep, for the per-state release read and rerun (``check.deep``)."""
    root = os.path.join(workdir, "root")
    os.makedirs(root)
    job = build(path, root)
    checks_home = os.path.join(workdir, "before")
    shutil.copytree(job["home"], checks_home)
    start = crash_states.snapshot(root)
    job["disable"] = [CONTROLS[name][1] for name in disable]
    trace = os.path.join(workdir, "trace.txt")
    # HERMES_POWERLOSS_COLLECTIONS: another engine to record (e.g. an older commit's, unpacked)
    collections = os.environ.get("HERMES_POWERLOSS_COLLECTIONS", str(COLLECTIONS_ROOT))
    holder = None
    if job.get("holder"):  # another process with state.db open (the gateway), outside the recording
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, os.path.join(job["home"], "state.db")], stdout=subprocess.PIPE
        )
        holder.stdout.readline()
    try:
        wrapper = ["eatmydata"] if eatmydata else []
        run = crash_states.record(CHILD, [collections, json.dumps(job)], root, trace, wrapper=wrapper)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    assert run.returncode == 0 and "done" in run.stdout, run.stderr[-3000:]
    recording = crash_states.Recording(root, start, trace)
    final = os.path.join(workdir, "final")
    os.mkdir(final)
    recording.live.materialize(final)
    return recording, checker(path, job, checks_home, os.path.join(final, "home"), deep)
