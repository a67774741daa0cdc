# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An operator's first apply is quiet and its dry run short (root only; CI runs as root).

Real ``ansible-playbook`` runs of playbooks/schedule.yml, with the role's defaults but the
user, its home and its own directory, for the test user ``hermes-ops-i37q``, on whichever
ansible-core runs the tests (CI runs them on the oldest and the newest it supports):

* the first ``--check --diff`` is under 300 lines with under 100 diff lines (each engine file
  and each directory is named, not diffed line by line; the checks share tasks), then the apply, a second apply
  and ``absent`` print no ``[WARNING]`` and no
  ``[DEPRECATION WARNING]`` (no ``bool`` coercing the ``null`` defaults, no find on a path that
  is not there yet);
* so do the playbooks ``maintain.yml`` (check mode and real) and ``report.yml``;
* an engine option written without its prefix fails the apply naming the variable meant.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
from hermes_role_host import RoleHost, role_host

pytestmark = pytest.mark.managed_node

USER = "hermes-ops-i37q"
LIB = Path("/usr/local/lib/hermes-ops") / USER
ETC = Path("/etc/hermes-ops") / USER
MAX_DIFF_LINES = 100
MAX_CHECK_DIFF_LINES = 300

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 120, "ended_days_ago": 119, "messages": 3},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def _remove_everything():
    for path in (LIB, ETC):
        shutil.rmtree(str(path), ignore_errors=True)
    if shutil.which("crontab"):
        subprocess.run(["crontab", "-r", "-u", USER], capture_output=True, check=False)


@pytest.fixture
def host():
    with role_host(RoleHost, USER, SPECS, _remove_everything) as h:
        yield h


def _defaults(h, **extra):
    """The role's defaults but for what locates this user's home (and cron when there is none)."""
    variables = {
        "hermes_maintenance_user": USER,
        "hermes_maintenance_homes": [str(h.hermes)],
        "hermes_maintenance_install_dir": str(h.data),
    }
    if not shutil.which("crontab"):
        variables["hermes_maintenance_scheduler"] = "none"
    return dict(variables, **extra)


def _quiet(rc, out):
    text = getattr(out, "text", out)
    assert rc == 0, text
    warnings = [line for line in text.splitlines() if "WARNING]" in line]
    assert warnings == [], text
    return text


def test_first_check_diff_is_short_and_every_run_is_quiet(ansible_playbook, host, tmp_path):
    h = host
    text = _quiet(*ansible_playbook("playbooks/schedule.yml", extra_vars=_defaults(h), check=True, diff=True))
    lines = text.splitlines()[1:]  # the command line the fixture puts first
    diff = [line for line in lines if line[:1] and line[:1] in "+-@" and not line.startswith("--check")]
    print("first --check --diff of the role: %d lines, %d of them diff lines" % (len(lines), len(diff)))
    # The diffs: the wrapper, the config, the marker files, the crontab line; the engine's and
    # the trust check's files and the directories are named, not shown (7,646 lines before).
    assert len(diff) < MAX_DIFF_LINES, text
    # The rest is one TASK header and status per task: one stat for every path the checks look
    # at, one assert per stage, loops where tasks differed only in their path (260 lines, 73 of
    # them diff lines, 40 tasks when this was written).
    assert len(lines) < MAX_CHECK_DIFF_LINES, text
    assert "maintain/run.py" in text  # each engine file is still named
    assert not LIB.exists()

    try:
        _quiet(*ansible_playbook("playbooks/schedule.yml", extra_vars=_defaults(h)))
        _quiet(*ansible_playbook("playbooks/schedule.yml", extra_vars=_defaults(h), diff=True))
        extra = _defaults(h)
        _quiet(*ansible_playbook("playbooks/maintain.yml", extra_vars=extra, check=True))
        _quiet(*ansible_playbook("playbooks/maintain.yml", extra_vars=extra))
        # Both runs are in the scheduled job's log, written as the Hermes user.
        log = h.data / "log" / "maintenance.log"
        assert log.read_text().count("=== Session Maintenance Start ===") == 2 and log.stat().st_uid == h.uid
        report = {"hermes_report_markdown": str(tmp_path / "r.md"), "hermes_report_csv": str(tmp_path / "r.csv")}
        _quiet(*ansible_playbook("playbooks/report.yml", extra_vars=dict(extra, **report)))
    finally:
        _quiet(*ansible_playbook("playbooks/schedule.yml", extra_vars=_defaults(h, hermes_maintenance_state="absent")))


@pytest.mark.parametrize("how", ["vars", "play_vars", "role_param", "include_role"])
def test_an_engine_option_without_its_prefix_fails_the_apply(ansible_playbook, host, tmp_path, how):
    h = host
    playbook = tmp_path / "site.yml"
    role = "hermes_agent.ops.session_maintenance"
    name = "zombie_days" if how == "play_vars" else "prune_days"
    play_vars = "  vars:\n    zombie_days: 2\n" if how == "play_vars" else ""
    if how.startswith("include_role"):
        # include_role takes the role's arguments in its vars:, checked against the argument specs too.
        body = "  tasks:\n    - ansible.builtin.include_role:\n        name: %s\n" % role
        body += "      vars:\n        prune_days: 90\n"
    else:
        entry = {
            "vars": "    - role: %s\n      vars:\n        prune_days: 90\n" % role,
            "play_vars": "    - role: %s\n" % role,
            "role_param": "    - role: %s\n      prune_days: 90\n" % role,
        }[how]
        body = "  roles:\n%s" % entry
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n%s%s" % (play_vars, body))
    rc, out = ansible_playbook(str(playbook), extra_vars=_defaults(h))
    text = getattr(out, "text", out)
    assert rc != 0, text
    # A role parameter passes Ansible's own check of the role's arguments (the bare names are
    # declared there as "not a role variable") and fails the role's first task as the rest do.
    assert "Unsupported parameters" not in text, text
    expected = "%s is not a variable of the role: its variables carry the prefix hermes_maintenance_ (write %s)"
    assert expected % (name, "hermes_maintenance_" + name) in text, text
    assert not LIB.exists()
