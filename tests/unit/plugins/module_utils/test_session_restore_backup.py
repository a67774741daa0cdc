"""Undo a prune from a whole-file backup, beside the real release writing.

For Hermes 0.19.0 (WAL) and 0.22.2 (rollback journal on this SQLite): a home written with the
release's own schema, with a compression lineage, a delegate and a source of its own, is
pruned with no holder, so the run takes a whole-file backup (gzipped for 0.19.0, plain for
0.22.2). Then, while the release's ``SessionDB`` appends a message every 20 ms:
``list_missing`` says what the backup holds that the file lacks, per day and source; one
session (with the sessions the prune took along), a day and a source come back, each predicted
exactly by check mode and done again without change; a restore killed halfway is completed
by the next run. The release then resumes, appends to and finds by search every restored
session; the writer had no failed write and its identity guards did not trip; the file passes
every check. The refusals (another profile, a file others can write, damaged, newer schema, no
selection, an unknown session) restore nothing. An older (0.19.0) backup restores into the file
0.22.2 migrated. A restore SIGKILLed at its steps (``crash``) is completed by the next run.
"""

import calendar
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from hermes_reliability import COLLECTIONS_ROOT, MARKS, db_problems, full_rows, parse_mark, query
from hermes_rollback import journal_mode, make_big_rollback_home, release_view
from hermes_writer import WriterProcess

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.whole_file import list_backups
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import (
    list_missing,
    opened_source,
    restore_selected,
    selection,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import copy_db, hermes_python, open_with_release, run_release_code

DAY = 86400.0
# 0.22.2 keeps rollback-journal mode on an SQLite with the WAL-reset bug (this host's), WAL on a fixed one.
RELEASES = {
    "0.19.0": {"modes": ("wal",), "compress": True},
    "0.22.2.post1": {"modes": ("delete", "wal"), "compress": False},
}
CHAIN = ["chain-a", "chain-b", "chain-c", "chain-d"]  # a -> b -> c compression continuations; d: c's delegate
SUPPORT = ["support-%d" % i for i in range(3)]  # source "discord", one titled "Tuesday support chat"
STALL_LIMIT = 5.0  # seconds: a write of the release's own retries (15 x 1 s busy timeout) never fails

pytestmark = [pytest.mark.slow, pytest.mark.releases]


def _add_sessions(db, now):
    """The lineage and the discord sessions, ended 20 days ago, with words only they hold."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA foreign_keys=ON")
    start = now - 20 * DAY
    rows = [
        ("chain-a", "cli", None, "compression", None, None),
        ("chain-b", "cli", "chain-a", "compression", None, None),
        ("chain-c", "cli", "chain-b", "user_exit", None, None),
        ("chain-d", "cli", "chain-c", "user_exit", json.dumps({"_delegate_from": "chain-c"}), None),
    ] + [
        (sid, "discord", None, "user_exit", None, "Tuesday support chat" if i == 0 else None)
        for i, sid in enumerate(SUPPORT)
    ]
    with conn:
        for n, (sid, source, parent, reason, model_config, title) in enumerate(rows):
            started = start + n * 60
            conn.execute(
                "INSERT INTO sessions (id, source, parent_session_id, started_at, ended_at, end_reason, model_config,"
                " title, message_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 3)",
                (sid, source, parent, started, started + 50, reason, model_config, title),
            )
            word = "word%s" % sid.replace("-", "")
            conn.executemany(
                "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                [(sid, role, "%s about zanzibar %d" % (word, i) if sid == "chain-c" else "%s %d" % (word, i),
                  started + 10 * (i + 1)) for i, role in enumerate(("user", "assistant", "user"))],
            )  # fmt: skip
    conn.close()


@pytest.fixture(scope="module", params=sorted(RELEASES))
def pruned(request, tmp_path_factory):
    """A home of the release, pruned with no holder: (release, home, db, backup path, pruned ids)."""
    release = request.param
    if hermes_python(release) is None:
        pytest.skip("no hermes-%s venv (tests/setup_hermes_venvs.sh)" % release)
    root = tmp_path_factory.mktemp("undo-" + release)
    home = root / "home"
    now = time.time()
    db = str(make_big_rollback_home(home, 40, 5, seed=25, now=now, release=release))
    _add_sessions(db, now)
    mode = journal_mode(db)
    assert mode in RELEASES[release]["modes"], mode
    before = {r[0] for r in query(db, "SELECT id FROM sessions")}
    options = {
        "prune_days": 7,
        "hermes_home": [str(home)],
        "allow_unknown_schema": True,
        "backup_compress": RELEASES[release]["compress"],
    }
    profile = run_maintenance(options)["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["backup"]["kind"] == "file" and profile["backup"]["compressed"] == RELEASES[release]["compress"]
    pruned_ids = before - {r[0] for r in query(db, "SELECT id FROM sessions")}
    assert set(CHAIN + SUPPORT) <= pruned_ids and len(pruned_ids) == profile["sessions_pruned"] == 27
    return {"release": release, "root": root, "home": str(home), "db": db, "backup": profile["backup"]["path"],
            "pruned": pruned_ids, "now": now, "mode": mode}  # fmt: skip


def _backup_rows(pruned, sql, *args):
    with opened_source("file", pruned["backup"], "default") as (plain, _info):
        return query(plain, sql, *args)


def _messages(db, sids):
    marks = ",".join("?" * len(sids))
    return query(db, "SELECT COUNT(*) FROM messages WHERE session_id IN (%s)" % marks, *sids)[0][0]


def ours(db):
    """Every session with its messages, but the live writer's own."""
    return {sid: row for sid, row in full_rows(db).items() if not sid.startswith("undo-live")}


def _restore_and_again(pruned, expected_ids, **select):
    """Check mode, the restore, the same again: the prediction is exact and the second run changes nothing."""
    home, db = pruned["home"], pruned["db"]
    args = dict(backup=os.path.basename(pruned["backup"]), select=selection(**select), pause=0.01)
    there = {r[0] for r in query(db, "SELECT id FROM sessions")} & set(expected_ids)  # a killed run's
    before, messages_before = ours(db), _messages(db, expected_ids)
    predicted = restore_selected(home, "default", check_mode=True, **args)
    assert ours(db) == before, "check mode wrote"
    assert sorted(s["id"] for s in predicted["sessions"]) == sorted(expected_ids), select
    assert predicted["sessions_restored"] == len(expected_ids) - len(there) and predicted["changed"]
    done = restore_selected(home, "default", **args)
    for key in ("sessions_restored", "messages_restored", "rows_restored", "orphaned"):
        assert done[key] == predicted[key], key
    assert [s["id"] for s in done["sessions"]] == [s["id"] for s in predicted["sessions"]]
    assert all(s["present"] and not s["messages_missing"] for s in done["after"])
    assert done["messages_restored"] == _messages(db, expected_ids) - messages_before
    again = restore_selected(home, "default", **args)
    assert not again["changed"] and again["sessions"] == [] and again["sessions_present"] >= len(expected_ids)
    return predicted, done


RESUME = r"""
import json, sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
out = {}
try:
    for sid, word in json.loads(sys.argv[2]).items():
        before = len(db.get_messages(sid))
        hits = sum(1 for h in db.search_messages(word, limit=1000) if h.get("session_id") == sid)
        db.reopen_session(sid)
        db.append_message(sid, "user", "resumed after restore")
        out[sid] = {"messages": before, "hits": hits, "after": len(db.get_messages(sid))}
finally:
    db.close()
print(json.dumps(out))
"""


def _release_resumes(pruned, sids):
    words = {sid: "word%s" % sid.replace("-", "") for sid in sids if not sid.startswith("big-")}
    for sid in sids:
        if sid.startswith("big-"):  # a word its first message holds
            words[sid] = query(pruned["db"], "SELECT content FROM messages WHERE session_id = ? ORDER BY id", sid)[0][
                0
            ].split()[0]
    proc = run_release_code(hermes_python(pruned["release"]), RESUME, pruned["db"], json.dumps(words))
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {sid: len(_backup_rows(pruned, "SELECT id FROM messages WHERE session_id = ?", sid)) for sid in sids}
    for sid in sids:
        assert seen[sid]["messages"] == expected[sid] and seen[sid]["hits"] > 0, (sid, seen[sid])
        assert seen[sid]["after"] == expected[sid] + 1, (sid, seen[sid])


KILLED = r"""
import sys
sys.path[:0] = sys.argv[4].split(":")
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import sessions as r
r.restore_selected(sys.argv[1], "default", backup=sys.argv[2], select=r.selection(sources=[sys.argv[3]]), pause=3.0)
"""


def _killed_restore(pruned, source, ids):
    """A restore of ``source`` SIGKILLed once the first of ``ids`` is back, before the others are."""
    env = dict(os.environ, PYTHONPATH="")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, pruned["home"], pruned["backup"], source, ":".join(sys.path)], env=env
    )
    marks = ",".join("?" * len(ids))
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not query(
            pruned["db"], "SELECT 1 FROM sessions WHERE id IN (%s)" % marks, *sorted(ids)
        ):
            time.sleep(0.05)
        assert proc.poll() is None, "the restore ended before it could be killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.mark.timing
def test_undo_a_prune_from_a_whole_file_backup_beside_the_live_release(pruned):
    release, home, db, backup = pruned["release"], pruned["home"], pruned["db"], pruned["backup"]
    inode = os.stat(db).st_ino
    writer = WriterProcess(hermes_python(release), db, str(pruned["root"] / "writer.jsonl"), prefix="undo-live")
    writer.start()
    try:
        # Discovery: what the backup holds that the file lacks, per day and source.
        listed = list_missing(home, "default")
        (entry,) = [b for b in listed["backups"] if b["path"] == backup]
        assert "error" not in entry, entry
        assert entry["sessions_missing"] == len(pruned["pruned"]) and entry["kind"] == "file"
        assert sum(e["sessions"] for e in entry["missing"]) == len(pruned["pruned"])
        discord = [e for e in entry["missing"] if e["source"] == "discord"]
        assert sum(e["sessions"] for e in discord) == 3 and sum(e["messages"] for e in discord) == 9

        # One session: chain-c, with the compression ancestors it continues and its delegate.
        predicted, _done = _restore_and_again(pruned, CHAIN, sessions=["chain-c"])
        assert [s["id"] for s in predicted["sessions"]] == CHAIN  # parents first
        assert predicted["messages_restored"] == 12 and predicted["orphaned"] == 0
        assert query(db, "SELECT parent_session_id FROM sessions WHERE id = 'chain-d'")[0][0] == "chain-c"

        # A day: every pruned session active on the busiest day of the listing.
        added = {time.strftime("%Y-%m-%d", time.gmtime(pruned["now"] - 20 * DAY + t)) for t in (0, 600)}
        big = [e for e in entry["missing"] if e["day"] not in added]
        day = max({e["day"] for e in big}, key=lambda d: sum(e["sessions"] for e in big if e["day"] == d))
        lo = calendar.timegm(time.strptime(day, "%Y-%m-%d"))
        in_day = {
            sid
            for sid, started, last in _backup_rows(
                pruned,
                "SELECT s.id, s.started_at, MAX(s.started_at, COALESCE(MAX(m.timestamp), 0)) FROM sessions s "
                "LEFT JOIN messages m ON m.session_id = s.id GROUP BY s.id",
            )
            if sid in pruned["pruned"] and started < lo + DAY and last >= lo
        }
        assert in_day and not in_day & set(CHAIN + SUPPORT), day
        _restore_and_again(pruned, in_day, active_after=day, active_before=lo + DAY)

        # A source, killed once its first session is back; the next run completes it.
        _killed_restore(pruned, "discord", SUPPORT)
        assert db_problems(db) == [] and len(query(db, "SELECT id FROM sessions WHERE source = 'discord'")) < 3
        predicted, done = _restore_and_again(pruned, SUPPORT, sources=["discord"])
        assert any("unfinished restore" in note for note in predicted["notes"]), predicted["notes"]
        assert not os.path.exists(os.path.join(os.path.dirname(backup), ".hermes-ops-restore_default.pending"))

        # A match through the backup's own FTS (and titles): nothing more to bring back now.
        matched = restore_selected(
            home, "default", backup="newest", select=selection(match="zanzibar"), check_mode=True
        )
        assert matched["notes"] == [] and matched["sessions"] == [] and matched["sessions_present"] == 4
        titled = restore_selected(
            home, "default", backup="newest", select=selection(match="tuesday SUPPORT"), check_mode=True
        )
        assert titled["sessions_present"] == 1

        restored = CHAIN + sorted(in_day) + SUPPORT
        _release_resumes(pruned, restored)
        time.sleep(0.5)
        summary = writer.stop()
    finally:
        writer.kill()
    records = writer.records()
    worst = max(r["lat"] for r in records)
    print("\n%s writer (%s, SQLite %s): %d appends, %d failed, worst %.0f ms" % (release, pruned["mode"],
          summary.get("sqlite_version"), summary["attempts"], summary["failed"], 1000 * worst))  # fmt: skip
    assert summary["failed"] == 0 and summary["file_problems"] == [], summary
    assert summary["message_count_seen"] == summary["appended"] > 0
    assert worst < STALL_LIMIT
    guards = summary.get("guards") or {}
    assert not any(guards.get(k) for k in ("replaced", "wal_generation_lost", "quarantined")), guards
    assert guards.get("probe", "ok") == "ok", guards
    assert os.stat(db).st_ino == inode and journal_mode(db) == pruned["mode"]
    assert db_problems(db) == []
    leftovers = [n for n in os.listdir(os.path.dirname(backup)) if n.startswith(".hermes-ops-restore_")]
    assert leftovers == []


def test_a_compressed_backup_is_read_from_a_private_copy_and_bad_sources_restore_nothing(pruned):
    home, db, backup = pruned["home"], pruned["db"], pruned["backup"]
    backups = os.path.dirname(backup)
    with opened_source("file", backup, "default") as (plain, info):
        assert info["schema_version"] == query(db, "SELECT MAX(version) FROM schema_version")[0][0]
        if backup.endswith(".gz"):  # decompressed beside it, private, and gone afterwards
            assert os.path.dirname(os.path.dirname(plain)) == backups
            assert os.stat(plain).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(plain)).st_mode & 0o777 == 0o700
        else:
            assert plain == backup
    assert [n for n in os.listdir(backups) if n.startswith(".hermes-ops-restore_")] == []

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + 7200))
    suffix = ".db.gz" if backup.endswith(".gz") else ".db"
    other = os.path.join(backups, "hermes-ops_work_%s%s" % (stamp, suffix))
    shutil.copyfile(backup, other)
    os.chmod(other, 0o600)
    writable = os.path.join(backups, "hermes-ops_default_%s-1%s" % (stamp, suffix))
    shutil.copyfile(backup, writable)
    os.chmod(writable, 0o666)
    with opened_source("file", backup, "default") as (plain, _info):
        newer = os.path.join(backups, "hermes-ops_default_%s-2.db" % stamp)
        shutil.copyfile(plain, newer)
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    damaged = os.path.join(backups, "hermes-ops_default_%s-3.db" % stamp)
    data = bytearray(open(newer, "rb").read())
    data[len(data) // 2 : len(data) // 2 + 8192] = b"\x5a" * 8192
    open(damaged, "wb").write(bytes(data))
    for path in (newer, damaged):
        os.chmod(path, 0o600)
    one = selection(sessions=["big-0000001"])
    cases = [
        (os.path.basename(other), one, "is a backup of profile work, not of default: refused"),
        (writable, one, "is writable by others or owned by uid"),
        (newer, one, "was taken from schema_version 99, state.db is at"),
        (damaged, one, "is damaged or not a state.db"),
        (backup, selection(), "name what to bring back from backup"),
        (backup, selection(sessions=["no-such-session"]), "does not hold session(s) no-such-session"),
        ("hermes-ops_default_20000101T000000Z.db", one, "does not exist: check the name and backup_dir"),
        (".hermes-ops_default_20000101T000000Z.db.partial", one, "is an unfinished backup"),
    ]
    before = full_rows(db)
    for source, select, text in cases:
        for check_mode in (True, False):
            with pytest.raises(MaintenanceError) as refused:
                restore_selected(home, "default", backup=source, select=select, check_mode=check_mode)
            assert text in str(refused.value), (source, str(refused.value))
    with pytest.raises(MaintenanceError, match="is neither unix seconds nor an ISO 8601 date"):
        selection(active_after="last tuesday")
    with pytest.raises(MaintenanceError, match="is not before active_before"):
        selection(active_after="2026-11-24", active_before="2026-11-23T23:00:00Z")
    assert full_rows(db) == before
    listed = {b["path"]: b for b in list_missing(home, "default")["backups"]}
    assert listed[newer]["schema_version"] == 99 and "writable by others" in listed[writable]["error"]
    assert "is damaged" in listed[damaged]["error"] and "error" not in listed[backup]
    assert other not in listed and list_backups(backups, "work")[0][0] == other

    # A backup without a usable full-text index: match looks at titles only, and says so.
    no_fts = os.path.join(backups, "hermes-ops_default_%s-4.db" % stamp)
    with opened_source("file", backup, "default") as (plain, _info):
        shutil.copyfile(plain, no_fts)
    os.chmod(no_fts, 0o600)
    conn = sqlite3.connect(no_fts)
    conn.execute("DROP TABLE messages_fts")
    conn.commit()
    conn.close()
    for text, found in (("tuesday support", 1), ("zanzibar", 0)):  # a title; words only in messages
        titles = restore_selected(home, "default", backup=no_fts, select=selection(match=text), check_mode=True)
        assert len(titles["sessions"]) + titles["sessions_present"] == found, (text, titles)
        assert "match looked at titles only" in titles["notes"][0], titles["notes"]
    for path in (other, writable, newer, damaged, no_fts):
        os.unlink(path)


@pytest.mark.parametrize("pruned", ["0.19.0"], indirect=True)
def test_an_older_backup_restores_into_a_file_a_newer_release_migrated(pruned, tmp_path):
    """The 0.19.0 backup (schema 6), into a copy of its file that 0.22.2 has migrated: columns matched by name."""
    if hermes_python("0.22.2.post1") is None:
        pytest.skip("no hermes-0.22.2.post1 venv (tests/setup_hermes_venvs.sh)")
    home = tmp_path / "home"
    shutil.copytree(os.path.join(pruned["home"], "backups"), str(home / "backups"))
    db = str(copy_db(pruned["db"], home / "state.db"))
    os.chmod(db, 0o600)
    assert open_with_release("hermes-0.22.2.post1", db)["schema_version"] == 31
    missing = sorted(pruned["pruned"] - {r[0] for r in query(db, "SELECT id FROM sessions")})
    sid = missing[0]
    done = restore_selected(str(home), "default", backup="newest", select=selection(sessions=[sid]), pause=0)
    assert done["backup"]["schema_version"] < done["db_schema_version"] == 31, done["backup"]
    held = _backup_rows(pruned, "SELECT content FROM messages WHERE session_id = ? ORDER BY id", sid)
    assert done["sessions_restored"] == 1 and done["messages_restored"] == len(held) > 0
    seen = release_view(db, sid, held[0][0].split()[0], release="0.22.2.post1")
    assert seen["messages"] == len(held) and seen["hits"] > 0, seen

    # A killed restore of a source stays listed as unfinished through a restore of something else,
    # and the next restore of that source completes it.
    sources = {}
    for other, source in _backup_rows(pruned, "SELECT id, source FROM sessions"):
        if other in missing[1:]:
            sources.setdefault(source, []).append(other)
    source, ids = max(sources.items(), key=lambda item: len(item[1]))
    assert len(ids) >= 2, sources
    copy = dict(pruned, home=str(home), db=db, backup=done["backup"]["path"])
    _killed_restore(copy, source, ids)
    pending = home / "backups" / ".hermes-ops-restore_default.pending"
    assert set(json.loads(pending.read_text())["sessions"]) == set(ids) and db_problems(db) == []
    restore_selected(str(home), "default", backup="newest", select=selection(sessions=[sid]), pause=0)
    assert pending.exists(), "a restore of another session forgot the unfinished one"
    finished = restore_selected(str(home), "default", backup="newest", select=selection(sources=[source]), pause=0)
    assert sorted(s["id"] for s in finished["sessions"]) == sorted(ids) and not pending.exists()
    assert finished["sessions_restored"] == len(ids) - 1 and finished["notes"]
    assert all(s["messages_missing"] == 0 for s in finished["after"]) and db_problems(db) == []


# The restore in a child: every write transaction (open, about to commit, committed), the
# decompression and the pending list's write numbered on stderr; at step KILL_AT it SIGKILLs itself.
RESTORE_CHILD = (
    MARKS
    + r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import archive
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore import sessions as restore
KILL_AT = int(sys.argv[5])
archive.write_transaction = marked(archive.write_transaction)
restore._write_pending = around("pending", restore._write_pending)
restore._decompress = around("decompress", restore._decompress)
select = restore.selection(sessions=[sys.argv[4]])
result = restore.restore_selected(sys.argv[2], "default", backup=sys.argv[3], select=select, pause=0)
print(json.dumps({k: result[k] for k in ("sessions_restored", "messages_restored")}))
"""
)
# Of the restore's steps: the first six (decompression, the pending list) and every third, or all.
KILL_EVERY = 1 if os.environ.get("HERMES_ARCHIVE_KILL_POINTS") == "all" else 3


def _restore_child(home, backup, sid, kill_at=0):
    proc = subprocess.run(
        [sys.executable, "-c", RESTORE_CHILD, str(COLLECTIONS_ROOT), str(home), backup, sid, str(kill_at)],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    if not kill_at:
        assert proc.returncode == 0, proc.stderr
    return [mark[1] for mark in map(parse_mark, proc.stderr.splitlines()) if mark], proc.returncode


@pytest.mark.crash
def test_sigkill_at_every_step_of_a_restore_from_a_backup(pruned, tmp_path):
    """Killed at a step, the file passes every check; the next run, predicted exactly by check mode,
    ends where an uninterrupted restore ends, leaves nothing in the backup directory, and a third
    changes nothing. The restore: chain-c, which brings its compression ancestors and its delegate."""
    base = tmp_path / "base"
    shutil.copytree(os.path.join(pruned["home"], "backups"), str(base / "backups"))
    os.chmod(str(copy_db(pruned["db"], base / "state.db")), 0o600)
    conn = sqlite3.connect(str(base / "state.db"))  # pruned again, whatever the other tests restored
    conn.execute("PRAGMA foreign_keys=ON")
    with conn:
        conn.execute("DELETE FROM messages WHERE session_id IN (%s)" % ",".join("?" * len(CHAIN)), CHAIN)
        for sid in reversed(CHAIN):
            conn.execute("DELETE FROM sessions WHERE id = ?", (sid,))
    conn.close()
    backup = os.path.basename(pruned["backup"])
    chosen = set(CHAIN)
    reference = tmp_path / "reference"
    shutil.copytree(str(base), str(reference))
    steps, _rc = _restore_child(reference, backup, "chain-c")
    expected = {sid: row for sid, row in full_rows(reference / "state.db").items() if sid in chosen}
    assert set(expected) == chosen
    points = sorted(set(range(1, min(6, len(steps)) + 1)) | set(range(1, len(steps) + 1, KILL_EVERY)))
    print("\nrestore-from-backup kill points (%s): %d of %d steps" % (pruned["release"], len(points), len(steps)))
    failures = []
    for n in points:
        home = tmp_path / ("kill-%d" % n)
        shutil.copytree(str(base), str(home))
        db = str(home / "state.db")
        _steps, rc = _restore_child(home, backup, "chain-c", kill_at=n)
        problems = [] if rc == -signal.SIGKILL else ["not killed (rc %s)" % rc]
        problems += ["after the kill: %s" % p for p in db_problems(db)]
        args = dict(backup=backup, select=selection(sessions=["chain-c"]), pause=0)
        predicted = restore_selected(str(home), "default", check_mode=True, **args)
        done = restore_selected(str(home), "default", **args)
        again = restore_selected(str(home), "default", **args)
        for key in ("sessions_restored", "messages_restored", "rows_restored"):
            if predicted[key] != done[key]:
                problems.append("check mode predicted %s=%s, the restore did %s" % (key, predicted[key], done[key]))
        if again["changed"] or again["sessions"]:
            problems.append("a third run changed something: %s" % again["sessions"])
        rows = {sid: row for sid, row in full_rows(db).items() if sid in chosen}
        if rows != expected:
            problems.append("rows differ from the uninterrupted restore: %s" % sorted(set(rows) ^ set(expected)))
        problems += ["at the end: %s" % p for p in db_problems(db)]
        left = [name for name in os.listdir(str(home / "backups")) if name.startswith(".hermes-ops-restore_")]
        if left:
            problems.append("left in the backup directory: %s" % left)
        if problems:
            failures.append("step %d (%s):\n    %s" % (n, steps[n - 1], "\n    ".join(problems)))
    assert not failures, "\n".join(failures)
