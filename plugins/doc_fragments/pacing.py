# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # How long a module waits for a lock Hermes holds: every module that reads a live state.db.
    DOCUMENTATION = r"""
options:
  # BEGIN GENERATED: busy-timeout (scripts/generate.py, from plugins/module_utils/_hermes/options.py)
  busy_timeout:
    description:
      - Seconds to wait for a lock held by Hermes before giving up on the profile (it is skipped; the next run takes
        it up again).
    type: float
    default: 5
  # END GENERATED
"""

    # The pause between the paced write transactions of the modules that write beside a live gateway.
    BATCH_PAUSE = r"""
options:
  # BEGIN GENERATED: batch-pause (scripts/generate.py, from plugins/module_utils/_hermes/options.py)
  batch_pause:
    description:
      - Seconds to pause between transactions, so that a live gateway's writes get the lock.
      - A waiting writer polls the lock every 25 ms or more, so a pause shorter than that can starve it.
    type: float
    default: 0.03
  # END GENERATED
"""
