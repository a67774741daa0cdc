# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only facts about every profile of a host (``gather_info``): state_db_info and the metrics."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from ..backup.archive import list_archives
from ..backup.whole_file import list_backups
from ..host.hazards import (
    auto_maintenance_meta,
    auto_prune_setting,
    database_backend,
    held_hermes_locks,
    litestream_tables,
)
from ..host.profiles import backups_of, each_profile, sessions_dir
from ..maintain.checked_options import for_profile, normalize_options
from ..options import Options
from ..plan.inventory import inventory, session_ids
from ..plan.selection import DAY, build_plan
from ..sqlite.db import MaintenanceError, ReadOnlyDB, check_db_file, engine_sqlite, holders, journal_mode
from ..sqlite.storage import storage
from ..store.catalogue import read_catalogue, summary
from ..store.schema import inspect_schema, stats, unusable_fts


def profile_info(home: str, name: str, db_path: str, opts: Options, check_mode: bool, now: float) -> dict[str, Any]:
    """Read-only facts about one profile; reports what it can even when maintenance would refuse."""
    info: dict[str, Any] = {
        "name": name,
        "home": home,
        "path": db_path,
        "status": "ok",
        "error": None,
        "sqlite": engine_sqlite(),
    }
    opts = for_profile(opts, name)
    db = None
    try:
        st = check_db_file(db_path)
        info["database_backend"] = database_backend(home, db_path)
        db = ReadOnlyDB(db_path, opts.busy_timeout)
        schema = inspect_schema(db.conn, home)
        schema["catalogue"] = read_catalogue(db.conn)
        info["catalogue"] = summary(schema["catalogue"])
        file_holders = holders(db_path)
        # Beside a gateway in rollback-journal mode every read blocks its commits: short reads only.
        live_rollback = bool(file_holders) and journal_mode(db.conn, db_path) != "wal"
        info.update(stats(db.conn, db_path, short_reads=live_rollback))
        info["storage"] = storage(db.conn, live_rollback)
        info.update(
            schema_version=schema["schema_version"],
            fts_layout=schema["fts_layout"],
            fts_unusable=unusable_fts(schema),
            auto_vacuum=schema["auto_vacuum"],
            holders=file_holders,
            mode="%o" % (st.st_mode & 0o777),
            hermes_locks_held=held_hermes_locks(db_path),
            litestream=litestream_tables(db.conn),
            hermes_auto_maintenance=dict(auto_maintenance_meta(db.conn), config=auto_prune_setting(home)),
        )
        backup_dir = backups_of(home, opts.backup_dir)
        backups, archives = list_backups(backup_dir, name), list_archives(backup_dir, name)
        info["newest_backup"] = _newest(backups, now)
        info["backups"] = len(backups)
        # Where a whole-file backup could not be taken beside the gateway: the archives kept instead.
        info["newest_archive"] = _newest(archives, now)
        info["archives"] = len(archives)
        root = os.path.dirname(db_path)
        info["home_files"] = inventory(root, session_ids(db.conn), skip=("profiles",) if name == "default" else ())
        plan = build_plan(db.conn, schema, opts, now, sessions_dir(db_path), short_reads=live_rollback)
        info.update(
            idle_open=len(plan.zombies),
            prunable_sessions=len(plan.delete_order),
            prunable_messages=plan.messages_pruned,
            bad_time_rows=plan.bad_time_rows,
        )
    except (MaintenanceError, sqlite3.Error, OSError) as exc:
        info["status"], info["error"] = "failed", str(exc)
    finally:
        if db is not None:
            db.close()
    return info


def _newest(stamped: Sequence[tuple[str, float]], now: float) -> dict[str, Any] | None:
    """The newest of ``stamped`` (path, unix time; newest first) as {"path", "age_days"}, or None."""
    return {"path": stamped[0][0], "age_days": round((now - stamped[0][1]) / DAY, 2)} if stamped else None


def gather_info(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Stats of every profile, for reports; opens read-only and writes nothing."""
    opts = normalize_options(options)
    return {"profiles": each_profile(opts, profile_info, check_mode=True), "sqlite": engine_sqlite()}
