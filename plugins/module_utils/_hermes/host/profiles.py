# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's Hermes profiles: where each keeps its state.db, the lock Hermes shares, its owner.

Restore, session restore and the maintenance all find profiles and take the lock here.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..results import ProfileResult, new_profile_result
from ..sqlite.db import MaintenanceError, ProfileSkipped

NO_PROFILES = "no_profiles"  # a home that exists but holds no state.db (a profile's status; a run's)
LOCK_SUFFIX = ".auto-maintenance.lock"  # the file Hermes's own auto-maintenance locks

if TYPE_CHECKING:
    from ..options import Options

# What a profile's work returns (a maintenance result, state_db_info's facts).
Report = TypeVar("Report", bound=Mapping[str, object])


def profile_path(home: str, name: str) -> str:
    """Where profile NAME keeps its state.db: HOME/state.db for 'default', else HOME/profiles/NAME/."""
    if name == "default":
        return os.path.join(home, "state.db")
    return os.path.join(home, "profiles", name, "state.db")


def discover_profiles(home: str, wanted: list[str] | None = None) -> list[tuple[str, str]]:
    """(name, state.db path) for HOME/state.db ('default') and HOME/profiles/*/state.db."""
    found = []
    if os.path.lexists(profile_path(home, "default")):
        found.append(("default", profile_path(home, "default")))
    profiles_dir = os.path.join(home, "profiles")
    if os.path.isdir(profiles_dir):
        for name in sorted(os.listdir(profiles_dir)):
            path = os.path.join(profiles_dir, name, "state.db")
            if os.path.lexists(path):
                found.append((name, path))
    if wanted:
        found = [item for item in found if item[0] in wanted]
    return found


def sessions_dir(db_path: str) -> str:
    """Hermes keeps transcripts in the profile's own home, beside its state.db."""
    return os.path.join(os.path.dirname(db_path), "sessions")


class ProfileLock:
    """A non-blocking flock on state.db.auto-maintenance.lock, shared with Hermes.

    Check mode only probes an existing lock file (it creates nothing). ``owner`` (uid, gid)
    is given to a lock file this creates, so a root caller leaves none that locks Hermes out.
    """

    def __init__(self, db_path: str, check_mode: bool, owner: tuple[int, int] | None = None) -> None:
        self.path = db_path + LOCK_SUFFIX
        self.fd: int | None = None
        flags = os.O_NOFOLLOW | (os.O_RDONLY if check_mode else os.O_RDWR | os.O_CREAT)
        if check_mode and not os.path.exists(self.path):
            return
        existed = os.path.lexists(self.path)
        try:
            self.fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise MaintenanceError("cannot open lock file %s: %s" % (self.path, exc.strerror)) from None
        if owner is not None and not existed and os.geteuid() == 0:
            os.fchown(self.fd, *owner)
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_SH if check_mode else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ProfileSkipped(
                    "another maintenance run (ours or Hermes's auto-maintenance) holds %s" % self.path
                ) from None
            raise

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays for Hermes
            self.fd = None

    def __enter__(self) -> ProfileLock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def backups_of(home: str, backup_dir: str | None = None) -> str:
    """The directory a home's backups go to: backup_dir when given, else HOME/backups."""
    return os.path.abspath(backup_dir or os.path.join(home, "backups"))


def run_as_owner(uid: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """As root, do a profile's work as the owner of its state.db, in a child process.

    Every file the engine creates (WAL, lock, backups) then belongs to the Hermes user,
    and a root-owned -shm can never lock the gateway out of its own database. What ``fn``
    returns comes back through JSON (so Any: JSON-like).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(read_fd)
            pw = pwd.getpwuid(uid)
            os.setgroups(os.getgrouplist(pw.pw_name, pw.pw_gid))
            os.setgid(pw.pw_gid)
            os.setuid(uid)
            os.environ["HOME"] = pw.pw_dir
            payload = json.dumps(fn(*args, **kwargs)).encode()
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    if not data:
        raise MaintenanceError("the worker process for uid %d died before reporting" % uid)
    return json.loads(data.decode())


def owner_of(path: str) -> int | None:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def each_profile(opts: Options, work: Callable[..., Report], *, check_mode: bool) -> list[Report | ProfileResult]:
    """``work(home, name, db_path, opts, check_mode=, now=)`` on every profile of every home (as the
    owner of its state.db when root), and a failed or ``no_profiles`` result where there is none."""
    now = time.time()
    results: list[Report | ProfileResult] = []
    for home in opts.hermes_home:
        home = os.path.abspath(os.path.expanduser(home))
        profiles = discover_profiles(home, opts.profiles)
        if not profiles:
            missing = new_profile_result(home, "default", os.path.join(home, "state.db"))
            # A home with nothing to maintain is not a success: the run says so (no_profiles).
            exists = os.path.isdir(home)
            missing["status"] = NO_PROFILES if exists or opts.allow_empty_homes else "failed"
            missing["error"] = (
                "no state.db under %s (no profile matches %s)" % (home, opts.profiles or "any")
                if exists
                else "no state.db under %s: the home does not exist yet (allow_empty_homes)" % home
                if opts.allow_empty_homes
                else "%s is the database file; give its home, %s (hermes_home)" % (home, os.path.dirname(home))
                if os.path.isfile(home) and os.path.basename(home) == "state.db"
                else "Hermes home %s does not exist: check hermes_home" % home
            )
            results.append(missing)
            continue
        for name, path in profiles:
            uid = owner_of(path)
            if os.geteuid() == 0 and uid is not None and uid != 0:
                try:
                    results.append(run_as_owner(uid, work, home, name, path, opts, check_mode=check_mode, now=now))
                except MaintenanceError as exc:
                    failed = new_profile_result(home, name, path)
                    failed["status"], failed["error"] = "failed", str(exc)
                    results.append(failed)
            else:
                results.append(work(home, name, path, opts, check_mode=check_mode, now=now))
    return results
