# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's runner uses a fixed SQLite where the host has one: real ``ansible-playbook`` runs
of playbooks/schedule.yml next to a Hermes install whose Python links SQLite 3.53.4.

That Python is built by scripts/build_fixed_python.sh: Debian's CPython and its standard
library, whose ``_sqlite3`` finds Debian sid's libsqlite3 (scripts/build_sqlite.sh) through its
own RUNPATH, as a Hermes-managed interpreter with its own SQLite does; no environment variable
is involved. The Hermes install is a virtualenv of that Python with the real Hermes 0.19.0
from PyPI (its dependencies left out: only its ``hermes`` entry point and ``hermes_state`` are
needed), so the role finds the interpreter on the entry point's first line, as on a host.

* with privilege, a root-owned install: the runner (as the user, and as root with
  ``--allow-root``) works with SQLite 3.53.4 through that interpreter, and says so;
* with privilege, the same install in the Hermes user's home (the user can change it): refused,
  never run by root (the user's replacement of its ``python`` leaves no trace of a run), the
  output says why, the runner stays on the host's affected SQLite;
* without privilege, for one's own account, the install in one's own directory is used.
"""

import getpass
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hermes_reliability import REPO_ROOT, chown_tree
from hermes_role_host import RoleHost, role_host

from hermes_fixtures import build_home

# What the role installs on the host does not depend on the controller's Python.
pytestmark = pytest.mark.managed_node

USER = "hermes-ops-i12"
LIB = Path("/usr/local/lib/hermes-ops") / USER
ETC = Path("/etc/hermes-ops") / USER
WRAPPER = LIB / "bin" / "hermes-session-maintenance"
FIXED_PREFIX = Path("/usr/local/lib/hermes-ops-i12-python")
ROOT_INSTALL = Path("/usr/local/lib/hermes-ops-i12-hermes")
HERMES = "hermes-agent==0.19.0"
SAY = "hermes_agent.ops.session_maintenance : Say which interpreter the runner uses, and why not the others"


def _sqlite_version(python):
    return subprocess.run(
        [str(python), "-I", "-S", "-c", "import sqlite3; print(sqlite3.sqlite_version)"],
        capture_output=True,
        text=True,
        check=True,
        env={},
    ).stdout.strip()


SYSTEM_SQLITE = _sqlite_version("/usr/bin/python3")

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3, "transcripts": True},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


@pytest.fixture(scope="module")
def fixed_python():
    """(prefix, SQLite version) of the Python built to link a fixed SQLite (cached in .cache)."""
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "build_fixed_python.sh"), "/usr/bin/python3"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        message = f"scripts/build_fixed_python.sh failed: {proc.stderr[-2000:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    prefix = Path(proc.stdout.strip().splitlines()[-1])
    return prefix, _sqlite_version(prefix / "bin" / "python3")


def _hermes_install(python, venv):
    """A virtualenv of ``python`` holding the real Hermes release: bin/hermes names bin/python."""
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", HERMES],
        check=True,
        capture_output=True,
    )
    entry = venv / "bin" / "hermes"
    assert entry.read_text().splitlines()[0] == f"#!{venv / 'bin' / 'python'}"
    subprocess.run([str(venv / "bin" / "python"), "-c", "import hermes_state"], check=True)
    return entry


def _sqlite_of_run(proc):
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert [p["status"] for p in result["profiles"]] == ["ok"], result["profiles"]
    return result["sqlite"], result["profiles"][0]


class Host(RoleHost):
    def __init__(self, user, base, uid, gid):
        super().__init__(user, base, uid, gid)
        self.entry = self.home / ".local" / "bin" / "hermes"

    def vars(self, **extra):
        return super().vars(
            **{
                "hermes_maintenance_metrics_dir": "",
                # The test user's passwd home is not its home here: name its ~/.local/bin/hermes.
                "hermes_maintenance_hermes_entry_points": [str(self.entry)],
                **extra,
            }
        )

    def link_entry_point(self, entry):
        """~/.local/bin/hermes -> the install's entry point, as Hermes's installer links it."""
        self.entry.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(str(entry), str(self.entry))
        chown_tree(self.home, self.uid, self.gid)


def _remove_everything():
    for path in (LIB, ETC, ROOT_INSTALL, FIXED_PREFIX):
        shutil.rmtree(str(path), ignore_errors=True)


@pytest.fixture
def host(fixed_python):
    with role_host(Host, USER, SPECS, _remove_everything) as h:
        shutil.copytree(str(fixed_python[0]), str(FIXED_PREFIX), symlinks=True)
        os.chmod(str(FIXED_PREFIX), 0o755)
        yield h


def _apply(ansible_playbook, extra):
    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=extra)
    assert rc == 0, getattr(out, "text", out)
    return out.result(SAY)["msg"]


def _wrapper(h, *args, **run_options):
    return subprocess.run(
        [str(WRAPPER), *args],
        cwd=str(h.home),
        env={"PATH": "/usr/bin:/bin", "HOME": str(h.home)},
        capture_output=True,
        text=True,
        check=False,
        **run_options,
    )


def test_the_runner_uses_the_fixed_sqlite_of_a_root_owned_hermes_install(ansible_playbook, host, fixed_python):
    h, version = host, fixed_python[1]
    python = ROOT_INSTALL / "bin" / "python"
    h.link_entry_point(_hermes_install(FIXED_PREFIX / "bin" / "python3", ROOT_INSTALL))

    said = _apply(ansible_playbook, h.vars())
    assert said[0] == f"The runner uses {python}", said
    assert f"{python}: SQLite {version} is free of the WAL-reset bug" in said, said
    assert f"/usr/bin/python3: SQLite {SYSTEM_SQLITE} has the WAL-reset bug" in said, said
    assert f"exec {python} -I -S -c " in WRAPPER.read_text()

    # The Hermes user's scheduled run, then root's with --allow-root: both on the fixed SQLite.
    sqlite, profile = _sqlite_of_run(_wrapper(h, "--json", **h.as_user()))
    assert sqlite == {"version": version, "wal_reset_affected": False, "python": str(python)}
    assert profile["sqlite"] == sqlite and profile["sessions_pruned"] == 1
    log = (h.data / "log" / "maintenance.log").read_text()
    assert f" SQLite {version} (free of the WAL-reset bug), python {python}\n" in log, log
    sqlite = _sqlite_of_run(_wrapper(h, "--allow-root", "--json", "--dry-run"))[0]
    assert sqlite == {"version": version, "wal_reset_affected": False, "python": str(python)}

    # Asked not to look, the role keeps the host's interpreter.
    said = _apply(ansible_playbook, h.vars(hermes_maintenance_python_search=False))
    assert said == [
        "The runner uses /usr/bin/python3",
        f"/usr/bin/python3: SQLite {SYSTEM_SQLITE} has the WAL-reset bug",
    ]
    sqlite = _sqlite_of_run(_wrapper(h, "--json", "--dry-run", **h.as_user()))[0]
    assert sqlite == {"version": SYSTEM_SQLITE, "wal_reset_affected": True, "python": "/usr/bin/python3"}


def test_with_privilege_a_hermes_install_the_user_can_change_is_refused_and_never_run(
    ansible_playbook, host, fixed_python
):
    h = host
    venv = h.home / ".hermes" / "hermes-agent" / "venv"
    h.link_entry_point(_hermes_install(FIXED_PREFIX / "bin" / "python3", venv))
    chown_tree(h.home, h.uid, h.gid)
    # What the user may do to its own install: put something else behind the interpreter.
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").write_text(
        f'#!/bin/sh\nid -u >> {h.markers / "ran"}\nexec {FIXED_PREFIX / "bin" / "python3"} "$@"\n'
    )
    os.chmod(str(venv / "bin" / "python"), 0o755)
    chown_tree(h.home, h.uid, h.gid)

    said = _apply(ansible_playbook, h.vars())
    assert said[0] == "The runner uses /usr/bin/python3", said
    refused = [line for line in said if line.startswith(f"{venv / 'bin' / 'python'}: ")]
    assert len(refused) == 1 and "refused, not root's alone: " in refused[0], said
    assert "not root" in refused[0], said
    assert not (h.markers / "ran").exists(), (h.markers / "ran").read_text()
    sqlite = _sqlite_of_run(_wrapper(h, "--json", "--dry-run", **h.as_user()))[0]
    assert sqlite == {"version": SYSTEM_SQLITE, "wal_reset_affected": True, "python": "/usr/bin/python3"}
    assert not (h.markers / "ran").exists()


def test_without_privilege_ones_own_hermes_install_is_used(ansible_playbook, tmp_path, fixed_python):
    version = fixed_python[1]
    venv = tmp_path / "hermes-agent" / "venv"
    entry = _hermes_install(fixed_python[0] / "bin" / "python3", venv)
    home = tmp_path / "hermes"
    build_home(str(home), "v30", SPECS)
    install = tmp_path / "install"
    role_vars = {
        "hermes_maintenance_user": getpass.getuser(),
        "hermes_maintenance_become": False,
        "hermes_maintenance_homes": [str(home)],
        "hermes_maintenance_install_dir": str(install),
        "hermes_maintenance_scheduler": "none",
        "hermes_maintenance_syslog": False,
        "hermes_maintenance_metrics_dir": "",
        "hermes_maintenance_hermes_entry_points": [str(entry)],
        "hermes_maintenance_prune_days": 7,
    }
    said = _apply(ansible_playbook, role_vars)
    python = venv / "bin" / "python"
    assert said[0] == f"The runner uses {python}", said
    proc = subprocess.run(
        [str(install / "bin" / "hermes-session-maintenance"), "--json"], capture_output=True, text=True, check=False
    )
    sqlite, profile = _sqlite_of_run(proc)
    assert sqlite == {"version": version, "wal_reset_affected": False, "python": str(python)}
    assert profile["sessions_pruned"] == 1
    assert "hermes_python" not in json.loads((install / "maintenance.json").read_text())

    # unknown_schema=release_rules: the Hermes installed on the host answers, through the
    # interpreter its entry point names, unless the operator named one.
    role_vars["hermes_maintenance_unknown_schema"] = "release_rules"
    _apply(ansible_playbook, role_vars)
    config = json.loads((install / "maintenance.json").read_text())
    assert (config["unknown_schema"], config["hermes_python"]) == ("release_rules", str(python)), config
    _apply(ansible_playbook, dict(role_vars, hermes_maintenance_hermes_python="/usr/bin/python3"))
    assert json.loads((install / "maintenance.json").read_text())["hermes_python"] == "/usr/bin/python3"


TRUST_CHECK = REPO_ROOT / "roles" / "session_maintenance" / "files" / "hermes_trusted_path.sh"


def _trusted(path):
    return subprocess.run(["sh", str(TRUST_CHECK), str(path)], capture_output=True, text=True, check=False)


def test_the_trust_check_covers_a_venvs_config_and_the_libraries_the_interpreter_loads(host):
    h = host
    subprocess.run(
        [str(FIXED_PREFIX / "bin" / "python3"), "-m", "venv", "--without-pip", str(ROOT_INSTALL)], check=True
    )
    python = ROOT_INSTALL / "bin" / "python"
    assert _trusted(python).returncode == 0, _trusted(python).stdout
    # The libsqlite3 that _sqlite3 loads through its RUNPATH, outside the standard library.
    library = FIXED_PREFIX / "lib" / "libsqlite3.so.0"
    os.chown(str(library), h.uid, h.gid)
    assert _trusted(python).stdout.strip() == f"{library}: owned by uid {h.uid}, not root"
    os.chown(str(library), 0, 0)
    # pyvenv.cfg names the home Python takes its standard library from.
    config = ROOT_INSTALL / "pyvenv.cfg"
    os.chown(str(config), h.uid, h.gid)
    assert _trusted(python).stdout.strip() == f"{config}: owned by uid {h.uid}, not root"
    os.chown(str(config), 0, 0)
    elsewhere = h.base / "python-home"
    elsewhere.mkdir()
    config.write_text(config.read_text().replace(f"home = {FIXED_PREFIX / 'bin'}", f"home = {elsewhere}"))
    refused = _trusted(python)
    assert refused.returncode == 1 and "lets group or others write it" in refused.stdout, refused.stdout
