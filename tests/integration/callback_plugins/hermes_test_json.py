# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test-only stdout callback: normal screen output plus a JSON record of every task result.

Used by the ``ansible_playbook`` fixture in tests/integration/conftest.py. ansible-core has
no JSON stdout callback (``ansible.posix.json`` lives in a collection that Galaxy would have
to provide), so this one extends ``ansible.builtin.default``: the screen output is unchanged
and, when the playbook ends, the collected results are written as JSON to the file named by
the environment variable ``HERMES_TEST_JSON_OUT``.
"""

from __future__ import annotations

import copy
import json
import os

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = """
    name: hermes_test_json
    type: stdout
    short_description: default output plus a JSON file of all task results (tests only)
    description:
      - Prints what C(ansible.builtin.default) prints and writes every task result as JSON to the
        file named by E(HERMES_TEST_JSON_OUT) when the playbook ends.
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout callback in configuration
"""


def _raw(result):
    """The result dict of a task result object (ansible-core 2.19 ``.result``, older ``._result``)."""
    raw = getattr(result, "result", None)
    if raw is None:
        raw = getattr(result, "_result", {})
    return raw


def _clean(value):
    """Deep copy without Ansible's internal ``_ansible_*`` keys."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items() if not str(k).startswith("_ansible_")}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return copy.deepcopy(value)


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "hermes_test_json"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._record = {"plays": [], "stats": {}}

    # -- structure ---------------------------------------------------------------------
    def _current_play(self):
        if not self._record["plays"]:
            self._record["plays"].append({"name": "", "tasks": []})
        return self._record["plays"][-1]

    def _task_entry(self, task):
        tasks = self._current_play()["tasks"]
        uuid = getattr(task, "_uuid", None)
        if tasks and tasks[-1].get("uuid") == uuid:
            return tasks[-1]
        entry = {"name": task.get_name(), "action": task.action, "uuid": uuid, "hosts": {}}
        tasks.append(entry)
        return entry

    def _store(self, result, status, **extra):
        raw = _clean(_raw(result))
        raw["_status"] = status
        raw.update(extra)
        # ansible-core 2.19 has public ``host``/``task``; older releases only ``_host``/``_task``
        host = (getattr(result, "host", None) or result._host).get_name()
        task = getattr(result, "task", None) or result._task
        self._task_entry(task)["hosts"][host] = raw

    # -- events --------------------------------------------------------------------------
    def v2_playbook_on_play_start(self, play):
        self._record["plays"].append({"name": play.get_name().strip(), "tasks": []})
        super().v2_playbook_on_play_start(play)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_entry(task)
        super().v2_playbook_on_task_start(task, is_conditional)

    def v2_playbook_on_handler_task_start(self, task):
        self._task_entry(task)
        super().v2_playbook_on_handler_task_start(task)

    def v2_runner_on_ok(self, result):
        self._store(result, "changed" if _raw(result).get("changed") else "ok")
        super().v2_runner_on_ok(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._store(result, "failed", _ignored=bool(ignore_errors))
        super().v2_runner_on_failed(result, ignore_errors=ignore_errors)

    def v2_runner_on_skipped(self, result):
        self._store(result, "skipped")
        super().v2_runner_on_skipped(result)

    def v2_runner_on_unreachable(self, result):
        self._store(result, "unreachable")
        super().v2_runner_on_unreachable(result)

    def v2_playbook_on_stats(self, stats):
        for host in sorted(stats.processed):
            self._record["stats"][host] = stats.summarize(host)
        out = os.environ.get("HERMES_TEST_JSON_OUT")
        if out:
            with open(out, "w", encoding="utf-8") as handle:
                json.dump(self._record, handle, default=str, indent=1, sort_keys=True)
        super().v2_playbook_on_stats(stats)
