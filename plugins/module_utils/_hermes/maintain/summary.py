# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each profile's line in the run's ``summary``: the seed script's words first, then what was done and why."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..apply.window import window_words
from ..host.profiles import NO_PROFILES
from .actions import human_size
from .checked_options import for_profile
from .profile import total_bytes

if TYPE_CHECKING:
    from ..options import Options
    from ..results import ProfileResult

if TYPE_CHECKING:
    pass


def _days(value: float) -> str:
    return "%gd" % float(value)


def _relative(path: str, home: str | None) -> str:
    """A backup path as the operator finds it: relative to its home when it lies under it."""
    if home and path.startswith(home.rstrip(os.sep) + os.sep):
        return path[len(home.rstrip(os.sep)) + 1 :]
    return path


def retention_words(retention: dict[str, Any] | None, opts: Options, name: str | None = None) -> str:
    """``retention 7d`` or, by source, ``retention 7d (2 sessions), cron 3d (5), telegram 365d (0)``;
    ``(profile NAME)`` after it when that profile's prune_days_by_profile entry applied."""
    if name is not None:
        opts = for_profile(opts, name)
    own = " (profile %s)" % name if name in opts.prune_days_by_profile else ""
    by_source = opts.prune_days_by_source
    if not by_source:
        return "retention " + _days(opts.prune_days) + own
    selected = (retention or {}).get("selected") or {}
    rest = sum(n for source, n in selected.items() if source not in by_source)
    words = ["retention %s (%d sessions)" % (_days(opts.prune_days), rest)]
    words += ["%s %s (%d)" % (src, _days(days), selected.get(src, 0)) for src, days in sorted(by_source.items())]
    return ", ".join(words) + own


def backup_words(p: ProfileResult, opts: Options) -> str:
    """The backup taken, in a few words: why a whole-file copy was not (``backup_deferred``) is in the
    result, not in the line."""
    backup = p["backup"]
    if backup:
        return "backup=%s %s" % (backup.get("kind") or "file", _relative(backup["path"], p["home"]))
    if p["backup_deferred"]:
        return "no backup (whole-file deferred: the file is held)"
    return "no backup (nothing changed)" if opts.backup else "no backup (backup is off)"


def vacuum_words(reclaim_: dict[str, Any], backup: dict[str, Any] | None) -> list[str]:
    """``vacuum full``, or why it was skipped (its first clause; what to do about it is in the result).
    Beside a gateway holding a rollback-journal file, ``backup=archive`` already says the file is
    held: the same holder keeping the vacuum out is said once, in the result."""
    if reclaim_.get("action"):
        return ["vacuum %s" % reclaim_["action"]]
    reason = reclaim_.get("skipped_reason")
    if not reason or ((backup or {}).get("kind") == "archive" and reason.startswith("held open by ")):
        return []
    return ["vacuum skipped: %s" % reason.split("; ")[0]]


def summary_details(p: ProfileResult, opts: Options) -> str:
    """What was done and why, after the seed's words: retention, backup, reclaim, stopped early."""
    words = [retention_words(p.get("retention"), opts, p["name"])]
    words.append(backup_words(p, opts))
    words += vacuum_words(p["reclaim"] or {}, p["backup"])
    files = p.get("file_retention")
    if files and (files["removed"] or files["skipped"] or files["errors"]):
        words.append("files removed=%d (%s)%s%s" % (
            len(files["removed"]), human_size(files["bytes"]),
            "".join(", %s skipped: %s" % item for item in sorted(files["skipped"].items())),
            ", %d not removed: %s" % (len(files["errors"]), files["errors"][0]) if files["errors"] else "",
        ))  # fmt: skip
    payloads = p.get("tool_payloads")
    if payloads:
        if payloads["skipped_reason"]:
            words.append("tool payloads not elided: %s" % payloads["skipped_reason"])
        else:
            words.append("tool payloads elided=%d (%s, older than %s)" % (
                payloads["elided"], human_size(payloads["bytes"]), _days(payloads["days"]),
            ))  # fmt: skip
    stores = [kind for kind, entry in (p.get("stores") or {}).items() if entry["action"]]
    if stores:
        words.append("stores vacuumed: %s" % ", ".join(stores))
    if p["stopped_early"]:
        words.append("stopped early: %s" % p["stopped_early"])
    return "; ".join(words)


def format_summary_line(p: ProfileResult, check_mode: bool = False, opts: Options | None = None) -> str:
    """The seed script's line: ``default: zombies=3 pruned=12 freed=45MB remaining=...``, its
    words first (scripts read them), then what was done and why (with ``opts``, the run's options).

    Sizes in human units (``freed=290KB``); in check mode ``freed=~...`` is the plan's estimate
    (the counts and every word after them are the plan's decisions, the same as the run's)."""
    if p["status"] in ("skipped", NO_PROFILES):
        return "%s: %s: %s" % (p["name"], p["status"], p["error"])
    if p["status"] == "failed" and not p["before"]:
        return "%s: FAILED: %s" % (p["name"], p["error"])
    before, after = p["before"], p["after"] or p["before"]
    if check_mode:
        freed = "~" + human_size((p["reclaim"] or {}).get("bytes_freed") or 0)
    else:
        freed = human_size(max(0, total_bytes(before) - total_bytes(after)))
    line = "%s: zombies=%d pruned=%d freed=%s remaining=%d sessions, %d messages" % (
        p["name"], p["zombies_closed"], p["sessions_pruned"], freed, after["sessions"], after["messages"],
    )  # fmt: skip
    if opts is not None:
        line += "; " + summary_details(p, opts)
    line += "".join("; " + words for words in window_words(p.get("window"), check_mode))
    if p["status"] == "failed":
        line += " FAILED: %s" % p["error"]
    return line
