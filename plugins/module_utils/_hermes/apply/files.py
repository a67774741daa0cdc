# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Retention of the other files of a Hermes home, and reclaim of its other SQLite stores.

Both are off by default (option ``file_retention``, option ``reclaim_stores``). The same plan
is what check mode reports and what a real run removes: ``plan_files`` decides, ``remove_files``
removes exactly the planned items that are still the files that were planned (same inode and
mtime), under the same guards, re-checked.

Guards (why an item or a whole kind is left alone):
- never the newest item of a kind (per directory and name prefix for zips, as Hermes prunes
  them), never a partial one (``*.partial``, ``*.incomplete.zip``, hidden staging names);
- Hermes's backups, snapshots and emergency copies: never while ``.backup.lock`` is held (Hermes's
  backup and quick snapshot take it; a real run holds it itself while it removes) or while
  ``hermes update`` runs (its ``.hermes-update-in-progress`` marker names a live process);
- transcripts whose session is not in state.db: only when not modified for ``days``, open in no
  process, and never while a retired WAL generation is in the home (Hermes then diverts a
  session's transcript to ``sessions/<id>.jsonl`` and its messages may be missing from state.db);
- retired WAL generations are never removed (reported by the inventory; the operator decides).
Hermes's repair and rebuild locks skip the whole profile before this runs (host.hazards).
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import shutil
import sqlite3
import stat
from collections.abc import Collection, Iterator, Mapping
from typing import Any, TypedDict

from ..host.hazards import lock_is_held
from ..plan.inventory import STORES, orphaned_transcripts, store_facts
from ..sqlite.db import MaintenanceError, free_bytes, fsync_tree, holders

DAY = 86400.0
BACKUP_LOCK = ".backup.lock"  # hermes_cli/backup.py: _backup_operation_lock
UPDATE_MARKER = ".hermes-update-in-progress"  # hermes_cli/update_lock.py: in the root home
# kind: (the rule keys it takes, whether Hermes's backup slot guards it)
RULES = {
    "state_snapshots": (("keep", "days"), True),
    "hermes_backup_zip": (("keep", "days"), True),
    "pre_update_emergency": (("keep", "days"), True),
    "malformed_backup": (("days",), False),
    "orphaned_transcripts": (("days",), False),
}
NEVER = {
    "retired_wal": "a retired WAL generation is reported, never removed: whether its frames belong on top of "
    "state.db is the operator's decision (docs/fleet.md)",
}
ZIP_PREFIXES = ("hermes-backup-", "pre-update-", "pre-migration-")  # hermes_cli/backup.py
_PARTIAL = (".partial", ".incomplete.zip", ".tmp")

Rule = dict[str, float]  # "keep" (a whole number) and/or "days"
Rules = dict[str, Rule]  # kind -> its rule
Identity = tuple[int, int, int, int]  # inode, device, mtime (ns), file type: the same file still


class RemovedItem(TypedDict):
    kind: str
    path: str
    files: list[str]
    bytes: int
    why: str


class FilesPlan(TypedDict):
    """``plan_files``'s answer: what a run removes (each item with why), and each kind left alone with why."""

    remove: list[tuple[Item, str]]
    skipped: dict[str, str]


class StorePlan(TypedDict, total=False):
    """What ``reclaim_stores`` does to one other SQLite store (``bytes_after`` once done)."""

    path: str
    bytes: int
    free_pages: int
    action: str | None
    skipped_reason: str | None
    bytes_after: int


def check_rules(value: object) -> Rules:
    """file_retention as {kind: {keep, days}}; anything else is refused, naming the entry."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MaintenanceError(
            "file_retention must be a mapping of kind to a rule, such as {state_snapshots: {keep: 5}}"
        )
    rules: Rules = {}
    for kind, rule in value.items():
        if kind in NEVER:
            raise MaintenanceError("file_retention[%s]: %s" % (kind, NEVER[kind]))
        if kind not in RULES:
            raise MaintenanceError(
                "file_retention: %r is no kind this collection removes; the kinds are %s" % (kind, ", ".join(RULES))
            )
        keys = RULES[kind][0]
        if not isinstance(rule, dict) or not rule or set(rule) - set(keys):
            raise MaintenanceError(
                "file_retention[%s] must be a mapping with %s (got %r)" % (kind, " and/or ".join(keys), rule)
            )
        rules[kind] = {}
        for key, number in rule.items():
            whole = key == "keep"
            try:
                if isinstance(number, bool):
                    raise ValueError
                parsed = int(number) if whole else float(number)
            except (TypeError, ValueError):
                parsed = None
            if parsed is None or (whole and str(number).strip() != str(parsed)) or math.isnan(parsed) or parsed < 1:
                raise MaintenanceError(
                    "file_retention[%s].%s must be %s of at least 1 (got %r)"
                    % (kind, key, "a whole number" if whole else "a number of days", number)
                )
            rules[kind][key] = parsed
    return rules


class Item:
    """One unit of removal: a file with its sidecars, or a snapshot directory."""

    def __init__(self, kind: str, root: str, rels: list[str], group: str | None = None) -> None:
        self.kind = kind
        self.rels = rels
        self.group = group
        self.paths = [os.path.join(root, rel) for rel in rels]
        self.identity = [_identity(path) for path in self.paths]
        entries = [st for path in self.paths for st in _tree_entries(path)]  # one walk for both figures
        self.bytes = sum(st.st_size for st in entries if not stat.S_ISDIR(st.st_mode))
        self.mtime = int(max(st.st_mtime for st in entries))
        self.newest: Item | None = None  # the newest item of its group, made durable before this one goes

    def as_result(self, why: str) -> RemovedItem:
        return {"kind": self.kind, "path": self.paths[0], "files": self.rels, "bytes": self.bytes, "why": why}


def _identity(path: str) -> Identity:
    st = os.lstat(path)
    return (st.st_ino, st.st_dev, st.st_mtime_ns, stat.S_IFMT(st.st_mode))


def _tree_entries(path: str) -> Iterator[os.stat_result]:
    st = os.lstat(path)
    yield st
    if stat.S_ISDIR(st.st_mode):
        for base, dirs, files in os.walk(path):
            for name in dirs + files:
                try:
                    yield os.lstat(os.path.join(base, name))
                except OSError:
                    continue


def _partial(name: str) -> bool:
    return name.startswith(".") or name.endswith(_PARTIAL)


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _listdir(directory: str) -> list[str]:
    if os.path.islink(directory) or not os.path.isdir(directory):
        return []
    return sorted(os.listdir(directory))


def find_items(root: str, kind: str, ids: Collection[str] | None = None) -> list[Item]:
    """The items of one kind in a profile's home (root: the directory holding its state.db)."""
    items: list[Item] = []
    if kind == "state_snapshots":
        for name in _listdir(os.path.join(root, "state-snapshots")):
            rel = "state-snapshots/" + name
            full = os.path.join(root, rel)
            if not _partial(name) and os.path.isdir(full) and not os.path.islink(full):
                _add(items, kind, root, [rel], group="state-snapshots")
    elif kind == "hermes_backup_zip":
        for where in ("", "backups/"):
            for name in _listdir(os.path.join(root, where) if where else root):
                prefix = next((p for p in ZIP_PREFIXES if name.startswith(p)), None)
                if (
                    prefix
                    and name.endswith(".zip")
                    and not _partial(name)
                    and _regular(os.path.join(root, where + name))
                ):
                    if where or prefix == "hermes-backup-":
                        _add(items, kind, root, [where + name], group=where + prefix)
    elif kind == "pre_update_emergency":
        for name in _listdir(root):
            if (
                name.startswith("state.db.pre-update-emergency-")
                and name.endswith(".bak")
                and _regular(os.path.join(root, name))
            ):
                _add(items, kind, root, [name], group="emergency")
    elif kind == "malformed_backup":
        names = _listdir(root)
        for name in names:
            if name.startswith("state.db.malformed-backup-") and not name.endswith(("-wal", "-shm", "-journal")):
                if _regular(os.path.join(root, name)):
                    rels = [name] + [name + s for s in ("-wal", "-shm", "-journal") if name + s in names]
                    _add(items, kind, root, rels)
    elif kind == "orphaned_transcripts":
        for rel in sorted(orphaned_transcripts(root, ids)):
            if _regular(os.path.join(root, rel)):
                _add(items, kind, root, [rel])
    return items


def _add(items: list[Item], kind: str, root: str, rels: list[str], group: str | None = None) -> None:
    """Append the Item: one whose file went away since the listing is left out."""
    try:
        items.append(Item(kind, root, rels, group))
    except OSError:
        pass


def _update_running(home: str) -> str | None:
    """Why ``hermes update`` counts as running (its marker names a live process), or None."""
    marker = os.path.join(home, UPDATE_MARKER)
    if not os.path.lexists(marker):
        return None
    try:  # the Hermes user writes this file: no link followed, a FIFO planted there cannot block us
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            pid = int(os.read(fd, 64).split(b"\n", 1)[0])
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return "%s exists and cannot be read: an update may be running" % marker
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a marker left by a dead updater
    except PermissionError:
        pass
    return "hermes update is running (%s names pid %d)" % (marker, pid)


def _backup_lock_held(root: str) -> str | None:
    path = os.path.join(root, BACKUP_LOCK)
    return "Hermes's backup or snapshot is running (%s is held)" % path if lock_is_held(path) else None


def _open_files_under(root: str) -> set[str]:
    """Paths under root that some process has open (the processes this user can see)."""
    found: set[str] = set()
    prefix = os.path.realpath(root) + os.sep
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fd_dir = "/proc/%s/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith(prefix):
                found.add(target)
    return found


def plan_files(root: str, home: str, rules: Rules, ids: Collection[str] | None, now: float) -> FilesPlan:
    """{"remove": [(item, why)], "skipped": {kind: reason}}: what a run removes, and what it leaves and why."""
    remove: list[tuple[Item, str]] = []
    skipped: dict[str, str] = {}
    if not rules:
        return {"remove": remove, "skipped": skipped}
    guard = _update_running(home) or _backup_lock_held(root)
    retired = [n for n in _listdir(root) if n.startswith("state.db.retired-wal-")]
    open_now = _open_files_under(root) if "orphaned_transcripts" in rules else set()
    for kind, rule in rules.items():
        if RULES[kind][1] and guard:
            skipped[kind] = guard
            continue
        if kind == "orphaned_transcripts" and retired:
            skipped[kind] = (
                "a retired WAL generation (%s) is in the home: a transcript Hermes diverted may hold messages missing "
                "from state.db" % retired[0]
            )
            continue
        items = find_items(root, kind, ids)
        newest: dict[str | None, Item] = {}
        for item in items:
            if item.group is not None and (item.group not in newest or item.mtime > newest[item.group].mtime):
                newest[item.group] = item
        by_group: dict[str | None, int] = {}
        for item in sorted(items, key=lambda i: (-i.mtime, i.rels[0])):
            rank = by_group[item.group] = by_group.get(item.group, 0) + 1
            if item.group is not None and newest[item.group] is item:
                continue  # never the newest
            if kind == "orphaned_transcripts" and any(os.path.realpath(p) in open_now for p in item.paths):
                continue
            item.newest = newest.get(item.group)
            age = (now - item.mtime) / DAY
            if "days" in rule and age > rule["days"]:
                remove.append((item, "older than %g days (%.1f)" % (rule["days"], age)))
            elif "keep" in rule and rank > rule["keep"]:
                remove.append((item, "beyond the newest %d" % rule["keep"]))
    return {"remove": remove, "skipped": skipped}


class _BackupSlot:
    """Hermes's backup slot (.backup.lock, flock), held while our removals run; None when taken."""

    def __init__(self, root: str) -> None:
        self.fd: int | None = None
        self.why: str | None = None
        path = os.path.join(root, BACKUP_LOCK)
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
            self.why = (
                "Hermes's backup or snapshot is running (%s is held)" % path
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                else "cannot take %s: %s" % (path, exc.strerror)
            )

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _remove(item: Item) -> None:
    for path, identity in zip(item.paths, item.identity):
        if _identity(path) != identity:
            raise OSError(errno.ESTALE, "changed since it was planned", path)
    for path in item.paths:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)  # fd-based on Linux: a link planted inside is removed, never followed
        else:
            os.unlink(path)


def newest_durable(item: Item) -> None:
    """The copy kept in place of the older ones, on disk before any of them goes: Hermes may
    not have fsynced it (a snapshot directory: every file and directory in it)."""
    for path in item.paths:
        fsync_tree(path)


def describe(plan: FilesPlan) -> dict[str, Any]:
    """The plan as the result reports it (check mode's prediction): the result's ``file_retention``, whose keys are
    the result table's."""
    removed = [item.as_result(why) for item, why in plan["remove"]]
    return {"removed": removed, "bytes": sum(r["bytes"] for r in removed), "skipped": plan["skipped"], "errors": []}


def remove_files(root: str, home: str, plan: FilesPlan) -> dict[str, Any]:
    """Remove the planned items, re-checking the guards; report as ``describe`` does."""
    removed: list[RemovedItem] = []
    report: dict[str, Any] = {"removed": removed, "bytes": 0, "skipped": dict(plan["skipped"]), "errors": []}
    guarded = [(i, w) for i, w in plan["remove"] if RULES[i.kind][1]]
    slot = None
    if guarded:
        slot = _BackupSlot(root)
        why = _update_running(home) or (getattr(slot, "why", None) if slot.fd is None else None)
        if why:
            for kind in {i.kind for i, _w in guarded}:
                report["skipped"][kind] = why
    synced: set[str | None] = set()
    try:
        for item, why in plan["remove"]:
            if RULES[item.kind][1] and item.kind in report["skipped"]:
                continue
            try:
                if item.newest is not None and item.group not in synced:
                    newest_durable(item.newest)
                    synced.add(item.group)
                _remove(item)
            except OSError as exc:
                report["errors"].append("%s: %s" % (exc.filename or item.paths[0], exc.strerror))
                continue
            report["removed"].append(item.as_result(why))
            report["bytes"] += item.bytes
    finally:
        if slot is not None:
            slot.release()
    return report


def plan_stores(root: str, threshold_percent: float) -> dict[str, StorePlan]:
    """What reclaim_stores does to each other SQLite store: {kind: {path, free_pages, action, skipped_reason}}."""
    plans: dict[str, StorePlan] = {}
    for kind, rel in STORES.items():
        path = os.path.join(root, rel)
        if not _regular(path):
            continue
        facts = store_facts(path)
        entry: StorePlan = {"path": path, "bytes": facts["bytes"], "free_pages": facts["free_pages"], "action": None}
        entry["skipped_reason"] = _store_refusal(path, facts, threshold_percent)
        if entry["skipped_reason"] is None:
            entry["action"] = "incremental" if facts["auto_vacuum"] == 2 else "full"
        plans[kind] = entry
    return plans


def _store_refusal(path: str, facts: Mapping[str, Any], threshold_percent: float) -> str | None:
    if facts["error"]:
        return "cannot read it: %s" % facts["error"]
    if not facts["free_pages"]:
        return "no free pages"
    percent = 100.0 * facts["free_pages"] / max(1, facts["page_count"])
    if facts["auto_vacuum"] != 2 and percent < threshold_percent:
        return "free pages %.1f%% are below vacuum_threshold (%g%%)" % (percent, threshold_percent)
    others = holders(path)
    if others:
        return "held by %d process(es) (%s): a store is reclaimed only when nothing holds it" % (
            len(others), ", ".join(sorted({str(h["command"]) for h in others})),
        )  # fmt: skip
    if facts["auto_vacuum"] != 2 and free_bytes(os.path.dirname(path)) < 2 * facts["bytes"]:
        return "the disk has less free space than twice the store's size (VACUUM writes a copy)"
    return None


def reclaim_stores(plans: dict[str, StorePlan], busy_timeout: float) -> dict[str, StorePlan]:
    """Run the planned VACUUMs, each after a last look for holders; fills in bytes_after."""
    for entry in plans.values():
        if not entry["action"]:
            continue
        if holders(entry["path"]):
            entry["action"], entry["skipped_reason"] = None, "a process opened it just before the VACUUM"
            continue
        conn = sqlite3.connect(entry["path"], timeout=busy_timeout, isolation_level=None)
        try:
            if entry["action"] == "incremental":
                conn.executescript("PRAGMA incremental_vacuum;")  # executescript runs it to completion
            else:
                conn.execute("VACUUM")
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            entry["action"], entry["skipped_reason"] = None, "VACUUM failed, nothing lost: %s" % exc
        finally:
            conn.close()
        entry["bytes_after"] = os.lstat(entry["path"]).st_size
    return plans
