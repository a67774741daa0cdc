# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Off-site copies: each profile's newest verified backup pushed to a restic repository.

Runs as root, never as the Hermes user: the agent's account must neither read the
repository's password nor write to or delete from the repository. So root here reads only
what the engine itself writes into a backup directory, and only through a descriptor that
proves it:

* a name the engine gives a finished backup (``hermes-ops_<profile>_<stamp>.db[.gz]``; a
  backup is verified and fsynced before it gets that name, see backup.whole_file);
* opened with O_NOFOLLOW|O_NONBLOCK and checked on the open descriptor (fstat) to be a
  regular file with one link, owned by the profile's user: a symlink, a FIFO, a hard link
  to a file of root's or another account's file planted in ``backups/`` is refused;
* restic reads that descriptor as its standard input (``backup --stdin``), so it never opens
  a path the agent can change between the check and the read.

restic (root's, found on a fixed PATH) runs with a clean environment, in ``/``; no code of
the Hermes user's runs. restic's own repository lock keeps two pushes (or a push and a
prune elsewhere) from writing over each other; a push that fails leaves no snapshot (restic
writes the snapshot file last) and the next push retries.

Nothing here raises for a repository that cannot be reached, refuses the password, is
locked or full: the result says so (``status``, ``reason``, ``error``) and the metrics
(``hermes_ops_offsite_*``) count the failure, so the local maintenance never depends on it.
"""

from __future__ import annotations

import argparse
import calendar
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, TypedDict

from .backup.whole_file import BACKUP_NAME, stamp_time
from .report.metrics import Labels, gauge_family, metrics_filename, write_atomically
from .sqlite.db import fsync_path

TAG = "hermes-ops"
DEFAULT_KEEP = {"daily": 7, "weekly": 4, "monthly": 6}
DEFAULT_CHECK_SUBSET = "5%"
DEFAULT_CHECK_DAYS = 7
# root's restic, never one found on a PATH the Hermes user could put first.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RESTIC_TIMEOUT = 6 * 3600  # a push of a few GB over a slow link; a hung remote must end some day
METRICS_PREFIX = "hermes_ops_offsite_"

# The reason label: a fixed set picked from restic's messages (never the text itself).
# First match wins.
REASONS = (
    ("wrong_password", ("wrong password", "no key found")),
    ("locked", ("already locked", "unable to create lock", "lock was created", "stale locks")),
    ("no_space", ("no space left", "disk quota exceeded", "quotaexceeded", "insufficient storage")),
    (
        "unreachable",
        (
            "unable to open config file",
            "is there a repository",
            "connection refused",
            "no such host",
            "connection reset",
            "timed out",
            "timeout",
            "network is unreachable",
            "ssh command exited",
            "unable to start the sftp session",
            "does not exist",
            "no such file or directory",
        ),
    ),
    ("refused_file", ("refused:",)),
    ("password_file", ("password file",)),
)
REASON_NONE = "none"
REASON_OTHER = "error"
ALL_REASONS = tuple(r for r, _n in REASONS) + (REASON_NONE, REASON_OTHER)


class OffsiteError(Exception):
    """A push step failed: ``reason`` is one of ALL_REASONS."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        Exception.__init__(self, message)
        self.reason = reason or reason_of(message)


def reason_of(text: str | None) -> str:
    low = (text or "").lower()
    for reason, needles in REASONS:
        if any(needle in low for needle in needles):
            return reason
    return REASON_OTHER


def check_password_file(path: str) -> None:
    """Refuse a password file another account could read or change (root's, 0600 or stricter,
    no link): else the agent could learn the key, or swap in its own."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise OffsiteError("password file %s: %s" % (path, exc.strerror), "password_file") from exc
    if not stat.S_ISREG(st.st_mode):
        raise OffsiteError("password file %s is not a regular file (a link?)" % path, "password_file")
    if st.st_uid != 0 or st.st_mode & 0o077:
        raise OffsiteError(
            "password file %s must be root's and readable by root alone (mode 0600), is uid %d mode %04o"
            % (path, st.st_uid, stat.S_IMODE(st.st_mode)),
            "password_file",
        )


def find_restic(path: str | None = None) -> str:
    found = path or shutil.which("restic", path=SAFE_PATH)
    if not found:
        raise OffsiteError("restic is not installed (Debian/Ubuntu: apt-get install restic; RHEL: EPEL's restic)")
    return found


class Restic:
    """restic with a clean environment and the repository's settings."""

    def __init__(
        self,
        repository: str,
        password_file: str,
        restic: str | None = None,
        cache_dir: str | None = None,
        timeout: int = RESTIC_TIMEOUT,
    ) -> None:
        self.binary = find_restic(restic)
        self.repository = repository
        self.timeout = timeout
        self.env = {
            "PATH": SAFE_PATH,
            "HOME": os.environ.get("HOME") or "/root",
            "LC_ALL": "C",
            "RESTIC_REPOSITORY": repository,
            "RESTIC_PASSWORD_FILE": password_file,
        }
        if cache_dir:
            self.env["RESTIC_CACHE_DIR"] = cache_dir

    def run(self, args: Sequence[str], stdin: int = subprocess.DEVNULL, ok_codes: Sequence[int] = (0,)) -> str:
        try:
            proc = subprocess.run(
                [self.binary] + list(args),
                stdin=stdin,
                capture_output=True,
                env=self.env,
                cwd="/",
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise OffsiteError("restic %s timed out after %ds" % (args[0], self.timeout), "unreachable") from None
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        if proc.returncode not in ok_codes:
            # restic's last lines say why (Fatal: ...); earlier ones are progress noise.
            lines = [line for line in err.strip().splitlines() if line.strip()]
            why = " ".join(lines[-3:]) if lines else "exit status %d" % proc.returncode
            raise OffsiteError("restic %s on %s: %s" % (args[0], self.repository, why))
        return out

    def run_json(self, args: Sequence[str]) -> Any:
        """restic's JSON answer (a list or an object, as the command gives it; None for no output)."""
        return json.loads(self.run(list(args) + ["--json"]) or "null")


def _missing_repository(message: str) -> bool:
    low = message.lower()
    return ("unable to open config file" in low or "is there a repository" in low) and (
        "no such file" in low or "does not exist" in low or "not exist" in low or "404" in low
    )


def init_repository(restic: Restic) -> bool:
    """Create the repository unless it exists; returns True when it was created. A repository
    that cannot be reached (rather than one that is not there) is an error, never created."""
    try:
        restic.run(["cat", "config"])
        return False
    except OffsiteError as exc:
        if not _missing_repository(str(exc)):
            raise
    restic.run(["init"])
    return True


def newest_backups(backup_dirs: Sequence[str], owner_uid: int) -> dict[str, tuple[str, int]]:
    """{profile: (path, unix time)} of the newest finished backup per profile, by name."""
    newest: dict[str, tuple[str, int, tuple[int, int]]] = {}
    for backup_dir in backup_dirs:
        try:
            names = os.listdir(backup_dir)
        except OSError:
            continue
        for name in names:
            match = BACKUP_NAME.match(name)
            if not match:
                continue
            key = (stamp_time(match.group("stamp")), int(match.group("seq") or 0))
            profile = match.group("profile")
            if profile not in newest or key > newest[profile][2]:
                newest[profile] = (os.path.join(backup_dir, name), key[0], key)
    return {p: (path, when) for p, (path, when, _key) in newest.items()}


def open_backup(path: str, owner_uid: int) -> int:
    """A descriptor on path, refused unless it is a regular file with one link owned by owner_uid."""
    try:
        # O_NONBLOCK: a FIFO planted under a backup's name must not hang root's open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OffsiteError("refused: %s is a symbolic link" % path, "refused_file") from exc
        raise OffsiteError("refused: %s: %s" % (path, exc.strerror), "refused_file") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OffsiteError("refused: %s is not a regular file" % path, "refused_file")
        if st.st_uid != owner_uid:
            raise OffsiteError(
                "refused: %s belongs to uid %d, not to the profile's user (uid %d)" % (path, st.st_uid, owner_uid),
                "refused_file",
            )
        if st.st_nlink != 1:
            raise OffsiteError("refused: %s has %d hard links" % (path, st.st_nlink), "refused_file")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def snapshot_path(host: str, user: str, profile: str, name: str) -> str:
    return "%s/%s/%s/%s" % (host, user, profile, name)


def _snapshots(restic: Restic, host: str) -> list[dict[str, Any]]:
    return restic.run_json(["snapshots", "--host", host, "--tag", TAG]) or []


class PushedBackup(TypedDict):
    profile: str
    name: str
    snapshot: str | None
    bytes: int | None
    bytes_added: int | None
    seconds: float


class PassedBackup(TypedDict, total=False):
    """A backup not pushed: skipped (``why``) or refused (``error``)."""

    profile: str
    name: str
    why: str
    error: str


class CheckResult(TypedDict, total=False):
    ok: bool
    seconds: float
    error: str


class PushResult(TypedDict, total=False):
    """What ``push`` did; every key but ``seconds`` from the start."""

    repository: str
    host: str
    user: str
    status: str
    reason: str
    error: str | None
    pushed: list[PushedBackup]
    skipped: list[PassedBackup]
    refused: list[PassedBackup]
    snapshots: int | None
    newest_snapshot: int | None
    repository_bytes: int | None
    check: CheckResult | None
    seconds: float


def push(
    repository: str,
    password_file: str,
    backup_dirs: Sequence[str],
    owner_uid: int,
    user: str,
    host: str,
    keep: dict[str, int] | None = None,
    check_subset: str = DEFAULT_CHECK_SUBSET,
    check: bool = False,
    restic: str | None = None,
    cache_dir: str | None = None,
) -> PushResult:
    """Push each profile's newest backup not in the repository yet, forget by the retention,
    optionally check a subset. Never raises for the repository's failures: see ``status``."""
    started = time.time()
    keep = dict(DEFAULT_KEEP, **(keep or {}))
    result: PushResult = {
        "repository": repository,
        "host": host,
        "user": user,
        "status": "ok",
        "reason": REASON_NONE,
        "error": None,
        "pushed": [],
        "skipped": [],
        "refused": [],
        "snapshots": None,
        "newest_snapshot": None,
        "repository_bytes": None,
        "check": None,
    }
    try:
        check_password_file(password_file)
        tool = Restic(repository, password_file, restic=restic, cache_dir=cache_dir)
        _push_newest(tool, result, newest_backups(backup_dirs, owner_uid), owner_uid)
        groups = _forget(tool, host, keep)
        if check:
            _check(tool, check_subset, result)
        _count_kept(result, groups)
        stats = tool.run_json(["stats", "--mode", "raw-data"]) or {}
        result["repository_bytes"] = stats.get("total_size")
    except OffsiteError as exc:
        _failed(result, exc.reason, str(exc))
    if result["status"] == "ok" and result["refused"]:
        _failed(result, "refused_file", result["refused"][0]["error"])
    result["seconds"] = round(time.time() - started, 3)
    return result


def _failed(result: PushResult, reason: str, error: str) -> None:
    result["status"] = "failed"
    result["reason"] = reason
    result["error"] = error


def _push_newest(tool: Restic, result: PushResult, newest: dict[str, tuple[str, int]], owner_uid: int) -> None:
    """Push each of ``newest`` that the repository lacks; the result lists it as pushed, skipped or refused."""
    host, user = result["host"], result["user"]
    present = {p for snap in _snapshots(tool, host) for p in snap.get("paths") or []}
    for profile, (path, when) in sorted(newest.items()):
        name = os.path.basename(path)
        target = snapshot_path(host, user, profile, name)
        if "/" + target in present or target in present:
            result["skipped"].append({"profile": profile, "name": name, "why": "already in the repository"})
            continue
        try:
            fd = open_backup(path, owner_uid)
        except OffsiteError as exc:
            result["refused"].append({"profile": profile, "name": name, "error": str(exc)})
            continue
        t0 = time.time()
        try:
            summary = _backup(tool, fd, target, host, user, profile, when)
        finally:
            os.close(fd)
        result["pushed"].append(
            {
                "profile": profile,
                "name": name,
                "snapshot": summary.get("snapshot_id"),
                "bytes": summary.get("total_bytes_processed"),
                "bytes_added": summary.get("data_added"),
                "seconds": round(time.time() - t0, 3),
            }
        )


def _forget(tool: Restic, host: str, keep: dict[str, int]) -> list[dict[str, Any]]:
    """Forget (and prune) this host's snapshots beyond the retention; returns restic's groups."""
    forget = ["forget", "--host", host, "--tag", TAG, "--group-by", "host,tags", "--prune"]
    for period in ("daily", "weekly", "monthly"):
        forget += ["--keep-%s" % period, str(int(keep[period]))]
    for line in tool.run(forget + ["--json"]).splitlines():
        # The JSON list of groups, then the prune's own lines (not JSON).
        if line.startswith("["):
            groups: list[dict[str, Any]] = json.loads(line)
            return groups
    return []


def _check(tool: Restic, check_subset: str, result: PushResult) -> None:
    """restic check of a subset of the data, in the result; raises when it fails (the push then failed)."""
    t0 = time.time()
    try:
        tool.run(["check", "--read-data-subset", check_subset])
    except OffsiteError as exc:
        result["check"] = {"ok": False, "error": str(exc)}
        raise
    result["check"] = {"ok": True, "seconds": round(time.time() - t0, 3)}


def _count_kept(result: PushResult, groups: list[dict[str, Any]]) -> None:
    # What forget kept is every snapshot of this host's (it filters by host and tag).
    kept = [snap for group in groups for snap in group.get("keep") or []]
    result["snapshots"] = len(kept)
    times = [t for t in (snapshot_time(snap.get("time")) for snap in kept) if t is not None]
    result["newest_snapshot"] = max(times) if times else None


_RFC3339 = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.\d+)?(Z|([+-])(\d\d):(\d\d))$")


def snapshot_time(text: str | None) -> int | None:
    """Unix time of restic's snapshot time (RFC 3339, nanoseconds and zone), None if unparsable."""
    match = _RFC3339.match(text or "")
    if not match:
        return None
    fields = tuple(int(match.group(i)) for i in range(1, 7))
    offset = 0
    if match.group(7) != "Z":
        offset = (int(match.group(9)) * 3600 + int(match.group(10)) * 60) * (1 if match.group(8) == "+" else -1)
    return calendar.timegm(fields + (0, 0, 0)) - offset


def _backup(tool: Restic, fd: int, target: str, host: str, user: str, profile: str, when: int) -> dict[str, Any]:
    args = [
        "backup",
        "--stdin",
        "--stdin-filename",
        target,
        "--host",
        host,
        "--tag",
        TAG,
        "--tag",
        "user=" + user,
        "--tag",
        "profile=" + profile,
        # The backup's own time, so the retention keeps backups by when they were taken.
        "--time",
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)),
        "--json",
    ]
    out = tool.run(args, stdin=fd)
    summary: dict[str, Any] = {}
    for line in out.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("message_type") == "summary":
            summary = message
    if not summary.get("snapshot_id"):
        raise OffsiteError("restic backup of %s ended without a snapshot" % target)
    return summary


# --- restore: a backup back from the repository ----------------------------------------


class Fetched(TypedDict):
    path: str
    name: str
    snapshot: str | None
    time: str | None


def fetch(
    repository: str,
    password_file: str,
    host: str,
    user: str,
    profile: str,
    into: str,
    snapshot: str | None = None,
    restic: str | None = None,
    cache_dir: str | None = None,
) -> Fetched:
    """Write the backup of ``profile`` in ``snapshot`` (default: the host's newest for the user
    and profile) to the directory ``into`` (root's, created 0700) under its own name; returns
    {path, name, snapshot, time}. Raises OffsiteError naming what is missing."""
    check_password_file(password_file)
    tool = Restic(repository, password_file, restic=restic, cache_dir=cache_dir)
    chosen = _chosen_snapshot(tool, host, user, profile, snapshot)
    [path] = chosen.get("paths") or [None]
    name = os.path.basename(path or "")
    parsed = BACKUP_NAME.match(name)
    if not parsed or parsed.group("profile") != profile:
        raise OffsiteError("snapshot %s holds %s, not a backup of profile %s" % (chosen.get("short_id"), path, profile))
    os.makedirs(into, mode=0o700, exist_ok=True)
    st = os.lstat(into)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise OffsiteError("%s must be a directory root alone can write" % into)
    final = os.path.join(into, name)
    _dump(tool, chosen, path, final)
    return {"path": final, "name": name, "snapshot": chosen.get("short_id"), "time": chosen.get("time")}


def _chosen_snapshot(tool: Restic, host: str, user: str, profile: str, snapshot: str | None) -> dict[str, Any]:
    """restic's entry of ``snapshot``, or of the newest snapshot of the host's user and profile."""
    found: list[dict[str, Any]] = (
        tool.run_json(["snapshots", "--host", host, "--tag", "%s,user=%s,profile=%s" % (TAG, user, profile)]) or []
    )
    if snapshot:
        found = [s for s in found if s.get("id", "").startswith(snapshot) or s.get("short_id") == snapshot]
    if not found:
        raise OffsiteError(
            "no snapshot%s of host %s, user %s, profile %s in %s"
            % (" " + snapshot if snapshot else "", host, user, profile, tool.repository)
        )
    return max(found, key=lambda s: snapshot_time(s.get("time")) or 0)


def _dump(tool: Restic, chosen: dict[str, Any], path: str, final: str) -> None:
    """restic dump of ``path`` in ``chosen`` to ``final`` (0600): written as FINAL.partial, fsynced,
    renamed, the directory fsynced; the partial file removed when a step fails."""
    partial = final + ".partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            proc = subprocess.run(
                [tool.binary, "dump", chosen["id"], path],
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.PIPE,
                env=tool.env,
                cwd="/",
                timeout=tool.timeout,
                check=False,
            )
        finally:
            os.fsync(fd)
            os.close(fd)
        if proc.returncode != 0:
            raise OffsiteError("restic dump %s: %s" % (chosen.get("short_id"), proc.stderr.decode("utf-8", "replace")))
        os.rename(partial, final)
        fsync_path(os.path.dirname(final))
    except BaseException:
        if os.path.lexists(partial):
            os.unlink(partial)
        raise


# --- metrics ---------------------------------------------------------------------------

METRICS = (
    ("last_run_timestamp_seconds", "Unix time the last off-site push ended."),
    ("last_success_timestamp_seconds", "Unix time the last successful off-site push ended (absent: never)."),
    ("failures", "Off-site pushes that failed in a row (0 after a success)."),
    ("snapshots", "Snapshots of this host in the off-site repository, after the last successful push."),
    ("newest_snapshot_timestamp_seconds", "Unix time of this host's newest backup in the off-site repository."),
    ("repository_bytes", "Size of the off-site repository (restic stats raw-data), after the last successful push."),
    ("last_pushed_bytes_added", "Bytes the last push added to the repository (after deduplication)."),
    ("last_check_timestamp_seconds", "Unix time of the last restic check of the repository (absent: never)."),
    ("check_ok", "1 when the last restic check passed, 0 when it failed."),
)
_SAMPLE = re.compile(r"^" + METRICS_PREFIX + r"(?P<name>[a-z_]+)(?:\{[^}]*\})?\s+(?P<value>[0-9.eE+-]+)\s*$", re.M)


def offsite_metrics_filename(user: str) -> str:
    return metrics_filename(user).replace("hermes_ops_", "hermes_ops_offsite_", 1)


def previous_figures(path: str) -> dict[str, float]:
    try:
        with open(path) as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return {}
    return {m.group("name"): float(m.group("value")) for m in _SAMPLE.finditer(text)}


def render(result: PushResult, previous: dict[str, float], finished: float) -> str:
    ok = result["status"] == "ok"
    figures: dict[str, float] = {
        "last_run_timestamp_seconds": finished,
        "failures": 0 if ok else int(previous.get("failures", 0)) + 1,
    }
    kept = ("last_success_timestamp_seconds", "snapshots", "newest_snapshot_timestamp_seconds", "repository_bytes")
    for name in kept:
        if name in previous:
            figures[name] = previous[name]
    if ok:
        figures["last_success_timestamp_seconds"] = finished
        figures["snapshots"] = result["snapshots"] or 0
        figures["repository_bytes"] = result["repository_bytes"] or 0
        if result["newest_snapshot"] is not None:
            figures["newest_snapshot_timestamp_seconds"] = result["newest_snapshot"]
    figures["last_pushed_bytes_added"] = sum(p.get("bytes_added") or 0 for p in result["pushed"])
    check = result.get("check")
    if check is not None:
        figures["last_check_timestamp_seconds"] = finished
        figures["check_ok"] = 1 if check["ok"] else 0
    else:
        for name in ("last_check_timestamp_seconds", "check_ok"):
            if name in previous:
                figures[name] = previous[name]
    labels: Labels = (("host", result["host"]), ("user", result["user"]))
    lines: list[str] = []
    for name, help_text in METRICS:
        if name in figures:
            lines += gauge_family(METRICS_PREFIX + name, help_text, [(labels, figures[name])])
    status = [(labels + (("reason", reason),), 1 if reason == result["reason"] else 0) for reason in ALL_REASONS]
    lines += gauge_family(
        METRICS_PREFIX + "last_run_status", "1 for the last push's reason (none: it succeeded).", status
    )
    return "\n".join(lines) + "\n"


def record(directory: str, result: PushResult, finished: float | None = None) -> str:
    finished = time.time() if finished is None else finished
    filename = offsite_metrics_filename(result["user"])
    previous = previous_figures(os.path.join(directory, filename))
    return write_atomically(directory, filename, render(result, previous, finished))


def check_due(directory: str, user: str, days: int, now: float | None = None) -> bool:
    """True when the last restic check (from the metrics) is older than ``days``."""
    if not directory or days <= 0:
        return days == 0
    previous = previous_figures(os.path.join(directory, offsite_metrics_filename(user)))
    last = previous.get("last_check_timestamp_seconds")
    return last is None or (now or time.time()) - last >= days * 86400


# --- command line (the role's root-run job) -----------------------------------------------


def load_config(path: str) -> dict[str, Any]:
    """The role's offsite.json: root's, refused otherwise (it names what root reads and runs)."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise OffsiteError("config %s must be a regular file root alone can write" % path)
    with open(path) as handle:
        config: dict[str, Any] = json.load(handle)
    for key in ("repository", "password_file", "backup_dirs", "uid", "user", "host"):
        if key not in config:
            raise OffsiteError("config %s has no %r" % (path, key))
    return config


def summary_line(result: PushResult) -> str:
    if result["status"] == "ok":
        pushed = ", ".join(
            "%s (%s, %s bytes added)" % (p["profile"], p["name"], p["bytes_added"]) for p in result["pushed"]
        )
        return "off-site %s: ok; pushed %s; %d already there; %s snapshots, %s bytes in the repository" % (
            result["repository"],
            pushed or "nothing",
            len(result["skipped"]),
            result["snapshots"],
            result["repository_bytes"],
        )
    return "off-site %s: FAILED (%s): %s" % (result["repository"], result["reason"], result["error"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hermes-ops-offsite", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.add_argument("--init", action="store_true", help="create the repository when it does not exist")
    parser.add_argument("--check", action="store_true", help="run restic check now, whenever the last one was")
    parser.add_argument("--fetch", metavar="PROFILE", help="write PROFILE's backup from the repository to --into")
    parser.add_argument("--snapshot", help="with --fetch: this snapshot (default: the newest of the profile)")
    parser.add_argument("--into", default="/var/lib/hermes-ops/offsite-restore", help="with --fetch: where to")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        sys.stderr.write("hermes-ops-offsite: runs as root alone (the Hermes user must not read the password)\n")
        return 2
    try:
        config = load_config(args.config)
    except (OSError, ValueError, OffsiteError) as exc:
        sys.stderr.write("hermes-ops-offsite: %s" % exc + "\n")
        return 2
    if args.init:
        return _init_command(config)
    if args.fetch:
        return _fetch_command(config, args.fetch, args.snapshot, args.into)
    return _push_command(config, args.check, args.json)


def _init_command(config: dict[str, Any]) -> int:
    """--init: create the repository unless it exists; one JSON line for the role's task."""
    try:
        check_password_file(config["password_file"])
        tool = Restic(config["repository"], config["password_file"], cache_dir=config.get("cache_dir"))
        created = init_repository(tool)
    except OffsiteError as exc:
        sys.stdout.write(json.dumps({"changed": False, "failed": True, "msg": str(exc)}) + "\n")
        return 1
    sys.stdout.write(json.dumps({"changed": created, "repository": config["repository"]}) + "\n")
    return 0


def _fetch_command(config: dict[str, Any], profile: str, snapshot: str | None, into: str) -> int:
    """--fetch: a profile's backup back from the repository, under INTO/USER; one JSON line."""
    try:
        got = fetch(
            config["repository"],
            config["password_file"],
            config["host"],
            config["user"],
            profile,
            os.path.join(into, config["user"]),
            snapshot=snapshot,
            cache_dir=config.get("cache_dir"),
        )
    except (OffsiteError, OSError) as exc:
        sys.stdout.write(json.dumps({"failed": True, "msg": str(exc)}) + "\n")
        return 1
    sys.stdout.write(json.dumps(got) + "\n")
    return 0


def _push_command(config: dict[str, Any], check_now: bool, as_json: bool) -> int:
    """The scheduled push: the newest backups, the retention, a check when due, the metrics."""
    metrics_dir = config.get("metrics_dir") or ""
    check = check_now or check_due(metrics_dir, config["user"], int(config.get("check_days", DEFAULT_CHECK_DAYS)))
    result = push(
        config["repository"],
        config["password_file"],
        config["backup_dirs"],
        int(config["uid"]),
        config["user"],
        config["host"],
        keep=config.get("keep"),
        check_subset=config.get("check_subset", DEFAULT_CHECK_SUBSET),
        check=check,
        cache_dir=config.get("cache_dir"),
    )
    if metrics_dir:
        try:
            record(metrics_dir, result)
        except OSError as exc:
            sys.stderr.write("hermes-ops-offsite: metrics not written to %s: %s" % (metrics_dir, exc) + "\n")
    sys.stdout.write((json.dumps(result, indent=2, sort_keys=True) if as_json else summary_line(result)) + "\n")
    return 0 if result["status"] == "ok" else 1
