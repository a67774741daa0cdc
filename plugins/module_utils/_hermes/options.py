# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine's options, written once: name, type, default, choices, bounds, documentation.

At run time the engine's defaults and checks, the runner's config types and the modules'
argument specs are read from ``OPTIONS``. What Ansible needs as literal text (DOCUMENTATION,
the doc fragment, the role's defaults and argument specs, ``playbooks/maintain.yml``, the
README tables) is written from it by ``scripts/generate.py``; ``make lint`` fails when a copy
differs. Adding an option: add one ``Option`` row below, run ``python3 scripts/generate.py``.

Documentation uses Ansible's markup (``C()``, ``O()``, ``V()``); the first paragraph is the
one-line summary the tables show.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any, Literal, TypedDict

# Hermes's non-messaging sources: closing a messaging session (telegram, discord, ...)
# makes the gateway start a fresh conversation in a live chat, so those are never closed.
ZOMBIE_SOURCES = ("cli", "cron", "kanban", "acp", "api_server", "subagent", "tool", "recovered")

# Where an option is documented and accepted: both modules (the doc fragment) or
# session_maintenance only.
SHARED = "shared"
MAINTENANCE = "maintenance"

# How the role exposes an option: a generated hermes_maintenance_<name> variable that is
# null by default (the engine's default applies), a hand-written role variable, or none.
ROLE_GENERATED = "generated"
ROLE_HAND_WRITTEN = "hand-written"
ROLE_NONE = None


class Option:
    """One engine option. ``unset`` says in words what None means when the default is None."""

    def __init__(
        self,
        name: str,
        type: str,
        doc: tuple[str, ...],
        default: Any = None,
        elements: str | None = None,
        choices: tuple[str, ...] | None = None,
        minimum: float | None = None,
        maximum: float | None = None,
        percent: bool = False,
        unset: str | None = None,
        scope: str = MAINTENANCE,
        role: str | None = ROLE_GENERATED,
    ) -> None:
        self.name = name
        self.type = type
        self.doc = tuple(doc)
        self.default = default
        self.elements = elements
        self.choices = tuple(choices) if choices else None
        self.minimum = minimum
        self.maximum = maximum
        self.percent = percent
        self.unset = unset
        self.scope = scope
        self.role = role

    def __repr__(self) -> str:
        return "Option(%r)" % self.name


HOME_UNSET = "C(~/.hermes) of the user the module runs as"

# fmt: off
OPTIONS = (
    Option("hermes_home", "list", elements="path", scope=SHARED, role=ROLE_NONE, unset=HOME_UNSET, doc=(
        "Hermes homes to work on. Each home's C(state.db) is profile C(default); each C(profiles/<name>/state.db) "
        "below it is profile C(<name>).",
        "Defaults to C(~/.hermes) of the user the module runs as.",
    )),
    Option("profiles", "list", elements="str", scope=SHARED, unset="all profiles", doc=(
        "Names of the profiles to include. All profiles when omitted.",
    )),
    Option("zombie_days", "float", default=1.0, minimum=0, scope=SHARED, doc=(
        "An open session (no C(ended_at)) idle for longer than this many days is a zombie.",
        "Idle time counts from the latest of C(last_activity_at), the newest message and C(started_at).",
    )),
    Option("prune_days", "float", default=90.0, minimum=0, scope=SHARED, doc=(
        "An ended session whose last activity is older than this many days is pruned.",
        "The default, 90, is the retention of Hermes's own auto-prune, so a session goes no sooner than Hermes "
        "itself would delete it. The monthly C(session-maintenance.sh) this replaces pruned at 7 (set 7 for that).",
    )),
    Option("prune_days_by_source", "dict", scope=SHARED, unset="one retention, prune_days, for every source", doc=(
        "Retention in days for the sessions of some sources, a mapping of source to days (cron to 3 and telegram to "
        "365, say); the sessions of "
        "every other source take O(prune_days). Each value is like O(prune_days) (a number, not below "
        "O(zombie_days)), and every rule that protects a session still applies.",
        "A delegate (subagent) takes the retention of the session it works for, and goes with it when that one is "
        "pruned; a compression lineage stays while any of its sessions is younger than its own retention.",
    )),
    Option("prune_days_by_profile", "dict", scope=SHARED, unset="every profile takes the run's retention", doc=(
        "Retention for some profiles, a mapping of profile name to days (work to 30, say) or to a mapping with "
        "C(prune_days) and/or C(prune_days_by_source), for a profile that keeps a year but its cron sessions 3 days; "
        "what a profile's entry leaves out it takes from O(prune_days) and O(prune_days_by_source).",
        "The same checks apply as to those two, and the summary line says which retention applied.",
    )),
    Option("zombie_sources", "list", default=list(ZOMBIE_SOURCES), elements="str", scope=SHARED, doc=(
        "Session sources whose zombies may be closed. Messaging platforms (telegram, discord, slack, ...) are left out "
        "on purpose, as Hermes does, because closing them makes the gateway start a new conversation in a live chat.",
    )),
    Option("backup_dir", "path", scope=SHARED, role=ROLE_HAND_WRITTEN, unset="C(HOME/backups) of each home", doc=(
        "Where backups are written and looked up. Defaults to C(HOME/backups) of each home.",
        "Must be a real directory owned by the owner of C(state.db) and not writable by others.",
    )),
    Option("busy_timeout", "float", default=5.0, minimum=0, scope=SHARED, doc=(
        "Seconds to wait for a lock held by Hermes before giving up on the profile (it is skipped; the next run "
        "takes it up again).",
    )),
    Option("end_reason", "str", default="startup_orphan_reap", doc=(
        "C(end_reason) written on closed zombies. The default is one Hermes treats as recoverable.",
    )),
    Option("backup", "bool", default=True, doc=(
        "Take a verified backup before the first change to a profile. If the backup fails, nothing in that profile is "
        "changed.",
        "Verified means the copy opens and holds every session about to be pruned with all its messages; the full "
        "C(quick_check) runs on C(state.db) at the start of the run and on a backup before any restore.",
        "In rollback-journal mode (C(journal_mode=DELETE), what Hermes 0.20 and later run on an SQLite with the "
        "WAL-reset bug) with another process holding C(state.db), a whole-file copy would block every commit of the "
        "gateway for as long as it takes. The backup is then an archive of the rows the prune deletes "
        "(C(hermes-ops-archive_<profile>_<time>.db) in the backup directory, quick_checked and fsynced before the "
        "first delete); the whole-file copy is taken by a run with no holder (the result says so in "
        "C(backup_deferred)).",
    )),
    Option("metrics_dir", "path", role=ROLE_HAND_WRITTEN, unset="no metrics", doc=(
        "After a real run (not in check mode), write Prometheus text-format metrics of every profile to "
        "C(METRICS_DIR/hermes_ops_<user>.prom) for node_exporter's textfile collector, through a temporary file "
        "renamed into place, mode 0644 (sizes, counts, times and a status reason only, no chat content).",
        "Debian's collector directory is C(/var/lib/prometheus/node-exporter). Not written when omitted.",
        "A failure to write them is a warning; the maintenance result stands.",
    )),
    Option("backup_keep_days", "float", default=30, minimum=0, doc=(
        "Remove this collection's backups of a profile older than this many days (the newest is always kept). Files it "
        "did not write, such as Hermes's C(pre-update-*.zip), are never touched.",
    )),
    Option("backup_keep_count", "int", minimum=1, unset="no limit", doc=(
        "Keep at most this many backups per profile. No limit when omitted.",
    )),
    Option("backup_interval_days", "float", minimum=0, unset="back up only before a change", doc=(
        "Also take a backup when the newest one is older than this many days, even if nothing else changes.",
    )),
    Option("backup_compress", "bool", default=False, doc=("Gzip the backup.",)),
    Option("vacuum_mode", "str", default="auto", choices=('auto', 'full', 'incremental', 'never'), doc=(
        "V(auto) reclaims in short C(incremental_vacuum) steps where the file is in incremental mode, and otherwise "
        "runs a full C(VACUUM) when free pages pass O(vacuum_threshold), nobody else holds the file, and the disk has "
        "room.",
        "V(full) runs a full C(VACUUM) whenever there are free pages (same safety conditions); use it in a service "
        "window with the gateway stopped.",
        "V(incremental) only uses C(incremental_vacuum); V(never) reclaims nothing.",
    )),
    Option("vacuum_threshold", "float", default=25.0, minimum=0, maximum=100, percent=True, doc=(
        "Free pages, in percent of the file, above which V(auto) runs a full C(VACUUM).",
    )),
    Option("vacuum_switch_incremental", "bool", default=True, doc=(
        "A full C(VACUUM) also sets C(auto_vacuum=INCREMENTAL), so later runs can reclaim in short steps while Hermes "
        "is live.",
    )),
    Option("gateway_service", "str", unset="no service window", doc=(
        "The systemd unit of the Hermes gateway, for a service window inside the run. The steps that need "
        "C(state.db) alone (a full C(VACUUM), which also makes the one-time switch to C(auto_vacuum=INCREMENTAL) "
        "with O(vacuum_switch_incremental), after FTS5's optimize of what the gateway wrote since) run with the "
        "gateway "
        "drained and stopped, when they pay and their estimated time fits O(max_downtime). Everything else runs "
        "with the gateway up.",
        "A system unit, or the Hermes user's own C(systemctl --user) unit as C(hermes gateway install) makes it "
        "(C(hermes-gateway), or C(hermes-gateway-<profile>)); the system unit is used where there is one of that "
        "name. Off when omitted (with O(gateway_stop_command) it is not given).",
        "The window drains the gateway first (Hermes's own C(HERMES_HOME/.drain_request.json), so no new turn "
        "starts and the turns in flight finish), then stops it. It is always started again, on any failure too, and "
        "the run checks that it is back (the unit active, and a holder on C(state.db) again). Each profile's "
        "C(window) says whether it opened, why not, the steps and the downtime.",
    )),
    Option("gateway_stop_command", "list", elements="str", unset="no service window", doc=(
        "The command (an argv list, the program by its absolute path) that stops the Hermes gateway, for a "
        "service window under another supervisor (a container, supervisord, s6); with O(gateway_start_command), "
        "instead of O(gateway_service). It must return once the gateway is stopped, with exit code 0.",
        "As root both commands run as root, so their program and every directory above it must not be "
        "writable by the owner of C(state.db) (the run refuses the window otherwise).",
    )),
    Option("gateway_start_command", "list", elements="str", unset="no service window", doc=(
        "The command (an argv list, the program by its absolute path) that starts the Hermes gateway again after "
        "the window; exit code 0 and a holder on C(state.db) again within 90 seconds mean it is back.",
    )),
    Option("max_downtime", "float", default=120.0, minimum=1, doc=(
        "Seconds the service window may keep the gateway from serving, from the drain until it is back. A window "
        "whose estimated time does not fit is not opened (the profile's C(window) says so); a step still running "
        "at the bound is interrupted and rolled back, and the gateway started again.",
    )),
    Option("batch_size", "int", default=4000, minimum=1, doc=(
        "Most messages deleted in one transaction (messages fire Hermes's FTS triggers); this also bounds a single "
        "statement on a very long session. While nobody has written to the file for half a second and O(batch_time) is "
        "set (an idle gateway), a transaction of whole sessions may take up to 8 times as many, O(batch_time) still "
        "ending it; the gateway's first commit puts the bound back.",
    )),
    Option("batch_time", "float", default=0.06, minimum=0, doc=(
        "Seconds one transaction may hold the write lock before it commits and lets the gateway in. Wall time, so a "
        "busy machine cannot stretch the stall a live writer sees. While no other connection commits to the file (an "
        "idle gateway) the bound grows to at most 0.12 s and a O(batch_pause) longer than a waiting writer's next poll "
        "shrinks towards it; the gateway's first commit puts both back.",
        "With O(batch_pause), the defaults kept a live Hermes writer's worst stall within 250 ms in the collection's "
        "benchmark (docs/benchmarks.md), at 0.6x to 0.8x the speed of Hermes 0.19's own single-transaction "
        "prune and 0.37x to 0.72x that of 0.22's. Where Hermes runs WAL on a fixed SQLite, V(0.1) brought 0.22 to "
        "0.5x with stalls within 131 ms.",
    )),
    Option("batch_pause", "float", default=0.03, minimum=0, doc=(
        "Seconds to pause between transactions, so that a live gateway's writes get the lock.",
        "A waiting writer polls the lock every 25 ms or more, so a pause shorter than that can starve it.",
    )),
    Option("tool_payload_days", "float", minimum=0, unset="no tool output is elided", doc=(
        "In the sessions the prune keeps, replace the content of C(role=tool) messages older than this many days "
        "with a short tombstone saying what was there. Off by default.",
        "The tombstone is the one Hermes's own proposed tool-payload retention writes (C([elided) C(tool output older "
        "than 30d - retention policy])), followed by size, tool and day (C(48213 bytes of terminal output from "
        "2026-08-01)), so a Hermes with that retention reads it as its own.",
        "Tool output (web extracts, terminal dumps, browser trees) and its two full-text indexes are most of a "
        "long-lived C(state.db); the conversation stays. Sessions a rule keeps (pinned, a live lease, the runtime "
        "ledger's fence) are not touched, nor anything when the file holds objects this collection does not know.",
        "The original bytes go first to an owner-only C(hermes-ops-payloads_<profile>_<time>.db) in the backup "
        "directory, fsynced before the first change; M(hermes_agent.ops.session_restore) with C(tool_payloads=true) "
        "puts them back from it, or from the run's whole-file backup where its rows match the tombstones. Paced "
        "like the prune; Hermes's own triggers keep both full-text indexes in step. A second "
        "run elides nothing; check mode gives the exact count and bytes (C(tool_payloads) of each profile).",
    )),
    Option("file_retention", "dict", unset="no file of the home is removed but transcripts of pruned sessions", doc=(
        "Remove some of the other files of each profile's home, by kind (the kinds of state_db_info's C(home_files)). "
        "Off by default; a mapping of kind to a rule, as follows.",
        "V(state_snapshots) (C(state-snapshots/<id>/) of C(hermes backup --quick) and C(hermes update)), "
        "V(hermes_backup_zip) (C(hermes-backup-*.zip), C(backups/pre-update-*.zip), C(backups/pre-migration-*.zip)) "
        "and V(pre_update_emergency) (C(state.db.pre-update-emergency-*.bak)) take C(keep) (keep that many newest) "
        "and/or C(days) (remove those older); never the newest one, never a partial one, never while Hermes's "
        "backup slot C(.backup.lock) is held or C(hermes update) runs.",
        "V(malformed_backup) (Hermes's forensic copies, with their sidecars) and V(orphaned_transcripts) "
        "(C(sessions/) files whose session is not in C(state.db)) take C(days); a transcript is removed only when no "
        "process has it open and no retired WAL generation is in the home. Retired WAL generations are never "
        "removed.",
        "Check mode lists exactly what a real run removes (C(file_retention) of each profile in the result).",
    )),
    Option("reclaim_stores", "bool", default=False, doc=(
        "Also VACUUM the home's other SQLite stores (C(cron/executions.db), C(cron/deliveries.db), "
        "C(cron/notepad.db)) when nothing holds them, their free pages pass O(vacuum_threshold) (any free pages in "
        "incremental mode) and the disk has room for the copy. No row is deleted from them (Hermes prunes "
        "C(cron/executions.db) itself).",
    )),
    Option("allow_unknown_schema", "bool", default=False, doc=(
        "Maintain a C(schema_version) newer than any this collection knows. Refused by default.",
    )),
    Option("unknown_schema", "str", default="refuse", choices=("refuse", "release_rules"), doc=(
        "What to do with a C(schema_version) newer than any this collection knows (unless O(allow_unknown_schema)).",
        "V(refuse) leaves the profile untouched and fails it. V(release_rules) asks the Hermes installed on the "
        "host (O(hermes_python), run as the Hermes user, never as root) which sessions its own C(prune_sessions) "
        "would delete, on a private scratch copy of the file, and prunes only the sessions both it and this "
        "collection's rules select; each profile's C(release_rules) in the result says which release answered.",
    )),
    Option("hermes_python", "path", unset="none", doc=(
        "The Python interpreter of the Hermes installed on the host (the one its C(hermes) entry point names), "
        "needed when O(unknown_schema) is V(release_rules) or O(delete_with) is V(hermes).",
        "With a service window (O(gateway_service), O(gateway_stop_command)) it also runs that Hermes's own "
        "C(hermes sessions optimize-storage) in the window, as the owner of C(state.db), where the file still "
        "has the FTS storage upgrade to do (C(state_meta.fts_optimize_available), or an interrupted one).",
    )),
    Option("delete_with", "str", default="auto", choices=("auto", "engine", "hermes"), doc=(
        "Who deletes the sessions the prune selected (each profile's C(deleted_by) says who did).",
        "V(engine) deletes with this collection's own statements.",
        "V(hermes) has the delete code of the Hermes installed on the host do it (O(hermes_python), run as the "
        "owner of C(state.db), never as root), its bulk C(delete_sessions) where it has one, else "
        "C(delete_session) one session at a time, in transactions paced as the engine's own (O(batch_size), "
        "O(batch_time), the gateway's turn between them); a session it refuses is kept and named in "
        "C(sessions_refused). Check mode runs it on a private scratch copy.",
        "V(auto) lets the engine delete where this collection knows every object of the file; where it does "
        "not, the installed Hermes (O(hermes_python)) when its own delete publishes upstream's deletion fence "
        "(asked of what it ships, not of its version), else the engine, refusing what those objects could "
        "affect and naming them, and why the installed Hermes was not used.",
    )),
    Option("allow_empty_homes", "bool", default=False, doc=(
        "Accept a home that does not exist yet or holds no C(state.db) in it nor under C(profiles/) (a host where "
        "Hermes is not set up yet). The run then reports V(no_profiles) for it, never success, instead of failing.",
        "The role refuses such a home at apply time unless this is set (mostly it is a mistyped path).",
    )),
    Option("allow_foreign_owner", "bool", default=False, doc=(
        "Work on a C(state.db) owned by another user when not running as root.",
    )),
)
# fmt: on

BY_NAME = {option.name: option for option in OPTIONS}

# Each option's type in Options follows from its row (type, choices, elements; "| None" where the
# default is None), except these: a mapping's shape, or a value normalize_options always fills.
TYPES_IN_OPTIONS = {
    "hermes_home": "list[str]",
    "prune_days_by_source": "dict[str, float]",
    "prune_days_by_profile": "dict[str, ProfileRetention]",
    "file_retention": "dict[str, dict[str, float]]",
}

# The types the engine converts with: what float(...) / int(...) must accept.
NUMBER_TYPES = ("int", "float")


class ProfileRetention(TypedDict, total=False):
    """One profile's entry of prune_days_by_profile, as normalize_options leaves it."""

    prune_days: float
    prune_days_by_source: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Options:
    """The run's options, one field per row of OPTIONS, every one filled and checked: only
    normalize_options (maintain.checked_options) makes one, and ``for_profile`` one profile's."""

    # BEGIN GENERATED: options-dataclass (scripts/generate.py)
    hermes_home: list[str]
    profiles: list[str] | None
    zombie_days: float
    prune_days: float
    prune_days_by_source: dict[str, float]
    prune_days_by_profile: dict[str, ProfileRetention]
    zombie_sources: list[str]
    backup_dir: str | None
    busy_timeout: float
    end_reason: str
    backup: bool
    metrics_dir: str | None
    backup_keep_days: float
    backup_keep_count: int | None
    backup_interval_days: float | None
    backup_compress: bool
    vacuum_mode: Literal["auto", "full", "incremental", "never"]
    vacuum_threshold: float
    vacuum_switch_incremental: bool
    gateway_service: str | None
    gateway_stop_command: list[str] | None
    gateway_start_command: list[str] | None
    max_downtime: float
    batch_size: int
    batch_time: float
    batch_pause: float
    tool_payload_days: float | None
    file_retention: dict[str, dict[str, float]]
    reclaim_stores: bool
    allow_unknown_schema: bool
    unknown_schema: Literal["refuse", "release_rules"]
    hermes_python: str | None
    delete_with: Literal["auto", "engine", "hermes"]
    allow_empty_homes: bool
    allow_foreign_owner: bool
    # END GENERATED


def defaults() -> dict[str, Any]:
    """A fresh dict of every option's default (lists copied, so callers may change them)."""
    return {o.name: list(o.default) if isinstance(o.default, list) else o.default for o in OPTIONS}


def options_in(scope: str) -> list[Option]:
    """The options of one scope (SHARED, MAINTENANCE), in table order."""
    return [o for o in OPTIONS if o.scope == scope]


def check_option(option: Option, value: Any) -> str | None:
    """The message for a value out of bounds or choices, or None when it is fine (None always is)."""
    if value is None:
        return None
    if option.choices and value not in option.choices:
        return "%s must be one of %s (got %r)" % (option.name, ", ".join(option.choices), value)
    if option.type not in NUMBER_TYPES:
        return None
    number = int(value) if option.type == "int" else float(value)
    low, high = option.minimum, option.maximum
    if option.percent and low is not None and high is not None and not low <= number <= high:
        return "%s is a percentage from %s to %s (got %s)" % (option.name, option.minimum, option.maximum, value)
    if option.minimum == 0 and number < 0:
        return "%s must not be negative (got %s)" % (option.name, value)
    if option.minimum is not None and number < option.minimum:
        return "%s must be at least %s (got %s)" % (option.name, option.minimum, value)
    if option.maximum is not None and number > option.maximum:
        return "%s must be at most %s (got %s)" % (option.name, option.maximum, value)
    return None


def iso_seconds(text: str) -> float | None:
    """An ISO 8601 date, or date and time, in unix seconds (UTC unless it names a zone), or None when
    ``text`` is not one. A trailing ``Z`` is read as UTC (Python 3.9's parser refuses it)."""
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
