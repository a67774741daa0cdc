# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The main playbook says nothing but its results: under whatever ansible-core runs the tests
(the controller venv's, and each core of the controller matrix) maintain.yml --check and a real
run print no ``[WARNING]`` and no ``[DEPRECATION WARNING]`` (a deprecated keyword or module option
of ours, a core version the collection's ``requires_ansible`` does not admit, an interpreter
discovered rather than given) on ansible-core's own output, its default callback."""

import importlib.util
import re
from pathlib import Path

import pytest
from ansible.release import __version__ as ansible_version

REPO = Path(__file__).resolve().parents[2]
WARNING = re.compile(r"\[(?:DEPRECATION )?WARNING\]")


def demo_home(path):
    spec = importlib.util.spec_from_file_location(
        "hermes_demo_home", REPO / "playbooks" / "files" / "hermes_demo_home.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([str(path), "--profiles", "default,work", "--sessions", "10", "--force"]) == 0
    return path


@pytest.mark.parametrize("check", [True, False], ids=["check", "real"])
def test_maintain_prints_no_warning(ansible_playbook, tmp_path, check):
    home = demo_home(tmp_path / "hermes")
    extra = {"hermes_maintenance_homes": [str(home)], "hermes_maintenance_become": False}
    rc, text = ansible_playbook(
        "playbooks/maintain.yml",
        extra_vars=extra,
        check=check,
        # ansible-core's own callback and its warnings as a user sees them
        env={
            "ANSIBLE_STDOUT_CALLBACK": "default",
            "ANSIBLE_DEPRECATION_WARNINGS": "1",
            "ANSIBLE_CALLBACK_PLUGINS": None,
        },
    )
    assert rc == 0, text
    assert isinstance(text, str)
    assert "ok=" in text and "failed=0" in text, text  # the recap: the play ran to its end
    warnings = [line for line in text.splitlines() if WARNING.search(line)]
    assert not warnings, f"ansible-core {ansible_version}: {warnings}\n{text}"
