# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks of the test harness itself: the ``ansible_playbook`` fixture and the collection path."""

import importlib
import textwrap

PLAYBOOK = textwrap.dedent(
    """\
    - name: Harness check
      hosts: localhost
      gather_facts: false
      tasks:
        - name: Echo the extra vars
          ansible.builtin.debug:
            msg: "{{ {'number': number, 'items': items} }}"

        - name: Write a file
          ansible.builtin.copy:
            content: "hello\\n"
            dest: "{{ dest }}"
            mode: "0644"

        - name: Fail on purpose when asked
          ansible.builtin.fail:
            msg: asked to fail
          when: fail_now | default(false)
    """
)


def _write_playbook(tmp_path):
    path = tmp_path / "harness.yml"
    path.write_text(PLAYBOOK, encoding="utf-8")
    return path


def test_collection_importable_from_build_collections():
    module = importlib.import_module("ansible_collections.hermes_agent.ops")
    assert any(str(p).endswith("ansible_collections/hermes_agent/ops") for p in module.__path__)


def test_playbook_results_are_structured(ansible_playbook, tmp_path):
    dest = tmp_path / "out.txt"
    rc, out = ansible_playbook(
        _write_playbook(tmp_path), extra_vars={"number": 3, "items": ["a", "b"], "dest": str(dest)}
    )
    assert rc == 0, out if isinstance(out, str) else out.text
    assert out.result("Echo the extra vars")["msg"] == {"number": 3, "items": ["a", "b"]}
    assert out.result("Write a file")["_status"] == "changed"
    assert out.result("Fail on purpose when asked")["_status"] == "skipped"
    assert out["stats"]["localhost"]["failures"] == 0
    assert dest.read_text() == "hello\n"


def test_check_and_diff_do_not_write(ansible_playbook, tmp_path):
    dest = tmp_path / "out.txt"
    rc, out = ansible_playbook(
        _write_playbook(tmp_path), extra_vars={"number": 1, "items": [], "dest": str(dest)}, check=True, diff=True
    )
    assert rc == 0, out if isinstance(out, str) else out.text
    result = out.result("Write a file")
    assert result["changed"] is True
    assert result["diff"]  # --diff output is kept in the record
    assert not dest.exists()


def test_failure_is_reported(ansible_playbook, tmp_path):
    rc, out = ansible_playbook(
        _write_playbook(tmp_path),
        extra_vars={"number": 1, "items": [], "dest": str(tmp_path / "x"), "fail_now": True},
    )
    assert rc == 2
    failed = out.result("Fail on purpose when asked")
    assert failed["_status"] == "failed" and failed["msg"] == "asked to fail"
    assert out["stats"]["localhost"]["failures"] == 1


def test_broken_playbook_returns_text(ansible_playbook, tmp_path):
    path = tmp_path / "broken.yml"
    path.write_text("- hosts: localhost\n  tasks:\n    - no_such_module_anywhere: {}\n", encoding="utf-8")
    rc, out = ansible_playbook(path)
    assert rc != 0
    assert isinstance(out, str) and "no_such_module_anywhere" in out
