# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pytest set-up for the integration tests: real ``ansible-playbook`` runs on localhost.

Paths: like tests/unit/conftest.py, puts ``<repo>/build/collections`` (creating the collection
symlink if missing) and ``<repo>/tests/lib`` on ``sys.path``.

Fixture ``ansible_playbook``::

    rc, out = ansible_playbook(playbook_path, extra_vars=None, check=False, diff=False,
                               env=None, args=(), timeout=900)

runs ``ansible-playbook -i localhost, -c local PLAYBOOK`` with the ansible-playbook next to the
running Python (the .venv's), ``ANSIBLE_COLLECTIONS_PATH=<repo>/build/collections`` and
``ANSIBLE_PYTHON_INTERPRETER`` = the running Python. ``playbook_path`` may be absolute or
relative to the repo root (``"playbooks/maintain.yml"``). ``extra_vars`` is passed as a JSON
file (``-e @file``), so types survive. ``check``/``diff`` add ``--check``/``--diff``; ``env``
entries override the environment (a value of None removes a variable); ``args`` are extra
command-line arguments.

Output: the stdout callback is ``hermes_test_json`` (tests/integration/callback_plugins), which
prints what ``ansible.builtin.default`` prints and writes every task result as JSON. ``out`` is
then a ``PlaybookOutput`` (a dict)::

    {"plays": [{"name": "...", "tasks": [{"name": "...", "action": "...", "uuid": "...",
                "hosts": {"localhost": {<the module result, as `register:` would get it>,
                                        "_status": "ok|changed|failed|skipped|unreachable",
                                        ["_ignored": bool on failures]}}}]}],
     "stats": {"localhost": {"ok": n, "changed": n, "failures": n, "unreachable": n,
                             "skipped": n, "rescued": n, "ignored": n}}}

with helpers ``out.result("task name")`` (that task's result for localhost; the last run of a
task with that name, a role's task of that name where the play has none),
``out.results("task name")`` (all of them), ``out.tasks()`` and
``out.text`` (stdout + stderr, to print on failure). When ansible-playbook stops before the
playbook ends (syntax error, unknown module, bad option) no JSON is written and ``out`` is
the text (a ``str``) instead.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CALLBACK_DIR = Path(__file__).resolve().parent / "callback_plugins"


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import hermes_markers  # noqa: E402
from collection_paths import COLLECTIONS_ROOT, REPO_ROOT  # noqa: E402  (also puts both on sys.path)


def pytest_collection_modifyitems(items):
    hermes_markers.mark_heavy(items)


def _find_ansible_playbook():
    candidates = [
        Path(sys.executable).parent / "ansible-playbook",
        REPO_ROOT / ".venv" / "bin" / "ansible-playbook",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(str(candidate), os.X_OK):
            return str(candidate)
    pytest.fail(f"ansible-playbook not found next to {sys.executable} nor in .venv/bin: run `make setup`")
    return None  # unreachable


class PlaybookOutput(dict):
    """Parsed JSON record of one ansible-playbook run; ``text`` holds stdout + stderr."""

    text = ""

    def tasks(self):
        return [task for play in self.get("plays", []) for task in play.get("tasks", [])]

    def results(self, task_name, host="localhost"):
        """Results of the tasks named ``task_name``; where the play has none, of a role's task of
        that name (recorded as ``ROLE : NAME``)."""
        ran = [t for t in self.tasks() if host in t.get("hosts", {})]
        named = [t for t in ran if t.get("name") == task_name]
        if not named:
            named = [t for t in ran if (t.get("name") or "").endswith(" : " + task_name)]
        return [t["hosts"][host] for t in named]

    def result(self, task_name, host="localhost"):
        found = self.results(task_name, host)
        if not found:
            names = [t.get("name") for t in self.tasks()]
            raise KeyError(f"no result for task {task_name!r} on {host}; tasks run: {names}")
        return found[-1]


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session")
def collections_path():
    return COLLECTIONS_ROOT


@pytest.fixture
def ansible_playbook(tmp_path_factory):
    """Run a playbook on localhost; returns ``(rc, PlaybookOutput | str)``. See module doc."""
    executable = _find_ansible_playbook()

    def run(playbook_path, extra_vars=None, check=False, diff=False, env=None, args=(), timeout=900):
        workdir = tmp_path_factory.mktemp("ansible-playbook")
        playbook = Path(playbook_path)
        if not playbook.is_absolute():
            playbook = REPO_ROOT / playbook
        json_out = workdir / "results.json"

        cmd = [executable, "-i", "localhost,", "-c", "local", str(playbook)]
        if extra_vars:
            vars_file = workdir / "extra_vars.json"
            vars_file.write_text(json.dumps(extra_vars), encoding="utf-8")
            cmd += ["-e", f"@{vars_file}"]
        if check:
            cmd.append("--check")
        if diff:
            cmd.append("--diff")
        cmd += list(args)

        run_env = dict(os.environ)
        run_env.update(
            {
                "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS_ROOT),
                "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
                "ANSIBLE_STDOUT_CALLBACK": "hermes_test_json",
                "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACK_DIR),
                "ANSIBLE_LOCAL_TEMP": str(workdir / "ansible-local-tmp"),
                "ANSIBLE_RETRY_FILES_ENABLED": "0",
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FORCE_COLOR": "0",
                "HERMES_TEST_JSON_OUT": str(json_out),
            }
        )
        for key, value in (env or {}).items():
            if value is None:
                run_env.pop(key, None)
            else:
                run_env[key] = str(value)

        proc = subprocess.run(
            cmd,
            cwd=str(REPO_ROOT),
            env=run_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        text = "$ {}\n{}{}".format(" ".join(cmd), proc.stdout, proc.stderr)
        if json_out.is_file():
            out = PlaybookOutput(json.loads(json_out.read_text(encoding="utf-8")))
            out.text = text
            return proc.returncode, out
        return proc.returncode, text

    return run
