"""The modules through real ansible-playbook runs on localhost."""

import hashlib
import os
import sqlite3

from hermes_fixtures import build_home, layout_available, standard_scenario

HERE = os.path.dirname(os.path.abspath(__file__))


def scenario_home(tmp_path):
    layout = "hermes-0.19.0" if layout_available("hermes-0.19.0") else "v30"
    specs, expected = standard_scenario(layout)
    build_home(str(tmp_path), layout, specs)
    build_home(str(tmp_path), "v30", standard_scenario("v30")[0], profile="work")
    return str(tmp_path), expected


def test_four_steps(ansible_playbook, tmp_path):
    home, expected = scenario_home(tmp_path)
    rc, out = ansible_playbook(os.path.join(HERE, "playbooks", "four_step.yml"), extra_vars={"test_home": home})
    assert rc == 0, getattr(out, "text", out)
    real = out.result("Real run")
    default = [p for p in real["profiles"] if p["name"] == "default"][0]
    assert default["sessions_pruned"] == len(expected["pruned"])
    assert default["zombies_closed"] == len(expected["zombies"])
    ids = {r[0] for r in sqlite3.connect(os.path.join(home, "state.db")).execute("SELECT id FROM sessions")}
    assert ids == expected["kept"]


def test_check_mode_changes_no_byte(ansible_playbook, tmp_path):
    home = scenario_home(tmp_path)[0]
    db = os.path.join(home, "state.db")
    before = hashlib.sha256(open(db, "rb").read()).hexdigest()
    files = sorted(os.listdir(home))
    rc, out = ansible_playbook(
        os.path.join(HERE, "playbooks", "four_step.yml"), extra_vars={"test_home": home}, check=True
    )
    # Under --check every step is a dry run, so the assertions on real runs fail; the
    # point here is that nothing on disk moved.
    assert hashlib.sha256(open(db, "rb").read()).hexdigest() == before
    assert sorted(os.listdir(home)) == files
    assert out.result("Check mode predicts")["changed"] is True


def test_broken_profile_fails_the_task_others_maintained(ansible_playbook, tmp_path):
    home = scenario_home(tmp_path)[0]
    broken = tmp_path / "profiles" / "broken"
    broken.mkdir(parents=True)
    (broken / "state.db").write_bytes(b"garbage" * 100)
    rc, out = ansible_playbook(os.path.join(HERE, "playbooks", "failing_profile.yml"), extra_vars={"test_home": home})
    assert rc == 0, getattr(out, "text", out)
    failed = out.result("Maintain a home with a broken profile")
    assert failed["_status"] == "failed" and failed["failed_profiles"] == ["broken"]


def test_metrics_dir_writes_the_textfile_after_a_real_run(ansible_playbook, tmp_path):
    home, expected = scenario_home(tmp_path / "hermes")
    metrics_dir = tmp_path / "textfile"
    metrics_dir.mkdir()
    extra = {"test_home": home, "test_metrics_dir": str(metrics_dir)}
    rc, out = ansible_playbook(os.path.join(HERE, "playbooks", "metrics.yml"), extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    (prom,) = list(metrics_dir.iterdir())  # one file, from the real run only
    assert prom.name.startswith("hermes_ops_") and prom.name.endswith(".prom")
    assert oct(prom.stat().st_mode & 0o777) == "0o644"
    text = prom.read_text()
    labels = '{home="%s",profile="default"}' % home
    assert "hermes_ops_last_run_sessions_pruned%s %d\n" % (labels, len(expected["pruned"])) in text
    sessions = sqlite3.connect(os.path.join(home, "state.db")).execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    assert "hermes_ops_sessions%s %d\n" % (labels, sessions) in text
    missing = out.result("Missing metrics directory")
    assert missing["_status"] in ("ok", "changed")
    assert any("cannot write metrics to" in w and "does not exist" in w for w in missing.get("warnings", []))
