# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What else may be working on a state.db: Hermes's own locked operations, a Litestream
replica, Hermes's own auto-maintenance schedule. Read-only: nothing here creates a file.

Standard library only, Python 3.9+, no Ansible imports.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import sqlite3
from typing import Union

from ..sqlite.db import ProfileSkipped

# Hermes (0.22.2: hermes_state_repair.py, hermes_state_dbfile.py, hermes_state_common.py)
# takes each with fcntl.flock(LOCK_EX | LOCK_NB) in a bounded poll, on files that stay on
# disk after it is done: a file that exists says nothing, a held flock does.
HERMES_OPERATION_LOCKS = (
    (".repair.lock", "a schema repair"),
    (".quarantine.lock", "a quarantine of a damaged file"),
    (".fts_rebuild.lock", "a full-text index rebuild"),
)
AUTO_MAINTENANCE_LOCK = (".auto-maintenance.lock", "its auto-maintenance (prune and VACUUM)")
LITESTREAM_TABLES = ("_litestream_seq", "_litestream_lock")
# A plain value of config.yaml as _config_block reads it (the type of the default it replaces).
Scalar = Union[str, bool, int, float]


def lock_is_held(path: str) -> bool:
    """True when another open file holds a flock on ``path``; never creates it.

    A shared, non-blocking probe, dropped at once: a Hermes process that asks for the lock
    in that instant polls again (its acquires are bounded waits, not single tries).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False  # absent (or unreadable: then Hermes could not take it either)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # closing drops our probe lock
    return False


def held_hermes_locks(db_path: str, include_auto_maintenance: bool = True) -> list[dict[str, str]]:
    """The Hermes lock files of this state.db that are held right now."""
    locks = HERMES_OPERATION_LOCKS + ((AUTO_MAINTENANCE_LOCK,) if include_auto_maintenance else ())
    held = []
    for suffix, operation in locks:
        path = db_path + suffix
        if lock_is_held(path):
            held.append({"file": path, "operation": operation})
    return held


def refuse_during_hermes_operation(db_path: str) -> None:
    """Skip the profile while Hermes repairs, quarantines or rebuilds it (the others go on)."""
    held = held_hermes_locks(db_path, include_auto_maintenance=False)
    if held:
        raise ProfileSkipped(
            "Hermes is running %s on this file (%s is held): maintaining it meanwhile is unsafe; "
            "skipped, nothing changed, the next run retries" % (held[0]["operation"], held[0]["file"])
        )


def litestream_tables(conn: sqlite3.Connection) -> list[str]:
    """Litestream's own tables in the file: present means a replica is shadowing its WAL."""
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (%s)" % ",".join("?" * len(LITESTREAM_TABLES)),
        LITESTREAM_TABLES,
    ).fetchall()
    return sorted(r[0] for r in rows)


def no_checkpoint_on_close(conn: sqlite3.Connection) -> None:
    """Litestream owns a replica's checkpoints; SQLite checkpoints when its last connection
    closes. Python 3.12+ can turn that off per connection; before that, Litestream's own
    long read transaction (it holds one while it runs) is what stops the close checkpoint."""
    option = getattr(sqlite3, "SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE", None)
    if option is not None and hasattr(conn, "setconfig"):
        conn.setconfig(option, True)


def auto_maintenance_meta(conn: sqlite3.Connection) -> dict[str, float | None]:
    """Hermes's own bookkeeping in state_meta: when it last pruned and vacuumed (epoch seconds)."""
    meta: dict[str, float | None] = {"last_auto_prune": None, "last_vacuum": None}
    try:
        rows = conn.execute(
            "SELECT key, value FROM state_meta WHERE key IN ('last_auto_prune', 'last_vacuum')"
        ).fetchall()
    except Exception:  # no state_meta (older Hermes): nothing recorded
        return meta
    for key, value in rows:
        try:
            meta[key] = float(value)
        except (TypeError, ValueError):
            meta[key] = None
    return meta


# Hermes's defaults when config.yaml says nothing (0.22.2 hermes_cli/config_defaults.py).
AUTO_PRUNE_DEFAULTS: dict[str, Scalar] = {
    "auto_prune": True,
    "retention_days": 90,
    "min_interval_hours": 24,
    "vacuum_after_prune": True,
    "min_vacuum_interval_days": 30,
}
CONFIG_MAX_BYTES = 1024 * 1024
_KEY = re.compile(r"^( *)([A-Za-z_][A-Za-z0-9_]*) *:(.*)$")


def auto_prune_setting(home: str) -> dict[str, Scalar]:
    """``sessions.auto_prune`` and its companions as HOME/config.yaml gives them.

    Anything the file does not say plainly leaves Hermes's default and says so in ``source``.
    """
    path = os.path.join(home, "config.yaml")
    setting: dict[str, Scalar] = dict(AUTO_PRUNE_DEFAULTS, source="Hermes default (no %s)" % path)
    values = _config_block(path, "sessions", AUTO_PRUNE_DEFAULTS)
    if values is not None:
        setting.update(values, source=path)
    return setting


# Hermes 0.22+ (website/docs/developer-guide/session-storage.md): ``database.backend: postgres``
# with HERMES_DATABASE_URL keeps sessions in PostgreSQL; state.db then gets no writes.
BACKEND_DEFAULTS: dict[str, Scalar] = {"backend": "sqlite"}


def database_backend(home: str, db_path: str) -> dict[str, Scalar]:
    """Where this profile's Hermes stores its sessions: ``{"backend", "source"}``.

    The profile's own config.yaml (beside its state.db) says it, else the home's; ``backend``
    is the value in lower case (``sqlite`` when neither file says).
    """
    for directory in dict.fromkeys((os.path.dirname(os.path.abspath(db_path)), home)):
        path = os.path.join(directory, "config.yaml")
        values = _config_block(path, "database", BACKEND_DEFAULTS)
        backend = (values or {}).get("backend")
        if isinstance(backend, str) and backend:
            return {"backend": backend.lower(), "source": path}
    return dict(BACKEND_DEFAULTS, source="Hermes default (no database.backend in config.yaml)")


def _config_block(path: str, block: str, wanted: dict[str, Scalar]) -> dict[str, Scalar] | None:
    """Plain ``key: scalar`` lines of top-level ``block:`` in a config.yaml, for the keys of
    ``wanted`` (parsed to the type of their value there); None when the file cannot be read.

    The file belongs to the Hermes user, so it is untrusted input: read at most 1 MB, with
    no YAML library and nothing evaluated; any other line is ignored.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            text = handle.read(CONFIG_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    found: dict[str, Scalar] = {}
    inside, indent = False, None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _KEY.match(line)
        if not match:
            continue
        depth, key, value = len(match.group(1)), match.group(2), match.group(3).strip()
        if depth == 0:
            inside, indent = key == block and not value, None
            continue
        if not inside:
            continue
        indent = depth if indent is None else indent
        if depth == indent and key in wanted:
            parsed = _scalar(value, type(wanted[key]))
            if parsed is not None:
                found[key] = parsed
    return found


def _scalar(value: str, kind: type[Scalar]) -> Scalar | None:
    value = value.strip().strip("'\"")
    if kind is str:
        return value or None
    value = value.lower()
    if kind is bool:
        return {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}.get(value)
    try:
        return kind(float(value)) if kind is int else kind(value)
    except ValueError:
        return None
