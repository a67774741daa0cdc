# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The README's two playbooks (docs/examples/), run as a user would on localhost.

single_server.yml: the dry run (--check --diff) writes nothing and predicts what the real run
then does, profile by profile; the real run also installs the runner (scheduler `none` here:
no crontab of the machine running the tests is touched). fleet/fleet.yml with its
group_vars, the inventory's group `hermes_hosts` holding localhost: the dry run over the role
and maintain.yml writes nothing and predicts every profile. Both are first syntax-checked.
Each is also run with per-source retention (single_server.yml's run now keeps exactly what
maintain.yml keeps) and with a misspelt variable (it fails at once, naming it, nothing written).
Everything lives under tmp_path, for the user running the tests (no become).
"""

import getpass
import hashlib
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
PROFILES = ["default", "work", "research"]
LINE = re.compile(r"^(?P<name>[\w-]+): zombies=(?P<z>\d+) pruned=(?P<p>\d+) freed=")


def make_home(path):
    spec = importlib.util.spec_from_file_location("hermes_demo_home", REPO / "playbooks/files/hermes_demo_home.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([str(path), "--profiles", ",".join(PROFILES), "--sessions", "40", "--force"]) == 0
    return path


def digests(home):
    paths = [home / "state.db"] + sorted(home.glob("profiles/*/state.db"))
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def counts(lines):
    return {m["name"]: (int(m["z"]), int(m["p"])) for m in map(LINE.match, lines) if m}


def local_vars(tmp_path, home):
    """The examples' variables for the user running the tests, all under tmp_path."""
    return {
        "ansible_become": False,
        "hermes_maintenance_become": False,
        "hermes_maintenance_user": getpass.getuser(),
        "hermes_maintenance_homes": [str(home)],
        "hermes_maintenance_install_dir": str(tmp_path / "install"),
        "hermes_maintenance_scheduler": "none",
        "hermes_maintenance_syslog": False,
        "hermes_maintenance_metrics_dir": "",
    }


@pytest.mark.parametrize("playbook", ["single_server.yml", "fleet/fleet.yml"])
def test_syntax(ansible_playbook, tmp_path, playbook):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"hermes_hosts": {"hosts": {"localhost": None}}}))
    rc, out = ansible_playbook(EXAMPLES / playbook, args=("-i", str(inventory), "--syntax-check"))
    assert rc == 0, getattr(out, "text", out)


def test_single_server_dry_run_then_real_run_and_keeps_what_maintain_keeps(ansible_playbook, tmp_path):
    """The dry run writes nothing and predicts the real run; before that real run, on the same
    untouched home, per-source retention reaches the example's run now exactly as it reaches
    maintain.yml (one dry run serves both: the plain selection is the one predicted)."""
    home = make_home(tmp_path / "hermes")
    extra = local_vars(tmp_path, home)
    before = digests(home)

    rc, out = ansible_playbook(EXAMPLES / "single_server.yml", extra_vars=extra, check=True, diff=True)
    assert rc == 0, getattr(out, "text", out)
    assert digests(home) == before
    assert not (tmp_path / "install").exists()
    predicted = counts(out.result("Say what was done, per profile")["msg"])
    assert set(predicted) == set(PROFILES)
    assert any(pruned for _z, pruned in predicted.values())  # 90 days prunes some of the demo's sessions
    plain = selected(
        out.result("Keep the result (session_maintenance_result)")["ansible_facts"]["session_maintenance_result"]
    )
    assert any((s or {}).get("telegram") for s in plain.values())  # 90 days selects some old Telegram chats

    assert_keeps_what_maintain_keeps(ansible_playbook, extra, plain)
    assert digests(home) == before  # the dry runs with per-source retention wrote nothing either

    rc, out = ansible_playbook(EXAMPLES / "single_server.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    assert counts(out.result("Say what was done, per profile")["msg"]) == predicted
    assert out.result("Maintain now (with --check, the exact dry run)")["changed"]
    assert (tmp_path / "install" / "bin" / "hermes-session-maintenance").is_file()
    assert sorted(p.name for p in (home / "backups").iterdir())  # a backup before the first change
    # The run now is the scheduled run started now: its log has it.
    assert "=== Session Maintenance Start ===" in (tmp_path / "install" / "log" / "maintenance.log").read_text()


def test_fleet_dry_run_and_keeps_by_source(ansible_playbook, tmp_path):
    """The fleet's dry run writes nothing and predicts every profile; its maintain.yml run reads
    per-source retention from the same variables as the role (the plain dry run is the one the
    retention is compared with)."""
    home = make_home(tmp_path / "hermes")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"hermes_hosts": {"hosts": {"localhost": None}}}))
    before = digests(home)

    rc, out = ansible_playbook(
        EXAMPLES / "fleet" / "fleet.yml",
        extra_vars=local_vars(tmp_path, home),
        check=True,
        diff=True,
        args=("-i", str(inventory)),
    )
    assert rc == 0, getattr(out, "text", out)
    assert digests(home) == before
    assert not (tmp_path / "install").exists()
    assert set(counts(out.result("Summary")["msg"])) == set(PROFILES)
    runs = {"plain": selected(out.result("Maintain"))}

    extra = dict(local_vars(tmp_path, home), hermes_maintenance_prune_days_by_source={"telegram": 365})
    rc, out = ansible_playbook(
        EXAMPLES / "fleet" / "fleet.yml", extra_vars=extra, check=True, args=("-i", str(inventory))
    )
    assert rc == 0, getattr(out, "text", out)
    runs["telegram"] = selected(out.result("Maintain"))
    telegram = {name: sum((s or {}).get("telegram", 0) for s in run.values()) for name, run in runs.items()}
    assert telegram["telegram"] < telegram["plain"], telegram


def selected(result):
    """Per profile, the sessions the plan selected for the prune, by source."""
    return {p["name"]: (p.get("retention") or {}).get("selected") for p in result["profiles"]}


def assert_keeps_what_maintain_keeps(ansible_playbook, extra, plain):
    """Per-source retention reaches the example's run now exactly as it reaches maintain.yml:
    ``plain``, the example's selection without it, on the same home."""
    extra = dict(extra, hermes_maintenance_prune_days_by_source={"telegram": 365})
    rc, out = ansible_playbook(EXAMPLES / "single_server.yml", extra_vars=extra, check=True)
    assert rc == 0, getattr(out, "text", out)
    example = selected(
        out.result("Keep the result (session_maintenance_result)")["ansible_facts"]["session_maintenance_result"]
    )
    sooner = "Say where Hermes's own auto-prune deletes sooner than the retention asked for"
    (note,) = out.result(sooner)["msg"]  # the demo home has no config.yaml: Hermes's default, 90 days
    assert "sessions.retention_days 90, Hermes default" in note and "(telegram 365d)" in note, note
    assert "set sessions.auto_prune: false in config.yaml" in note and "hermes_maintenance_prune_days" in note, note
    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra, check=True)
    assert rc == 0, getattr(out, "text", out)
    maintain = selected(out.result("Maintain"))
    assert out.result(sooner)["msg"] == [note]
    assert example == maintain
    assert sum((s or {}).get("telegram", 0) for s in example.values()) < sum(
        (s or {}).get("telegram", 0) for s in plain.values()
    )


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("hermes_maintenance_prune_day", "hermes_maintenance_prune_days"),
        ("hermes_maintenance_usr", "hermes_maintenance_user"),
    ],
)
def test_single_server_typo_fails_before_anything_runs(ansible_playbook, tmp_path, typo, meant):
    home = make_home(tmp_path / "hermes")
    before = digests(home)
    extra = dict(local_vars(tmp_path, home), **{typo: 30 if typo.endswith("day") else "hermes"})
    rc, out = ansible_playbook(EXAMPLES / "single_server.yml", extra_vars=extra)
    text = getattr(out, "text", out)
    assert rc != 0, text
    assert f"unknown variable {typo}: did you mean {meant}?" in text
    assert digests(home) == before
    assert not (tmp_path / "install").exists()
    assert not (home / "backups").exists()


@pytest.mark.parametrize("typo", ["hermes_maintenance_prune_day", "hermes_maintenance_usr"])
def test_fleet_typo_fails_before_anything_runs(ansible_playbook, tmp_path, typo):
    home = make_home(tmp_path / "hermes")
    before = digests(home)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"hermes_hosts": {"hosts": {"localhost": None}}}))
    extra = dict(local_vars(tmp_path, home), **{typo: 30 if typo.endswith("day") else "hermes"})
    rc, out = ansible_playbook(EXAMPLES / "fleet" / "fleet.yml", extra_vars=extra, args=("-i", str(inventory)))
    text = getattr(out, "text", out)
    assert rc != 0 and f"unknown variable {typo}: did you mean " in text, text
    assert digests(home) == before and not (tmp_path / "install").exists()


def test_a_run_now_with_maintain_is_logged_and_measured_like_the_scheduled_one(ansible_playbook, tmp_path):
    """Where the role is installed, maintain.yml's run goes to the job's log and metrics file too."""
    home = make_home(tmp_path / "hermes")
    metrics = tmp_path / "metrics"
    extra = dict(local_vars(tmp_path, home), hermes_maintenance_metrics_dir=str(metrics))
    rc, out = ansible_playbook(EXAMPLES / "single_server.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    log = tmp_path / "install" / "log" / "maintenance.log"
    prom = metrics / ("hermes_ops_%s.prom" % getpass.getuser())
    assert log.read_text().count("=== Session Maintenance Start ===") == 1 and prom.is_file()
    first = prom.read_text()

    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra, check=True)
    assert rc == 0, getattr(out, "text", out)
    assert log.read_text().count("=== Session Maintenance Start === (dry run)") == 1
    assert prom.read_text() == first  # a dry run writes no metrics

    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    text = log.read_text()
    assert text.count("=== Session Maintenance Start ===") == 3, text
    assert all(line.split(" ", 1)[1] in text for line in out.result("Summary")["msg"])  # its lines, as printed
    assert prom.read_text() != first and "hermes_ops_last_run_sessions_pruned" in prom.read_text()


@pytest.mark.parametrize("check", [True, False])
def test_single_server_reports_a_failed_profile_after_its_summary(ansible_playbook, tmp_path, check):
    home = make_home(tmp_path / "hermes")
    broken = home / "profiles" / "broken"
    broken.mkdir()
    (broken / "state.db").write_bytes(b"not a database\n")
    rc, out = ansible_playbook(EXAMPLES / "single_server.yml", extra_vars=local_vars(tmp_path, home), check=check)
    assert rc != 0, getattr(out, "text", out)
    lines = out.result("Say what was done, per profile")["msg"]
    assert set(counts(lines)) == set(PROFILES)  # the others were maintained (or predicted)
    assert any(line.startswith("broken: FAILED") for line in lines), lines
    said = out.result("Fail when maintenance failed")["msg"]
    assert said.startswith("maintenance failed on localhost: "), said
    # check mode: the module's message names the profile; a run: the runner's summary line did
    assert ("broken (" in said) if check else said.endswith("its summary line above says why"), said
