"""playbooks/restore_sessions.yml end to end, on a file the real Hermes 0.22.2 wrote, beside it writing.

The file is in rollback-journal mode (Hermes 0.22.2 refuses WAL on this SQLite), and a real
0.22.2 ``SessionDB`` (tests/lib/hermes_writer.py) holds it and appends a message every 20 ms
through the maintenance run that archives what it prunes, and through every playbook run
after it: check mode with --diff (predicts exactly, changes nothing), the real restore of two
sessions, the same again (changes nothing), every session of the archive, and the refusals
(archive missing, unfinished, damaged, unverified, of a newer schema; a session the archive
does not hold). Afterwards the release's own SessionDB reads and searches a restored session,
the writer had no failed write, and the file passes every check. As root on a Hermes user's
home (*root*), the restore works as that user: every file in the home stays the user's.
"""

import os
import re
import shutil
import sqlite3
import textwrap
import time

import pytest
from hermes_reliability import (
    chown_tree,
    db_problems,
    files_not_owned_by,
    query,
    user_with_dir,
)
from hermes_rollback import RELEASE, journal_mode, make_big_rollback_home, release_view
from hermes_writer import WriterProcess

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from hermes_fixtures import hermes_python

pytestmark = [
    pytest.mark.slow,
    pytest.mark.releases,
    pytest.mark.skipif(
        hermes_python(RELEASE) is None, reason="no hermes-%s venv (tests/setup_hermes_venvs.sh)" % RELEASE
    ),
]

BAD_CASES = textwrap.dedent(
    """
    - name: Refusals of session_restore
      hosts: localhost
      gather_facts: false
      tasks:
        - name: Restore from a bad archive
          hermes_agent.ops.session_restore:
            hermes_home: "{{ home }}"
            archive: "{{ item.archive }}"
            sessions: "{{ item.sessions | default(omit) }}"
          loop: "{{ cases }}"
          ignore_errors: true
          register: refused
        # Asked of Ansible's own `failed` test: the JSON record of a failed loop item differs
        # between ansible-core releases (2.21 leaves its `failed` key out).
        - name: Which restores failed
          ansible.builtin.debug:
            msg: "{{ refused.results | select('failed') | map(attribute='item.name') | list }}"
    """
)


def session_ids(db):
    return {r[0] for r in query(db, "SELECT id FROM sessions")}


def messages_of(db, sids):
    marks = ",".join("?" * len(sids))
    return query(db, "SELECT COUNT(*) FROM messages WHERE session_id IN (%s)" % marks, *sids)[0][0]


@pytest.fixture
def live(tmp_path):
    """A 0.22.2 home pruned beside a live 0.22.2 writer: (home, db, archive, writer)."""
    home = tmp_path / "home"
    db = str(make_big_rollback_home(home, 60, 20, seed=5))
    assert journal_mode(db) == "delete", "the release chose WAL here: this test is about rollback-journal mode"
    writer = WriterProcess(hermes_python(RELEASE), db, str(tmp_path / "writer.jsonl"), prefix="restore-live")
    writer.start()
    try:
        profile = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "allow_unknown_schema": True})[
            "profiles"
        ][0]
        assert profile["status"] == "ok", profile["error"]
        assert profile["backup"]["kind"] == "archive" and profile["sessions_pruned"] == 30, profile
        yield {"home": str(home), "db": db, "archive": profile["backup"]["path"], "writer": writer}
    finally:
        writer.kill()


def test_restore_sessions_playbook_beside_a_live_hermes(ansible_playbook, live, tmp_path):
    home, db, archive, writer = live["home"], live["db"], live["archive"], live["writer"]
    inode = os.stat(db).st_ino
    archived = [r[0] for r in query(archive, "SELECT id FROM archive_sessions ORDER BY seq")]
    two = archived[:2]
    per_session = {sid: messages_of(archive, [sid]) for sid in archived}
    assert not session_ids(db) & set(archived)
    play = {"hermes_restore_home": home, "hermes_maintenance_become": False}
    chosen = dict(play, hermes_restore_archive=os.path.basename(archive), hermes_restore_sessions=two)

    # Check mode with --diff: the exact prediction, nothing written, no file created beside state.db.
    beside = sorted(n for n in os.listdir(home) if not n.endswith("-journal"))
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=chosen, check=True, diff=True)
    assert rc == 0, getattr(out, "text", out)
    predicted = out.result("Restore the sessions")
    assert predicted["_status"] == "changed" and predicted["msg"].startswith("would restore 2 session(s)")
    assert (predicted["sessions_restored"], predicted["messages_restored"]) == (2, per_session[two[0]] * 2)
    assert [s["id"] for s in predicted["sessions"]] == list(reversed(two))  # parents first: the prune's order reversed
    assert predicted["diff"]["before"] == "".join("%s: absent\n" % sid for sid in reversed(two))
    assert predicted["diff"]["after"] == "".join(
        "%s: present, %d of %d archived messages\n" % (sid, per_session[sid], per_session[sid]) for sid in reversed(two)
    )
    assert predicted["archive"]["schema_version"] == predicted["db_schema_version"] == 31
    assert not session_ids(db) & set(two)
    assert sorted(n for n in os.listdir(home) if not n.endswith("-journal")) == beside

    # The real run equals the prediction; the same run again changes nothing.
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=chosen, diff=True)
    assert rc == 0, getattr(out, "text", out)
    done = out.result("Restore the sessions")
    assert done["_status"] == "changed"
    for key in ("sessions_restored", "messages_restored", "sessions_present", "orphaned"):
        assert done[key] == predicted[key], key
    assert set(two) <= session_ids(db) and messages_of(db, two) == predicted["messages_restored"]
    assert [s["messages_missing"] for s in done["after"]] == [0, 0]
    before_again = query(db, "SELECT * FROM messages WHERE session_id IN (?, ?) ORDER BY id", *two)
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=chosen)
    assert rc == 0, getattr(out, "text", out)
    again = out.result("Restore the sessions")
    assert again["_status"] == "ok" and again["changed"] is False
    assert (again["sessions_restored"], again["messages_restored"], again["sessions_present"]) == (0, 0, 2)
    assert query(db, "SELECT * FROM messages WHERE session_id IN (?, ?) ORDER BY id", *two) == before_again

    # The release reads and finds a restored session while its writer keeps writing.
    word = query(archive, "SELECT content FROM messages WHERE session_id = ? LIMIT 1", two[0])[0][0].split()[0]
    seen = release_view(db, two[0], word)
    assert seen["messages"] == per_session[two[0]] and seen["hits"] > 0, seen

    # Refusals, each naming what is wrong; nothing restored by any of them.
    backups = os.path.dirname(archive)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + 7200))
    bad = {kind: os.path.join(backups, "hermes-ops-archive_default_%s-%d.db" % (stamp, n))
           for n, kind in enumerate(("damaged", "unverified", "newer"), 1)}  # fmt: skip
    data = bytearray(open(archive, "rb").read())
    data[len(data) // 2 : len(data) // 2 + 8192] = b"\x5a" * 8192  # pages of rows overwritten
    with open(bad["damaged"], "wb") as handle:
        handle.write(bytes(data))
    edits = {
        "unverified": "DELETE FROM archive_meta",
        "newer": "UPDATE archive_meta SET value = '99' WHERE key = 'schema_version'",
    }
    for kind, sql in edits.items():
        shutil.copyfile(archive, bad[kind])
        conn = sqlite3.connect(bad[kind])
        conn.execute(sql)
        conn.commit()
        conn.close()
    partial = os.path.join(backups, "." + os.path.basename(archive) + ".partial")
    shutil.copyfile(archive, partial)
    for path in list(bad.values()) + [partial]:
        os.chmod(path, 0o600)
    cases = [
        {"name": "missing", "archive": "hermes-ops-archive_default_20000101T000000Z.db"},
        {"name": "partial", "archive": partial},
        {"name": "damaged", "archive": bad["damaged"]},
        {"name": "unverified", "archive": bad["unverified"]},
        {"name": "newer", "archive": bad["newer"]},
        {"name": "unknown session", "archive": archive, "sessions": [archived[2], "no-such-session"]},
        {"name": "whole-file backup", "archive": "hermes-ops_default_20261201T000000Z.db"},
    ]
    before = session_ids(db)
    playbook = tmp_path / "refusals.yml"
    playbook.write_text(BAD_CASES)
    rc, out = ansible_playbook(str(playbook), extra_vars={"home": home, "cases": cases})
    assert rc == 0, getattr(out, "text", out)  # ignore_errors: the play goes on, each item fails
    results = {r["item"]["name"]: r for r in out.result("Restore from a bad archive")["results"]}
    expected = {
        "missing": "does not exist: check the name and backup_dir",
        "partial": "is an unfinished archive (a hidden .partial file): refused",
        "damaged": "is damaged (quick_check: ",
        "unverified": "is not a complete, verified archive",
        "newer": "was taken from schema_version 99, state.db is at 31 (an older Hermes): refused",
        "unknown session": "does not hold session(s) no-such-session",
        "whole-file backup": "is not an archive of this collection",
    }
    assert sorted(out.result("Which restores failed")["msg"]) == sorted(expected)
    for name, text in expected.items():
        assert text in results[name]["msg"], (name, results[name]["msg"])
    assert session_ids(db) == before and archived[2] not in before

    # Every session of the archive only when asked for: without a selection nor the flag, nothing.
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=dict(play, hermes_restore_archive=archive))
    assert rc != 0 and "add -e hermes_restore_all=true" in getattr(out, "text", out)
    assert session_ids(db) == before

    # Every session of the archive: the two already there are counted, the rest put back.
    rc, out = ansible_playbook(
        "playbooks/restore_sessions.yml", extra_vars=dict(play, hermes_restore_archive=archive, hermes_restore_all=True)
    )
    assert rc == 0, getattr(out, "text", out)
    everything = out.result("Restore the sessions")
    assert (everything["sessions_restored"], everything["sessions_present"]) == (len(archived) - 2, 2)
    assert everything["messages_restored"] == sum(per_session.values()) - 2 * per_session[two[0]]
    assert set(archived) <= session_ids(db)

    time.sleep(0.5)
    summary = writer.stop()
    assert summary["failed"] == 0 and summary["file_problems"] == [], summary
    assert summary["message_count_seen"] == summary["appended"] > 0
    assert journal_mode(db) == "delete" and os.stat(db).st_ino == inode  # restored in place
    assert db_problems(db) == []


@pytest.mark.root
def test_restore_sessions_as_root_writes_only_the_users_files(ansible_playbook):
    with user_with_dir("hermes-ops-t1", "hermes-ops-session-restore-") as (uid, gid, base):
        home = base / "home"
        db = str(make_big_rollback_home(home, 20, 6, seed=8))
        writer = WriterProcess(hermes_python(RELEASE), db, str(base / "writer.jsonl"), prefix="root-gw")
        writer.start()
        try:  # the archive is taken while root owns the file, then the home is given to the user
            profile = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "allow_unknown_schema": True})[
                "profiles"
            ][0]
        finally:
            assert writer.stop()["failed"] == 0
        assert profile["backup"]["kind"] == "archive" and profile["sessions_pruned"] == 10, profile
        archive = profile["backup"]["path"]
        chown_tree(home, uid, gid)
        os.chmod(str(home), 0o700)
        os.unlink(db + ".auto-maintenance.lock")  # the restore creates it again: as the user, or the test fails
        play = {"hermes_restore_home": str(home), "hermes_maintenance_become": False,
                "hermes_restore_archive": os.path.basename(archive), "hermes_restore_all": True}  # fmt: skip
        rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=play, check=True)
        assert rc == 0, getattr(out, "text", out)
        assert out.result("Restore the sessions")["sessions_restored"] == 10
        rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=play)
        assert rc == 0, getattr(out, "text", out)
        done = out.result("Restore the sessions")
        assert done["sessions_restored"] == 10 and done["messages_restored"] == 60
        assert os.path.exists(db + ".auto-maintenance.lock")
        assert files_not_owned_by(home, uid) == []
        assert db_problems(db) == []


def test_undo_a_prune_from_a_whole_file_backup_with_the_playbook(ansible_playbook, tmp_path):
    """No holder at the prune, so a gzipped whole-file backup; the listing, then a source back, --check first."""
    home = tmp_path / "home"
    db = str(make_big_rollback_home(home, 24, 4, seed=11))
    options = {"prune_days": 7, "hermes_home": [str(home)], "allow_unknown_schema": True, "backup_compress": True}
    profile = run_maintenance(options)["profiles"][0]
    assert profile["backup"]["kind"] == "file" and profile["backup"]["compressed"], profile["backup"]
    backup = profile["backup"]["path"]
    play = {"hermes_restore_home": str(home), "hermes_maintenance_become": False}

    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=dict(play, hermes_restore_list=True))
    assert rc == 0, getattr(out, "text", out)
    listed = out.result("List what the backups hold that state.db no longer has")
    assert listed["_status"] == "ok" and listed["changed"] is False
    (entry,) = listed["backups"]
    assert entry["path"] == backup and entry["sessions_missing"] == profile["sessions_pruned"] == 12
    assert entry["messages_missing"] == profile["messages_pruned"]
    assert listed["listing"][0].startswith("%s (file): 12 session(s)" % os.path.basename(backup))
    assert out.result("Result")["msg"][0] == listed["msg"] and listed["msg"].endswith(
        "holds 12 session(s) (%d messages) that state.db no longer has" % profile["messages_pruned"]
    )
    by_source = {}
    for e in entry["missing"]:
        by_source[e["source"]] = by_source.get(e["source"], 0) + e["sessions"]
    source = max(by_source, key=by_source.get)

    chosen = dict(play, hermes_restore_backup="newest", hermes_restore_sources=[source])
    beside = sorted(os.listdir(str(home))), sorted(os.listdir(os.path.dirname(backup)))
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=chosen, check=True, diff=True)
    assert rc == 0, getattr(out, "text", out)
    assert (sorted(os.listdir(str(home))), sorted(os.listdir(os.path.dirname(backup)))) == beside  # nothing left
    predicted = out.result("Restore the sessions")
    assert predicted["_status"] == "changed" and predicted["sessions_restored"] == by_source[source]
    assert predicted["backup"]["path"] == backup and predicted["backup"]["compressed"] is True
    assert predicted["diff"]["before"].count(": absent\n") == by_source[source]
    assert predicted["msg"].startswith("would restore %d session(s)" % by_source[source])
    assert not session_ids(db) & {s["id"] for s in predicted["sessions"]}

    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=chosen)
    assert rc == 0, getattr(out, "text", out)
    done = out.result("Restore the sessions")
    assert done["_status"] == "changed"
    for key in ("sessions_restored", "messages_restored", "orphaned"):
        assert done[key] == predicted[key], key
    assert {s["id"] for s in predicted["sessions"]} <= session_ids(db)
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=chosen)
    assert rc == 0, getattr(out, "text", out)
    again = out.result("Restore the sessions")
    assert again["_status"] == "ok" and again["sessions_restored"] == again["messages_restored"] == 0
    # Every session of that source is there now: those restored, and those the prune kept (never touched).
    assert again["sessions_present"] == query(db, "SELECT COUNT(*) FROM sessions WHERE source = ?", source)[0][0]

    # The operator's mistakes fail at once, naming the variables.
    for wrong in ({}, {"hermes_restore_backup": "newest", "hermes_restore_archive": "x.db"},
                  {"hermes_restore_list": True, "hermes_restore_backup": "newest"}):  # fmt: skip
        rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=dict(play, **wrong))
        assert rc != 0 and "Set exactly one of hermes_restore_archive" in getattr(out, "text", out), wrong
    rc, out = ansible_playbook(
        "playbooks/restore_sessions.yml",
        extra_vars=dict(play, hermes_restore_list=True, hermes_restore_sources=["cli"]),
    )
    assert rc != 0 and "restores nothing: leave hermes_restore_sources out" in getattr(out, "text", out)
    assert db_problems(db) == []
    assert [n for n in os.listdir(os.path.dirname(backup)) if n.startswith(".hermes-ops-restore_")] == []


def test_restore_sessions_runs_on_the_hosts_chosen(ansible_playbook, tmp_path):
    """On an inventory of several hosts a restore needs -l, and with several hosts chosen a confirmation;
    the listing, which changes nothing, runs anywhere."""
    home = tmp_path / "home"
    db = str(make_big_rollback_home(home, 24, 4, seed=12))
    profile = run_maintenance({"prune_days": 7, "hermes_home": [str(home)], "allow_unknown_schema": True})["profiles"][
        0
    ]
    assert profile["backup"]["kind"] == "file" and profile["sessions_pruned"] == 12, profile
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("h1 ansible_connection=local\nh2 ansible_connection=local\n")
    play = {"hermes_restore_home": str(home), "hermes_maintenance_become": False, "hermes_restore_backup": "newest",
            "hermes_restore_sources": ["cli", "telegram", "discord", "cron"]}  # fmt: skip
    before = session_ids(db)

    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=play, args=("-i", str(inventory)))
    text = getattr(out, "text", out)
    assert rc != 0 and "on every host it runs on, here 3 (" in text and "choose the host with -l HOST" in text, text
    rc, out = ansible_playbook(
        "playbooks/restore_sessions.yml", extra_vars=play, args=("-i", str(inventory), "-l", "h1,h2")
    )
    assert rc != 0 and "add -e hermes_restore_confirm=true" in getattr(out, "text", out)
    assert session_ids(db) == before

    listing = {"hermes_restore_home": str(home), "hermes_maintenance_become": False, "hermes_restore_list": True}
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=listing, args=("-i", str(inventory)))
    assert rc == 0, getattr(out, "text", out)
    assert session_ids(db) == before

    rc, out = ansible_playbook(
        "playbooks/restore_sessions.yml", extra_vars=play, args=("-i", str(inventory), "-l", "h1")
    )
    assert rc == 0, getattr(out, "text", out)
    done = out.result("Restore the sessions", host="h1")
    assert done["sessions_restored"] > 0 and session_ids(db) > before


def test_undo_as_documented_finds_the_archive(ansible_playbook, live):
    """Beside the live gateway the prune kept an archive, no whole-file backup: the listing names its sessions
    (id, title, source), and hermes_restore_backup=newest takes the archive, saying so."""
    home, db, archive, writer = live["home"], live["db"], live["archive"], live["writer"]
    archived = {r[0]: (r[1], r[2]) for r in query(archive, "SELECT id, source, title FROM sessions")}
    play = {"hermes_restore_home": home, "hermes_maintenance_become": False}

    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=dict(play, hermes_restore_list=True))
    assert rc == 0, getattr(out, "text", out)
    (entry,) = out.result("List what the backups hold that state.db no longer has")["backups"]
    assert entry["kind"] == "archive" and entry["sessions_missing"] == len(archived) == 30
    named = {s["id"]: (e["source"], s["title"]) for e in entry["missing"] for s in e["ids"]}
    assert named == archived
    text = "\n".join(out.result("Result")["msg"])
    shown = [sid for sid in archived if sid in text]
    assert shown and len(shown) == sum(min(20, len(e["ids"])) for e in entry["missing"])
    for sid in shown:  # id, messages, title where it has one
        title = archived[sid][1]
        assert ("    %s (" % sid) in text and (not title or "): %s" % title in text), sid

    one = sorted(archived)[0]
    newest = dict(play, hermes_restore_backup="newest")
    rc, out = ansible_playbook("playbooks/restore_sessions.yml", extra_vars=dict(newest, hermes_restore_sessions=[one]))
    assert rc == 0, getattr(out, "text", out)
    done = out.result("Restore the sessions")
    assert done["sessions_restored"] == 1 and one in session_ids(db)
    assert done["archive"]["path"] == archive
    assert done["notes"][0].startswith("no whole-file backup of profile default in ")
    assert "its newest archive, %s" % os.path.basename(archive) in done["msg"]

    # The report says what was taken instead of a whole-file backup, and when one comes.
    rc, out = ansible_playbook(
        "playbooks/report.yml",
        extra_vars={"hermes_maintenance_homes": [home], "hermes_maintenance_become": False,
                    "hermes_report_markdown": "", "hermes_report_csv": ""},
    )  # fmt: skip
    assert rc == 0, getattr(out, "text", out)
    (row,) = [line for line in out.result("Print the table")["msg"] if "| default " in line]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert re.fullmatch(r"none, archive 0\.\d days", cells[6]), cells
    assert cells[7].startswith("the newest copy is an archive of deleted rows: the next whole-file backup comes"), cells

    writer_summary = writer.stop()
    assert writer_summary["failed"] == 0, writer_summary
    assert db_problems(db) == []
