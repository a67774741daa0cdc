"""The service window's plan, refusals and failures, without a gateway (test_service_window.py
runs the real one): check mode's window and its words, operator mistakes named at the start,
root never running what the Hermes user can write, a step interrupted and rolled back at the
bound, and the gateway started again (its drain marker removed first) when the stop fails. A
holder is a real process with state.db open.
"""

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest
from hermes_markers import release_module_marks
from hermes_reliability import chown_tree, db_problems, user_with_dir
from hermes_reliability import query as q
from hermes_rollback import RELEASE, make_big_rollback_home

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply import window
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import normalize_options
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError
from hermes_fixtures import APPEND_MESSAGES, build_home, copy_db, hermes_python, run_release_code, terminal_dump

RELEASE_LAYOUT = "hermes-" + RELEASE
DAY = 86400.0


def needs_release(test):
    """A test on a file the real release wrote in rollback-journal mode: the marks of a release
    module (slow and releases, so not in the SQLite matrix, where a fixed SQLite makes the release
    choose WAL; skipped without the release's venv)."""
    for mark in release_module_marks(RELEASE):
        test = mark(test)
    return test


@pytest.mark.parametrize(
    "options, words",
    [
        ({"gateway_stop_command": ["/bin/true"]}, "gateway_stop_command and gateway_start_command go together"),
        (
            {
                "gateway_service": "hermes-gateway",
                "gateway_stop_command": ["/bin/true"],
                "gateway_start_command": ["/bin/true"],
            },
            "not both",
        ),  # fmt: skip
        ({"gateway_stop_command": ["systemctl", "stop"], "gateway_start_command": ["/bin/true"]}, "absolute path"),
        ({"gateway_stop_command": ["/bin/true", ""], "gateway_start_command": ["/bin/true"]}, "non-empty strings"),
        (
            {"gateway_stop_command": ["/usr/bin/supervisorctl stop hermes"], "gateway_start_command": ["/bin/true"]},
            "is a command line; give an argv list",
        ),
        ({"gateway_service": "../hermes-gateway"}, "gateway_service must be a systemd unit name"),
        ({"gateway_service": "hermes-gateway", "max_downtime": 0}, "max_downtime must be at least 1"),
    ],
)
def test_operator_mistakes_are_named(tmp_path, options, words):
    with pytest.raises(MaintenanceError, match=words):
        normalize_options(dict(options, hermes_home=[str(tmp_path)]))


def test_root_runs_nothing_the_hermes_user_can_write(tmp_path):
    agent_uid, agent_gid = 64713, 64713
    program = tmp_path / "bin" / "stop-gateway"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    os.chmod(str(tmp_path), 0o755)
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another uid")
    assert window.agent_writable(str(program), agent_uid, agent_gid) is None
    os.chown(str(program.parent), agent_uid, agent_gid)
    assert "belongs to uid %d" % agent_uid in window.agent_writable(str(program), agent_uid, agent_gid)
    os.chown(str(program.parent), 0, agent_gid)
    os.chmod(str(program.parent), 0o775)
    assert "group %d may write" % agent_gid in window.agent_writable(str(program), agent_uid, agent_gid)
    os.chmod(str(program.parent), 0o755)
    os.chmod(str(program), 0o757)
    assert "anyone may write" in window.agent_writable(str(program), agent_uid, agent_gid)


def test_root_reads_what_the_agent_writes_in_gateway_state_json_within_bounds(tmp_path):
    """gateway_state.json is the Hermes user's file and root reads it: a symlink, a file past
    STATE_MOST, text that is not a JSON object all read as no record; a stamp is read in UTC."""
    record = {"gateway_state": "running", "platforms": {"api_server": {"state": "connected"}, "x": []}}
    (tmp_path / window.STATE_FILE).write_text(json.dumps(record))
    assert window.connected_platforms(str(tmp_path)) == ["api_server"]
    assert window.gateway_state(str(tmp_path)) == ("running", None)
    padded = dict(record, pad=" " * window.STATE_MOST)
    (tmp_path / window.STATE_FILE).write_text(json.dumps(padded))
    assert window.connected_platforms(str(tmp_path)) is None
    assert window.gateway_state(str(tmp_path)) == (None, None)
    (tmp_path / window.STATE_FILE).write_text("[1, 2]")
    assert window.connected_platforms(str(tmp_path)) is None
    (tmp_path / window.STATE_FILE).unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(record))
    (tmp_path / window.STATE_FILE).symlink_to(tmp_path / "elsewhere.json")
    assert window.connected_platforms(str(tmp_path)) is None
    assert window.iso_seconds("2026-12-07T10:00:00Z") == window.iso_seconds("2026-12-07T11:00:00+01:00")
    assert window.iso_seconds("2026-12-07T10:00:00") == 1796637600.0
    assert window.iso_seconds("yesterday") is None


@pytest.fixture
def small_home(tmp_path):
    home = tmp_path / "home"
    db = str(make_big_rollback_home(home, 200, 50, seed=7, now=time.time()))
    pages = q(db, "PRAGMA page_count")[0][0]
    conn = sqlite3.connect(db)  # free pages inside the file, as a prune beside the gateway leaves them
    conn.execute("DELETE FROM messages WHERE session_id IN (SELECT id FROM sessions WHERE ended_at IS NOT NULL)")
    conn.commit()
    conn.close()
    assert q(db, "PRAGMA freelist_count")[0][0] > 0 and q(db, "PRAGMA page_count")[0][0] == pages
    return str(home), db


@needs_release
def test_a_step_past_the_bound_is_interrupted_and_rolled_back(small_home):
    home, db = small_home
    before = (os.path.getsize(db), q(db, "PRAGMA freelist_count")[0][0], q(db, "SELECT COUNT(*) FROM messages"))
    opts = normalize_options({"hermes_home": [home], "gateway_service": "hermes-gateway"})
    entry = {"home": home, "path": db, "name": "default", "backup_dir": None, "steps": [window.VACUUM_FULL]}
    report = window.window_steps(entry, opts, deadline=time.time() - 1)
    assert report["done"] == [] and "interrupted at the bound" in report["reason"], report
    after = (os.path.getsize(db), q(db, "PRAGMA freelist_count")[0][0], q(db, "SELECT COUNT(*) FROM messages"))
    assert after == before and q(db, "PRAGMA auto_vacuum")[0][0] == 0
    assert db_problems(db) == []
    # with time enough, the same step switches the file and gives the pages back
    report = window.window_steps(entry, opts, deadline=time.time() + 60)
    assert report["done"] == [window.VACUUM_FULL] and report["reason"] is None
    assert report["file"]["auto_vacuum"] == 2 and report["file"]["free_pages"] == 0
    assert report["bytes_after"] < report["bytes_before"]


HOLD = "import sqlite3, sys, time\nc = sqlite3.connect(sys.argv[1])\nc.execute('SELECT 1 FROM sessions LIMIT 1')\n" \
    "print('ready', flush=True)\ntime.sleep(120)\n"  # fmt: skip


@needs_release
def test_the_gateway_is_started_again_when_the_stop_fails(small_home, tmp_path):
    home, db = small_home
    holder = subprocess.Popen([sys.executable, "-c", HOLD, db], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        seen, started = tmp_path / "seen.json", tmp_path / "started"
        stop = ["/bin/sh", "-c", 'cp "$0/.drain_request.json" "$1"; exit 3', home, str(seen)]
        start = ["/bin/sh", "-c", 'test ! -e "$0/.drain_request.json" && touch "$1"', home, str(started)]
        opts = normalize_options(
            {"hermes_home": [home], "gateway_stop_command": stop, "gateway_start_command": start, "max_downtime": 8}
        )
        entry = {"home": home, "path": db, "name": "default", "backup_dir": None, "steps": [window.VACUUM_FULL]}
        report = window.run_window(opts, [entry], lambda fn, *a: fn(*a), None)
    finally:
        holder.kill()
        holder.wait()
    assert report["opened"] and report["reason"].startswith("not stopped: /bin/sh -c"), report
    assert "exited with 3" in report["reason"] and report["profiles"] == {}
    marker = json.loads(seen.read_text())
    assert marker["action"] == "drain" and marker["epoch"] == window.instantiation_epoch()
    assert started.exists(), "the start command did not run, or ran before the drain marker was removed"
    assert report["gateway_back"] and report["downtime_s"] < 8
    assert not os.path.exists(os.path.join(home, window.DRAIN_FILE))
    assert q(db, "PRAGMA auto_vacuum")[0][0] == 0


@needs_release
def test_check_mode_says_whether_a_window_would_open_and_for_what(small_home):
    home, db = small_home
    holder = subprocess.Popen([sys.executable, "-c", HOLD, db], stdout=subprocess.PIPE, text=True)
    commands = {"gateway_stop_command": ["/bin/true"], "gateway_start_command": ["/bin/true"]}
    options = dict(commands, hermes_home=[home], allow_unknown_schema=True, prune_days=7)
    try:
        assert holder.stdout.readline().strip() == "ready"
        fits = run_maintenance(dict(options, max_downtime=120), check_mode=True)
        short = run_maintenance(dict(options, max_downtime=5), check_mode=True)
        without = run_maintenance(dict(options, gateway_stop_command=None, gateway_start_command=None), True)
    finally:
        holder.kill()
        holder.wait()
    profile = fits["profiles"][0]
    assert profile["preflight"]["live_rollback"] and profile["backup_deferred"]
    assert profile["window"]["opened"] and profile["window"]["steps"] == ["backup", "fts_optimize", "vacuum_full"]
    assert profile["reclaim"]["action"] == "full" and profile["reclaim"]["in_window"]
    assert "service window would open for backup, fts_optimize, vacuum_full" in fits["summary"][0]
    # the same plan with too little downtime allowed: no window, the VACUUM skipped for both reasons
    profile = short["profiles"][0]
    assert not profile["window"]["opened"] and "more than max_downtime 5" in profile["window"]["reason"]
    assert profile["reclaim"]["action"] is None and not profile["reclaim"]["in_window"]
    assert "held open by" in profile["reclaim"]["skipped_reason"]
    assert "the service window: estimated" in profile["reclaim"]["skipped_reason"]
    assert "no service window: estimated" in short["summary"][0]
    # without a window configured nothing of it shows
    profile = without["profiles"][0]
    assert profile["window"] is None and profile["reclaim"]["action"] is None
    assert "in_window" in profile["reclaim"]
    assert "allow a window (gateway_service)" in profile["reclaim"]["skipped_reason"]  # the summary: its first clause
    assert "service window" not in without["summary"][0]
    assert q(db, "PRAGMA auto_vacuum")[0][0] == 0  # check mode wrote nothing


def payload_home(base):
    """A 0.22.2 home whose bytes are mostly old tool output (as test_tool_payloads.py builds it)."""
    now = time.time()
    specs = [dict(id="old-%d" % i, started_days_ago=60, ended_days_ago=50, messages=2) for i in range(6)]
    db = build_home(base / "home", RELEASE_LAYOUT, specs, now=now)
    rows = [
        [spec["id"], "tool", terminal_dump(spec["id"], i, 24000 + 97 * i), "terminal", now - (55 - i) * DAY]
        for spec in specs
        for i in range(12)
    ]
    plan = base / "append.json"
    plan.write_text(json.dumps(rows))
    proc = run_release_code(hermes_python(RELEASE), APPEND_MESSAGES, db, str(plan))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(base / "home"), str(db)


def fts_bytes(db):
    return q(db, "SELECT SUM(pgsize) FROM dbstat WHERE name LIKE 'messages_fts%'")[0][0]


@needs_release
def test_fts_optimize_after_an_elision_beside_a_holder_runs_live_and_opens_no_window(tmp_path):
    """FTS5's optimize after an elision runs in steps beside the holder: a window would only cost
    downtime (and open every month the elision finds bodies)."""
    home, db = payload_home(tmp_path)
    alone = tmp_path / "alone"
    alone.mkdir()
    copy_db(db, alone / "state.db")
    options = dict(allow_unknown_schema=True, prune_days=365, tool_payload_days=30, vacuum_mode="never")
    by_itself = run_maintenance(dict(options, hermes_home=[str(alone)]))["profiles"][0]
    assert by_itself["tool_payloads"]["elided"] > 0 and by_itself["tool_payloads"]["fts_optimize_steps"] > 0
    # the "gateway": a process holding state.db, stopped and started again by the window's commands
    pidfile = tmp_path / "holder.pid"
    start = ["/bin/sh", "-c", '"$1" -c "$2" "$3" >/dev/null 2>&1 & echo $! > "$0"', str(pidfile), sys.executable,
             HOLD, db]  # fmt: skip
    stop = ["/bin/sh", "-c", 'kill "$(cat "$0")"', str(pidfile)]
    subprocess.run(start, check=True)
    try:
        deadline = time.monotonic() + 30
        while not window.holders(db) and time.monotonic() < deadline:
            time.sleep(0.1)
        options.update(gateway_stop_command=stop, gateway_start_command=start, hermes_home=[home])
        predicted = run_maintenance(options, check_mode=True)["profiles"][0]
        profile = run_maintenance(options)["profiles"][0]
        assert window.holders(db), "the start command did not bring the holder back"
    finally:
        subprocess.run(stop, check=False)
    assert predicted["window"]["steps"] == [] and not predicted["window"]["opened"]
    assert predicted["window"]["reason"] == "no step needs the file alone"
    assert profile["status"] == "ok", profile["error"]
    assert profile["window"]["steps"] == [] and not profile["window"]["opened"]
    assert profile["tool_payloads"]["fts_optimize_steps"] > 0
    payloads = profile["tool_payloads"]
    assert payloads["elided"] == by_itself["tool_payloads"]["elided"] and payloads["fts_optimize_stopped"] == []
    # the index ends as small as the run with no holder leaves it
    assert fts_bytes(db) <= 1.1 * fts_bytes(str(alone / "state.db")), (
        fts_bytes(db),
        fts_bytes(str(alone / "state.db")),
    )
    assert db_problems(db) == []
    print(
        "\nFTS after an elision: %d bytes, optimized beside the holder; %d with no holder (%d elided)"
        % (fts_bytes(db), fts_bytes(str(alone / "state.db")), payloads["elided"])
    )


@needs_release
@pytest.mark.root
def test_as_root_the_window_works_as_the_owner_and_stops_and_starts_as_root(tmp_path):
    # a user of its own: other test runs switch to hermes-ops-t1 at the same time, and their workers
    # (no exec after the switch) look like possible holders to that user
    with user_with_dir("hermes-ops-win", "hermes-ops-window-") as (uid, gid, base):
        home = base / "home"
        db = str(make_big_rollback_home(home, 200, 50, seed=11, now=time.time()))
        chown_tree(home, uid, gid)
        pidfile, seen = tmp_path / "holder.pid", tmp_path / "seen"
        # the "gateway" runs as the owner, as Hermes's does (root's descriptors are hidden from the owner)
        owner = ["/usr/bin/setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "/usr/bin/python3"]
        start = ["/bin/sh", "-c", '"$@" >/dev/null 2>&1 & echo $! > "$0"', str(pidfile)] + owner + ["-c", HOLD, db]
        # the stop records who runs it and who owns the drain marker it finds
        stop = ["/bin/sh", "-c", 'echo "$(id -u) $(stat -c %u "$1/.drain_request.json")" > "$2"; kill "$(cat "$0")"',
                str(pidfile), str(home), str(seen)]  # fmt: skip
        subprocess.run(start, check=True)
        try:
            deadline = time.monotonic() + 30
            while not window.holders(db) and time.monotonic() < deadline:
                time.sleep(0.1)
            options = dict(allow_unknown_schema=True, prune_days=7, hermes_home=[str(home)])
            result = run_maintenance(dict(options, gateway_stop_command=stop, gateway_start_command=start))
        finally:
            subprocess.run(["/bin/sh", "-c", 'kill "$(cat "$0")"', str(pidfile)], check=False)
        profile = result["profiles"][0]
        assert profile["status"] == "ok", profile["error"]
        assert (
            profile["window"]["done"] == ["backup", "fts_optimize", "vacuum_full"] and profile["window"]["gateway_back"]
        ), profile["window"]
        assert seen.read_text().split() == ["0", str(uid)]  # root stops; the marker is the owner's
        assert not os.path.exists(os.path.join(str(home), window.DRAIN_FILE))
        backup = profile["window"]["backup"]
        for path in (db, backup):
            st = os.stat(path)
            assert (st.st_uid, st.st_mode & 0o777) == (uid, 0o600), path
        assert q(db, "PRAGMA auto_vacuum")[0][0] == 2 and db_problems(db) == []
