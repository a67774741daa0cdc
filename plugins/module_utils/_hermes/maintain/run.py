# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Maintenance of every Hermes state.db of a host, one profile at a time.

Entry points: ``run_maintenance`` (modules, runner) and ``gather_info`` (read-only).
One profile's failure never stops the others; each result says what happened and why.

A profile's maintenance is named steps (``maintain_profile``): open, inspect, decide (the one
decision check mode reports and the run executes), then report (check mode) or execute.
"""

from __future__ import annotations

import os
import pwd
import sqlite3
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable

from ..apply.window import GatewayControl, run_window
from ..apply.window import configured as window_configured
from ..host.profiles import NO_PROFILES, backups_of, each_profile, owner_of, run_as_owner
from ..options import defaults
from ..results import new_profile_result
from ..sqlite.db import MaintenanceError, ProfileSkipped, engine_sqlite
from .actions import report_check
from .checked_options import for_profile, normalize_options
from .decision import decide
from .execution import execute
from .inspection import inspect_profile, open_profile
from .profile import Handles
from .summary import format_summary_line

if TYPE_CHECKING:
    from ..options import Options
    from ..results import ProfileResult, RunResult

DEFAULTS = defaults()  # the option table's defaults (options.OPTIONS)


def maintain_profile(home: str, name: str, db_path: str, opts: Options, check_mode: bool, now: float) -> ProfileResult:
    """Open, inspect, decide, then report (check mode) or execute: one profile, never raising."""
    result = new_profile_result(home, name, db_path)
    result["sqlite"] = engine_sqlite()
    started = time.time()
    opts = for_profile(opts, name)
    held = Handles()
    try:
        profile = open_profile(home, name, db_path, opts, check_mode, now, result, held)
        inspect_profile(profile, opts)
        decision = decide(profile, opts)
        if check_mode:
            report_check(profile, decision, opts)
        else:
            execute(profile, decision, opts)
        conclude(result)
    except Exception as exc:  # one profile must never stop the others
        record_failure(result, exc, db_path, opts)
    finally:
        held.close()
    result["duration"] = round(time.time() - started, 3)
    return result


def conclude(result: ProfileResult) -> None:
    """Files removed or stores vacuumed are changes too; an error refusing part of the work fails the profile."""
    if result["file_retention"] and result["file_retention"]["removed"]:
        result["changed"] = True
    if result["stores"] and any(entry["action"] for entry in result["stores"].values()):
        result["changed"] = True
    if result["error"]:
        result["status"] = "failed"


def record_failure(result: ProfileResult, exc: Exception, db_path: str, opts: Options) -> None:
    """Why the profile stopped: skipped (nothing lost, the next run retries) or failed."""
    if isinstance(exc, ProfileSkipped):
        result["status"], result["error"] = "skipped", str(exc)
    elif isinstance(exc, MaintenanceError):
        result["status"], result["error"] = "failed", str(exc)
    elif isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
        result["status"] = "skipped"
        result["error"] = (
            "%s stayed locked by another writer for longer than busy_timeout (%ss): skipped, nothing lost; "
            "the next run retries" % (db_path, opts.busy_timeout)
        )
    elif isinstance(exc, sqlite3.OperationalError):
        result["status"], result["error"] = "failed", "%s: %s" % (db_path, exc)
    else:
        result["status"] = "failed"
        result["error"] = "%s: unexpected %s: %s" % (db_path, type(exc).__name__, exc)
        result["traceback"] = traceback.format_exc()


def service_window(opts: Options, profiles: list[ProfileResult]) -> None:
    """One window for every profile whose plan opened one, after all their live work: the gateway
    drained and stopped (as the caller: root's stop and start), the steps as each file's owner, the
    gateway always started again; each profile's ``window``, ``reclaim`` and ``after`` then say
    what the window did."""
    planned = [p for p in profiles if p["status"] == "ok" and (p.get("window") or {}).get("opened")]
    if not planned:
        return
    owner = _common_owner(planned)
    if owner is None and os.geteuid() == 0:
        for p in planned:
            p["window"].update(opened=False, reason="the profiles' state.db files have different owners")
        return

    def as_owner(fn: Callable[..., Any], *args: Any) -> Any:
        if owner is not None and os.geteuid() == 0 and owner.pw_uid != 0:  # root has one owner here (above)
            return run_as_owner(owner.pw_uid, fn, *args)
        return fn(*args)

    entries = [
        {"home": p["home"], "path": p["path"], "name": p["name"], "steps": p["window"]["steps"],
         "backup_dir": backups_of(p["home"], opts.backup_dir)}
        for p in planned
    ]  # fmt: skip
    report = run_window(opts, entries, as_owner, owner)
    for p in planned:
        _window_result(p, report)


def _common_owner(profiles: list[ProfileResult]) -> pwd.struct_passwd | None:
    """The pwd entry of the one owner of the profiles' state.db files, else None."""
    owners = {owner_of(p["path"]) for p in profiles}
    uid = owners.pop() if len(owners) == 1 else None
    return pwd.getpwuid(uid) if uid is not None else None


def check_gateway(opts: Options, profiles: list[ProfileResult]) -> None:
    """A ``gateway_service`` this host has neither as a system unit nor as the files' owner's user
    unit (or a stop/start command root may not run) is the operator's mistake: each profile fails
    naming the option, in check mode too and whether or not a window was due this time (the live
    work done stays done). Files of several owners are left to the window, which says so."""
    ok = [p for p in profiles if p["status"] == "ok"]
    if not (window_configured(opts) and ok):
        return
    owner = _common_owner(ok)
    if owner is None and len({owner_of(p["path"]) for p in ok}) > 1:
        return
    refused = GatewayControl(opts, owner).refusal()
    for p in ok if refused else ():
        p["status"], p["error"] = "failed", refused
        if p.get("window"):
            p["window"].update(opened=False, reason=refused)


def _window_result(p: ProfileResult, report: dict[str, Any]) -> None:
    done = report["profiles"].get(p["path"]) or {"done": [], "reason": None}
    p["window"].update(
        opened=report["opened"], downtime_s=report["downtime_s"], gateway_back=report["gateway_back"],
        done=done["done"], reason="; ".join(why for why in (report["reason"], done["reason"]) if why) or None,
    )  # fmt: skip
    if not report["opened"]:
        p["reclaim"]["skipped_reason"] = "the service window did not open: %s" % report["reason"]
    if done.get("backup"):
        p["window"]["backup"] = done["backup"]["path"]
        p["backups_removed"] = (p.get("backups_removed") or []) + done["backup"]["removed"]
        p["changed"] = True
    if "vacuum_full" in done["done"]:
        freed = max(0, done["bytes_before"] - done["bytes_after"])
        p["reclaim"].update(action="full", skipped_reason=None, bytes_freed=p["reclaim"]["bytes_freed"] + freed)
        p["after"].update(db_bytes=done["bytes_after"], wal_bytes=0)
        p["after"].update((k, v) for k, v in done["file"].items() if k != "auto_vacuum")
        p["window"]["auto_vacuum"] = done["file"].get("auto_vacuum")
        p["changed"] = True
    if "optimize_storage" in done["done"] and "vacuum_full" not in done["done"]:  # Hermes's own VACUUM ran
        p["after"].update(db_bytes=done["bytes_after"], wal_bytes=0)
        p["changed"] = True
    if "fts_optimize" in done["done"] and p.get("tool_payloads"):
        p["tool_payloads"]["fts_optimize_stopped"] = []
    if report["gateway_back"] is False:
        p["status"] = "failed"
        p["error"] = report["reason"]


def run_maintenance(options: dict[str, Any], check_mode: bool = False) -> RunResult:
    """Maintain every profile of every home; see docs/architecture.md for the result."""
    opts = normalize_options(options)
    old_umask = os.umask(0o077)  # backups, lock files: private chat history
    try:
        profiles = each_profile(opts, maintain_profile, check_mode=check_mode)
        check_gateway(opts, profiles)
        if not check_mode:
            service_window(opts, profiles)
    finally:
        os.umask(old_umask)
    return {
        "status": run_status(profiles),
        "changed": any(p["changed"] for p in profiles),
        "profiles": profiles,
        "summary": [format_summary_line(p, check_mode, opts) for p in profiles],
        "failed": [p["name"] for p in profiles if p["status"] == "failed"],
        "check_mode": check_mode,
        "sqlite": engine_sqlite(),
    }


def run_status(profiles: list[ProfileResult]) -> str:
    """``failed`` when a profile failed, ``no_profiles`` when a home held none to maintain, else ``ok``."""
    statuses = {p["status"] for p in profiles}
    return "failed" if "failed" in statuses else NO_PROFILES if NO_PROFILES in statuses else "ok"
