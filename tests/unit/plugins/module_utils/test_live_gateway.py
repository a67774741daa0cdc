"""What a client of a REAL Hermes 0.22.2 gateway sees while our run prunes its state.db, and the
space the run gives back beside it once the file is in incremental auto_vacuum.

The gateway is the release's own ``hermes gateway run`` (tests/lib/hermes_gateway.py): its API
server platform on loopback, its model a stub on loopback, its state.db in rollback-journal
mode as the release makes it here (SQLite 3.40.1 has the WAL-reset bug). A client sends a chat
request every 100 ms before, during and after the run. Every request succeeds, every turn the
client was answered for is in state.db, and the run pruned half the file beside the gateway.
After the one-time switch to ``auto_vacuum=INCREMENTAL`` (a run with no holder, as the service
window does it) the live run gives back every page it freed, in ``incremental_vacuum`` steps
sized to the prune's bound; what it gives back against the same run on a copy nobody holds
(which also optimizes the FTS indexes) is printed.

A 0.19.0 file in WAL mode (the release writes it so; the 0.22.2 gateway migrates it and keeps WAL):
beside the gateway, which checkpoints after its own commits, and with no checkpoint of ours (SQLite
3.40.1 has the WAL-reset bug), the run leaves the ``-wal`` within a few of the gateway's checkpoint
intervals rather than holding every frame it wrote.

Latency figures are printed, not asserted beyond a 3 s safety net (the 250 ms target belongs to
bench/run.py, on an idle machine).
"""

import os
import shutil
import time

import pytest
from hermes_gateway import Client, Gateway, gateway_missing, latency_summary, stored_user_messages, wait_settled
from hermes_markers import release_module_marks
from hermes_reliability import db_problems
from hermes_reliability import query as q
from hermes_rollback import RELEASE, copy_of_big_rollback_home, journal_mode

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import sqlite_wal_reset_affected
from hermes_fixtures import layout_available, make_big_home, missing_venv_message

SIZE = (1600, 100)  # sessions, messages each; half of them ended 8..90 days ago
STALL_LIMIT = 3.0
WAL_LAYOUT, WAL_SIZE = "hermes-0.19.0", (800, 80)
CHECKPOINT_FRAMES = 1000  # SQLite's wal_autocheckpoint, which the gateway keeps
OPTIONS = {"allow_unknown_schema": True, "prune_days": 7}

pytestmark = release_module_marks(RELEASE) + [
    pytest.mark.skipif(gateway_missing(RELEASE) is not None, reason=str(gateway_missing(RELEASE)))
]


def served_and_stored(client, db, t0, t1):
    """No request failed, some ran during our run (t0..t1) within STALL_LIMIT, every turn answered is in
    state.db and the file is sound; returns the latency summary during the run."""
    during = latency_summary(client.between(t0, t1))
    assert [a for a in client.snapshot() if not a["ok"]] == []
    assert during["count"] > 0 and during["worst_ms"] < STALL_LIMIT * 1000, during
    assert stored_user_messages(db, client.prefix) == client.messages_sent
    assert db_problems(db) == []
    return during


@pytest.fixture
def gateway_home(tmp_path, request):
    """A big 0.22.2 home served by a real gateway; ``incremental`` (indirect): switched first,
    and a copy of it left beside for the run with no holder."""
    home = tmp_path / "home"
    db = copy_of_big_rollback_home(home, SIZE[0], SIZE[1], seed=53)
    assert journal_mode(str(db)) == "delete"
    if getattr(request, "param", None) == "incremental":
        switch = dict(OPTIONS, hermes_home=[str(home)], vacuum_mode="full", prune_days=3650, backup=False)
        assert run_maintenance(switch)["profiles"][0]["reclaim"]["action"] == "full"
        assert q(db, "PRAGMA auto_vacuum")[0][0] == 2
        (tmp_path / "alone").mkdir()
        shutil.copy2(str(db), str(tmp_path / "alone" / "state.db"))
    with Gateway(home) as gateway:
        wait_settled(str(db))
        yield home, str(db), gateway


def test_client_sees_no_failure_during_our_prune(gateway_home):
    home, db, gateway = gateway_home
    with Client(gateway.port) as client:
        time.sleep(3.0)
        t0 = time.monotonic()
        result = run_maintenance(dict(OPTIONS, hermes_home=[str(home)]))
        t1 = time.monotonic()
        time.sleep(2.0)
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    assert profile["preflight"]["live_rollback"], "the gateway did not hold the file: the test proves nothing"
    assert profile["sessions_pruned"] > 0 and profile["messages_pruned"] >= SIZE[0] * SIZE[1] // 4
    before, during, after = (latency_summary(client.between(*span)) for span in ((0, t0), (t0, t1), (t1, float("inf"))))
    assert during["count"] > 0 and after["count"] > 0
    failed = [a for a in client.snapshot() if not a["ok"]]
    assert failed == [], failed[:3]
    assert during["worst_ms"] < STALL_LIMIT * 1000, during
    # every turn the client was answered for is in the file, and the file is sound
    assert stored_user_messages(db, client.prefix) == client.messages_sent
    assert db_problems(db) == []
    print(
        "\nclient of a live 0.22.2 gateway, our run %.1f s (%d sessions, %d messages pruned): before %s; during %s;"
        " after %s" % (t1 - t0, profile["sessions_pruned"], profile["messages_pruned"], before, during, after)
    )


@pytest.mark.parametrize("gateway_home", ["incremental"], indirect=True)
def test_space_comes_back_live_after_the_switch(gateway_home, tmp_path):
    home, db, gateway = gateway_home
    alone = run_maintenance(dict(OPTIONS, hermes_home=[str(tmp_path / "alone")]))["profiles"][0]
    assert alone["status"] == "ok" and alone["reclaim"]["action"] == "incremental"
    with Client(gateway.port) as client:
        time.sleep(2.0)
        t0 = time.monotonic()
        live = run_maintenance(dict(OPTIONS, hermes_home=[str(home)]))["profiles"][0]
        t1 = time.monotonic()
        time.sleep(2.0)
    assert live["status"] == "ok", live["error"]
    assert live["preflight"]["live_rollback"], "the gateway did not hold the file: the test proves nothing"
    reclaim = live["reclaim"]
    assert reclaim["action"] == "incremental" and reclaim["incremental_steps"] > 0, reclaim
    assert live["sessions_pruned"] > 0 and live["after"]["free_pages"] < live["before"]["page_count"] // 100
    # every page the live run freed goes back to the disk, in steps beside the gateway
    freed_pages = reclaim["free_pages_before_vacuum"] * live["before"]["page_size"]
    assert reclaim["bytes_freed"] >= 0.9 * freed_pages, (reclaim["bytes_freed"], freed_pages)
    # Against the run with no holder: that one also runs FTS5's optimize after its prune, which
    # beside a writer would climb a level per foreign commit; so the live file keeps the deleted
    # rows' FTS entries, and the ratio is a figure (what is left of FTS beside a live writer).
    ratio = reclaim["bytes_freed"] / float(alone["reclaim"]["bytes_freed"])
    during = served_and_stored(client, db, t0, t1)
    print(
        "\nafter the switch: live run gave back %d bytes in %d incremental steps (%d retried), %.2f of the no-holder"
        " run's %d; client during %s"
        % (reclaim["bytes_freed"], reclaim["incremental_steps"], reclaim["incremental_retries"], ratio,
           alone["reclaim"]["bytes_freed"], during)
    )  # fmt: skip


def wal_bytes(db):
    return os.path.getsize(db + "-wal") if os.path.exists(db + "-wal") else 0


def test_a_wal_file_keeps_a_small_wal_beside_the_gateway(tmp_path):
    """Our run writes tens of MB of frames (prune, FTS optimize, incremental_vacuum) and checkpoints
    none of them; the gateway's checkpoints after its commits copy them, and our commits that follow a
    complete checkpoint restart the -wal and cut it (journal_size_limit): it ends within a few of the
    gateway's checkpoint intervals, not holding every frame we wrote (67 MB after such a run before)."""
    if not layout_available(WAL_LAYOUT):
        pytest.skip(missing_venv_message(WAL_LAYOUT))
    home = tmp_path / "home"
    db = str(make_big_home(str(home), WAL_LAYOUT, WAL_SIZE[0], WAL_SIZE[1], old_fraction=0.5, seed=53))
    switch = dict(OPTIONS, hermes_home=[str(home)], vacuum_mode="full", prune_days=3650, backup=False)
    assert run_maintenance(switch)["profiles"][0]["reclaim"]["action"] == "full"
    assert q(db, "PRAGMA auto_vacuum")[0][0] == 2
    with Gateway(home) as gateway:
        wait_settled(db)
        assert journal_mode(db) == "wal"
        with Client(gateway.port) as client:
            time.sleep(3.0)
            wal_before = wal_bytes(db)  # the gateway's own, serving the client
            t0 = time.monotonic()
            live = run_maintenance(dict(OPTIONS, hermes_home=[str(home)]))["profiles"][0]
            t1 = time.monotonic()
            wal_after = wal_bytes(db)
            time.sleep(2.0)
    assert live["status"] == "ok", live["error"]
    assert live["sessions_pruned"] > 0 and live["reclaim"]["fts_merge_steps"] > 0
    reclaim = live["reclaim"]
    assert reclaim["action"] == "incremental" and reclaim["incremental_steps"] > 0, reclaim
    if sqlite_wal_reset_affected():  # no checkpoint of ours beside the gateway
        assert reclaim["checkpoint"] is None and "WAL-reset" in reclaim["checkpoint_skipped_reason"], reclaim
    frame = live["before"]["page_size"] + 24
    assert wal_after <= 4 * CHECKPOINT_FRAMES * frame, (wal_before, wal_after)
    during = served_and_stored(client, db, t0, t1)
    print(
        "\n0.19.0 WAL file beside the gateway: -wal %.1f MB before our run (the gateway's), %.1f MB after it; "
        "%d sessions pruned, %d FTS steps, %d incremental steps; client during %s"
        % (wal_before / 1e6, wal_after / 1e6, live["sessions_pruned"], reclaim["fts_merge_steps"],
           reclaim["incremental_steps"], during)
    )  # fmt: skip
