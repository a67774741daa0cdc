# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An operator's mistakes, each a real ansible-playbook run: the play fails before it changes
anything, with a message that names the variable to change (or the run reports the right
status). The cases: a misspelt variable, a value the engine refuses, a mistyped
or parent home, the database file given as the home, restore.yml without a chosen host.
Everything lives under tmp_path and belongs to the user running the tests."""

import getpass
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from hermes_reliability import chown_tree, user_with_dir

from hermes_fixtures import build_home, layout_available, missing_venv_message, standard_scenario

LAYOUT = "hermes-0.22.2.post1"  # written by Hermes's own SessionDB


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    if not layout_available(LAYOUT):
        pytest.skip(missing_venv_message(LAYOUT))
    home = tmp_path_factory.mktemp("mistakes") / "hermes"
    build_home(home, LAYOUT, standard_scenario(LAYOUT)[0])
    return home


def digests(home):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(home.rglob("state.db"))}


def role_vars(tmp_path, home, **extra):
    values = {
        "hermes_maintenance_homes": [str(home)],
        "hermes_maintenance_become": False,
        "hermes_maintenance_user": getpass.getuser(),
        "hermes_maintenance_install_dir": str(tmp_path / "install"),
        "hermes_maintenance_scheduler": "none",
        "hermes_maintenance_metrics_dir": "",
        "hermes_maintenance_syslog": False,
    }
    values.update(extra)
    return values


def failure(rc, out):
    """The message of the task that failed the play."""
    assert rc == 2, getattr(out, "text", out)
    failed = [h for t in out.tasks() for h in t["hosts"].values() if h["_status"] == "failed" and not h.get("_ignored")]
    assert len(failed) == 1, out.text
    return failed[0]["msg"]


# (playbook, variables (a function of tmp_path and home), the message's words)
CASES = {
    "misspelt variable": (
        "playbooks/maintain.yml",
        lambda tmp, home: {"hermes_maintenance_homes": [str(home)], "hermes_maintenance_prune_day": 90},
        "unknown variable hermes_maintenance_prune_day: did you mean hermes_maintenance_prune_days?",
    ),
    "negative prune_days (role)": (
        "playbooks/schedule.yml",
        lambda tmp, home: role_vars(tmp, home, hermes_maintenance_prune_days=-1),
        "hermes_maintenance_prune_days must not be negative",
    ),
    "zombie_days above prune_days": (
        "playbooks/maintain.yml",
        lambda tmp, home: {
            "hermes_maintenance_homes": [str(home)],
            "hermes_maintenance_zombie_days": 10,
            "hermes_maintenance_prune_days": 5,
        },
        "hermes_maintenance_zombie_days (10.0) is larger than hermes_maintenance_prune_days (5.0)",
    ),
    "not a number": (  # the role's argument specs catch this one; maintain.yml has none
        "playbooks/maintain.yml",
        lambda tmp, home: {"hermes_maintenance_homes": [str(home)], "hermes_maintenance_batch_size": "lots"},
        "hermes_maintenance_batch_size must be an integer (got 'lots')",
    ),
    "a stop command without its start (role)": (
        "playbooks/schedule.yml",
        lambda tmp, home: role_vars(tmp, home, hermes_maintenance_gateway_stop_command=["/usr/bin/s6-svc", "-d"]),
        "hermes_maintenance_gateway_stop_command and hermes_maintenance_gateway_start_command go together",
    ),
    "a command line for an argv list (maintain)": (
        "playbooks/maintain.yml",
        lambda tmp, home: {
            "hermes_maintenance_homes": [str(home)],
            "hermes_maintenance_gateway_stop_command": "/usr/bin/supervisorctl stop hermes",
            "hermes_maintenance_gateway_start_command": "/usr/bin/supervisorctl start hermes",
        },
        "hermes_maintenance_gateway_stop_command: '/usr/bin/supervisorctl stop hermes' is a command line",
    ),
    "mistyped home (role)": (
        "playbooks/schedule.yml",
        lambda tmp, home: role_vars(tmp, home, hermes_maintenance_homes=[str(tmp / ".hermse")]),
        "hermes_maintenance_homes: {tmp}/.hermse does not exist on localhost",
    ),
    "parent of the home (maintain)": (
        "playbooks/maintain.yml",
        lambda tmp, home: {"hermes_maintenance_homes": [str(home.parent)]},
        "hermes_maintenance_homes: {home.parent} on localhost has no state.db in it or under profiles/",
    ),
    "the database file as the home": (
        "playbooks/maintain.yml",
        lambda tmp, home: {"hermes_maintenance_homes": str(home / "state.db")},  # a string: a list of one
        "hermes_maintenance_homes: {home}/state.db is the database file; give its home, {home}",
    ),
    "misspelt restore variable": (
        "playbooks/restore.yml",
        lambda tmp, home: {
            "hermes_restore_home": str(home),
            "hermes_restore_hosts": "localhost",
            "hermes_restore_profil": "work",
        },
        "unknown variable hermes_restore_profil: did you mean hermes_restore_profile?",
    ),
    "restore without a chosen host": (
        "playbooks/restore.yml",
        lambda tmp, home: {"hermes_restore_home": str(home)},
        "restore.yml replaces state.db on every host it runs on: choose the host with -l HOST",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mistake_fails_the_play_naming_the_variable(ansible_playbook, tmp_path, home, case):
    playbook, make_vars, words = CASES[case]
    before = digests(home)
    extra = dict({"hermes_maintenance_become": False}, **make_vars(tmp_path, home))
    msg = failure(*ansible_playbook(playbook, extra_vars=extra))
    assert msg.startswith(words.format(tmp=tmp_path, home=home)), msg
    assert digests(home) == before
    assert not (tmp_path / "install").exists()  # the role stopped before it installed anything
    assert not (tmp_path / ".hermse").exists()


def test_restore_on_several_hosts_asks_for_confirmation(ansible_playbook, home):
    extra = {"hermes_restore_home": str(home), "hermes_maintenance_become": False}
    rc, out = ansible_playbook("playbooks/restore.yml", extra_vars=extra, args=("-i", "otherhost,", "-l", "all"))
    assert rc == 2, getattr(out, "text", out)
    msgs = {h["msg"] for t in out.tasks() for h in t["hosts"].values() if h["_status"] == "failed"}
    assert msgs == {
        "restore.yml would replace state.db on 2 hosts (localhost, otherhost): "
        "add -e hermes_restore_confirm=true if that is meant"
    }, msgs


def test_restore_error_names_the_profiles_file(ansible_playbook, home):
    extra = {"hermes_restore_home": str(home), "hermes_restore_profile": "broken", "hermes_maintenance_become": False}
    msg = failure(*ansible_playbook("playbooks/restore.yml", extra_vars=extra, check=True, args=("-l", "localhost")))
    assert msg.startswith("restore of %s: no backup of profile broken" % (home / "profiles" / "broken" / "state.db"))


def test_empty_home_allowed_then_absent_after_the_user_was_deleted(ansible_playbook, tmp_path):
    """hermes_maintenance_allow_empty_homes: a host where Hermes is not set up yet applies, with
    nothing created under the home, and the scheduled run says no_profiles (exit 3). Then absent,
    with the user deleted first: the system layout under /etc/hermes-ops/USER and the user's
    metrics file go all the same; the metrics directory the role made goes once nothing else is
    in it, else it stays root's."""
    user = "hermes-ops-i22-%d" % os.getpid()  # unique: xdist workers, other engineers
    lib, etc = Path("/usr/local/lib/hermes-ops") / user, Path("/etc/hermes-ops") / user
    with user_with_dir(user, user + "-") as (uid, gid, base):
        try:
            (base / "home").mkdir()
            chown_tree(base / "home", uid, gid)
            hermes = base / "home" / ".hermes"  # Hermes is not set up yet
            metrics = tmp_path / "textfile"
            extra = {
                "hermes_maintenance_user": user,
                "hermes_maintenance_homes": [str(hermes)],
                "hermes_maintenance_allow_empty_homes": True,
                "hermes_maintenance_install_dir": str(base / "home" / "data"),
                "hermes_maintenance_scheduler": "none",
                "hermes_maintenance_syslog": False,
                "hermes_maintenance_metrics_dir": str(metrics),
                "hermes_maintenance_become": False,
            }
            rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=extra)
            assert rc == 0, getattr(out, "text", out)
            # the directory the role made is root's; the one file there the user may write is its own
            assert (etc / "maintenance.json").is_file() and metrics.stat().st_gid == 0
            assert (metrics / ("hermes_ops_%s.prom" % user)).stat().st_uid == uid
            assert not hermes.exists()
            proc = subprocess.run([str(lib / "bin" / "hermes-session-maintenance"), "--allow-root"],
                                  capture_output=True, text=True, check=False)  # fmt: skip
            assert proc.returncode == 3, proc.stdout + proc.stderr
            assert "default: no_profiles: no state.db under %s" % hermes in proc.stdout, proc.stdout
            assert not hermes.exists()
            subprocess.run(["userdel", user], check=True)
            rc, out = ansible_playbook(
                "playbooks/schedule.yml", extra_vars=dict(extra, hermes_maintenance_state="absent")
            )
            assert rc == 0, getattr(out, "text", out)
            assert not lib.exists() and not etc.exists()
            assert not (metrics / ("hermes_ops_%s.prom" % user)).exists()
            if metrics.exists():  # the role made it; the run as root above left its own file there
                assert metrics.stat().st_gid == 0 and set(os.listdir(str(metrics))) - {".hermes-ops-created"}
        finally:
            subprocess.run(["userdel", user], capture_output=True, check=False)
            subprocess.run(["rm", "-rf", str(lib), str(etc)], check=False)
