"""The service window inside the run, beside a REAL Hermes 0.22.2 gateway under a supervisor.

The gateway is the release's own ``hermes gateway run`` (tests/lib/hermes_gateway.py), started
and stopped by a process supervisor the test runs: ``gateway_stop_command`` SIGTERMs the pid
``gateway.pid`` names and returns once it is gone, ``gateway_start_command`` starts a new
``hermes gateway run`` and returns once it answers. Its state.db is in rollback-journal mode
with auto_vacuum NONE, as the release makes it; half the sessions are old enough to prune.

The prune runs beside the live gateway; the full VACUUM (the one-time switch to incremental
auto_vacuum) runs in the window. A client sends a request every 100 ms throughout and sends a
failed one again: in the window requests fail fast (Hermes's drain answers 503, then the port is
closed) and succeed on retry, none fails after, and every turn answered is in the file.
"""

import os
import socket
import time

import pytest
from hermes_gateway import (
    Client,
    Gateway,
    gateway_missing,
    gateway_pid,
    latency_summary,
    spawn_gateway,
    stored_user_messages,
    supervised_gateway,
    supervisor_argv,
)
from hermes_markers import release_module_marks
from hermes_reliability import db_problems
from hermes_reliability import query as q
from hermes_rollback import RELEASE, copy_of_big_rollback_home, journal_mode

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.apply.window import (
    connected_platforms,
    serving_since,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.run import run_maintenance

SIZE = (1600, 100)  # sessions, messages each; half of them ended 8..90 days ago
FAIL_FAST = 2.0  # s: a request refused in the window answers within this

pytestmark = release_module_marks(RELEASE) + [
    pytest.mark.skipif(gateway_missing(RELEASE) is not None, reason=str(gateway_missing(RELEASE)))
]


@pytest.fixture
def supervised(tmp_path):
    """A home with a big 0.22.2 state.db and its gateway started by the supervisor."""
    home = tmp_path / "home"
    db = str(copy_of_big_rollback_home(home, SIZE[0], SIZE[1], seed=53))
    assert journal_mode(db) == "delete" and q(db, "PRAGMA auto_vacuum")[0][0] == 0
    with supervised_gateway(home, db) as port:
        yield home, db, port


def window_options(home, **more):
    return dict(
        hermes_home=[str(home)],
        allow_unknown_schema=True,
        prune_days=7,
        gateway_stop_command=supervisor_argv("stop", home),
        gateway_start_command=supervisor_argv("start", home),
        **more,
    )


def test_window_switches_to_incremental_while_clients_retry(supervised):
    home, db, port = supervised
    pid_before = gateway_pid(home)
    predicted = run_maintenance(window_options(home), check_mode=True)["profiles"][0]
    assert predicted["status"] == "ok", predicted["error"]
    # the whole-file backup a live rollback-journal run defers comes first in the window
    steps = ["backup", "fts_optimize", "vacuum_full"]
    assert predicted["window"]["opened"] and predicted["window"]["steps"] == steps, predicted["window"]
    assert predicted["reclaim"]["action"] == "full" and predicted["reclaim"]["in_window"]
    with Client(port, retry=True) as client:
        time.sleep(2.0)
        t0 = time.monotonic()
        result = run_maintenance(window_options(home))
        t1 = time.monotonic()
        # the restarted gateway's first turn takes seconds more (its warm-up), many more on a loaded
        # machine: wait for a few answered turns after the run rather than a fixed time
        deadline = time.monotonic() + 90
        while len(client.between(t1, float("inf"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
    # the run returns once the gateway serves again: no request after it finds the port closed
    refused = [a for a in client.between(t1, float("inf")) if a["status"] is None and "refused" in a["error"]]
    assert refused == [], refused[:3]
    profile = result["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    window = profile["window"]
    assert window["opened"] and window["done"] == steps and window["gateway_back"], window
    assert window["reason"] is None, window["reason"]
    assert 0 < window["downtime_s"] <= 120 and window["auto_vacuum"] == 2
    assert gateway_pid(home) not in (None, pid_before), "the supervisor did not start a new gateway"
    assert profile["backup"]["kind"] == "archive" and "rollback-journal" in profile["backup_deferred"]
    whole = window["backup"]
    assert os.path.basename(whole).startswith("hermes-ops_default_") and os.stat(whole).st_mode & 0o777 == 0o600
    assert db_problems(whole) == [] and q(whole, "PRAGMA auto_vacuum")[0][0] == 0  # the file as it was before
    sessions = q(whole, "SELECT COUNT(*) FROM sessions")[0][0]  # the client's go on being added
    assert profile["after"]["sessions"] <= sessions <= q(db, "SELECT COUNT(*) FROM sessions")[0][0]
    # the prune ran beside the live gateway, the VACUUM in the window
    assert profile["preflight"]["live_rollback"] and profile["sessions_pruned"] > 0
    assert profile["reclaim"]["action"] == "full" and profile["reclaim"]["bytes_freed"] > 0
    assert q(db, "PRAGMA auto_vacuum")[0][0] == 2 and journal_mode(db) == "delete"
    assert any("service window" in line for line in result["summary"]), result["summary"]
    # the client: failures only in the window, each fast, each message answered on a retry
    attempts = client.snapshot()
    failed = [a for a in attempts if not a["ok"]]
    assert failed, "no request met the window: the test proves nothing"
    assert all(t0 <= a["start"] < t1 for a in failed), [a for a in failed if not t0 <= a["start"] < t1][:3]
    assert max(a["latency"] for a in failed) < FAIL_FAST, latency_summary(failed)
    assert all(a["status"] in (503, None) for a in failed), {a["status"] for a in failed}
    after = client.between(t1, float("inf"))
    first_after = [a for a in attempts if a["ok"] and a["start"] > failed[-1]["start"]][0]
    assert after and all(a["ok"] for a in after)
    answered = client.messages_sent
    assert set(a["message"] for a in attempts) == set(answered), "a message never succeeded on retry"
    assert stored_user_messages(db, client.prefix) == answered
    assert db_problems(db) == []
    print(
        "\nservice window: downtime %.1f s (estimate %.0f s), %s freed; client: %d attempts, %d failed in the window"
        " (worst %.0f ms); the first turn after it %.1f s; after %s"
        % (window["downtime_s"], window["estimate_s"], profile["reclaim"]["bytes_freed"], len(attempts), len(failed),
           1000 * max(a["latency"] for a in failed), first_after["latency"],
           latency_summary(after))
    )  # fmt: skip


def test_the_window_waits_for_the_restarted_gateway_to_serve(tmp_path):
    """What "the gateway is back" reads: a restarted 0.22.2 gateway writes its pid into the record
    the stopped one left (``running``) before it binds its port, so the state alone would say back
    while connections are refused; the platform connected before must say ``connected`` again."""
    home = tmp_path / "home"
    gateway = Gateway(home).start()
    try:
        platforms = connected_platforms(str(home))
        assert platforms == ["api_server"], platforms
        gateway.stop()
        started = time.time()
        assert not serving_since(str(home), platforms, started)  # the stopped gateway's word is not taken
        gateway.proc = spawn_gateway(home, gateway.log)
        deadline, polls = time.monotonic() + 90, 0
        while not serving_since(str(home), platforms, started):
            assert time.monotonic() < deadline, "the restarted gateway never said it serves"
            assert gateway.proc.poll() is None, "the restarted gateway exited"
            polls += 1
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=5):
            pass  # serving_since was true: the port takes connections at once
        assert polls > 10  # it was asked while the gateway started, not only after
    finally:
        gateway.close()
