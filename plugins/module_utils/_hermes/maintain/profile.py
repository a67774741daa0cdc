# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one profile's maintenance steps hand on to each other (maintain.run.maintain_profile).

``Profile``: the file opened and inspected (open, inspect); ``Decision``: what the run does to it
(decide), which check mode reports and the run executes.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ..host.profiles import ProfileLock
    from ..plan.selection import Plan
    from ..results import ProfileResult
    from ..sqlite.db import ReadOnlyDB
    from ..store.schema import Schema
    from .actions import Actions
    from .deleter import Deleter


@dataclass
class Handles:
    """What ``maintain_profile`` closes whatever happened: the profile lock and the connection."""

    lock: ProfileLock | None = None
    db: ReadOnlyDB | None = None  # check mode's read-only connection
    conn: sqlite3.Connection | None = None

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
        elif self.conn is not None:
            self.conn.close()
        if self.lock is not None:
            self.lock.release()


@dataclass
class Profile:
    """One profile's state.db, opened: whose it is, what it holds, and its result so far (the run's
    options for it travel beside it, as each step's ``opts``)."""

    home: str
    name: str
    db_path: str
    check_mode: bool
    now: float
    result: ProfileResult
    conn: sqlite3.Connection
    st: os.stat_result  # the file's lstat (check_db_file)
    schema: Schema = field(default_factory=lambda: cast("Schema", {}))  # inspect_schema's answer, and more
    allowed: set[str] | None = None  # release rules: the only sessions the installed Hermes prunes too

    @property
    def short_reads(self) -> bool:
        """Beside a live gateway in rollback-journal mode: every read kept short."""
        return bool(self.result["preflight"]["live_rollback"])

    @property
    def root(self) -> str:
        return os.path.dirname(self.db_path)


@dataclass
class Decision:
    """Every decision of the run for one profile, taken before any write."""

    plan: Plan  # the rows: zombies to close, sessions to prune, tool payloads to elide
    actions: Actions  # the backup, the reclaim, the window, the other files and stores
    deleter: Deleter  # who deletes the sessions: the engine or the installed Hermes
    backup_dir: str


def total_bytes(stats: dict[str, Any]) -> int:
    """The file's bytes and its -wal's, from store.schema.stats."""
    return int(stats["db_bytes"] + stats["wal_bytes"])
