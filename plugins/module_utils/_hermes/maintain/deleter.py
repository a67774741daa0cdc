# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who deletes the sessions the plan selected (``delete_with``): one strategy, two deleters.

``predict`` gives check mode's counts and ``execute`` deletes in the run; both come as a
PruneResult, which ``record_pruned`` alone writes into the profile's result. The engine's paced
prune (apply.prune) predicts from the plan, which it follows exactly; the installed Hermes's
delete code (apply.hermes_deletes) predicts by running the run's loop on a private copy.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

from ..apply.hermes_deletes import ENGINE, HERMES, ReleaseDeleter, release_prune, release_prune_on_copy
from ..apply.prune import KeepCopy, PruneResult, Stop, prune
from ..backup.archive import take_archive
from ..backup.whole_file import check_backup_dir
from ..sqlite.db import fts_automerge_paused, holders
from .checked_options import installed_python

if TYPE_CHECKING:
    from ..options import Options
    from ..plan.selection import Plan
    from ..results import ProfileResult
    from .profile import Decision, Profile


class Deleter(Protocol):
    """Deletes the plan's sessions, or says what it would delete."""

    name: str  # the result's ``deleted_by``: ENGINE or HERMES

    def predict(self, profile: Profile, decision: Decision, opts: Options) -> PruneResult:
        """Check mode: what ``execute`` would delete (nothing of the file is written)."""

    def execute(
        self, profile: Profile, decision: Decision, opts: Options, pruned: PruneResult, stop: Stop | None
    ) -> None:
        """The run: delete ``decision.plan.delete_order``, adding to ``pruned`` as each transaction commits."""


def planned_counts(plan: Plan) -> PruneResult:
    """What the plan selects, as the engine's prune deletes it."""
    counts = PruneResult()
    counts.sessions = len(plan.delete_order)
    counts.messages = plan.messages_pruned
    counts.orphaned = plan.orphaned
    counts.transcripts = plan.transcripts_count
    counts.prompts = plan.prompts
    return counts


class EnginePrune:
    """The engine's own statements, paced beside a live gateway (apply.prune.prune)."""

    name = ENGINE

    def predict(self, profile: Profile, decision: Decision, opts: Options) -> PruneResult:
        return planned_counts(decision.plan)

    def execute(
        self, profile: Profile, decision: Decision, opts: Options, pruned: PruneResult, stop: Stop | None
    ) -> None:
        # Beside a holder, the gateway's appends would carry on, inside their own transactions, the
        # FTS merges our transactions leave under way (sqlite.db.fts_automerge_paused)
        indexes = [fts["name"] for fts in profile.schema.get("fts", []) if not fts["error"]]
        with fts_automerge_paused(profile.conn, indexes if holders(profile.db_path) else []):
            prune(
                profile.conn, decision.plan, profile.schema,
                batch_size=int(opts.batch_size), pause=float(opts.batch_pause), result=pruned,
                batch_time=float(opts.batch_time),
                # rollback-mode commits are slower: let the gateway's next poll in
                pause_after_commit=profile.short_reads,
                stop=stop, keep_copy=slice_copy(profile, decision.backup_dir),
            )  # fmt: skip


class HermesDeletes:
    """The installed Hermes's own delete code, paced by the engine (apply.hermes_deletes)."""

    name = HERMES

    def predict(self, profile: Profile, decision: Decision, opts: Options) -> PruneResult:
        """Exactly what the release deletes, from a private copy (the run's zombie closes first)."""
        predicted, profile.result["release_delete"] = release_prune_on_copy(
            profile.conn, decision.plan, profile.schema, installed_python(opts),
            batch_size=int(opts.batch_size), batch_time=float(opts.batch_time), end_reason=opts.end_reason,
        )  # fmt: skip
        return predicted

    def execute(
        self, profile: Profile, decision: Decision, opts: Options, pruned: PruneResult, stop: Stop | None
    ) -> None:
        deleter = ReleaseDeleter(installed_python(opts), profile.db_path, profile.root)
        profile.result["release_delete"] = deleter.info()
        try:
            release_prune(
                profile.conn, decision.plan, profile.schema, deleter,
                batch_size=int(opts.batch_size), batch_time=float(opts.batch_time),
                pause=float(opts.batch_pause), result=pruned, stop=stop,
            )  # fmt: skip
        finally:
            deleter.close()


def deleter_for(choice: str, plan: Plan) -> Deleter:
    """The strategy for ``choice`` (apply.hermes_deletes.choose_deleter's): the installed Hermes only
    when it has sessions to delete; otherwise the engine's prune, which also finishes what an
    interrupted run left (its transcripts)."""
    if choice == HERMES and plan.delete_order:
        return HermesDeletes()
    return EnginePrune()


def record_pruned(result: ProfileResult, zombies_closed: int, pruned: PruneResult, deleter: Deleter) -> None:
    """The one place a profile's result gets its counts: predicted in check mode, committed in the run."""
    result["zombies_closed"] = zombies_closed
    result["sessions_pruned"] = pruned.sessions
    result["messages_pruned"] = pruned.messages
    result["sessions_orphaned"] = pruned.orphaned
    result["transcripts_removed"] = pruned.transcripts
    result["prompts_collected"] = pruned.prompts
    result["sessions_left_alone"] = len(pruned.left_alone)
    result["sessions_refused"] = pruned.refused
    result["sessions_kept"] = result.get("sessions_kept", []) + pruned.kept
    result["deleted_by"] = deleter.name if pruned.sessions else None


def slice_copy(profile: Profile, backup_dir: str) -> KeepCopy:
    """``keep_copy`` of the prune: where a session deleted in slices is kept whole: the run's own
    backup or archive (fsynced before the first delete) when SQLite reads it as it is, else a
    private archive (0600, fsynced) of that session. Returns (path, whether the list owns it)."""
    backup: dict[str, Any] | None = profile.result.get("backup")

    def keep(order: list[str], counts: dict[str, int]) -> tuple[str, bool]:
        if backup and not backup.get("compressed"):
            return str(backup["path"]), False
        check_backup_dir(backup_dir, os.stat(profile.db_path).st_uid, create=True)
        archive = take_archive(
            profile.conn, profile.db_path, backup_dir, profile.name, order, counts, profile.schema["schema_version"]
        )
        return str(archive["path"]), True

    return keep
