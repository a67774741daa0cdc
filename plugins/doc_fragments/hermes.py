# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Where the databases are, and the selection thresholds shared by both modules.
    DOCUMENTATION = r"""
options:
  # BEGIN GENERATED: options (scripts/generate.py, from plugins/module_utils/_hermes/options.py)
  hermes_home:
    description:
      - Hermes homes to work on. Each home's C(state.db) is profile C(default); each C(profiles/<name>/state.db) below
        it is profile C(<name>).
      - Defaults to C(~/.hermes) of the user the module runs as.
    type: list
    elements: path
  profiles:
    description:
      - Names of the profiles to include. All profiles when omitted.
    type: list
    elements: str
  zombie_days:
    description:
      - An open session (no C(ended_at)) idle for longer than this many days is a zombie.
      - Idle time counts from the latest of C(last_activity_at), the newest message and C(started_at).
    type: float
    default: 1
  prune_days:
    description:
      - An ended session whose last activity is older than this many days is pruned.
      - The default, 90, is the retention of Hermes's own auto-prune, so a session goes no sooner than Hermes itself
        would delete it. The monthly C(session-maintenance.sh) this replaces pruned at 7 (set 7 for that).
    type: float
    default: 90
  prune_days_by_source:
    description:
      - Retention in days for the sessions of some sources, a mapping of source to days (cron to 3 and telegram to
        365, say); the sessions of every other source take O(prune_days). Each value is like O(prune_days) (a number,
        not below O(zombie_days)), and every rule that protects a session still applies.
      - A delegate (subagent) takes the retention of the session it works for, and goes with it when that one is
        pruned; a compression lineage stays while any of its sessions is younger than its own retention.
    type: dict
  prune_days_by_profile:
    description:
      - Retention for some profiles, a mapping of profile name to days (work to 30, say) or to a mapping with
        C(prune_days) and/or C(prune_days_by_source), for a profile that keeps a year but its cron sessions 3 days;
        what a profile's entry leaves out it takes from O(prune_days) and O(prune_days_by_source).
      - The same checks apply as to those two, and the summary line says which retention applied.
    type: dict
  zombie_sources:
    description:
      - Session sources whose zombies may be closed. Messaging platforms (telegram, discord, slack, ...) are left out
        on purpose, as Hermes does, because closing them makes the gateway start a new conversation in a live chat.
    type: list
    elements: str
    default: [cli, cron, kanban, acp, api_server, subagent, tool, recovered]
  backup_dir:
    description:
      - Where backups are written and looked up. Defaults to C(HOME/backups) of each home.
      - Must be a real directory owned by the owner of C(state.db) and not writable by others.
    type: path
  # END GENERATED
"""

    ATTRIBUTES = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details:
      - Opens every database read-only and creates no file (no backup, no lock file, no WAL).
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details:
      - Shows each profile's counts and sizes before and after.
  idempotent:
    description: Run twice in a row outside check mode with the same arguments, the second run reports no change.
    support: full
    details:
      - A second run on unchanged data reports no change.
"""
