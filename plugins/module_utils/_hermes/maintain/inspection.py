# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The first two steps of a profile's maintenance: open the file (checked, locked, connected)
and inspect it (preflight check, schema, catalogue, the release's own prune rules, the counts)."""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING, Any

from ..host.hazards import (
    auto_prune_setting,
    database_backend,
    litestream_tables,
    no_checkpoint_on_close,
    refuse_during_hermes_operation,
)
from ..host.profiles import ProfileLock
from ..sqlite.db import (
    MaintenanceError,
    ProfileSkipped,
    ReadOnlyDB,
    check_db_file,
    holders,
    journal_mode,
    open_rw,
    refuse_wal_on_shared_filesystem,
)
from ..store.catalogue import read_catalogue, summary
from ..store.release_rules import release_prune_set
from ..store.schema import check_version, inspect_schema, quick_check, quick_check_small_tables, stats
from .checked_options import installed_python
from .profile import Handles, Profile

if TYPE_CHECKING:
    from ..options import Options
    from ..results import ProfileResult


def open_profile(
    home: str, name: str, db_path: str, opts: Options, check_mode: bool, now: float, result: ProfileResult,
    held: Handles,
) -> Profile:  # fmt: skip
    """Refuse a file the run must not touch, take the profile lock and connect (``held`` keeps both
    for the caller to close, whatever happens next)."""
    st = check_db_file(db_path)
    check_owner(db_path, st, opts)
    result["database_backend"] = backend = database_backend(home, db_path)
    result["hermes_retention"] = hermes_retention(home, opts)
    if backend["backend"] != "sqlite":
        raise ProfileSkipped(elsewhere(backend))  # before the lock: nothing is written
    held.lock = ProfileLock(db_path, check_mode=check_mode)
    refuse_during_hermes_operation(db_path)
    held.db = ReadOnlyDB(db_path, opts.busy_timeout) if check_mode else None
    held.conn = conn = held.db.conn if held.db else open_rw(db_path, float(opts.busy_timeout))
    return Profile(home, name, db_path, check_mode, now, result, conn, st)


def inspect_profile(profile: Profile, opts: Options) -> None:
    """What the file is: the preflight check, its schema and catalogue, the counts before the run and,
    where the schema is unknown to the engine, the sessions the installed Hermes's own prune deletes."""
    conn, result = profile.conn, profile.result
    result["preflight"] = preflight_check(conn, profile.db_path)
    schema = profile.schema = inspect_schema(conn, profile.home)
    release_rules = check_version(schema, opts.allow_unknown_schema, opts.unknown_schema)
    schema["catalogue"] = read_catalogue(conn)
    result["catalogue"] = summary(schema["catalogue"])
    schema["litestream"] = result["litestream"] = litestream_tables(conn)
    if schema["litestream"] and not profile.check_mode:
        no_checkpoint_on_close(conn)
    result["schema_version"] = schema["schema_version"]
    result["fts_layout"] = schema["fts_layout"]
    result["before"] = stats(conn, profile.db_path, profile.short_reads)
    if release_rules:  # only what the installed Hermes's own prune deletes too
        # the shortest retention: the release's set then holds every session any retention selects
        shortest = min([float(opts.prune_days)] + list(opts.prune_days_by_source.values()))
        answer = release_prune_set(conn, installed_python(opts), shortest)
        profile.allowed = answer.pop("deleted")
        result["release_rules"] = dict(answer, release_pruned=len(profile.allowed))


def preflight_check(conn: sqlite3.Connection, db_path: str) -> dict[str, Any]:
    """Check the file before any change, without stalling a live gateway; say how.

    In WAL mode (or with nobody else holding the file) a full quick_check: WAL readers block
    no writer. In rollback-journal mode with other processes holding the file, a read's
    SHARED lock blocks every commit of the gateway for as long as it lasts, so only the
    small tables are checked here, each in its own short read (quick_check_small_tables);
    the rows the prune deletes are checked through their archive.
    """
    mode = journal_mode(conn, db_path)
    shared = refuse_wal_on_shared_filesystem(db_path, mode)
    others = holders(db_path) if mode != "wal" else []
    report = {"journal_mode": mode, "live_rollback": bool(others), "holders": len(others), "shared_filesystem": shared}
    if others:
        report["check"] = "tables"
        report["tables_checked"] = quick_check_small_tables(conn, db_path)
    else:
        quick_check(conn, db_path)
        report["check"] = "quick_check"
    return report


def hermes_retention(home: str, opts: Options) -> dict[str, Any]:
    """Hermes's own auto-prune (config.yaml) beside this run's retentions (``opts`` of the profile):
    where Hermes prunes sooner, its retention wins, whatever the collection keeps."""
    setting = auto_prune_setting(home)
    days = setting["retention_days"]
    longer = {}
    if setting["auto_prune"] is True and isinstance(days, (int, float)) and not isinstance(days, bool):
        wanted = dict(opts.prune_days_by_source, prune_days=float(opts.prune_days))
        longer = {key: value for key, value in sorted(wanted.items()) if float(value) > float(days)}
    note = None
    if longer:
        note = (
            "Hermes's own auto-prune (sessions.retention_days %s, %s) deletes ended sessions after %s days, before "
            "this collection's longer retention (%s) applies: to keep them, set sessions.auto_prune: false in "
            "config.yaml; else set hermes_maintenance_prune_days (and _by_source) to at most %s"
            % (days, setting["source"], days, ", ".join("%s %gd" % (k, float(v)) for k, v in longer.items()), days)
        )
    return dict(
        auto_prune=setting["auto_prune"], retention_days=days, source=setting["source"], longer=longer, note=note
    )


def elsewhere(backend: dict[str, Any]) -> str:
    return (
        "%s selects database.backend: %s: Hermes keeps its sessions there and this state.db gets no writes, "
        "so maintaining it would be pointless and misleading; skipped, nothing written"
        % (backend["source"], backend["backend"])
    )


def check_owner(db_path: str, st: os.stat_result, opts: Options) -> None:
    uid = os.geteuid()
    if uid not in (0, st.st_uid) and not opts.allow_foreign_owner:
        raise MaintenanceError(
            "%s belongs to uid %d but this run is uid %d: files it creates (WAL, lock, backups) would belong to "
            "the wrong user; run as that user or as root (the engine then switches to the owner)"
            % (db_path, st.st_uid, uid)
        )
