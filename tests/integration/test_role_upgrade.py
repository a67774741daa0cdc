# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Upgrading a root-owned install that the previous release made (root only; CI runs as root).

The previous release installed the engine as flat files ``hermes_ops/_hermes_*.py``; this one
installs a package tree (``hermes_ops/<layer>/*.py``). Real ``ansible-playbook`` runs of
playbooks/schedule.yml (cron scheduler, with privilege) for the test user ``hermes-ops-u54``,
whose Hermes home holds a state.db written by the real Hermes 0.22.2:

* the previous release, installed from this repository's history with ``ansible-galaxy
  collection install git+file://...`` as the README shows, installs the flat engine; its
  scheduled command runs, once as root with ``--allow-root`` (which leaves Python's caches of
  the flat files in ``hermes_ops/__pycache__``);
* this release's apply removes every flat file and names them (the engine's ``extra``, the
  removal task's items), installs exactly the collection's tree, root's with 0755 folders and
  0644 files, and a second apply changes nothing;
* the command the crontab entry runs, run as the Hermes user as cron runs it, maintains the
  home (dry run, then a real run: the old session pruned, the zombie closed, the metrics say
  so); the caches of the flat files (left in ``__pycache__``: Python reads a cache only beside
  its source) import nothing, and the tree's modules import without any flat one.
"""

import os
import pwd
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hermes_markers import release_module_marks
from hermes_reliability import REPO_ROOT
from hermes_role_host import RoleHost, role_host

# The last commit whose engine was flat files (plugins/module_utils/_hermes_*.py).
PREVIOUS_RELEASE = "7bce31eeb3b12ea3fc70a4b112ffefc437c5e7f0"
HERMES = "0.22.2.post1"

pytestmark = [
    pytest.mark.managed_node,
    *release_module_marks(HERMES),
    pytest.mark.skipif(not shutil.which("crontab"), reason="needs the crontab command (cron)"),
    pytest.mark.skipif(not shutil.which("git"), reason="needs git to install the previous release"),
]

USER = "hermes-ops-u54"
LIB = Path("/usr/local/lib/hermes-ops") / USER
ETC = Path("/etc/hermes-ops") / USER
PACKAGE = LIB / "lib" / "hermes_ops"
WRAPPER = LIB / "bin" / "hermes-session-maintenance"
CRON_NAME = f"#Ansible: hermes_agent.ops session maintenance ({USER})"
ENGINE = REPO_ROOT / "plugins" / "module_utils" / "_hermes"
REMOVAL = "Remove engine files the collection no longer has, and the engine, wrapper and config the Hermes user owned"

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3},
    {"id": "zombie", "source": "cli", "started_days_ago": 3, "messages": 2, "last_message_days_ago": 2},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def _remove_everything():
    for path in (LIB, ETC):
        shutil.rmtree(str(path), ignore_errors=True)
    subprocess.run(["crontab", "-r", "-u", USER], capture_output=True, check=False)


@pytest.fixture
def host():
    with role_host(RoleHost, USER, SPECS, _remove_everything, layout="hermes-" + HERMES) as h:
        yield h


@pytest.fixture
def previous_release(tmp_path):
    """The previous release's playbook and its collections path (installed from git history)."""
    known = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "cat-file", "-e", PREVIOUS_RELEASE + "^{commit}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        pytest.skip(f"{REPO_ROOT} is no git clone holding {PREVIOUS_RELEASE[:7]} (a shallow clone or a copy)")
    collections = tmp_path / "previous"
    galaxy = Path(sys.executable).parent / "ansible-galaxy"  # beside the ansible-playbook the fixture runs
    proc = subprocess.run(
        [str(galaxy), "collection", "install", "--no-deps", "-p", str(collections),
         f"git+file://{REPO_ROOT},{PREVIOUS_RELEASE}"],
        capture_output=True, text=True, check=False,
        env=dict(os.environ, ANSIBLE_LOCAL_TEMP=str(tmp_path / "galaxy-tmp")),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = collections / "ansible_collections" / "hermes_agent" / "ops"
    assert (installed / "plugins" / "module_utils" / "_hermes_engine.py").is_file()
    return installed / "playbooks" / "schedule.yml", collections


def _apply(ansible_playbook, h, env=None, playbook="playbooks/schedule.yml"):
    extra = h.vars(hermes_maintenance_scheduler="cron", hermes_maintenance_metrics_dir=str(h.base / "metrics"))
    rc, out = ansible_playbook(str(playbook), extra_vars=extra, env=env)
    assert rc == 0, getattr(out, "text", out)
    return out


def _engine_files(package):
    """The .py files of an installed package, relative to it (Python's caches left out)."""
    return {p.relative_to(package).as_posix() for p in package.rglob("*.py") if "__pycache__" not in p.parts}


def _ls(path):
    st = os.lstat(str(path))
    return (stat.filemode(st.st_mode), pwd.getpwuid(st.st_uid).pw_name, st.st_gid)


def _as_user(h, argv, **options):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(h.home), "SHELL": "/bin/sh", "LOGNAME": USER}
    return subprocess.run(argv, cwd=str(h.home), env=env, capture_output=True, text=True, check=False,
                          **h.as_user(), **options)  # fmt: skip


def _cron_command():
    """The command of the role's crontab entry (the line after its name, less the five schedule fields)."""
    lines = subprocess.run(
        ["crontab", "-l", "-u", USER], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert lines.count(CRON_NAME) == 1, lines
    return lines[lines.index(CRON_NAME) + 1].split(None, 5)[5]


def _sessions(h):
    conn = sqlite3.connect(f"file:{h.hermes / 'state.db'}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT id, ended_at FROM sessions"))
    finally:
        conn.close()


def test_upgrade_from_the_flat_engine_removes_it_and_the_scheduled_run_works(ansible_playbook, host, previous_release):
    h = host
    old_playbook, old_collections = previous_release

    # The previous release: the flat engine, and its scheduled command runs.
    _apply(ansible_playbook, h, env={"ANSIBLE_COLLECTIONS_PATH": old_collections}, playbook=old_playbook)
    flat = _engine_files(PACKAGE)
    assert "_hermes_engine.py" in flat and "_hermes_runner.py" in flat, flat
    assert all(name == "__init__.py" or re.fullmatch(r"_hermes_\w+\.py", name) for name in flat), flat
    assert _cron_command() == f"{WRAPPER} >/dev/null"
    before = _as_user(h, [str(WRAPPER), "--dry-run"])
    assert before.returncode == 0 and " pruned=1 " in before.stdout, before.stdout + before.stderr
    # Root's run (--allow-root) can write Python's caches of the flat files beside them.
    as_root = subprocess.run(
        [str(WRAPPER), "--allow-root", "--dry-run"], cwd="/", capture_output=True, text=True, check=False
    )
    assert as_root.returncode == 0, as_root.stderr
    flat_caches = sorted(p.name for p in (PACKAGE / "__pycache__").glob("_hermes_*.pyc"))
    assert any(name.startswith("_hermes_runner.") for name in flat_caches), flat_caches

    # This release: the flat files removed and named, exactly the collection's tree installed.
    out = _apply(ansible_playbook, h)
    install = out.result("Install the engine as package hermes_ops")
    assert sorted(install["extra"]) == sorted(str(PACKAGE / name) for name in flat if name != "__init__.py"), install
    removed = [r["item"] for r in out.result(REMOVAL)["results"] if r.get("changed")]
    assert sorted(removed) == sorted(install["extra"]), removed
    tree = {p.relative_to(ENGINE).as_posix() for p in ENGINE.rglob("*.py") if "__pycache__" not in p.parts}
    assert _engine_files(PACKAGE) == tree | {"__init__.py"}
    for name in tree:
        assert (PACKAGE / name).read_bytes() == (ENGINE / name).read_bytes(), name
    folders = [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and "__pycache__" not in p.parts)]
    assert {"sqlite", "maintain"} <= {p.name for p in folders}
    for path in folders:
        assert _ls(path) == ("drwxr-xr-x", "root", 0), path
    for name in _engine_files(PACKAGE):
        assert _ls(PACKAGE / name) == ("-rw-r--r--", "root", 0), name
    again = _apply(ansible_playbook, h)
    assert again["stats"]["localhost"]["changed"] == 0, [
        t["name"] for t in again.tasks() if any(r.get("_status") == "changed" for r in t["hosts"].values())
    ]

    # The caches the flat engine left import nothing: Python reads a cache only beside its source.
    left = sorted(p.name for p in (PACKAGE / "__pycache__").glob("_hermes_*.pyc"))
    probe = (
        "import sys\nsys.path[:] = [sys.argv[1]] + [p for p in sys.path if p]\n"
        "import hermes_ops.runner, hermes_ops.maintain.run\n"
        "assert not [m for m in sys.modules if m.startswith('hermes_ops._hermes_')], sys.modules\n"
        "try:\n    import hermes_ops._hermes_engine\nexcept ModuleNotFoundError:\n    raise SystemExit(0)\n"
        "raise SystemExit('the flat engine imported from ' + hermes_ops._hermes_engine.__file__)\n"
    )
    runner_python = re.search(r"^exec (\S+) -I -S -c", WRAPPER.read_text(), re.M).group(1)  # whose caches they are
    imports = _as_user(h, [runner_python, "-I", "-S", "-c", probe, str(LIB / "lib")])
    assert imports.returncode == 0, (left, imports.stderr)
    print("%d flat files removed and named; %d caches of them left, importing nothing" % (len(removed), len(left)))

    # The scheduled command, as cron runs it for the user: a dry run, then the real run.
    assert _cron_command() == f"{WRAPPER} >/dev/null"
    dry = _as_user(h, [str(WRAPPER), "--dry-run"])
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[0] == "=== Session Maintenance Start ===", dry.stdout
    assert " pruned=1 " in dry.stdout, dry.stdout
    assert set(_sessions(h)) == {"old", "zombie", "new"}
    real = _as_user(h, ["/bin/sh", "-c", _cron_command()])
    assert real.returncode == 0 and real.stderr == "", real.stderr
    log = (h.data / "log" / "maintenance.log").read_text()
    last = log[log.rindex("=== Session Maintenance Start ===") :]
    assert " pruned=1 " in last and "=== Session Maintenance Done ===" in last, last
    sessions = _sessions(h)
    assert set(sessions) == {"zombie", "new"} and sessions["zombie"] is not None, sessions
    prom = (h.base / "metrics" / f"hermes_ops_{USER}.prom").read_text()
    assert re.search(r'^hermes_ops_last_run_sessions_pruned\{[^}]*profile="default"\} 1$', prom, re.M), prom
    assert re.search(r'^hermes_ops_last_run_zombies_closed\{[^}]*profile="default"\} 1$', prom, re.M), prom
