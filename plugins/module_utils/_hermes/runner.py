# Copyright: Contributors to the hermes_agent.ops collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Command line runner for the scheduled maintenance job.

The role ``hermes_agent.ops.session_maintenance`` copies the engine files
(``_hermes/``) to the managed host as the plain package ``hermes_ops`` (root-owned,
in ``/usr/local/lib/hermes-ops/USER/lib``) and schedules a wrapper that starts it in an
isolated interpreter with only the engine's directory added to the path::

    python3 -I -S -c '<put LIB first, run main>' LIB --config /etc/hermes-ops/USER/maintenance.json

No Ansible is needed on the host: standard library only, Python 3.8+.

Output (the format of the shell script this replaces)::

    === Session Maintenance Start ===
    04:00:01 default: zombies=3 pruned=12 freed=45MB remaining=150 sessions, 8420 messages
    === Session Maintenance Done ===

The log file has the same, with the date on the first line and, before the profiles, which
SQLite did the work (``04:00:01 SQLite 3.53.4 (free of the WAL-reset bug), python /usr/bin/python3``).

Exit codes: 0 all profiles ok or skipped, 1 at least one profile failed (its
error is printed on stderr), 2 bad configuration or refused to run (also written to the log
and, as ``hermes_ops_last_run_config_error 1``, to the metrics), 3 a home held no
``state.db`` (``no_profiles``: nothing was maintained there, which is no success).

Besides the engine options (the keys of ``DEFAULTS``), the JSON config may hold
these runner keys:

``allow_root``  (bool) run as root on a home owned by another user.
``log_file``    (str)  append each run's output to this file...
``log_keep``    (int)  ...keeping only the last N runs in it (default 12).
``syslog``      (bool) log one line per profile to syslog (default true).

The option ``metrics_dir`` is the runner's to act on, as it is the module's: after each real
run (not a dry run) it writes Prometheus metrics to METRICS_DIR/hermes_ops_<user>.prom.

``--record RESULT`` runs nothing: it logs and measures the result of a run made elsewhere
(``maintain.yml``'s run now, as the Hermes user), so every run shows in the job's log and metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import IO, Any, Callable

from .host.profiles import run_as_owner
from .maintain.run import DEFAULTS, run_maintenance
from .options import BY_NAME
from .report.metrics import record_config_error, record_run
from .sqlite.db import MaintenanceError, fsync_path, makedirs_durable
from .sqlite.durable import replace_file

fcntl: ModuleType | None
syslog: ModuleType | None
try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None

try:
    import syslog
except ImportError:  # pragma: no cover - not on Unix
    syslog = None

START = "=== Session Maintenance Start ==="
DONE = "=== Session Maintenance Done ==="
SYSLOG_IDENT = "hermes-maintenance"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_NO_PROFILES = 3

# Keys the runner itself understands, with their defaults and types.
RUNNER_KEYS: dict[str, tuple[object, type]] = {
    "allow_root": (False, bool),
    "log_file": (None, str),
    "log_keep": (12, int),
    "syslog": (True, bool),
}
# Options of the table that the runner acts on itself after the run, not the engine.
AFTER_RUN_OPTIONS = ("metrics_dir",)

# The Python type a JSON value must have for each of the option table's types.
_JSON_TYPES: dict[str, type] = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "path": str,
    "list": list,
    "dict": dict,
}

# What run_maintenance raises for options it refuses (before touching any profile).
OPTION_ERRORS = (ValueError, TypeError, MaintenanceError)


class ConfigError(Exception):
    """The configuration cannot be used; the message names file and key."""


def _type_name(kind: type) -> str:
    return {
        bool: "true/false",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(kind, kind.__name__)


def _check_type(source: str, key: str, value: Any, kind: type) -> Any:
    """Return value converted to kind, or raise ConfigError naming source and key."""
    if value is None:
        return None
    ok = True
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int and key in RUNNER_KEYS:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind in (int, float):  # the engine checks ranges; accept any number here
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is str:
        ok = isinstance(value, str)
    elif kind is list:
        if isinstance(value, str):
            value = [value]
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif kind is dict:  # the engine checks each entry
        ok = isinstance(value, dict)
    if not ok:
        raise ConfigError(f"{source}: key {key!r} must be {_type_name(kind)}, got {json.dumps(value)}")
    return value


def _expected_type(key: str) -> type | None:
    option = BY_NAME.get(key)
    return _JSON_TYPES.get(option.type) if option else None


def load_config(path: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read the JSON config written by the role.

    Returns ``(engine_options, runner_settings)``; raises ConfigError.
    """
    runner: dict[str, Any] = {k: v[0] for k, v in RUNNER_KEYS.items()}
    options: dict[str, Any] = dict(DEFAULTS)
    data: dict[str, Any]
    if path is None:
        source = "defaults"
        data = {}
    else:
        source = f"config {path}"
        try:
            with open(path) as handle:
                data = json.load(handle)
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read it: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError(f"{source}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object of option names, got {type(data).__name__}")
    for key in sorted(data):
        value = data[key]
        if key in RUNNER_KEYS:
            runner[key] = _check_type(source, key, value, RUNNER_KEYS[key][1])
            if runner[key] is None:
                runner[key] = RUNNER_KEYS[key][0]
        elif key in DEFAULTS:
            kind = _expected_type(key)
            options[key] = _check_type(source, key, value, kind) if kind else value
        else:
            known = ", ".join(sorted(set(DEFAULTS) | set(RUNNER_KEYS)))
            raise ConfigError(f"{source}: unknown key {key!r} (known keys: {known})")
    homes = options.get("hermes_home")
    if isinstance(homes, str):
        homes = [homes]
    if not homes:
        homes = ["~/.hermes"]
    options["hermes_home"] = [os.path.expanduser(h) for h in homes]
    if options.get("backup_dir"):
        options["backup_dir"] = os.path.expanduser(options["backup_dir"])
    for key in AFTER_RUN_OPTIONS:
        runner[key] = options.pop(key)
    for key in ("log_file", "metrics_dir"):
        if runner.get(key):
            runner[key] = os.path.expanduser(runner[key])
    if runner["log_keep"] < 1:
        raise ConfigError("{}: key 'log_keep' must be at least 1, got {}".format(source, runner["log_keep"]))
    return options, runner


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_root(homes: Sequence[str], allow_root: bool) -> None:
    """Refuse (ConfigError) to work as root on a home that another user owns.

    A scheduled job belongs in that user's own crontab or timer. With the
    override the engine still does each profile's work as the owner of its
    state.db, so no file there ever belongs to root.
    """
    if allow_root or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return
    for home in homes:
        try:
            uid = os.stat(home).st_uid
        except OSError:
            continue  # the engine reports a missing home per profile
        if uid != 0:
            user = _owner_name(uid)
            raise ConfigError(
                f"refusing to run as root on {home}, which belongs to {user}: run it as that user "
                f"(sudo -u {user} ...), or pass --allow-root (config key allow_root: true); "
                "the work is then done as the owner of each state.db"
            )


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


def _profile_errors(result: Mapping[str, Any]) -> list[str]:
    """Lines "name (path): error" for every failed profile."""
    lines = []
    failed = set(result.get("failed") or [])
    seen = set()
    for prof in result.get("profiles") or []:
        name = prof.get("name")
        if prof.get("status") == "failed" or name in failed:
            seen.add(name)
            where = prof.get("path") or prof.get("home") or "?"
            lines.append("{} ({}): FAILED: {}".format(name, where, prof.get("error") or "unknown error"))
    for name in sorted(failed - seen):
        lines.append(f"{name}: FAILED")
    return lines


def _log_syslog(lines: Sequence[str], errors: Sequence[str], dry_run: bool) -> None:
    if syslog is None:
        return
    try:
        syslog.openlog(SYSLOG_IDENT, syslog.LOG_PID, syslog.LOG_USER)
        prefix = "dry run: " if dry_run else ""
        for line in lines:
            syslog.syslog(syslog.LOG_INFO, prefix + line)
        for line in errors:
            syslog.syslog(syslog.LOG_ERR, prefix + line)
        syslog.closelog()
    except Exception:  # syslog is best effort, never fail a run for it
        pass


def _locked_log(path: str) -> IO[str]:
    """The log file open and flock-ed, still the one at ``path`` (a run that held the lock
    before may have renamed a new file over it)."""
    while True:
        handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+")
        if fcntl is None:
            return handle
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            if os.path.samestat(os.fstat(handle.fileno()), os.stat(path)):
                return handle
        except FileNotFoundError:
            pass
        handle.close()


def append_log(path: str, text: str, keep: int) -> None:
    """Append one run's text to path, keeping only the last ``keep`` runs.

    The new text goes to a temporary file, fsynced and renamed over the log, then the directory
    fsynced: a power loss leaves the old log or the new one, never a torn one, and the run's
    text is on disk when the run ends."""
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        makedirs_durable(directory, 0o700)
    with _locked_log(path) as handle:
        old = handle.read()
        runs: list[list[str]] = []
        for line in old.splitlines(True):
            if line.startswith("=== Session Maintenance Start") or not runs:
                runs.append([])
            runs[-1].append(line)
        runs.append([text])
        replace_file(path, "".join("".join(run) for run in runs[-keep:]), 0o600)
        fsync_path(directory or ".")


def _owner_of_nearest_dir(path: str) -> int:
    """The uid owning the directory that holds path (or its nearest existing parent)."""
    directory = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    return os.stat(directory).st_uid


def write_log(path: str, text: str, keep: int) -> None:
    """append_log, done as the owner of the log's directory when root runs this.

    The log lives where the Hermes user writes; as root, a symlink the user left there
    must never make root rewrite a file of its choosing.
    """
    owner = _owner_of_nearest_dir(path) if hasattr(os, "geteuid") and os.geteuid() == 0 else 0
    if owner == 0:
        append_log(path, text, keep)
    else:
        run_as_owner(owner, append_log, path, text, keep)


def sqlite_line(sqlite: Mapping[str, Any]) -> str:
    """Which SQLite did the work, and through which interpreter: the log's first line of a run."""
    bug = "has the WAL-reset bug" if sqlite.get("wal_reset_affected") else "free of the WAL-reset bug"
    return "SQLite {} ({}), python {}".format(sqlite.get("version"), bug, sqlite.get("python"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes-session-maintenance",
        description="Maintain Hermes Agent state.db files: close zombie sessions, prune old "
        "sessions, back up, reclaim space (hermes_agent.ops engine).",
    )
    parser.add_argument("--config", metavar="FILE", help="JSON file with engine options (written by the role)")
    parser.add_argument("--dry-run", action="store_true", help="change nothing; print what a real run would do")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON instead of summary lines")
    parser.add_argument(
        "--allow-root", action="store_true", help="allow running as root on a home owned by another user"
    )
    parser.add_argument(
        "--record",
        metavar="RESULT",
        help="run nothing: log RESULT (a JSON file of a run made elsewhere, such as maintain.yml's; - for stdin) "
        "and write its metrics, as for a run of this job",
    )
    return parser


def _recorded(path: str) -> dict[str, Any]:
    """The result of a run made elsewhere (the module's, maintain.yml's), to log and measure here."""
    try:
        handle = sys.stdin if path == "-" else open(path)
        with handle:
            result = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ConfigError("--record %s: not a readable run result: %s" % (path, exc)) from None
    if not isinstance(result, dict) or not isinstance(result.get("profiles"), list):
        raise ConfigError("--record %s: not a run result (no profiles)" % path)
    return result


def _raw_settings(path: str) -> dict[str, Any]:
    """log_file, log_keep, syslog and metrics_dir of a config load_config refused, where readable."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError, TypeError):
        return {}
    if not isinstance(data, dict):
        return {}
    settings: dict[str, Any] = {k: data[k] for k in ("log_file", "metrics_dir") if isinstance(data.get(k), str)}
    settings["log_keep"] = data["log_keep"] if isinstance(data.get("log_keep"), int) and data["log_keep"] > 0 else 12
    settings["syslog"] = data.get("syslog") is not False
    return {k: os.path.expanduser(v) if k in ("log_file", "metrics_dir") else v for k, v in settings.items()}


def _write_run_log(runner: Mapping[str, Any], text: str) -> None:
    try:
        write_log(runner["log_file"], text, runner.get("log_keep") or 12)
    except (OSError, MaintenanceError) as exc:
        sys.stderr.write("hermes-session-maintenance: cannot write log file {}: {}\n".format(runner["log_file"], exc))


def _config_error(runner: Mapping[str, Any], message: str, dry_run: bool) -> int:
    """A refused configuration goes to stderr, syslog, the log and the metrics: a cron job's
    stderr is mail nobody may read, and the run maintained nothing."""
    sys.stderr.write(f"hermes-session-maintenance: {message}\n")
    if runner.get("syslog"):
        _log_syslog([], [message], dry_run)
    if runner.get("log_file"):
        head = "{} {} {}\n".format(START, time.strftime("%Y-%m-%d"), _stamp())
        _write_run_log(runner, head + f"{_stamp()} ERROR {message}\n{DONE}\n")
    if runner.get("metrics_dir") and not dry_run:
        _write_metrics(runner, lambda: record_config_error(runner["metrics_dir"]), dry_run)
    return EXIT_CONFIG


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runner = None
    try:
        options, runner = load_config(args.config)
        check_root(options["hermes_home"], args.allow_root or runner["allow_root"])
    except ConfigError as exc:
        if runner is None:  # the config itself was refused: report where it says, if it can be read
            runner = _raw_settings(args.config) if args.config else {}
        return _config_error(runner, str(exc), args.dry_run)

    started = _stamp()
    try:
        result: Mapping[str, Any] = (
            _recorded(args.record) if args.record else run_maintenance(options, check_mode=args.dry_run)
        )
    except ConfigError as exc:
        return _config_error(runner, str(exc), args.dry_run)
    except OPTION_ERRORS as exc:
        where = (f"config {args.config}") if args.config else "options"
        return _config_error(runner, f"{where}: {exc}", args.dry_run)
    except Exception as exc:  # an engine bug must still leave a readable trace
        sys.stderr.write(f"hermes-session-maintenance: maintenance failed: {type(exc).__name__}: {exc}\n")
        if runner.get("syslog"):
            _log_syslog([], [f"maintenance failed: {type(exc).__name__}: {exc}"], args.dry_run)
        return EXIT_FAILED

    summary = [str(line) for line in (result.get("summary") or [])]
    errors = _profile_errors(result)

    _print_run(result, summary, errors, args.json)
    if runner.get("syslog"):
        _log_syslog(summary, errors, args.dry_run)
    if runner.get("log_file"):
        _write_run_log(runner, _run_log_text(result, summary, errors, started, args.dry_run))

    if runner.get("metrics_dir") and not args.dry_run:
        _write_metrics(runner, lambda: record_run(runner["metrics_dir"], options, result), args.dry_run)

    if result.get("failed") or errors:
        return EXIT_FAILED
    return EXIT_NO_PROFILES if result.get("status") == "no_profiles" else EXIT_OK


def _print_run(result: Mapping[str, Any], summary: Sequence[str], errors: Sequence[str], as_json: bool) -> None:
    """The run on stdout (summary lines between START and DONE, or the result as JSON), its errors on stderr."""
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    else:
        out = [START]
        out.extend(f"{_stamp()} {line}" for line in summary)
        out.append(DONE)
        sys.stdout.write("\n".join(out) + "\n")
    for line in errors:
        sys.stderr.write(f"{_stamp()} {line}\n")
    sys.stdout.flush()


def _run_log_text(
    result: Mapping[str, Any], summary: Sequence[str], errors: Sequence[str], started: str, dry_run: bool
) -> str:
    """One run's entry in the log file: the date, which SQLite did the work, the summary, the errors."""
    head = START + (" (dry run)" if dry_run else "") + " {} {}\n".format(time.strftime("%Y-%m-%d"), started)
    body = f"{_stamp()} {sqlite_line(result.get('sqlite') or {})}\n"
    body += "".join(f"{_stamp()} {line}\n" for line in summary)
    body += "".join(f"{_stamp()} ERROR {line}\n" for line in errors)
    return head + body + DONE + "\n"


def _write_metrics(runner: Mapping[str, Any], write: Callable[[], object], dry_run: bool) -> None:
    """Metrics are a report of the run: failing to write them is said, never fatal."""
    try:
        write()
    except Exception as exc:  # noqa: BLE001 - the run itself is done and reported
        detail = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
        message = "cannot write metrics to {}: {}".format(runner["metrics_dir"], detail)
        sys.stderr.write(f"hermes-session-maintenance: {message}\n")
        if runner.get("syslog"):
            _log_syslog([], [message], dry_run)


if __name__ == "__main__":
    raise SystemExit(main())
