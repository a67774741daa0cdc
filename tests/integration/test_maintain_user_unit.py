"""maintain.yml's window and the Hermes user's own gateway unit.

``hermes gateway install`` makes a ``systemctl --user`` unit, which ``ansible.builtin.service``
run by root cannot find. maintain.yml hands a unit its host's service manager does not know to
the maintenance module's own window (``gateway_service``: a system unit, else the owner's user
unit), so a unit that is neither fails naming ``hermes_gateway_service``. This host has no
systemd: the user unit itself is driven on the fleet's systemd host; here the error path, and
the module's window in maintain.yml through the stop/start commands, beside a REAL 0.22.2
gateway (tests/lib/hermes_gateway.py) on a file the release built.
"""

import time

import pytest
from hermes_gateway import (
    gateway_missing,
    gateway_pid,
    healthy,
    supervised_gateway,
    supervisor_argv,
)
from hermes_markers import release_module_marks
from hermes_reliability import db_problems
from hermes_rollback import RELEASE, make_big_rollback_home

pytestmark = release_module_marks(RELEASE) + [
    pytest.mark.skipif(gateway_missing(RELEASE) is not None, reason=str(gateway_missing(RELEASE)))
]
NO_UNIT = "hermes-ops-no-such-gateway"
# Hermes refuses to open a state.db under pytest (its variable): the playbook runs without it.
ENV = {"PYTEST_CURRENT_TEST": None}


def _extra(home, **more):
    return dict(
        hermes_maintenance_homes=[str(home)], hermes_maintenance_become=False,
        hermes_maintenance_allow_unknown_schema=True, hermes_maintenance_prune_days=7, **more,
    )  # fmt: skip


@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_a_gateway_unit_that_is_neither_system_nor_user_fails_naming_the_variable(ansible_playbook, tmp_path, check):
    home = tmp_path / "home"
    make_big_rollback_home(home, 40, 10, seed=3, now=time.time())
    rc, out = ansible_playbook(
        "playbooks/maintain.yml", extra_vars=_extra(home, hermes_gateway_service=NO_UNIT), env=ENV, check=check
    )
    assert rc != 0, getattr(out, "text", out)
    failed = out.result("Fail when the Hermes user's gateway unit could not be driven")
    assert failed["_status"] == "failed", failed
    msg = failed["msg"]
    assert msg.startswith("hermes_gateway_service: gateway_service %s: " % NO_UNIT), msg
    assert "nor a user unit of root" in msg or "no systemctl on this host" in msg, msg
    print("\n" + msg)
    # the play never tried to stop it as a system service
    stops = out.results("Stop the Hermes gateway for the window")
    assert all(r.get("_status") == "skipped" for r in stops), stops


def test_a_second_user_unit_or_one_beside_the_module_window_is_refused(ansible_playbook, tmp_path):
    home = tmp_path / "home"
    make_big_rollback_home(home, 10, 4, seed=4, now=time.time())
    for extra in (
        _extra(home, hermes_gateway_service=[NO_UNIT, NO_UNIT + "-2"]),
        _extra(home, hermes_gateway_service=NO_UNIT, hermes_maintenance_gateway_service="hermes-gateway"),
        _extra(home, hermes_gateway_service=NO_UNIT, hermes_maintenance_optimize_storage=True),
    ):
        rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra, env=ENV)
        assert rc != 0, getattr(out, "text", out)
        checked = out.result("Check the Hermes user's own gateway unit")
        assert checked["_status"] == "failed" and checked["msg"].startswith("hermes_gateway_service: "), checked


def test_maintain_runs_the_module_window_with_the_stop_and_start_commands(ansible_playbook, tmp_path):
    home = tmp_path / "home"
    db = str(make_big_rollback_home(home, 400, 40, seed=53, now=time.time()))
    with supervised_gateway(home, db) as port:
        pid_before = gateway_pid(home)
        extra = _extra(
            home, hermes_maintenance_gateway_stop_command=supervisor_argv("stop", home),
            hermes_maintenance_gateway_start_command=supervisor_argv("start", home),
        )  # fmt: skip
        rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra, env=ENV, check=True)
        assert rc == 0, getattr(out, "text", out)
        predicted = out.result("Maintain")["profiles"][0]["window"]
        assert predicted["opened"] and "vacuum_full" in predicted["steps"], predicted
        rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra, env=ENV)
        assert rc == 0, getattr(out, "text", out)
        window = out.result("Maintain")["profiles"][0]["window"]
        assert window["opened"] and window["gateway_back"] and "vacuum_full" in window["done"], window
        assert gateway_pid(home) not in (None, pid_before) and healthy(port)
        assert any("service window" in line for line in out.result("Summary")["msg"])
        assert db_problems(db) == []
