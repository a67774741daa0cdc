"""Tool-payload retention (``tool_payload_days``) and its undo, on a file Hermes 0.22.2 wrote.

The release builds the home and appends the tool messages itself (its own ``append_message``),
so the rows, triggers and both FTS indexes are the release's. Then: check mode predicts the run
exactly; the run elides the old tool bodies of kept sessions only (pinned, leased, recent, small
and already-elided bodies stay byte for byte), keeps both FTS indexes consistent, archives the
originals owner-only; the release resumes, searches and appends to an elided session; a second
run elides nothing; the file shrinks by half after the reclaim; ``restore_tool_payloads`` puts
the bodies back byte for byte (check mode predicting it), and with the payload archive gone, from
the whole-file backup the run took, refusing a backup row that is not what its tombstone records.
"""

import functools
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hermes_markers import release_module_marks
from hermes_reliability import chown_tree, files_not_owned_by, record_fdatasync, user_with_dir
from hermes_writer import MARK, WriterProcess, latency_stats

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import elision as payloads_engine
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.elision import PAYLOAD_PREFIX, fts_optimize
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import (
    whole_file as hermes_backup_whole_file,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.whole_file import backup_name
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain import execution as maintain_execution
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import restore_tool_payloads
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import (
    APPEND_MESSAGES,
    build_home,
    check_integrity,
    copy_db,
    hermes_python,
    message_rows,
    run_release_code,
    terminal_dump,
)

RELEASE = "hermes-0.22.2.post1"
pytestmark = release_module_marks(RELEASE)
DAY = 86400.0
UPSTREAM_TOMBSTONE = "[elided: tool output older than 30d - retention policy]"
OLD_SESSIONS = ["old-%d" % i for i in range(8)]

# Runs under the release: resume, search, append to a session; argv = db path, session id.
RESUME = r"""
import json, sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
sid = sys.argv[2]
try:
    conv = db.get_messages_as_conversation(sid)
    zebra = [h.get("session_id") for h in db.search_messages("zebra", limit=1000)]
    quokka = [h.get("session_id") for h in db.search_messages("quokka", limit=1000)]
    if db.get_session(sid)["ended_at"] is not None:
        db.reopen_session(sid)
    new = db.append_message(sid, "user", "resumetoken appended after the elision")
    again = [h.get("session_id") for h in db.search_messages("resumetoken", limit=1000)]
finally:
    db.close()
print(json.dumps({"conversation": len(conv), "tool_bodies": [m.get("content") for m in conv if m.get("role") == "tool"],
                  "zebra": zebra, "quokka": quokka, "appended": new, "resumetoken": again}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A 0.22.2 home whose bytes are mostly old tool output, built once (copied per test)."""
    base = tmp_path_factory.mktemp("payload-home")
    now = time.time()
    specs = [dict(id=sid, started_days_ago=200, ended_days_ago=100, messages=4) for sid in OLD_SESSIONS]
    specs += [
        dict(id="pinned", started_days_ago=200, ended_days_ago=100, messages=2, pinned=True),
        dict(id="leased", started_days_ago=200, messages=2, lease="turn"),
        dict(id="recent", started_days_ago=6, ended_days_ago=4, messages=2),
    ]
    db = build_home(base / "home", RELEASE, specs, now=now)
    rows = []
    for sid in OLD_SESSIONS + ["pinned", "leased"]:
        for i in range(12 if sid in OLD_SESSIONS else 2):
            rows.append([sid, "tool", terminal_dump(sid, i, 24000 + 97 * i), "terminal", now - (150 - i) * DAY])
        rows.append([sid, "tool", "ok", "terminal", now - 140 * DAY])  # smaller than its tombstone: kept
        rows.append([sid, "tool", UPSTREAM_TOMBSTONE, "web_extract", now - 140 * DAY])  # elided upstream
    for i in range(3):
        rows.append(["recent", "tool", terminal_dump("recent", i, 20000), "browser", now - 5 * DAY])
    plan = base / "append.json"
    plan.write_text(json.dumps(rows))
    proc = run_release_code(hermes_python(RELEASE), APPEND_MESSAGES, db, str(plan))
    assert proc.returncode == 0, proc.stderr[-3000:]
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return base / "home"


@pytest.fixture
def home(built, tmp_path):
    target = tmp_path / "home"
    shutil.copytree(str(built), str(target), ignore=shutil.ignore_patterns("state.db*"))
    copy_db(built / "state.db", target / "state.db")
    return target


def _opts(home, **more):
    opts = {"hermes_home": [str(home)], "prune_days": 365, "tool_payload_days": 30, "vacuum_mode": "full"}
    opts.update(more)
    return opts


def test_old_tool_payloads_are_elided_archived_and_restored_byte_for_byte(home):
    db = home / "state.db"
    original = message_rows(db)
    size_before = os.path.getsize(str(db))
    storage_before = gather_info({"hermes_home": [str(home)]})["profiles"][0]["storage"]

    predicted = run_maintenance(_opts(home), check_mode=True)["profiles"][0]
    assert message_rows(db) == original  # check mode wrote nothing
    run = run_maintenance(_opts(home))
    profile = run["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    payloads = profile["tool_payloads"]
    for key in ("elided", "bytes", "bytes_after", "sessions"):
        assert payloads[key] == predicted["tool_payloads"][key], key
    assert predicted["tool_payloads"]["archive"].endswith("hermes-ops-payloads_default_<timestamp>.db")
    assert payloads["elided"] == 12 * len(OLD_SESSIONS) and payloads["sessions"] == len(OLD_SESSIONS)
    assert "tool payloads elided=%d (" % payloads["elided"] in run["summary"][0], run["summary"]

    after = message_rows(db)
    assert set(after) == set(original)
    elided = {mid for mid in original if after[mid] != original[mid]}
    assert len(elided) == payloads["elided"]
    assert payloads["bytes"] == sum(len(original[mid][3]) for mid in elided)
    for mid in elided:
        sid, role, kind, body, tool, stamp = after[mid]
        assert (sid, role, kind, tool, stamp) == original[mid][:2] + ("text",) + original[mid][4:]
        assert sid in OLD_SESSIONS and role == "tool"
        text = body.decode()
        assert text.startswith(UPSTREAM_TOMBSTONE + " "), text
        assert text.endswith("%d bytes of terminal output from %s" % (
            len(original[mid][3]), time.strftime("%Y-%m-%d", time.gmtime(stamp))
        ))  # fmt: skip
    # pinned, leased, recent, small and upstream-elided bodies, and every other row: byte for byte
    # the old sessions' tool payloads shrink by at least 90%
    assert sum(len(after[mid][3]) for mid in elided) * 10 <= payloads["bytes"]
    untouched = {mid: row for mid, row in original.items() if mid not in elided}
    assert all(after[mid] == row for mid, row in untouched.items())
    assert any(row[0] == "recent" and row[1] == "tool" for row in untouched.values())
    check_integrity(db)

    archive = payloads["archive"]
    assert stat.S_IMODE(os.stat(archive).st_mode) == 0o600
    assert os.path.dirname(archive) == str(home / "backups")

    # the file after the reclaim: at least half of it was old tool output and its indexes
    size_after = os.path.getsize(str(db))
    storage_after = gather_info({"hermes_home": [str(home)]})["profiles"][0]["storage"]
    print("storage before:", json.dumps(storage_before, sort_keys=True))
    print("storage after:", json.dumps(storage_after, sort_keys=True))
    assert size_after * 2 <= size_before, (size_before, size_after)
    print("file bytes before/after:", size_before, size_after)

    # idempotent: a second run (check mode and real) elides nothing
    assert run_maintenance(_opts(home), check_mode=True)["profiles"][0]["tool_payloads"]["elided"] == 0
    second = run_maintenance(_opts(home))["profiles"][0]
    assert second["tool_payloads"]["elided"] == 0 and second["tool_payloads"]["archive"] is None
    assert message_rows(db) == after

    # the release resumes the elided session, searches it, appends to it
    proc = run_release_code(hermes_python(RELEASE), RESUME, db, OLD_SESSIONS[0])
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["conversation"] >= 4 + 14
    assert sum(1 for body in seen["tool_bodies"] if body.startswith(UPSTREAM_TOMBSTONE + " ")) == 12
    assert OLD_SESSIONS[0] in seen["zebra"]
    assert not set(seen["quokka"]) & set(OLD_SESSIONS)  # the elided output is gone from the index too
    assert "recent" in seen["quokka"] and "pinned" in seen["quokka"]
    assert OLD_SESSIONS[0] in seen["resumetoken"]
    check_integrity(db)

    # undo: check mode predicts it, the run puts every body back byte for byte
    plan = restore_tool_payloads(str(home), "default", check_mode=True)
    assert plan["planned"] == len(elided) and plan["bytes"] == payloads["bytes"]
    assert plan["sessions"] == sorted(OLD_SESSIONS)
    one = restore_tool_payloads(str(home), "default", session_ids=[OLD_SESSIONS[1]], check_mode=True)
    assert one["planned"] == 12 and one["sessions"] == [OLD_SESSIONS[1]]
    done = restore_tool_payloads(str(home), "default")
    assert done["done"]["restored"] == len(elided) and done["done"]["bytes"] == payloads["bytes"]
    restored = message_rows(db)
    assert all(restored[mid] == row for mid, row in original.items())
    assert len(restored) == len(original) + 1  # the release's appended message stays
    assert restore_tool_payloads(str(home), "default", check_mode=True)["planned"] == 0
    check_integrity(db)


def test_nothing_is_elided_without_the_option_or_in_protected_sessions(home):
    db = home / "state.db"
    original = message_rows(db)
    profile = run_maintenance({"hermes_home": [str(home)], "prune_days": 365})["profiles"][0]
    assert profile["tool_payloads"] is None and message_rows(db) == original
    # a 200-day retention keeps nothing old: the old sessions go whole, nothing is elided in them
    pruned = run_maintenance(_opts(home, prune_days=90), check_mode=True)["profiles"][0]
    assert pruned["sessions_pruned"] == len(OLD_SESSIONS)
    assert pruned["tool_payloads"]["elided"] == 0


def test_an_object_the_collection_does_not_know_stops_every_elision(home):
    db = home / "state.db"
    conn = sqlite3.connect(str(db))
    conn.execute(
        "CREATE TRIGGER site_audit AFTER UPDATE OF content ON messages BEGIN "
        "UPDATE sessions SET title = title WHERE id = new.session_id; END"
    )
    conn.close()
    original = message_rows(db)
    predicted = run_maintenance(_opts(home), check_mode=True)["profiles"][0]["tool_payloads"]
    assert predicted["elided"] == 0 and "site_audit" in predicted["skipped_reason"], predicted
    done = run_maintenance(_opts(home))["profiles"][0]["tool_payloads"]
    assert done["elided"] == 0 and done["archive"] is None and done["skipped_reason"] == predicted["skipped_reason"]
    assert message_rows(db) == original


LIVE_SESSIONS, LIVE_BODIES, LIVE_BYTES = 10, 30, 16000
STALL_LIMIT = 0.250  # the prune's bound for a writer appending every 20 ms (bench/elision.py measures it at size)


@pytest.mark.timing  # a stall bound: runs alone, in the timing pass
def test_elision_beside_a_live_writer_loses_no_append(tmp_path):
    """A 0.22.2 SessionDB appends every 20 ms through the whole run: no append fails, each is
    indexed, the elision matches its prediction, both FTS indexes stay consistent."""
    now = time.time()
    sids = ["live-old-%d" % i for i in range(LIVE_SESSIONS)]
    specs = [dict(id=sid, started_days_ago=200, ended_days_ago=100, messages=2) for sid in sids]
    home = tmp_path / "home"
    db = build_home(home, RELEASE, specs, now=now)
    rows = [
        [sid, "tool", terminal_dump(sid, i, LIVE_BYTES), "web_extract", now - (120 - i / 10.0) * DAY]
        for sid in sids
        for i in range(LIVE_BODIES)
    ]
    (tmp_path / "append.json").write_text(json.dumps(rows))
    proc = run_release_code(hermes_python(RELEASE), APPEND_MESSAGES, db, str(tmp_path / "append.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    writer = WriterProcess(hermes_python(RELEASE), db, str(tmp_path / "writer.jsonl"), prefix="payload-live")
    try:
        writer.start()
        time.sleep(0.5)
        t0 = time.time()
        predicted = run_maintenance(_opts(home, vacuum_mode="auto"), check_mode=True)["profiles"][0]
        began = time.monotonic()
        profile = run_maintenance(_opts(home, vacuum_mode="auto"))["profiles"][0]
        took = time.monotonic() - began
        t1 = time.time()
        time.sleep(0.5)
        summary = writer.stop()
    finally:
        writer.kill()
    assert profile["status"] == "ok", (profile["error"], profile.get("traceback"))
    payloads = profile["tool_payloads"]
    assert payloads["elided"] == predicted["tool_payloads"]["elided"] == LIVE_SESSIONS * LIVE_BODIES
    assert payloads["bytes"] == predicted["tool_payloads"]["bytes"] and payloads["left_alone"] == 0
    during = latency_stats(writer.records(), t0, t1)
    assert summary["failed"] == 0 and summary["file_problems"] == [], summary
    assert during["n"] > 0 and during["max"] < STALL_LIMIT, during
    assert summary["message_count_seen"] == summary["appended"] == summary["attempts"]
    conn = sqlite3.connect(str(db))
    try:
        hits = conn.execute(
            "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH ?", ('"%s" "payload-live"' % MARK,)
        ).fetchone()[0]
    finally:
        conn.close()
    assert hits == len(summary["ids"])
    check_integrity(db)
    print(
        "\nelision beside a live 0.22.2 writer (journal_mode=%s): %d bodies (%d MB) in %.2f s (whole run), "
        "%d appends during it, worst %.0f ms, p99 %.0f ms, %d FTS optimize steps"
        % (profile["preflight"]["journal_mode"], payloads["elided"], payloads["bytes"] // 2**20, took,
           during["n"], 1000 * during["max"], 1000 * during["p99"], payloads["fts_optimize_steps"])
    )  # fmt: skip


@pytest.mark.timing  # a live writer's commits between the optimize's steps
def test_the_fts_optimize_stops_when_another_connection_writes_and_the_index_stays_usable(home, tmp_path):
    """Each commit of another connection adds an FTS5 segment, and the next incremental optimize step
    then starts one level higher: run on beside a writer, the index passed FTS5's 2,000 levels and no
    connection could open it any more. This optimize (the service window's) stops at the first foreign
    commit instead; the run's own beside a writer goes on in positive merges (fts_optimize_live)."""
    db = home / "state.db"
    writer = WriterProcess(hermes_python(RELEASE), db, str(tmp_path / "writer.jsonl"), prefix="optimize-live")
    try:
        writer.start()
        time.sleep(0.5)
        profile = run_maintenance(_opts(home, vacuum_mode="never"))["profiles"][0]
        assert profile["tool_payloads"]["fts_optimize_stopped"] == [], profile["tool_payloads"]  # in live steps
        conn = sqlite3.connect(str(db), isolation_level=None, timeout=30)
        try:
            fts = [{"name": "messages_fts", "error": None}, {"name": "messages_fts_trigram", "error": None}]
            steps, stopped = fts_optimize(conn, fts, lambda held, paused=None: time.sleep(0.05))
        finally:
            conn.close()
        time.sleep(0.3)
        summary = writer.stop()
    finally:
        writer.kill()
    assert summary["failed"] == 0, summary
    assert steps < 20 and len(stopped) == 1 and "another connection wrote" in stopped[0], (steps, stopped)
    check_integrity(db)  # a fresh connection opens and checks both indexes


def test_the_payload_archive_is_flushed_to_disk_as_it_grows(home, monkeypatch):
    """Written with synchronous=OFF and fsynced once at the end, the 2.2 GB archive of a 5 GB file
    left its whole size for the kernel to write back at once: the live writer, and another writer on
    another file of the same disk, waited 970 ms for their own commits. It is fdatasynced each time
    it has grown by BACKUP_STEP_BYTES (made small here, with small read chunks, so that this archive
    crosses it many times), on the descriptor that created it, and is then complete."""
    step = 64 * 1024
    monkeypatch.setattr(hermes_backup_whole_file, "BACKUP_STEP_BYTES", step)
    monkeypatch.setattr(payloads_engine, "READ_BYTES", 16 * 1024)  # one 24 kB body per read
    flushed = record_fdatasync(monkeypatch)
    profile = run_maintenance(_opts(home, vacuum_mode="never"))["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    payloads = profile["tool_payloads"]
    assert payloads["elided"] == 12 * len(OLD_SESSIONS)
    partials = [size for path, size in flushed if path.endswith(".partial") and PAYLOAD_PREFIX in path]
    size = os.path.getsize(payloads["archive"])
    # never more than a step and one read's bodies left unflushed
    gaps = [b - a for a, b in zip([0] + partials, partials + [size])]
    assert len(partials) >= size // (2 * step) >= 10, (size, flushed)
    assert all(gap < 2 * step for gap in gaps) and all(gap >= step for gap in gaps[1:-1]), gaps
    rows = sqlite3.connect(payloads["archive"]).execute("SELECT COUNT(*), SUM(bytes) FROM payloads").fetchone()
    assert rows == (payloads["elided"], payloads["bytes"])


def _tampered_copy(backup, name, elided):
    """A copy of ``backup`` named as a later backup (0600), two of whose ``elided`` rows differ from
    what their tombstones record: one body a byte longer, one of another tool (the same size)."""
    copy = os.path.join(os.path.dirname(backup), name)
    shutil.copyfile(backup, copy)
    os.chmod(copy, 0o600)
    longer, other_tool = sorted(elided)[:2]
    conn = sqlite3.connect(copy)
    try:
        conn.execute("UPDATE messages SET content = content || 'x' WHERE id = ?", (longer,))
        conn.execute("UPDATE messages SET tool_name = 'browser' WHERE id = ?", (other_tool,))
        conn.commit()
    finally:
        conn.close()
    return copy, longer, other_tool


def test_tool_payloads_come_back_from_the_whole_file_backup_when_the_payload_archive_is_gone(home):
    db = home / "state.db"
    original = message_rows(db)
    profile = run_maintenance(_opts(home))["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    payloads, backup = profile["tool_payloads"], profile["backup"]["path"]
    assert os.path.basename(backup).startswith("hermes-ops_default_") and backup.endswith(".db")
    after = message_rows(db)
    elided = {mid for mid in original if after[mid] != original[mid]}
    assert len(elided) == payloads["elided"] == 12 * len(OLD_SESSIONS)
    os.unlink(payloads["archive"])  # the payload archive is lost: only the run's whole-file backup is left

    # the backup named: check mode exact (count, bytes, sessions), nothing written
    plan = restore_tool_payloads(str(home), "default", backup=os.path.basename(backup), check_mode=True)
    assert (plan["planned"], plan["bytes"]) == (len(elided), payloads["bytes"]), plan
    assert plan["sessions"] == sorted(OLD_SESSIONS) and plan["unmatched"] == 0 and plan["archives"] == []
    assert plan["backups"] == [backup]
    assert message_rows(db) == after

    # a later backup whose rows differ from what two tombstones record: those two are refused, named
    tampered, longer, other_tool = _tampered_copy(backup, "hermes-ops_default_20991231T000000Z.db", elided)
    plan = restore_tool_payloads(str(home), "default", backup="newest", check_mode=True)
    assert plan["backups"] == [tampered] and plan["planned"] == len(elided) - 2, plan
    assert plan["bytes"] == payloads["bytes"] - len(original[longer][3]) - len(original[other_tool][3])
    assert plan["unmatched"] == 2 and [u["id"] for u in plan["unmatched_messages"]] == [longer, other_tool]
    reasons = [u["reason"] for u in plan["unmatched_messages"]]
    size = len(original[longer][3])
    assert "the backup's body is %d bytes, the tombstone records %d" % (size + 1, size) in reasons[0], reasons
    assert "another tool_name ('browser', state.db 'terminal')" in reasons[1], reasons
    done = restore_tool_payloads(str(home), "default", backup="newest")
    assert (done["done"]["restored"], done["done"]["bytes"]) == (plan["planned"], plan["bytes"])
    now = message_rows(db)
    assert now[longer] == after[longer] and now[other_tool] == after[other_tool]  # left alone
    assert all(now[mid] == row for mid, row in original.items() if mid not in (longer, other_tool))
    check_integrity(db)

    # neither named: no payload archive, so the backups, newest first; the tampered one refuses the two
    # rows again and the run's own backup gives them
    plan = restore_tool_payloads(str(home), "default", check_mode=True)
    assert plan["archives"] == [] and plan["backups"] == [tampered, backup], plan
    assert (plan["planned"], plan["unmatched"]) == (2, 0)
    assert plan["bytes"] == len(original[longer][3]) + len(original[other_tool][3])
    done = restore_tool_payloads(str(home), "default")
    assert (done["done"]["restored"], done["done"]["bytes"]) == (plan["planned"], plan["bytes"])
    assert message_rows(db) == original  # every row byte for byte: type, bytes, tool, time
    check_integrity(db)

    # idempotent: nothing left to restore, from either source
    for named in ({}, {"backup": backup}):
        again = restore_tool_payloads(str(home), "default", **named)
        assert again["planned"] == 0 and not again["changed"] and "done" not in again, again
    assert message_rows(db) == original
    # owner-only, and no decompressed or staged copy left in the backup directory
    for name in os.listdir(str(home / "backups")):
        assert not name.startswith("."), name
        assert stat.S_IMODE(os.stat(str(home / "backups" / name)).st_mode) == 0o600, name
    print(
        "\ntool payloads restored from the whole-file backup: %d messages, %d bytes, %d sessions"
        % (len(elided), payloads["bytes"], len(OLD_SESSIONS))
    )


def test_tool_payloads_come_back_from_a_compressed_backup_and_bad_sources_restore_nothing(home):
    db = home / "state.db"
    original = message_rows(db)
    profile = run_maintenance(_opts(home, backup_compress=True))["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    backup = profile["backup"]["path"]
    assert backup.endswith(".db.gz"), backup
    os.unlink(profile["tool_payloads"]["archive"])
    after = message_rows(db)
    for bad, words in (
        (dict(archive=os.path.basename(backup)), "is not a payload archive of this collection"),
        (dict(backup="hermes-ops-payloads_default_20261201T040001Z.db"), "is not a whole-file backup"),
        (dict(backup="hermes-ops_work_20261201T040001Z.db"), "is a backup of profile work, not of default"),
        (dict(archive="x", backup="newest"), "at most one of archive and backup"),
    ):
        with pytest.raises(MaintenanceError) as refused:
            restore_tool_payloads(str(home), "default", **bad)
        assert words in str(refused.value), (bad, str(refused.value))
    assert message_rows(db) == after
    # no payload archive and no backup: refused, naming both
    hidden = os.path.join(os.path.dirname(backup), "kept-aside.gz")
    os.rename(backup, hidden)
    with pytest.raises(MaintenanceError, match="no payload archive .* and no whole-file backup"):
        restore_tool_payloads(str(home), "default", check_mode=True)
    os.rename(hidden, backup)
    # a backup taken after the elision holds the tombstones, not the bodies: every row refused, saying so
    later = copy_db(db, home / "backups" / "hermes-ops_default_20991231T000000Z.db")
    later.chmod(0o600)
    plan = restore_tool_payloads(str(home), "default", backup="newest", check_mode=True)
    assert (plan["planned"], plan["unmatched"]) == (0, profile["tool_payloads"]["elided"]), plan
    assert all("holds no original body (a tombstone)" in u["reason"] for u in plan["unmatched_messages"]), plan
    os.unlink(str(later))

    plan = restore_tool_payloads(str(home), "default", check_mode=True)
    assert plan["backups"] == [backup] and plan["planned"] == profile["tool_payloads"]["elided"], plan
    assert plan["bytes"] == profile["tool_payloads"]["bytes"] and plan["unmatched"] == 0
    done = restore_tool_payloads(str(home), "default", session_ids=OLD_SESSIONS)
    assert (done["done"]["restored"], done["done"]["bytes"]) == (plan["planned"], plan["bytes"])
    assert message_rows(db) == original
    check_integrity(db)
    assert not [n for n in os.listdir(str(home / "backups")) if n.startswith(".")]  # the decompressed copy is gone


ROOT_USER = "hermes-ops-u41p"


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="root restores a user's file")
def test_root_puts_tool_payloads_back_from_its_own_copy_of_a_users_backup(built):
    """As root on a user's file, from a backup root keeps in its own 0700 directory (the off-site
    fetch's): root opens it, the user's process reads that descriptor into a private copy, removed
    afterwards; every file in the home stays the user's. The run cannot rule out the processes the
    user's process cannot see as holders, so it takes no whole-file backup here: root's copy is the
    file as it was before the run, taken with SQLite's backup API."""
    with user_with_dir(ROOT_USER, ROOT_USER + "-") as (uid, gid, base):
        home = base / "home" / ".hermes"
        shutil.copytree(str(built), str(home), ignore=shutil.ignore_patterns("state.db*"))
        db = copy_db(built / "state.db", home / "state.db")
        chown_tree(base / "home", uid, gid)
        os.chmod(str(base / "home"), 0o700)
        original = message_rows(db)
        fetched = base / "offsite-restore"
        fetched.mkdir(mode=0o700)
        backup = copy_db(db, fetched / backup_name("default", time.time() - 60))
        backup.chmod(0o600)
        profile = run_maintenance(_opts(home))["profiles"][0]
        assert profile["status"] == "ok", profile["error"]
        payloads = profile["tool_payloads"]
        os.unlink(payloads["archive"])
        assert payloads["elided"] == 12 * len(OLD_SESSIONS) and message_rows(db) != original
        assert os.stat(str(backup)).st_uid == 0 and os.stat(str(db)).st_uid == uid

        plan = restore_tool_payloads(str(home), "default", backup=str(backup), check_mode=True)
        assert (plan["planned"], plan["bytes"], plan["unmatched"]) == (payloads["elided"], payloads["bytes"], 0)
        done = restore_tool_payloads(str(home), "default", backup=str(backup))
        assert (done["done"]["restored"], done["done"]["bytes"]) == (plan["planned"], plan["bytes"])
        assert message_rows(db) == original
        check_integrity(db)
        assert not [n for n in os.listdir(str(home / "backups")) if n.startswith(".")]  # the private copy is gone
        assert files_not_owned_by(base / "home", uid) == []
        assert (os.stat(str(backup)).st_uid, stat.S_IMODE(os.stat(str(backup)).st_mode)) == (0, 0o600)


def test_a_restore_transaction_cut_at_the_hard_bound_is_retried_and_loses_nothing(home, monkeypatch):
    """Every transaction of several bodies interrupted almost at once (a hard bound of 0.3 ms, as a
    preempted process or an FTS5 merge would make it): each is rolled back whole and retried in
    halves down to single bodies (never cut), and the undo still gives every row back."""
    db = home / "state.db"
    original = message_rows(db)
    profile = run_maintenance(_opts(home))["profiles"][0]
    os.unlink(profile["tool_payloads"]["archive"])
    trips = []
    real = payloads_engine._restore_group

    def counted(conn, rows, deadline, done):
        try:
            return real(conn, rows, deadline, done)
        except sqlite3.OperationalError:
            trips.append((len(rows), deadline.tripped))
            raise

    monkeypatch.setattr(payloads_engine, "hard_bound", lambda bound: 0.0003)
    monkeypatch.setattr(payloads_engine, "_restore_group", counted)
    done = restore_tool_payloads(str(home), "default", backup="newest")
    assert trips and all(tripped for _n, tripped in trips), trips
    assert done["done"]["restored"] == profile["tool_payloads"]["elided"], done
    assert message_rows(db) == original
    check_integrity(db)


def _archive_rows(path):
    conn = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    try:
        return conn.execute("SELECT id, session_id, kind, body, bytes, tombstone FROM payloads ORDER BY id").fetchall()
    finally:
        conn.close()


def _copies(built, tmp_path, names):
    homes = {}
    for name in names:
        target = tmp_path / name
        shutil.copytree(str(built), str(target), ignore=shutil.ignore_patterns("state.db*"))
        copy_db(built / "state.db", target / "state.db")
        homes[name] = target
    return homes


RETRY_OPTS = {"prune_days": 365, "tool_payload_days": 30, "vacuum_mode": "never"}


def _ends_as_uninterrupted(profile, home, reference):
    """``profile`` (a run on ``home``) left the file as ``reference`` (an uninterrupted run on a copy of
    the same file): the same rows and tombstones, the same archived bytes, both FTS indexes consistent."""
    assert profile["status"] == "ok", (profile["error"], profile.get("traceback"))
    payloads, free = profile["tool_payloads"], reference["tool_payloads"]
    for key in ("elided", "bytes", "bytes_after", "sessions", "left_alone"):
        assert payloads[key] == free[key], key
    assert payloads["elided"] == 12 * len(OLD_SESSIONS) and payloads["left_alone"] == 0
    assert message_rows(home / "state.db") == message_rows(Path(free["archive"]).parents[1] / "state.db")
    assert _archive_rows(payloads["archive"]) == _archive_rows(free["archive"])
    check_integrity(home / "state.db")


def test_a_transaction_past_the_hard_bound_is_rolled_back_and_retried_in_halves(built, tmp_path, monkeypatch):
    """The elision's own hard bound, passed to it as the parameter it has for that (``hard``): at 0 s
    every transaction of more than one body is still running at the bound when SQLite first calls the
    progress handler (after 1,000 VM steps: a count, not a time), so the first one of FIRST_GROUP
    bodies is interrupted, rolled back and retried in halves until one body, which always runs whole;
    ``retries`` says how often. The file ends as an uninterrupted run leaves it."""
    homes = _copies(built, tmp_path, ("bounded", "free"))
    free = run_maintenance(dict(RETRY_OPTS, hermes_home=[str(homes["free"])]))["profiles"][0]
    assert free["status"] == "ok" and free["tool_payloads"]["retries"] == 0, free
    monkeypatch.setattr(maintain_execution, "elide", functools.partial(payloads_engine.elide, hard=0.0))
    bounded = run_maintenance(dict(RETRY_OPTS, hermes_home=[str(homes["bounded"])]))["profiles"][0]
    _ends_as_uninterrupted(bounded, homes["bounded"], free)
    payloads = bounded["tool_payloads"]
    # 8 -> 4 -> 2 -> 1 at least: the first transaction's UPDATE alone runs past 1,000 VM steps
    assert payloads["retries"] >= 3, payloads
    print("\nhard bound 0 s: %d bodies elided, %d transactions interrupted and retried in halves"
          % (payloads["elided"], payloads["retries"]))  # fmt: skip


# Runs beside the elision (the dev venv's python): holds the write lock as a gateway's long transaction
# does, HOLD seconds at a time with a short gap; argv = db path, hold, ready file, stop file.
LOCK_HOLDER = r"""
import os, sqlite3, sys, time
db, hold, ready, stop = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
conn = sqlite3.connect(db, timeout=30, isolation_level=None)
holds = 0
while not os.path.exists(stop):
    conn.execute("BEGIN IMMEDIATE")
    holds += 1
    if holds == 1:
        open(ready, "w").close()
    time.sleep(hold)
    conn.execute("ROLLBACK")
    time.sleep(0.02)
conn.close()
print(holds)
"""
HOLDER_HOLD = 0.3  # twice the hard bound (150 ms)


@pytest.mark.timing  # a second process holding the lock: when our BEGIN gets it depends on the schedule
def test_waiting_for_the_lock_is_not_held_against_a_transaction(built, tmp_path):
    """Another process holds the write lock 300 ms at a time, so most elision transactions wait that
    long at their BEGIN. The hard bound counts from when the transaction has the lock: a BEGIN
    interrupted once it had taken the lock left the transaction open, and the next one failed
    ("cannot start a transaction within a transaction"; once on a 4.9 GB file beside a live writer).
    The run completes and ends as an uninterrupted run does."""
    homes = _copies(built, tmp_path, ("held", "free"))
    free = run_maintenance(dict(RETRY_OPTS, hermes_home=[str(homes["free"])]))["profiles"][0]
    db = homes["held"] / "state.db"
    ready, stop = tmp_path / "holder.ready", tmp_path / "holder.stop"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(db), str(HOLDER_HOLD), str(ready), str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
            time.sleep(0.01)
        held = run_maintenance(dict(RETRY_OPTS, hermes_home=[str(homes["held"])]))["profiles"][0]
    finally:
        stop.touch()
        out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    _ends_as_uninterrupted(held, homes["held"], free)
    done = held["tool_payloads"]
    print("\n%d bodies elided beside a process holding the lock %d ms at a time (%s holds), %d retried"
          % (done["elided"], 1000 * HOLDER_HOLD, out.strip(), done["retries"]))  # fmt: skip
