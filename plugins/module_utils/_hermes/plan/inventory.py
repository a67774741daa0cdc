# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every file of a Hermes home, by kind: count, bytes, oldest and newest mtime. Read-only.

``KINDS`` is the one table of kinds, each with its patterns as Hermes 0.22.2's code names the
files (hermes_state_repair.py, hermes_state_dbfile.py, hermes_cli/backup*.py,
gateway/shutdown_flush.py, cron/*.py) and this collection's own. A file no pattern names is
``other``, so a new kind that grows shows up there. The other SQLite stores are opened the way
the engine opens state.db for inspection (ReadOnlyDB) and asked for PRAGMAs only.
"""

from __future__ import annotations

import fnmatch
import os
import sqlite3
import stat
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from ..sqlite.db import ReadOnlyDB, journal_mode
from .selection import transcript_files

# (kind, patterns, depth, what). A pattern without ``/`` is matched against the first component of
# the path relative to the profile's home (so a directory it names is that kind whole); one with
# ``/`` against the whole path (fnmatch: ``*`` crosses ``/``). The first kind that matches wins. ``depth``: how many
# leading path components make one item (a retired-WAL directory is one generation), None: each
# file is one. The transcripts of sessions no longer in state.db are split out as
# ``orphaned_transcripts`` (TRANSCRIPTS below).
# fmt: off
KINDS = (
    ("state_db", ("state.db", "state.db-wal", "state.db-shm", "state.db-journal"), None,
     "The session store itself and its sidecars."),
    ("malformed_backup", ("state.db.malformed-backup-*", "state.db.backup-staging-*"), None,
     "Forensic copies Hermes's repair leaves (hermes_state_repair.py), with their sidecars and staging debris."),
    ("retired_wal", ("state.db.retired-wal-*",), 1,
     "WAL generations Hermes lost and captured (hermes_state_dbfile.py): messages may be missing from state.db."),
    ("pre_update_emergency", ("state.db.pre-update-emergency-*",), None,
     "Copies Hermes's updater makes before an update (hermes_cli/backup_sqlite.py)."),
    ("hermes_locks", ("state.db.*.lock",), None, "Hermes's lock files (flock; present is not held)."),
    ("hermes_backup_zip", ("hermes-backup-*.zip", "backups/hermes-backup-*.zip", "backups/pre-update-*.zip",
                           "backups/pre-migration-*.zip"), None,
     "Zips of `hermes backup`, the dashboard's backup and `hermes update`'s pre-update and pre-migration backups "
     "(hermes_cli/backup.py, web_routers/ops.py)."),
    ("hermes_ops_archive", ("backups/hermes-ops-archive_*",), None, "This collection's archives of pruned sessions."),
    ("hermes_ops_backup", ("backups/hermes-ops_*", "backups/.hermes-ops_*"), None, "This collection's backups."),
    ("state_snapshots", ("state-snapshots/*",), 2, "Snapshots of `hermes backup --quick` and `hermes update`."),
    ("pending_messages", ("pending_messages/*",), None,
     "Messages the gateway flushed to files while state.db refused inserts (gateway/shutdown_flush.py)."),
    ("transcripts", ("sessions/*",), None, "Session transcripts (sessions/<id>.jsonl) of sessions in state.db."),
    ("orphaned_transcripts", (), None, "Transcripts under sessions/ whose session is no longer in state.db."),
    ("cron_executions", ("cron/executions.db", "cron/executions.db-*"), None,
     "Cron's execution log (Hermes prunes it itself)."),
    ("cron_deliveries", ("cron/deliveries.db", "cron/deliveries.db-*"), None, "Cron's delivery queue."),
    ("notepad", ("cron/notepad.db", "cron/notepad.db-*"), None, "Cron's notepad store."),
    ("cron_other", ("cron/*",), None, "Cron's job definitions and output."),
    ("logs", ("logs", "*.log"), None, "Hermes's logs."),
    ("caches", ("cache", "image_cache", "audio_cache", "document_cache", "browser_screenshots"), None,
     "Hermes's caches (media, schema, scratch)."),
    ("agent_data", ("skills", "hooks", "memories", "pairing", "checkpoints", "plugins", "workspace"), None,
     "What the agent keeps: skills, hooks, memories, pairings, checkpoints."),
    ("config", ("config.yaml", ".env", "auth.json", "*.md", "*.pid", "*.lock", "*.json"), None,
     "Configuration, credentials and run-state files at the top of the home."),
    ("other", (), None, "Anything no pattern names."),
)
# fmt: on
KIND_NAMES = tuple(kind for kind, _p, _d, _w in KINDS)
STORES = {
    "cron_executions": "cron/executions.db",
    "cron_deliveries": "cron/deliveries.db",
    "notepad": "cron/notepad.db",
}
# (key in the result, PRAGMA): one short statement each.
STORE_PRAGMAS = (
    ("page_count", "page_count"),
    ("page_size", "page_size"),
    ("free_pages", "freelist_count"),
    ("journal_mode", "journal_mode"),
    ("auto_vacuum", "auto_vacuum"),
)
STORE_BUSY_TIMEOUT = 0.05  # seconds: a store that is locked is reported as such, never waited on
_TRANSCRIPT_SUFFIXES = (".jsonl", ".json")


def kind_of(relpath: str) -> tuple[str, str]:
    """(kind, item) of a path relative to a profile's home; item names the unit counted."""
    top = relpath.split("/", 1)[0]
    for kind, patterns, depth, _what in KINDS:
        if any(fnmatch.fnmatchcase(relpath if "/" in p else top, p) for p in patterns):
            item = "/".join(relpath.split("/")[:depth]) if depth else relpath
            return kind, item
    return "other", relpath


def _walk(root: str, skip: Collection[str]) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every non-directory under root, never following a link."""
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel) if rel else root))
        except OSError:
            continue
        for entry in entries:
            path = rel + "/" + entry.name if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if path not in skip:
                    stack.append(path)
            else:
                yield path, st


def orphaned_transcripts(root: str, ids: Collection[str] | None) -> set[str]:
    """Paths (relative) of the transcript files under sessions/ whose session is not in ``ids``.

    A file counts as a session's the way the prune finds them (plan.selection.transcript_files),
    plus the legacy ``session_<id>.json``; the gateway's own index ``sessions.json`` is no transcript.
    """
    directory = os.path.join(root, "sessions")
    if ids is None or os.path.islink(directory) or not os.path.isdir(directory):
        return set()
    owned = {os.path.basename(f) for files in transcript_files(directory, ids).values() for f in files}
    orphaned: set[str] = set()
    for name in os.listdir(directory):
        if name in owned or name == "sessions.json" or not name.endswith(_TRANSCRIPT_SUFFIXES):
            continue
        if name.startswith("session_") and name[len("session_") : -len(".json")] in ids:
            continue
        orphaned.add("sessions/" + name)
    return orphaned


def store_facts(path: str) -> dict[str, Any]:
    """Size, pages, free pages, journal and auto_vacuum mode of another SQLite store, read-only.

    ``reclaimable_bytes`` is what a VACUUM would give back (free pages times the page size); nothing
    is reclaimed here. An error (a locked or damaged store) is reported, never raised.
    """
    facts: dict[str, Any] = {"path": path, "bytes": os.lstat(path).st_size, "reclaimable_bytes": None, "error": None}
    db = None
    try:
        db = ReadOnlyDB(path, STORE_BUSY_TIMEOUT)
        for key, pragma in STORE_PRAGMAS:
            facts[key] = db.conn.execute("PRAGMA %s" % pragma).fetchone()[0]
        facts["journal_mode"] = journal_mode(db.conn, path)
        facts["reclaimable_bytes"] = facts["free_pages"] * facts["page_size"]
    except (sqlite3.Error, OSError) as exc:
        facts["error"] = str(exc)
    finally:
        if db is not None:
            db.close()
    for key, _pragma in STORE_PRAGMAS:
        facts.setdefault(key, None)
    return facts


def inventory(
    root: str, session_ids: Collection[str] | None = None, skip: Iterable[str] = ("profiles",)
) -> dict[str, Any]:
    """The files of one profile's home by kind.

    ``session_ids``: the ids in its state.db (None: unknown, then no transcript counts as
    orphaned). ``skip``: directories left out (the default profile's home holds the others).
    Returns {"kinds": {kind: {count, bytes, oldest, newest}}, "bytes", "named_bytes", "stores"}.
    """
    kinds: dict[str, dict[str, Any]] = {}
    items: dict[str, set[str]] = {}
    orphaned = orphaned_transcripts(root, session_ids)
    for relpath, st in _walk(root, set(skip)):
        kind, item = kind_of(relpath)
        if relpath in orphaned:
            kind = "orphaned_transcripts"
        entry = kinds.setdefault(kind, {"count": 0, "bytes": 0, "oldest": None, "newest": None})
        items.setdefault(kind, set()).add(item)
        entry["bytes"] += st.st_size
        mtime = int(st.st_mtime)
        entry["oldest"] = mtime if entry["oldest"] is None else min(entry["oldest"], mtime)
        entry["newest"] = mtime if entry["newest"] is None else max(entry["newest"], mtime)
    for kind, entry in kinds.items():
        entry["count"] = len(items[kind])
    total = sum(e["bytes"] for e in kinds.values())
    stores = {
        kind: store_facts(os.path.join(root, rel))
        for kind, rel in STORES.items()
        if os.path.isfile(os.path.join(root, rel)) and not os.path.islink(os.path.join(root, rel))
    }
    ordered = {kind: kinds[kind] for kind in KIND_NAMES if kind in kinds}
    named = total - ordered.get("other", {}).get("bytes", 0)
    return {"kinds": ordered, "bytes": total, "named_bytes": named, "stores": stores}


def session_ids(conn: sqlite3.Connection) -> set[str]:
    """The session ids of an open state.db (one read of the sessions table)."""
    return {row[0] for row in conn.execute("SELECT id FROM sessions")}
