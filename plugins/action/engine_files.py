# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of hermes_agent.ops.engine_files: the engine's files go to the module in its arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The engine: this collection's own module_utils, the files the role's runner imports.
ENGINE_DIR = Path(__file__).resolve().parent.parent / "module_utils" / "_hermes"
ENGINE_GLOB = "*.py"


def engine_files() -> dict[str, str]:
    """Path in the package ("sqlite/db.py") -> text of every engine file, read on the controller."""
    files = {
        path.relative_to(ENGINE_DIR).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(ENGINE_DIR.rglob(ENGINE_GLOB))
        if "__pycache__" not in path.parts
    }
    if not files:
        raise AnsibleActionFail("no engine files (%s) in %s: the collection is incomplete" % (ENGINE_GLOB, ENGINE_DIR))
    return files


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        del tmp  # unused since ansible-core 2.5
        if "_files" in self._task.args:
            raise AnsibleActionFail("_files is set by the action plugin from the collection's engine, not by the task")
        module_args = dict(self._task.args, _files=engine_files())
        result.update(
            self._execute_module(
                module_name="hermes_agent.ops.engine_files",
                module_args=module_args,
                task_vars=task_vars,
            )
        )
        return result
