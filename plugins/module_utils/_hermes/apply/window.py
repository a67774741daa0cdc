# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The service window: the gateway drained, stopped, and always started again, around the steps
that need state.db alone (a full VACUUM, which also switches the file to incremental auto_vacuum,
after FTS5's optimize of what the gateway wrote since the run's own; Hermes's own optimize-storage,
apply.storage_upgrade).

The plan (``plan_window``, in each profile's action plan) says whether a window opens and for
what; the run opens one window for every profile that planned it, after their live work
(``run_window``). Drain first: Hermes's own contract (0.22.2 ``gateway/drain_control.py``) is
the marker ``HERMES_HOME/.drain_request.json``; the gateway then refuses new turns with a
retryable 503 and says ``draining`` in ``gateway_state.json``, and the turns in flight finish.
The marker is removed before the gateway starts again (a fresh gateway honours a marker of the
same boot for an hour). The steps run against a deadline: the window's start plus
``max_downtime`` less the time the gateway needs to come back; a step still running then is
interrupted, and SQLite rolls it back.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import stat
import subprocess
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from ..backup.whole_file import apply_retention, take_backup
from ..options import iso_seconds
from ..sqlite.db import MB, MaintenanceError, file_size, holders, open_rw
from ..sqlite.durable import replace_file
from ..store.schema import inspect_schema, quick_check
from .elision import fts_optimize
from .reclaim import checkpoint, full_vacuum, full_vacuum_blocked, pragma
from .storage_upgrade import OPTIMIZE_STORAGE, run_storage_upgrade, storage_upgrade_seconds

if TYPE_CHECKING:
    from ..options import Options

# A profile's part of the window, as the run gives it: {"home", "path", "name", "backup_dir", "steps"}.
Entry = dict[str, Any]
# A window's plan and report: the JSON-like dicts each profile's ``window`` result holds.
Report = dict[str, Any]
# Runs ``fn(*args)`` as the owner of the profiles' files (a child process as root); what it returns.
AsOwner = Callable[..., Any]

DRAIN_FILE = ".drain_request.json"
STATE_FILE = "gateway_state.json"
# Hermes writes a few KB there; the agent can write any size, and root reads it: past this, unreadable.
STATE_MOST = 1024 * 1024
BACKUP = "backup"  # the whole-file backup a live rollback-journal run defers (quick_check first)
VACUUM_FULL = "vacuum_full"
FTS_OPTIMIZE = "fts_optimize"
# A full VACUUM's speed on the slowest host it was timed on (2 shared cores: a 0.7 GB 0.22.2 file in
# about 30 s), and FTS5's optimize taken as fast: both estimates err towards not opening a window.
VACUUM_BYTES_PER_SECOND = 20 * MB
# Drain, stop, start and the check that the gateway is back: 0.22.2 stops in 1.7 s idle and
# answers /health 2-3 s after start; the rest is room for a turn in flight and a loaded host.
RESTART_ALLOWANCE = 20.0
START_RESERVE = 10.0  # of max_downtime, kept for the start and the check that the gateway is back
DRAIN_WAIT = 30.0  # at most, for the turns in flight to finish (the gateway's own SIGTERM wait)
DRAIN_NOTICE = 5.0  # for the gateway to say it is draining (its watcher reads the marker every second)
STOP_WAIT = 45.0  # for the gateway to let go of state.db after the stop command
BACK_WAIT = 90.0  # for the gateway to hold state.db again and serve after the start command
SERVING = ("running", "degraded")  # gateway_state.json's words for a gateway that takes requests
CLOCK_SLACK = 0.05  # a file's mtime comes from the kernel's coarse clock, a tick behind time.time()
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # where root looks for systemctl, never the caller's PATH


def configured(opts: Options) -> bool:
    return bool(opts.gateway_service or opts.gateway_stop_command)


def check_window_options(opts: Options) -> str | None:
    """The message for a window configuration that cannot work, naming the option, or None."""
    stop, start = opts.gateway_stop_command, opts.gateway_start_command
    if bool(stop) != bool(start):
        return "gateway_stop_command and gateway_start_command go together: give both, or neither"
    if stop and opts.gateway_service:
        return "give gateway_service or gateway_stop_command/gateway_start_command, not both"
    for name, argv in (("gateway_stop_command", stop), ("gateway_start_command", start)):
        if argv is None:
            continue
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            return "%s must be a list of non-empty strings, the program first (got %r)" % (name, argv)
        if len(argv[0].split()) > 1:
            return "%s: %r is a command line; give an argv list, the program first (%r)" % (
                name, argv[0], argv[0].split(),
            )  # fmt: skip
        if not os.path.isabs(argv[0]):
            return "%s: the program must be an absolute path, so no PATH chooses it (got %r)" % (name, argv[0])
    service = opts.gateway_service
    if service is not None and (not service or service.startswith("-") or "/" in service):
        return "gateway_service must be a systemd unit name, such as hermes-gateway (got %r)" % (service,)
    return None


def estimate_seconds(steps: list[str], db_bytes: int, messages: int = 0) -> float:
    """The window's expected length: the gateway's restart, and each step at the slow host's speed
    (Hermes's optimize-storage by the messages it re-indexes, its own VACUUM only without ours)."""
    total = RESTART_ALLOWANCE
    for step in steps:
        if step == OPTIMIZE_STORAGE:
            total += storage_upgrade_seconds(messages, db_bytes, vacuum=VACUUM_FULL not in steps)
        else:
            total += db_bytes / float(VACUUM_BYTES_PER_SECOND)
    return total


def plan_window(
    opts: Options,
    reclaim: dict[str, Any],
    db_path: str,
    *,
    backup_deferred: bool = False,
    storage_upgrade: dict[str, Any] | None = None,
) -> Report | None:
    """Whether this profile's run opens a window and for what: ``{"opened", "reason", "steps",
    "estimate_s", "downtime_s"}`` (None when no window is configured). ``reclaim`` is the plan's
    reclaim decision (a full VACUUM planned ``in_window``, after FTS5's optimize: the window runs
    what a run with no holder runs; FTS5's optimize after a prune or an elision runs live, in steps,
    and needs no window of its own); ``backup_deferred``: the
    whole-file backup was due and the live run takes an archive instead, so a window that opens
    takes it first (never opened for it alone); ``storage_upgrade``: ``{"pending", "messages"}`` when
    Hermes's optimize-storage has work and ``hermes_python`` can run it (None otherwise)."""
    if not configured(opts):
        return None
    held = bool(holders(db_path))
    steps = [OPTIMIZE_STORAGE] if storage_upgrade and held else []
    if reclaim.get("in_window") and held:  # the FTS segments the gateway wrote since the live optimize
        steps.append(FTS_OPTIMIZE)
    if reclaim.get("in_window"):
        steps.append(VACUUM_FULL)
    if steps and backup_deferred:
        steps.insert(0, BACKUP)
    window: Report = {"opened": False, "reason": None, "steps": steps, "estimate_s": None, "downtime_s": None}
    if not steps:
        window["reason"] = "no step needs the file alone" if held else "nothing holds state.db: no window needed"
        return window
    messages = (storage_upgrade or {}).get("messages", 0)
    window["estimate_s"] = estimate = round(estimate_seconds(steps, file_size(db_path), messages), 1)
    if estimate > float(opts.max_downtime):
        window["reason"] = "estimated %.0f s for %s, more than max_downtime %s s" % (
            estimate, " and ".join(steps), opts.max_downtime,
        )  # fmt: skip
        return window
    window["opened"] = True
    return window


def window_words(window: Report | None, check_mode: bool) -> list[str]:
    """The summary's words for a profile's window (none without one, nor when nothing needs it)."""
    if not window or not window["steps"]:
        return []
    if not window["opened"]:
        return ["no service window: %s" % window["reason"]]
    if check_mode:
        return ["service window would open for %s (~%.0f s)" % (", ".join(window["steps"]), window["estimate_s"] or 0)]
    done = window.get("done") or []
    words = "service window %.1f s: %s" % (window["downtime_s"] or 0.0, ", ".join(done) or "nothing done")
    if window["reason"]:
        words += " (%s)" % window["reason"]
    return [words]


# ---------------------------------------------------------------------------- the steps, as the file's owner


def window_steps(entry: Entry, opts: Options, deadline: float) -> Report:
    """Run ``entry``'s steps on its ``path`` with the gateway stopped, each interrupted at ``deadline``
    (epoch seconds). Returns ``{"done", "reason", "bytes_before", "bytes_after", "file", "backup"}``;
    never raises. A failed step ends the steps (the backup's failure keeps the VACUUM out)."""
    db_path = entry["path"]
    report: Report = {
        "done": [],
        "reason": None,
        "bytes_before": _db_bytes(db_path),
        "bytes_after": None,
        "backup": None,
    }
    conn: sqlite3.Connection | None = None
    try:
        conn = _open_bounded(db_path, opts, deadline)
        for step in entry["steps"]:
            if step == OPTIMIZE_STORAGE:
                conn.close()  # Hermes refuses while any other process holds the file, this one too
                conn = None
                if not _storage_upgrade_step(entry, opts, deadline, report):
                    break
                conn = _open_bounded(db_path, opts, deadline)
                continue
            if step == BACKUP:
                report["backup"] = _whole_file_backup(conn, entry, opts)
            elif step == VACUUM_FULL:
                blocked = full_vacuum_blocked(db_path)
                if blocked:
                    report["reason"] = "no VACUUM: %s" % blocked
                    continue
                full_vacuum(conn, opts.vacuum_switch_incremental)
            elif step == FTS_OPTIMIZE:
                schema = inspect_schema(conn, entry["home"])
                fts_optimize(conn, schema["fts"], lambda _took: None, None)
            report["done"].append(step)
        if conn is not None:
            # The gateway is stopped: a WAL file's -wal (the live steps' frames and the window's own) is
            # checkpointed and cut here (TRUNCATE), which beside the gateway no checkpoint of ours may do
            # on an SQLite with the WAL-reset bug.
            checkpoint(conn, db_path)
    except MaintenanceError as exc:
        report["reason"] = str(exc)
    except sqlite3.OperationalError as exc:
        interrupted = "interrupt" in str(exc)
        report["reason"] = (
            "interrupted at the bound (max_downtime), rolled back" if interrupted else "%s: %s" % (db_path, exc)
        )
    except Exception as exc:  # the gateway is started again whatever happened here
        report["reason"] = "%s: unexpected %s: %s" % (db_path, type(exc).__name__, exc)
    finally:
        if conn is not None:
            conn.close()
    report["bytes_after"] = _db_bytes(db_path)
    report["file"] = _pages(db_path)
    return report


def _open_bounded(db_path: str, opts: Options, deadline: float) -> sqlite3.Connection:
    """A maintenance connection whose statements are interrupted at ``deadline`` (epoch seconds)."""
    conn: sqlite3.Connection = open_rw(db_path, float(opts.busy_timeout))
    conn.set_progress_handler(lambda: 1 if time.time() > deadline else 0, 10000)
    return conn


def _storage_upgrade_step(entry: Entry, opts: Options, deadline: float, report: Report) -> bool:
    """Hermes's optimize-storage, with its own VACUUM unless the window's follows; True when done."""
    if not opts.hermes_python:  # the plan asks for the step only with hermes_python (maintain.actions)
        report["reason"] = "optimize-storage needs hermes_python: the interpreter of the Hermes installed on the host"
        return False
    upgrade = run_storage_upgrade(
        opts.hermes_python, entry["home"], entry["path"], deadline, vacuum=VACUUM_FULL not in entry["steps"],
    )  # fmt: skip
    if upgrade["done"]:
        report["done"].append(OPTIMIZE_STORAGE)
    report["reason"] = upgrade["reason"]
    return bool(upgrade["done"])


def _whole_file_backup(conn: sqlite3.Connection, entry: Entry, opts: Options) -> dict[str, Any]:
    """quick_check (nothing else holds the file now), the verified copy, then the backup retention."""
    quick_check(conn, entry["path"])
    backup: dict[str, Any] = take_backup(
        conn, entry["path"], entry["backup_dir"], entry["name"], compress=opts.backup_compress, must_contain={},
        busy_timeout=float(opts.busy_timeout),
    )  # fmt: skip
    backup["removed"] = apply_retention(
        entry["backup_dir"], entry["name"], keep_days=opts.backup_keep_days, keep_count=opts.backup_keep_count,
        now=time.time(), keep_path=backup["path"],
    )  # fmt: skip
    return backup


def _db_bytes(db_path: str) -> int:
    size: int = file_size(db_path) + file_size(db_path + "-wal")
    return size


def _pages(db_path: str) -> dict[str, int]:
    """``auto_vacuum``, ``page_count`` and ``free_pages`` of the file after the window's steps."""
    try:
        conn = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True)
        try:
            names = (("auto_vacuum", "auto_vacuum"), ("page_count", "page_count"), ("free_pages", "freelist_count"))
            return {key: pragma(conn, name) for key, name in names}
        finally:
            conn.close()
    except sqlite3.Error:
        return {}


# ---------------------------------------------------------------------------- the drain marker, as the owner


def instantiation_epoch() -> str:
    """Hermes's ``current_instantiation_epoch``: ``<boot_id>:<pid 1's start time>`` ("" off Linux).
    A marker with another epoch is one a restarted machine left behind, and the gateway ignores it."""
    boot_id = pid1_start = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot_id = fh.read().strip()
    except OSError:
        pass
    try:
        with open("/proc/1/stat") as fh:
            pid1_start = fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        pass
    return "%s:%s" % (boot_id, pid1_start) if (boot_id or pid1_start) else ""


def write_drain_marker(home: str) -> bool:
    """Hermes's begin-drain marker, written atomically (a temporary file renamed into place)."""
    payload = {
        "action": "drain",
        "requested_at": datetime.now(timezone.utc).isoformat(),
        "principal": "hermes-ops maintenance window",
        "epoch": instantiation_epoch(),
        "suppress_notification": True,
    }
    replace_file(os.path.join(home, DRAIN_FILE), json.dumps(payload), 0o600)
    return True


def clear_drain_marker(home: str) -> bool:
    try:
        os.unlink(os.path.join(home, DRAIN_FILE))
        return True
    except FileNotFoundError:
        return False


def _state_record(home: str) -> tuple[dict[str, Any] | None, float]:
    """``HOME/gateway_state.json`` and when it was written, or (None, 0.0) when unreadable."""
    try:
        fd = os.open(os.path.join(home, STATE_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            written = os.fstat(fh.fileno()).st_mtime
            text = fh.read(STATE_MOST + 1)
        if len(text) > STATE_MOST:
            return None, 0.0
        state = json.loads(text)
    except (OSError, ValueError):
        return None, 0.0
    return (state, written) if isinstance(state, dict) else (None, 0.0)


def gateway_state(home: str) -> tuple[Any, Any]:
    """``(gateway_state, active_agents)`` from ``HOME/gateway_state.json``, (None, None) unreadable."""
    state, _written = _state_record(home)
    if state is None:
        return None, None
    return state.get("gateway_state"), state.get("active_agents")


def connected_platforms(home: str) -> list[str] | None:
    """The platforms ``HOME/gateway_state.json`` says are connected (the API server, a chat network),
    or None when the home keeps no readable record."""
    state, _written = _state_record(home)
    if state is None:
        return None
    platforms = state.get("platforms")
    if not isinstance(platforms, dict):
        return []
    return sorted(
        name for name, entry in platforms.items() if isinstance(entry, dict) and entry.get("state") == "connected"
    )


def serving_since(home: str, platforms: list[str], since: float) -> bool:
    """True when ``HOME/gateway_state.json`` says, in writes after ``since``, that the gateway
    serves (``running``, or ``degraded`` when a platform failed) and that each of ``platforms`` is
    connected again.

    The platform is the test: a restarted gateway writes its pid into the record left behind, which
    may still say ``running`` (0.22.2 leaves that when a signal stops it), before it binds its port;
    a platform's ``connected`` comes after the bind, stamped with its own ``updated_at``."""
    state, written = _state_record(home)
    if state is None or written < since - CLOCK_SLACK or state.get("gateway_state") not in SERVING:
        return False
    entries = state.get("platforms")
    entries = entries if isinstance(entries, dict) else {}
    for name in platforms:
        entry = entries.get(name)
        if not isinstance(entry, dict) or entry.get("state") != "connected":
            return False
        stamp = entry.get("updated_at")
        stamped = iso_seconds(stamp) if isinstance(stamp, str) else None
        if stamped is not None and stamped < since - CLOCK_SLACK:
            return False  # the stopped gateway's word (one killed outright leaves its ``connected``)
    return True


def wait_drained(homes: list[str], timeout: float) -> bool:
    """Wait until every home's gateway says ``draining`` with no turn in flight; True when it did.

    A gateway that has not said ``draining`` DRAIN_NOTICE seconds after the marker (its watcher
    reads it every second) has no drain contract (before 0.22, or no ``gateway_state.json``): the
    stop comes at once, and the gateway's own SIGTERM wait lets the turns in flight finish."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        states = [gateway_state(home) for home in homes]
        if all(state == "draining" and not active for state, active in states):
            return True
        if time.monotonic() - began > DRAIN_NOTICE and not any(state == "draining" for state, _n in states):
            return False
        time.sleep(0.2)
    return False


# ---------------------------------------------------------------------------- the gateway, as the caller


class GatewayControl:
    """Stop and start the gateway: a systemd unit (system, else the owner's user unit) or commands."""

    def __init__(self, opts: Options, owner: pwd.struct_passwd | None) -> None:
        self.service = opts.gateway_service
        self.stop_command = opts.gateway_stop_command
        self.start_command = opts.gateway_start_command
        self.owner = owner  # the pwd entry of the state.db files' owner, or None
        self.systemctl: list[str] | None = None  # the argv that reaches the unit, once refusal() found it

    def refusal(self) -> str | None:
        """Why this window may not be run by this process (None: it may)."""
        if self.service:
            found = shutil.which("systemctl", path=SAFE_PATH)
            if not found:
                return "gateway_service %s: no systemctl on this host" % self.service
            self.systemctl = self._scope(found)
            if self.systemctl is None:
                return "gateway_service %s: no system unit of that name, nor a user unit of %s" % (
                    self.service, self.owner.pw_name if self.owner else "this user",
                )  # fmt: skip
            return None
        if os.geteuid() == 0 and self.owner is not None and self.owner.pw_uid != 0:
            commands = (("gateway_stop_command", self.stop_command), ("gateway_start_command", self.start_command))
            for name, argv in commands:
                if not argv:
                    continue  # both or neither: check_window_options
                why = agent_writable(argv[0], self.owner.pw_uid, self.owner.pw_gid)
                if why:
                    return "%s: root does not run %s: %s" % (name, argv[0], why)
        return None

    def _scope(self, systemctl: str) -> list[str] | None:
        """The systemctl argv that reaches the unit: the system's, else the owner's user manager."""
        scopes = [[systemctl]]
        if os.geteuid() == 0 and self.owner is not None and self.owner.pw_uid != 0:
            scopes.append([systemctl, "--user", "--machine=%s@" % self.owner.pw_name])
        elif os.geteuid() != 0:
            scopes.append([systemctl, "--user"])
        for scope in scopes:
            out = _run(scope + ["show", "--property=LoadState", "--value", self.service or ""], 30)
            if out.returncode == 0 and out.stdout.strip() == "loaded":
                return scope
        return None

    def stop(self) -> str | None:
        argv = self._argv("stop", self.stop_command)
        return _command_error(_run(argv, STOP_WAIT), argv)

    def start(self) -> str | None:
        argv = self._argv("start", self.start_command)
        return _command_error(_run(argv, BACK_WAIT), argv)

    def active(self) -> bool:
        if not self.service:
            return True
        out = _run(self._argv("is-active", None), 30)
        return out.stdout.strip() == "active"

    def _argv(self, action: str, command: list[str] | None) -> list[str]:
        """systemctl's ``action`` of the unit, else the configured command (refusal() comes first)."""
        if self.service and self.systemctl is not None:
            return self.systemctl + [action, self.service]
        if self.service or not command:
            raise MaintenanceError("gateway %s: refusal() found no way to reach the gateway" % action)
        return command


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}
    for name in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS", "HOME"):
        if name in os.environ:
            env[name] = os.environ[name]
    if os.geteuid() != 0:  # `systemctl --user` from cron or a timer, where no login set it
        env.setdefault("XDG_RUNTIME_DIR", "/run/user/%d" % os.geteuid())
    try:
        return subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, -1, "", "%s" % exc)


def _command_error(out: subprocess.CompletedProcess[str], argv: list[str]) -> str | None:
    if out.returncode == 0:
        return None
    return "%s exited with %s: %s" % (" ".join(argv), out.returncode, (out.stderr or out.stdout).strip()[-300:])


def agent_writable(path: str, uid: int, gid: int) -> str | None:
    """Why the user ``uid`` could change what ``path`` runs (None: it cannot): the file or a
    directory above it is that user's, or writable by its group or by anyone (a sticky directory
    owned by root is fine: nobody else may replace what is in it)."""
    path = os.path.realpath(path)
    if not os.path.isfile(path):
        return "%s is not a file" % path
    current = path
    while True:
        st = os.stat(current)
        if st.st_uid == uid:
            return "%s belongs to uid %d" % (current, uid)
        sticky_root_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0
        if st.st_mode & stat.S_IWOTH and not sticky_root_dir:
            return "anyone may write %s" % current
        if st.st_mode & stat.S_IWGRP and st.st_gid == gid and not sticky_root_dir:
            return "group %d may write %s" % (gid, current)
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def run_window(opts: Options, entries: list[Entry], as_owner: AsOwner, owner: pwd.struct_passwd | None) -> Report:
    """Open one window for ``entries`` (each a profile that planned one: ``{"home", "path", "name",
    "backup_dir", "steps"}``): drain, stop, the steps (``as_owner(fn, *args)`` runs one as the
    files' owner), then always start again and check the gateway is back. Returns ``{"opened",
    "reason", "downtime_s", "gateway_back", "profiles": {path: window_steps' report}}``."""
    report: Report = {"opened": False, "reason": None, "downtime_s": None, "gateway_back": None, "profiles": {}}
    control = GatewayControl(opts, owner)
    refused = control.refusal()
    if refused:
        report["reason"] = refused
        return report
    homes = sorted({entry["home"] for entry in entries})
    paths = [entry["path"] for entry in entries]
    # A gateway that keeps gateway_state.json is back when it says it serves again, with the
    # platforms connected before; one that keeps none (a supervisor's own process) when it holds state.db.
    stated: dict[str, list[str]] = {}
    for home in homes:
        platforms = connected_platforms(home)
        if platforms is not None:
            stated[home] = platforms
    began = time.time()
    report["opened"] = True
    deadline = began + float(opts.max_downtime) - START_RESERVE
    try:
        report["reason"] = _drain_stop_and_steps(control, entries, opts, as_owner, deadline, report["profiles"])
    except Exception as exc:  # whatever failed in the window, the gateway is started again below
        report["reason"] = "the window failed: %s: %s" % (type(exc).__name__, exc)
    finally:
        left = _clear_markers(homes, as_owner)
        started = time.time()
        failed = control.start()
        back = not failed and _wait(lambda: _serves(control, paths, stated, started), BACK_WAIT)
        report["gateway_back"] = back and not left
        report["downtime_s"] = round(time.time() - began, 1)
        if not report["gateway_back"]:
            report["reason"] = "the gateway is NOT back: %s" % (
                left
                or failed
                or "%.0f s after the start it did not hold state.db%s"
                % (BACK_WAIT, " and say in %s that it serves" % STATE_FILE if stated else "")
            )
    return report


def _drain_stop_and_steps(
    control: GatewayControl, entries: list[Entry], opts: Options, as_owner: AsOwner, deadline: float, reports: Report
) -> str | None:
    """The window's work up to the start: None, or what went wrong (the steps are left out then)."""
    homes = sorted({entry["home"] for entry in entries})
    paths = [entry["path"] for entry in entries]
    reason = None
    for home in homes:
        as_owner(write_drain_marker, home)
    if not wait_drained(homes, min(DRAIN_WAIT, float(opts.max_downtime) / 4)):
        reason = "the gateway did not say it drained in time; stopped all the same"
    failed = control.stop()
    if failed:
        return "not stopped: %s" % failed
    if not _wait(lambda: not any(holders(p) for p in paths), STOP_WAIT):
        return "the gateway stopped but state.db is still held: no step run"
    for entry in entries:
        reports[entry["path"]] = as_owner(window_steps, entry, opts, deadline)
    return reason


def _serves(control: GatewayControl, paths: list[str], stated: dict[str, list[str]], started: float) -> bool:
    """The started gateway serves: its unit active, state.db held, and every home that keeps
    gateway_state.json saying so since the start, its platforms connected again."""
    return (
        control.active()
        and any(holders(p) for p in paths)
        and all(serving_since(home, platforms, started) for home, platforms in stated.items())
    )


def _clear_markers(homes: list[str], as_owner: AsOwner) -> str | None:
    """Remove every home's drain marker before the start (a gateway finding one stays draining);
    what could not be removed, in words, or None."""
    left = []
    for home in homes:
        try:
            as_owner(clear_drain_marker, home)
        except Exception as exc:  # the start comes next whatever happened here
            left.append("%s: %s" % (os.path.join(home, DRAIN_FILE), exc))
    return ("the drain marker stays, so the gateway refuses new turns: remove %s" % "; ".join(left)) if left else None


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
