"""The systemd host's gateway, its stub model and its client (run ON the host, by its python3).

    fleet_gateway.py mounts VENV                (on the controller) podman's --volume arguments for them
    fleet_gateway.py home OUT.tar.gz SESSIONS MESSAGES   (on the controller) the gateway's home
    fleet_gateway.py model PORT                 the stub model (a systemd unit runs it)
    fleet_gateway.py configure HOME MODEL_PORT API_PORT
    fleet_gateway.py ready HOME                 /health and one answered turn
    fleet_gateway.py client API_PORT OUT        a request every 100 ms until SIGTERM, then OUT (JSON)
    fleet_gateway.py wait-window USER UNIT.service TIMEOUT   a run with the window, and one after it
    fleet_gateway.py evidence HOME USER CLIENT_OUT GATEWAY_UNIT MAINTENANCE_UNIT   (as root: JSON)

Everything but ``evidence`` is tests/lib/hermes_gateway.py (bind-mounted read-only beside this
file): the same stub model, gateway configuration and client as the integration tests. The
Hermes 0.22.2 venv is bind-mounted at the controller's path (HERMES_VENV_DIR). ``evidence`` is
judged on the controller by fleet_assert.py (phase ``systemd``).
"""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

sys.path[:0] = [
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"),
    os.path.dirname(os.path.abspath(__file__)),
]

from hermes_gateway import (  # noqa: E402
    Client,
    StubModel,
    configured_port,
    stored_user_messages,
    wait_healthy,
    warm_up,
    write_gateway_config,
)


def mounts(venv):
    """podman's arguments that mount the venv (its real path: its scripts name it) and the prefix
    of the interpreter it was made from read-only at the same paths, one a line."""
    venv = os.path.realpath(venv)
    with open(os.path.join(venv, "pyvenv.cfg")) as handle:
        cfg = {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in handle if "=" in line)}
    prefix = os.path.dirname(os.path.realpath(cfg["home"]))
    if prefix.split("/")[1] in ("usr", "bin", "lib", "etc"):
        raise SystemExit("%s was made from %s, the system's own: the host has its own there" % (venv, prefix))
    print("\n".join("--volume=%s:%s:ro" % (path, path) for path in (venv, prefix)))


def home(out, sessions, messages):
    """A 0.22.2 state.db as the release makes it (rollback journal, auto_vacuum NONE), half its
    sessions old enough to prune, archived as ``.hermes/`` the way make_fleet_data.py does."""
    import tarfile
    import tempfile

    from hermes_rollback import make_big_rollback_home
    from make_fleet_data import tar_filter

    with tempfile.TemporaryDirectory() as tmp:
        make_big_rollback_home(os.path.join(tmp, ".hermes"), int(sessions), int(messages), seed=53)
        with tarfile.open(out, "w:gz") as tar:
            tar.add(os.path.join(tmp, ".hermes"), arcname=".hermes", filter=tar_filter)
    print("%s: %s sessions x %s messages" % (out, sessions, messages))


def model(port):
    StubModel(int(port))
    threading.Event().wait()


def ready(home):
    port = configured_port(home)
    wait_healthy(port, timeout=180)
    warm_up(port, timeout=120)
    print("gateway answers on %d" % port)


def client(port, out):
    """Send until SIGTERM; then every attempt, its start in wall-clock time (the journal's clock)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    offset = time.time() - time.monotonic()
    with Client(int(port), retry=True, prefix="fleet") as sender:
        stop.wait()
    attempts = [dict(a, start=a["start"] + offset) for a in sender.snapshot()]
    with open(os.open(out + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump({"prefix": sender.prefix, "attempts": attempts, "answered": sender.messages_sent}, handle)
    os.replace(out + ".tmp", out)


def _run(argv):
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()


def _holders(path):
    """Pids with a descriptor on ``path`` (read as root from /proc)."""
    real, pids = os.path.realpath(path), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) == real:
                    pids.append(int(pid))
                    break
            except OSError:
                pass
    return pids


def _read(path):
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _runs(unit):
    """Each start of ``unit`` from the journal: when it started and when it ended (wall clock, s)."""
    runs = []
    for line in _run(["journalctl", "--no-pager", "-o", "json", "-u", unit]).splitlines():
        entry = json.loads(line)
        if entry.get("JOB_TYPE") != "start" or entry.get("UNIT") != unit:
            continue
        at = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
        if "JOB_RESULT" not in entry:
            runs.append({"start": at, "end": None, "result": None})
        elif runs and runs[-1]["end"] is None:
            runs[-1].update(end=at, result=entry["JOB_RESULT"])
    return runs


LOG_START = "=== Session Maintenance Start"
BLOCK_STARTED = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)$", re.M)  # its first line's day and start
WINDOW_OPENED = re.compile(r"service window [\d.]+ s:")  # the summary's words for a window that opened


def _block_started(block):
    """When the run that wrote ``block`` started (the runner's local-time stamp, whole seconds)."""
    words = BLOCK_STARTED.search(block.split("\n", 1)[0])
    return time.mktime(time.strptime(" ".join(words.groups()), "%Y-%m-%d %H:%M:%S")) if words else None


def scheduled_runs(user, unit):
    """The maintenance unit's runs (journal: start, end, result), each with its part of the
    runner's log (its START .. DONE block), paired by time: a block belongs to the latest run
    that started before it (the runner's stamp has whole seconds). The runner writes its block
    as it ends, a moment before systemd marks the run done, so the newest block may belong to a
    run still going; pairing by position would give it to the run before."""
    config = {}
    try:
        with open("/etc/hermes-ops/%s/maintenance.json" % user) as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        pass
    blocks = [LOG_START + b for b in _read(config.get("log_file") or "/nonexistent").split(LOG_START)[1:]]
    runs = _runs(unit)
    for block in blocks:
        started = _block_started(block)
        owners = [r for r in runs if started is not None and r["start"] <= started + 1]
        if owners:
            owners[-1]["log"] = block
    return runs, config


def wait_window(user, unit, timeout):
    """Wait until a finished run opened the window and a later run finished too."""
    deadline = time.monotonic() + float(timeout)
    while True:
        runs = scheduled_runs(user, unit)[0]
        window = [i for i, r in enumerate(runs) if WINDOW_OPENED.search(r.get("log", "")) and r["end"]]
        if window and any(r["end"] for r in runs[window[0] + 1 :]):
            print("window in run %d of %d" % (window[0] + 1, len(runs)))
            return
        if time.monotonic() > deadline:
            raise SystemExit("no run with a service window and a run after it in %s s: %s" % (timeout, runs))
        time.sleep(3)


def evidence(home, user, client_out, gateway_unit, maintenance_unit):
    db = os.path.join(home, "state.db")
    with open(client_out) as handle:
        sent = json.load(handle)
    runs, config = scheduled_runs(user, maintenance_unit + ".service")
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=30)
    try:
        auto_vacuum = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        hermes_pruned = conn.execute("SELECT value FROM state_meta WHERE key = 'last_auto_prune'").fetchone()
    finally:
        conn.close()
    user_manager = ["systemctl", "--user", "--machine=%s@" % user]
    timer = _run(
        ["systemctl", "show", maintenance_unit + ".timer", "--property=ActiveState,UnitFileState,LastTriggerUSec"]
    )
    out = {
        "client": sent,
        "stored": stored_user_messages(db, sent["prefix"]),
        "gateway_active": _run(user_manager + ["is-active", gateway_unit]),
        "gateway_unit_path": _run(user_manager + ["show", "--property=FragmentPath", "--value", gateway_unit]),
        "holders": _holders(db),
        "auto_vacuum": auto_vacuum,
        "journal_mode": journal,
        "hermes_last_auto_prune": hermes_pruned and hermes_pruned[0],
        "runs": runs,
        "timer": dict(line.split("=", 1) for line in timer.splitlines() if "=" in line),
        "metrics": _read(os.path.join(config.get("metrics_dir") or "/nonexistent", "hermes_ops_%s.prom" % user)),
    }
    print(json.dumps(out))


def configure(home, model_port, api_port):
    """As docs/fleet.md tells an operator whose pruning this collection schedules: Hermes's own
    auto-prune off, so the timer's run is the only one that prunes and vacuums the file."""
    write_gateway_config(home, "http://127.0.0.1:%s/v1" % model_port, int(api_port), "sessions: {auto_prune: false}\n")


COMMANDS = {
    "mounts": mounts,
    "home": home,
    "model": model,
    "configure": configure,
    "ready": ready,
    "client": client,
    "wait-window": wait_window,
    "evidence": evidence,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
