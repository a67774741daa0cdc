# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Which state.db a restore module writes into, and where it looks for what it restores from.
    DOCUMENTATION = r"""
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
