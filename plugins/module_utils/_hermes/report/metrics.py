# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus text-format metrics of a maintenance run, for node_exporter's textfile collector.

``record_run`` renders one file per runner user (``hermes_ops_<user>.prom``) from the run
result and a read-only ``gather_info`` pass, and renames it into the collector's directory.
Only sizes, counts, times, the schema version and a status from a fixed set of reasons are
written: never an error text, a session id, a title or anything else taken from the chats.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from ..sqlite.db import fsync_path
from ..sqlite.durable import replace_file
from .info import gather_info

PREFIX = "hermes_ops_"
FILE_MODE = 0o644  # node_exporter runs as its own user and must read it; no chat content in it

# Every metric here is a gauge: a figure of the last run or of the files now.
# (metric, help); per profile, labels home and profile.
PROFILE_METRICS = (
    ("db_size_bytes", "Size of state.db."),
    ("wal_size_bytes", "Size of state.db-wal (0 when there is none)."),
    ("sessions", "Sessions in state.db."),
    ("messages", "Messages in state.db."),
    ("open_sessions", "Sessions without ended_at (live or zombie)."),
    ("prunable_sessions", "Ended sessions old enough to prune, after the run."),
    ("prunable_messages", "Messages of the prunable sessions, after the run."),
    ("schema_version", "Hermes schema_version of state.db (0 when unreadable)."),
    ("backups", "Backups this collection keeps of the profile."),
    ("backup_newest_timestamp_seconds", "Unix time of the newest backup (absent: none)."),
    (
        "archives",
        "Archives of deleted rows this collection keeps of the profile (taken instead of a whole-file backup "
        "beside a gateway holding a rollback-journal state.db).",
    ),
    ("archive_newest_timestamp_seconds", "Unix time of the newest archive (absent: none)."),
    ("last_run_zombies_closed", "Zombie sessions the last run closed."),
    ("last_run_sessions_pruned", "Sessions the last run pruned."),
    ("last_run_messages_pruned", "Messages the last run pruned."),
    ("last_run_freed_bytes", "Bytes the last run gave back (state.db plus WAL)."),
    ("last_run_duration_seconds", "Seconds the last run spent on the profile."),
    ("gateway_downtime_seconds", "Seconds the last run's service window kept the gateway from serving."),
)
STATUS_METRIC = (
    "profile_status",
    "1 for the last run's status of the profile (ok, skipped, failed, no_profiles) and why.",
)
# (metric, help); per profile and kind of file in its home (plan.inventory.KINDS).
HOME_METRICS = (
    ("home_bytes", "Bytes of the profile's home by kind of file (other: no pattern names it)."),
    ("home_files", "Items of the profile's home by kind (a retired-WAL or snapshot directory is one)."),
)
# (metric, help, label); per profile and object / message role (gather_info's storage).
STORAGE_METRICS = (
    (
        "db_object_bytes",
        "Bytes of state.db by table, index or FTS index (its shadow tables included), from SQLite's dbstat "
        "(absent where this SQLite lacks dbstat).",
        "object",
    ),
    (
        "payload_bytes",
        "Bytes of message payload (content, tool_calls, reasoning, ...) by message role.",
        "role",
    ),
)
# Roles Hermes writes; any other value in the file counts as "other" (a bounded label set).
ROLES = ("user", "assistant", "tool", "system")
# (metric, help); per runner user.
RUN_METRICS = (
    ("last_run_timestamp_seconds", "Unix time the last maintenance run ended."),
    ("last_success_timestamp_seconds", "Unix time the last run without a failed profile ended."),
    ("last_run_failed_profiles", "Profiles that failed in the last run."),
    ("last_run_config_error", "1 when the last run refused its configuration and maintained nothing."),
)
# A profile status that is not a success: the last-success time stays where it was.
NOT_SUCCESS = ("failed", "no_profiles")

# The reason label: a fixed set, picked from the error text (never the text itself).
# First match wins; the order puts the specific before the general.
REASONS = (
    ("locked", ("holds", "stayed locked", "database is locked", "busy")),
    ("no_database", ("no state.db under",)),
    ("missing_home", ("check hermes_home", "give its home")),
    ("damaged", ("quick_check", "not a SQLite database", "malformed", "is empty", "not a regular file")),
    ("unknown_schema", ("newer than any this collection knows", "not a Hermes state.db")),
    ("wrong_owner", ("belongs to uid",)),
    ("fts_tokenizer", ("pruning refused",)),
    ("disk_full", ("No space left", "disk is full", "disk full")),
    ("backup", ("backup",)),
    ("permission", ("Permission denied", "readonly", "read-only", "Operation not permitted")),
)
REASON_NONE = "none"
REASON_OTHER = "error"
ALL_REASONS = tuple(reason for reason, _needles in REASONS) + (REASON_NONE, REASON_OTHER)

# A profile's key in gather_info's entries: (home, profile name).
ProfileKey = tuple[Optional[str], Optional[str]]
# A sample's labels, (name, value) each, and a sample: its labels and its value.
Labels = tuple[tuple[str, str], ...]
Sample = tuple[Labels, float]

_LAST_SUCCESS = re.compile(
    r"^" + PREFIX + r"last_success_timestamp_seconds(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.MULTILINE
)


def reason_of(profile: Mapping[str, Any]) -> str:
    """The bounded reason label of a profile result."""
    if profile.get("status") == "ok" and not profile.get("error"):
        return REASON_NONE
    text = profile.get("error") or ""
    for reason, needles in REASONS:
        if any(needle in text for needle in needles):
            return reason
    return REASON_OTHER


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_labels(labels: Iterable[tuple[str, object]]) -> str:
    return "{" + ",".join('%s="%s"' % (k, _escape(v)) for k, v in labels) + "}"


def prometheus_number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def profile_figures(profile: Mapping[str, Any], info: Mapping[str, Any] | None, now: float) -> dict[str, float]:
    """Metric name -> value for one profile, from its run result and its info."""
    info = info or {}
    path = profile.get("path") or info.get("path") or ""
    figures: dict[str, float] = {
        "db_size_bytes": info.get("db_bytes", _file_size(path)),
        "wal_size_bytes": info.get("wal_bytes", _file_size(path + "-wal")),
        "schema_version": info.get("schema_version") or profile.get("schema_version") or 0,
        "backups": info.get("backups", 0),
        "archives": info.get("archives", 0),
        "last_run_zombies_closed": profile.get("zombies_closed") or 0,
        "last_run_sessions_pruned": profile.get("sessions_pruned") or 0,
        "last_run_messages_pruned": profile.get("messages_pruned") or 0,
        "last_run_freed_bytes": ((profile.get("reclaim") or {}).get("bytes_freed")) or 0,
        "last_run_duration_seconds": float(profile.get("duration") or 0.0),
        "gateway_downtime_seconds": float((profile.get("window") or {}).get("downtime_s") or 0.0),
    }
    for key in ("sessions", "messages", "open_sessions", "prunable_sessions", "prunable_messages"):
        if info.get(key) is not None:
            figures[key] = info[key]
    for key, metric in (("newest_backup", "backup_newest_timestamp_seconds"),
                        ("newest_archive", "archive_newest_timestamp_seconds")):  # fmt: skip
        newest = info.get(key)
        if newest and newest.get("age_days") is not None:
            figures[metric] = round(now - float(newest["age_days"]) * 86400.0)
    return figures


def render(
    result: Mapping[str, Any],
    infos: Mapping[ProfileKey, Mapping[str, Any]],
    user: str,
    finished: float,
    last_success: float | None,
    config_error: bool = False,
) -> str:
    """The whole .prom text of one run.

    ``infos`` maps (home, profile) to gather_info's entry; ``last_success`` is the time of
    the last run without a failed profile (this one's end if it had none), or None.
    """
    profiles = result.get("profiles") or []
    rows: list[tuple[Labels, Mapping[str, Any], dict[str, float]]] = []
    for profile in profiles:
        key = (profile.get("home"), profile.get("name"))
        labels: Labels = (("home", profile.get("home") or ""), ("profile", profile.get("name") or ""))
        rows.append((labels, profile, profile_figures(profile, infos.get(key), finished)))
    lines: list[str] = []
    for name, help_text in PROFILE_METRICS:
        samples: list[Sample] = [(labels, figures[name]) for labels, _p, figures in rows if name in figures]
        lines.extend(gauge_family(PREFIX + name, help_text, samples))
    for name, help_text in HOME_METRICS:
        field = "bytes" if name == "home_bytes" else "count"
        samples = [
            (labels + (("kind", k),), entry[field])
            for labels, p, _f in rows
            for k, entry in _home_kinds(infos.get((p.get("home"), p.get("name")))).items()
        ]
        lines.extend(gauge_family(PREFIX + name, help_text, samples))
    for name, help_text, label in STORAGE_METRICS:
        samples = [
            (labels + ((label, key),), value)
            for labels, p, _f in rows
            for key, value in _storage_figures(infos.get((p.get("home"), p.get("name"))), name).items()
        ]
        lines.extend(gauge_family(PREFIX + name, help_text, samples))
    name, help_text = STATUS_METRIC
    samples = [
        (labels + (("status", p.get("status") or "failed"), ("reason", reason_of(p))), 1) for labels, p, _f in rows
    ]
    lines.extend(gauge_family(PREFIX + name, help_text, samples))
    failed = sum(1 for p in profiles if p.get("status") == "failed")
    run_values: dict[str, float | None] = {
        "last_run_timestamp_seconds": round(finished, 3),
        "last_success_timestamp_seconds": None if last_success is None else round(last_success, 3),
        "last_run_failed_profiles": failed,
        "last_run_config_error": 1 if config_error else 0,
    }
    for name, help_text in RUN_METRICS:
        value = run_values[name]
        lines.extend(gauge_family(PREFIX + name, help_text, [] if value is None else [((("user", user),), value)]))
    return "\n".join(lines) + "\n"


def _home_kinds(info: Mapping[str, Any] | None) -> dict[str, dict[str, int]]:
    """kind -> {count, bytes, ...} of a profile's home (gather_info's home_files), {} if unknown."""
    return ((info or {}).get("home_files") or {}).get("kinds") or {}


def _storage_figures(info: Mapping[str, Any] | None, name: str) -> dict[str, int]:
    """object -> bytes or role -> payload bytes of a profile (gather_info's storage), {} if unknown."""
    st = (info or {}).get("storage") or {}
    if name == "db_object_bytes":
        return {obj: entry["bytes"] for obj, entry in sorted((st.get("by_object") or {}).items())}
    out: dict[str, int] = {}
    for role, entry in sorted((st.get("by_role") or {}).items()):
        key = role if role in ROLES else "other"
        out[key] = out.get(key, 0) + entry["payload_bytes"]
    return out


def gauge_family(full_name: str, help_text: str, samples: Sequence[Sample]) -> list[str]:
    """A gauge in the text format: its HELP and TYPE lines and a line per sample; nothing without samples."""
    if not samples:
        return []
    out = ["# HELP %s %s" % (full_name, help_text), "# TYPE %s gauge" % full_name]
    out.extend(
        "%s%s %s" % (full_name, prometheus_labels(labels), prometheus_number(value)) for labels, value in samples
    )
    return out


def previous_last_success(path: str) -> float | None:
    """The last-success time in an earlier file, so a run that was no success keeps it; None if none."""
    try:
        with open(path) as handle:
            match = _LAST_SUCCESS.search(handle.read())
    except (OSError, UnicodeDecodeError):
        return None
    return float(match.group(1)) if match else None


def write_atomically(directory: str, filename: str, text: str) -> str:
    """Write text to directory/filename so that node_exporter never takes a half-written file
    for a whole one; returns the path written.

    Where the directory is writable: a temporary file (its name does not end in .prom, so the
    collector skips it) renamed over the file. Where it is not (the role's layout with
    privilege: the directory is root's and only this one file is the user's), the file is
    rewritten in place: emptied, then written in one call. A scrape meanwhile reads the empty
    file (no samples), the whole new text, or a prefix of it; a prefix ending inside a line is
    refused by the collector's parser ("unexpected end of input stream", counted in
    node_textfile_scrape_error), one ending at a line end holds only lines of the new text.
    Never a mix of old and new lines.
    """
    final = os.path.join(directory, filename)
    try:
        replace_file(final, text, FILE_MODE)
    except PermissionError:
        if not os.path.lexists(final):
            raise
        return _rewrite_in_place(final, text)
    fsync_path(directory)  # the rename: else a power loss may bring the previous figures back
    return final


def _rewrite_in_place(path: str, text: str) -> str:
    """Replace the content of the existing regular file path (never through a symlink)."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "%s is not a regular file" % path)
        os.ftruncate(fd, 0)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return "uid%d" % os.geteuid()


def metrics_filename(user: str) -> str:
    return "hermes_ops_%s.prom" % re.sub(r"[^A-Za-z0-9_.-]", "_", user)


def _check_directory(directory: str) -> None:
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            errno.ENOENT,
            "metrics directory %s does not exist: create it (the role does) or unset metrics_dir" % directory,
        )


def record_run(
    directory: str,
    options: Mapping[str, Any],
    result: Mapping[str, Any],
    finished: float | None = None,
    user: str | None = None,
) -> str:
    """Write the run's metrics to directory; returns the path written.

    Raises OSError when the directory cannot be written (the caller reports it).
    """
    _check_directory(directory)
    finished = time.time() if finished is None else finished
    user = user or _user_name()
    filename = metrics_filename(user)
    success = not any(p.get("status") in NOT_SUCCESS for p in result.get("profiles") or [])
    last_success = finished if success else previous_last_success(os.path.join(directory, filename))
    info = gather_info(options)
    infos = {(p.get("home"), p.get("name")): p for p in info["profiles"] if p.get("status") == "ok"}
    return write_atomically(directory, filename, render(result, infos, user, finished, last_success))


def record_config_error(directory: str, finished: float | None = None, user: str | None = None) -> str:
    """Metrics of a run that refused its configuration: no profile figures, the last success kept."""
    _check_directory(directory)
    finished = time.time() if finished is None else finished
    filename = metrics_filename(user or _user_name())
    last_success = previous_last_success(os.path.join(directory, filename))
    text = render({"profiles": []}, {}, user or _user_name(), finished, last_success, config_error=True)
    return write_atomically(directory, filename, text)
