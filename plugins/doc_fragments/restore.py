# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Which state.db a restore module writes into, where it looks for what it restores from, and
    # what its attributes mean (each module says how far it supports them).
    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full  # a restore is planned in check mode before it runs (playbooks/restore.yml)
  diff_mode:
    description:
      - Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    description:
      - When run twice in a row outside check mode, with the same arguments, the second invocation indicates no
        change.
options:
  hermes_home:
    description:
      - The Hermes home the profile belongs to.
    type: path
    required: true
  profile:
    description:
      - V(default) restores into C(HOME/state.db); any other name into C(HOME/profiles/<name>/state.db).
    type: str
    default: default
  backup_dir:
    description:
      - Where the backups and archives written by M(hermes_agent.ops.session_maintenance) are. Defaults to
        C(HOME/backups).
    type: path
"""
