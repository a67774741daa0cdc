"""What a client of a REAL Hermes 0.22.2 gateway sees while our run prunes its state.db.

The gateway is the release's own ``hermes gateway run`` (tests/lib/hermes_gateway.py): its API
server platform on loopback, its model a stub on loopback, its state.db in rollback-journal
mode as the release makes it here (SQLite 3.40.1 has the WAL-reset bug). A client sends a chat
request every 100 ms before, during and after the run. Every request succeeds, every turn the
client was answered for is in state.db, and the run pruned half the file beside the gateway.

Latency figures are printed, not asserted beyond a 3 s safety net (the 250 ms target belongs to
bench/run.py, on an idle machine).
"""

import time

import pytest
from hermes_gateway import Client, Gateway, gateway_missing, latency_summary, stored_user_messages, wait_settled
from hermes_markers import release_module_marks
from hermes_reliability import db_problems
from hermes_rollback import RELEASE, journal_mode, make_big_rollback_home

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes_engine import run_maintenance

SIZE = (1600, 100)  # sessions, messages each; half of them ended 8..90 days ago
STALL_LIMIT = 3.0
OPTIONS = {"allow_unknown_schema": True, "prune_days": 7}

pytestmark = release_module_marks(RELEASE) + [
    pytest.mark.skipif(gateway_missing(RELEASE) is not None, reason=str(gateway_missing(RELEASE)))
]


@pytest.fixture
def gateway_home(tmp_path):
    home = tmp_path / "home"
    db = make_big_rollback_home(home, SIZE[0], SIZE[1], seed=53, now=time.time())
    assert journal_mode(str(db)) == "delete"
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
