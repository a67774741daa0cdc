# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role applied with privilege: the agent cannot rewrite its own maintenance, and root
never runs code the agent can change (root only; CI runs as root).

Real ``ansible-playbook`` runs of playbooks/schedule.yml for the test user ``hermes-ops-i16``
(created when absent), whose Hermes home and own directory live in a fresh directory:

* the engine, the wrapper and the config are root's; as the Hermes user, writing to any of
  them, or adding a file next to them, fails; the user can still run the wrapper;
* files the user plants where it can write (a ``hermes_ops`` package in the working
  directory and on PYTHONPATH, ``sitecustomize.py``, ``usercustomize.py``, a ``.pth`` in its
  user site-packages, PYTHONSTARTUP) are imported by the old way of starting the runner
  (the control) but never when root runs the wrapper from the user's home;
* root is refused before any Python starts, unless ``--allow-root``; then only with an
  interpreter and an engine that are root's alone; the role refuses an interpreter the
  user can change;
* the trust check follows every symlink and directory on the way (root-owned only, writable
  by no one else);
* an old per-user install is replaced (engine, wrapper, config gone; log and backups kept),
  and ``state: absent`` removes both layouts but never the backups.
"""

import json
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from hermes_reliability import REPO_ROOT, chown_tree
from hermes_role_host import RoleHost, role_host

# What the role installs on the host does not depend on the controller's Python.
pytestmark = pytest.mark.managed_node

USER = "hermes-ops-i16"
LIB = Path("/usr/local/lib/hermes-ops") / USER
ETC = Path("/etc/hermes-ops") / USER
WRAPPER = LIB / "bin" / "hermes-session-maintenance"
CONFIG = ETC / "maintenance.json"
CRON_NAME = f"#Ansible: hermes_agent.ops session maintenance ({USER})"
PLANTED = ("hermes_ops", "sitecustomize", "usercustomize", "pth", "startup")

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3, "transcripts": True},
    {"id": "zombie", "source": "cli", "started_days_ago": 3, "messages": 2, "last_message_days_ago": 2},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def _crontab(user):
    proc = subprocess.run(["crontab", "-l", "-u", user], capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else ""


def _remove_everything():
    for path in (LIB, ETC):
        shutil.rmtree(str(path), ignore_errors=True)
    if shutil.which("crontab"):
        subprocess.run(["crontab", "-r", "-u", USER], capture_output=True, check=False)


@pytest.fixture
def host():
    with role_host(RoleHost, USER, SPECS, _remove_everything, profiles=(None, "work")) as h:
        yield h


def _apply(ansible_playbook, h, **extra):
    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=h.vars(**extra))
    assert rc == 0, getattr(out, "text", out)
    return out


def cron_daemon_running():
    """A process named cron, crond or cronie runs on this machine (read from /proc)."""
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() in ("cron", "crond", "cronie"):
                return True
        except OSError:
            continue  # the process ended meanwhile
    return False


def _ls(path):
    st = os.lstat(str(path))
    return (stat.filemode(st.st_mode), pwd.getpwuid(st.st_uid).pw_name, st.st_gid)


def _user_python_site(h, python="/usr/bin/python3"):
    version = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return h.home / ".local" / "lib" / f"python{version}" / "site-packages"


def _plant(h):
    """Files that write a marker when imported, wherever the Hermes user can write."""

    def code(name):
        return f"open({str(h.markers / name)!r}, 'w').write('imported')\n"

    pkg = h.home / "hermes_ops"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(code("hermes_ops"))
    (pkg / "runner.py").write_text(code("hermes_ops") + "def main(argv=None):\n    return 0\n")
    (h.home / "sitecustomize.py").write_text(code("sitecustomize"))
    (h.home / "startup.py").write_text(code("startup"))
    site = _user_python_site(h)
    site.mkdir(parents=True)
    (site / "usercustomize.py").write_text(code("usercustomize"))
    (site / "hermes-planted.pth").write_text("import os; " + code("pth"))
    chown_tree(h.home, h.uid, h.gid)


def _planted_env(h):
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(h.home),
        "PYTHONPATH": str(h.home),
        "PYTHONSTARTUP": str(h.home / "startup.py"),
        "PYTHONUSERBASE": str(h.home / ".local"),
    }


def _markers(h):
    return sorted(os.listdir(str(h.markers)))


def _run_wrapper(h, env, *args, **run_options):
    """The installed wrapper, started from the user's home with ``env`` (the planted one)."""
    return subprocess.run(
        [str(WRAPPER), *args], cwd=str(h.home), env=env, capture_output=True, text=True, check=False, **run_options
    )


def test_engine_wrapper_and_config_are_roots_and_the_user_cannot_write_them(ansible_playbook, host):
    h = host
    _apply(ansible_playbook, h, hermes_maintenance_scheduler="hermes")
    package = LIB / "lib" / "hermes_ops"
    engine = sorted(package.rglob("*.py"))
    layers = sorted(p for p in package.rglob("*") if p.is_dir())
    assert {p.relative_to(package).as_posix() for p in engine} >= {"__init__.py", "maintain/run.py", "runner.py"}
    assert {"sqlite", "maintain"} <= {p.name for p in layers}
    for path in [LIB, LIB / "lib", LIB / "lib" / "hermes_ops", LIB / "bin", *layers]:
        assert _ls(path) == ("drwxr-xr-x", "root", 0), path
    for path in engine:
        assert _ls(path) == ("-rw-r--r--", "root", 0), path
    for path in [WRAPPER, LIB / "bin" / "hermes-ops-trusted-path"]:
        assert _ls(path) == ("-rwxr-xr-x", "root", 0), path
    assert _ls(ETC) == ("drwxr-xr-x", "root", 0)
    assert _ls(CONFIG) == ("-rw-r-----", "root", h.gid)
    config = json.loads(CONFIG.read_text())
    assert config["hermes_home"] == [str(h.hermes)] and "sessions" not in json.dumps(config)
    # What the runner writes as the user stays the user's.
    for path in [h.data, h.data / "log", h.hermes / "backups"]:
        assert _ls(path) == ("drwx------", USER, h.gid), path
    assert config["log_file"] == str(h.data / "log" / "maintenance.log")

    attempts = [f"open({str(p)!r}, 'a')" for p in [*engine, WRAPPER, CONFIG]]
    attempts += [f"open({str(d / 'planted.py')!r}, 'w')" for d in [package, *layers, LIB / "bin", ETC]]
    attempts += [f"os.rename({str(CONFIG)!r}, {str(CONFIG)!r} + '.old')", f"os.chmod({str(WRAPPER)!r}, 0o777)"]
    for attempt in attempts:
        proc = subprocess.run(
            ["/usr/bin/python3", "-c", f"import os\ntry:\n {attempt}\nexcept PermissionError:\n raise SystemExit(13)"],
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
            **h.as_user(),
        )
        assert proc.returncode == 13, (attempt, proc.stdout, proc.stderr)
    assert not (LIB / "lib" / "hermes_ops" / "planted.py").exists()

    # The user still runs its maintenance: the Hermes-cron launcher starts the root-owned wrapper.
    launcher = h.hermes / "scripts" / "hermes-ops-session-maintenance.sh"
    assert _ls(launcher)[1] == USER
    assert f"exec {WRAPPER} " in launcher.read_text()
    run = subprocess.run(
        ["bash", str(launcher), "--dry-run"],
        cwd=str(launcher.parent),
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(h.home)},
        **h.as_user(),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "=== Session Maintenance Start ===", run.stdout
    assert " pruned=1 " in run.stdout

    # A re-apply copies back exactly the engine files that differ from the collection's (one
    # changed, one with another mode) and leaves the others alone.
    source = REPO_ROOT / "plugins" / "module_utils" / "_hermes"
    with open(str(LIB / "lib" / "hermes_ops" / "maintain/run.py"), "a") as changed:
        changed.write("# changed on the host\n")
    os.chmod(str(LIB / "lib" / "hermes_ops" / "runner.py"), 0o600)
    out = _apply(ansible_playbook, h, hermes_maintenance_scheduler="hermes")
    installs = [t for t in out.tasks() if t["name"].endswith("Install the engine as package hermes_ops")]
    install = installs[-1]["hosts"]["localhost"]
    copied = sorted(Path(r["dest"]).relative_to(package).as_posix() for r in install["results"] if r.get("changed"))
    assert copied == ["maintain/run.py", "runner.py"], install
    assert len(install["results"]) == 2, install
    for name in copied:
        assert (LIB / "lib" / "hermes_ops" / name).read_bytes() == (source / name).read_bytes()
        assert _ls(LIB / "lib" / "hermes_ops" / name) == ("-rw-r--r--", "root", 0)


def test_run_now_is_the_users_scheduled_run(ansible_playbook, host):
    """hermes_maintenance_run_now as root: the installed wrapper runs as the Hermes user, as cron would,
    so the log and the metrics file are the user's own."""
    h = host
    metrics = h.base / "metrics"
    out = _apply(ansible_playbook, h, hermes_maintenance_scheduler="none", hermes_maintenance_run_now=True,
                 hermes_maintenance_metrics_dir=str(metrics))  # fmt: skip
    lines = out.result("Say what was done, per profile")["msg"]
    assert {line.split(":", 1)[0] for line in lines} == {"default", "work"}, lines
    assert all(" pruned=1 " in line for line in lines), lines  # the 29-day-old session of each profile
    log = h.data / "log" / "maintenance.log"
    assert _ls(log)[1] == USER and "=== Session Maintenance Start ===" in log.read_text()
    prom = metrics / ("hermes_ops_%s.prom" % USER)
    assert _ls(prom)[1] == USER and "hermes_ops_last_run_sessions_pruned" in prom.read_text()
    assert not (metrics / "hermes_ops_root.prom").exists()


def test_root_never_imports_what_the_user_planted(ansible_playbook, host):
    h = host
    _apply(ansible_playbook, h)
    _plant(h)
    env = _planted_env(h)

    # Control: the way the runner used to start imports every planted file but PYTHONSTARTUP
    # (only read by an interactive interpreter), so each plant would have run.
    control = subprocess.run(
        ["/usr/bin/python3", "-m", "hermes_ops.runner", "--config", str(CONFIG), "--dry-run"],
        cwd=str(h.home),
        env=dict(env, PYTHONPATH=f"{LIB / 'lib'}:{h.home}"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert _markers(h) == ["hermes_ops", "pth", "sitecustomize", "usercustomize"], control.stderr
    for name in _markers(h):
        os.unlink(str(h.markers / name))

    refused = _run_wrapper(h, env, "--dry-run")
    assert refused.returncode == 2, refused.stderr
    assert "refusing to run as root" in refused.stderr and f"sudo -u {USER}" in refused.stderr
    # A symlink the user leaves as its log must not make root's run rewrite another file.
    victim = h.base / "roots-file"
    victim.write_text("root's\n")
    log = h.data / "log" / "maintenance.log"
    if log.exists():
        log.unlink()
    os.symlink(str(victim), str(log))
    os.lchown(str(log), h.uid, h.gid)
    allowed = _run_wrapper(h, env, "--allow-root", "--dry-run", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert [p["status"] for p in json.loads(allowed.stdout)["profiles"]] == ["ok", "ok"]
    assert _markers(h) == []
    assert victim.read_text() == "root's\n"
    assert f"cannot write log file {log}" in allowed.stderr, allowed.stderr
    # Without the symlink, root's run appends to the log as the user.
    log.unlink()
    again = _run_wrapper(h, env, "--allow-root", "--dry-run")
    assert again.returncode == 0, again.stderr
    assert _ls(log)[1] == USER and "=== Session Maintenance Done ===" in log.read_text()
    assert _markers(h) == []

    # The same as the user: nothing planted is imported either (the user's own runs are isolated too).
    as_user = _run_wrapper(h, env, "--dry-run", **h.as_user())
    assert as_user.returncode == 0, as_user.stderr
    assert _markers(h) == []


def test_an_interpreter_the_user_can_change_is_refused(ansible_playbook, host):
    h = host
    own = h.home / "bin"
    own.mkdir()
    os.symlink("/usr/bin/python3", str(own / "python3"))
    chown_tree(h.home, h.uid, h.gid)
    rc, out = ansible_playbook(
        "playbooks/schedule.yml", extra_vars=h.vars(hermes_maintenance_python=str(own / "python3"))
    )
    assert rc != 0
    failed = out.result(
        "hermes_agent.ops.session_maintenance : Fail when another account can change the interpreter,"
        " or no Hermes answers for release_rules or delete_with=hermes"
    )
    assert "is not root's alone" in failed["msg"] and str(own) in failed["msg"], failed["msg"]
    assert not WRAPPER.exists()

    # A root-owned interpreter that later becomes the user's: the wrapper refuses it as root.
    pydir = Path("/usr/local/lib/hermes-ops-i16-python")
    shutil.rmtree(str(pydir), ignore_errors=True)
    pydir.mkdir(mode=0o755)
    try:
        os.symlink("/usr/bin/python3", str(pydir / "python3"))
        _apply(ansible_playbook, h, hermes_maintenance_python=str(pydir / "python3"))
        ok = subprocess.run([str(WRAPPER), "--allow-root", "--dry-run"], capture_output=True, text=True, check=False)
        assert ok.returncode == 0, ok.stderr
        os.chown(str(pydir), h.uid, h.gid)
        refused = subprocess.run(
            [str(WRAPPER), "--allow-root", "--dry-run"], capture_output=True, text=True, check=False
        )
        assert refused.returncode == 2
        assert f"{pydir}: owned by uid {h.uid}, not root" in refused.stderr, refused.stderr
    finally:
        shutil.rmtree(str(pydir), ignore_errors=True)


OLD_WRAPPER = """#!/bin/sh
PYTHONPATH={lib}${{PYTHONPATH:+:$PYTHONPATH}}
export PYTHONPATH
exec /usr/bin/python3 -m hermes_ops.runner --config {config} "$@"
"""


def _lay_out_old_install(h):
    """What the role installed before: engine, wrapper, config and log in the user's directory."""
    pkg = h.data / "lib" / "hermes_ops"
    shutil.copytree(
        str(REPO_ROOT / "plugins" / "module_utils" / "_hermes"), str(pkg), ignore=shutil.ignore_patterns("__pycache__")
    )
    (pkg / "__init__.py").write_text("")
    (h.data / "bin").mkdir()
    wrapper = h.data / "bin" / "hermes-session-maintenance"
    wrapper.write_text(OLD_WRAPPER.format(lib=h.data / "lib", config=h.data / "maintenance.json"))
    os.chmod(str(wrapper), 0o700)
    (h.data / "maintenance.json").write_text(json.dumps({"hermes_home": [str(h.hermes)], "prune_days": 0}))
    (h.data / "log").mkdir(exist_ok=True)
    (h.data / "log" / "maintenance.log").write_text("=== Session Maintenance Start === an older run\n")
    (h.hermes / "backups").mkdir(exist_ok=True)
    (h.hermes / "backups" / "default-state.db.older-backup").write_text("kept\n")
    chown_tree(h.home, h.uid, h.gid)
    return wrapper


@pytest.mark.skipif(not shutil.which("crontab"), reason="needs the crontab command (cron)")
def test_upgrade_from_the_per_user_install_and_absent_removes_both(ansible_playbook, host):
    h = host
    old_wrapper = _lay_out_old_install(h)
    entry = f"{CRON_NAME}\n0 4 1 * * {old_wrapper} >/dev/null\n"
    subprocess.run(["crontab", "-u", USER, "-"], input=entry, text=True, check=True)

    out = _apply(ansible_playbook, h, hermes_maintenance_scheduler="cron")
    # Whether the entry will fire is said, as the host's processes have it.
    said = out.result("Say whether cron will run the maintenance")["msg"]
    if cron_daemon_running():
        assert said.startswith("cron will run the maintenance on localhost: "), said
    else:
        assert said.startswith("The crontab entry is installed, but the schedule will not fire on localhost: "), said
        assert "Start it and enable it at boot" in said, said
    assert not (h.data / "lib").exists() and not (h.data / "bin").exists()
    assert not (h.data / "maintenance.json").exists()
    assert "an older run" in (h.data / "log" / "maintenance.log").read_text()
    assert (h.hermes / "backups" / "default-state.db.older-backup").read_text() == "kept\n"
    lines = _crontab(USER).splitlines()
    assert lines.count(CRON_NAME) == 1, lines
    assert lines[lines.index(CRON_NAME) + 1] == f"0 4 1 * * {WRAPPER} >/dev/null", lines
    assert WRAPPER.is_file() and CONFIG.is_file()
    assert json.loads(CONFIG.read_text()).get("prune_days") == 7

    # A per-user install left next to the new one: absent removes both, never the backups.
    _lay_out_old_install(h)
    _apply(ansible_playbook, h, hermes_maintenance_state="absent")
    assert not LIB.exists() and not ETC.exists() and not h.data.exists()
    assert "hermes_agent.ops" not in _crontab(USER)
    # the crontab held only the role's entry: no empty crontab is left behind
    assert subprocess.run(["crontab", "-l", "-u", USER], capture_output=True, check=False).returncode != 0
    assert (h.hermes / "backups" / "default-state.db.older-backup").read_text() == "kept\n"
    assert (h.hermes / "state.db").is_file()


TRUST_CHECK = REPO_ROOT / "roles" / "session_maintenance" / "files" / "hermes_trusted_path.sh"


def _trusted(*paths):
    return subprocess.run(["sh", str(TRUST_CHECK), *map(str, paths)], capture_output=True, text=True, check=False)


def test_the_trust_check_follows_every_link_and_directory(host):
    h = host
    assert _trusted("/usr/bin/python3").returncode == 0
    base = Path("/usr/local/lib/hermes-ops-i16-trust")
    shutil.rmtree(str(base), ignore_errors=True)
    base.mkdir(mode=0o755)
    try:
        (base / "lib").mkdir(mode=0o755)
        (base / "lib" / "engine.py").write_text("")
        assert _trusted(base / "lib").returncode == 0
        # A file in the tree that the user owns, a group-writable directory, /tmp on the way.
        os.chown(str(base / "lib" / "engine.py"), h.uid, h.gid)
        assert _trusted(base / "lib").stdout.startswith(f"{base / 'lib' / 'engine.py'}: under {base / 'lib'}")
        os.chown(str(base / "lib" / "engine.py"), 0, 0)
        os.chmod(str(base / "lib"), 0o775)
        assert _trusted(base / "lib").stdout.strip() == f"{base / 'lib'}: mode 775 lets group or others write it"
        os.chmod(str(base / "lib"), 0o755)
        temp = _trusted(h.base)  # under the sticky, world-writable temp directory
        assert temp.returncode == 1 and "lets group or others write it" in temp.stdout, temp.stdout
        # A root-owned link in a root-owned directory, through a link in a directory the user owns.
        hop = base / "user-dir"
        hop.mkdir(mode=0o755)
        os.symlink("/usr/bin/python3", str(hop / "python3"))
        os.symlink(str(hop / "python3"), str(base / "python3"))
        assert _trusted(base / "python3").returncode == 0
        os.chown(str(hop), h.uid, h.gid)
        assert _trusted(base / "python3").stdout.strip() == f"{hop}: owned by uid {h.uid}, not root"
        assert _trusted("relative/python3").stdout.strip() == "relative/python3: not an absolute path"
    finally:
        shutil.rmtree(str(base), ignore_errors=True)
