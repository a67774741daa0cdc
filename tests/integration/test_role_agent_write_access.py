# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Applying the role gives the Hermes user (and so the agent) no write access outside its home
but its own metrics file, and ``state: absent`` takes even that back (root only; CI runs as root).

Real ``ansible-playbook`` runs of playbooks/schedule.yml with the role's defaults (cron, metrics)
for the test user ``hermes-ops-i37``, whose home lives in a fresh directory. Before and after
each step, every path outside that home the user can write is listed as the user sees it
(``find / -xdev -writable`` run through runuser): the lists must differ by the one file
``hermes_ops_USER.prom`` after the apply and not at all after ``absent``. Also:

* metrics directories the role had to create are root's 0755, and ``absent`` removes them;
  an existing one keeps its owner, mode and other files; one an older release made
  ``root:USERGROUP 1775`` gets the group's write access taken back;
* the user's scheduled run still writes its metrics (in place, as it cannot rename there), and
  as the user nothing can be added, renamed or removed in the directory.
"""

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from hermes_reliability import REPO_ROOT
from hermes_role_host import RoleHost, role_host

pytestmark = pytest.mark.managed_node

USER = "hermes-ops-i37"
LIB = Path("/usr/local/lib/hermes-ops") / USER
ETC = Path("/etc/hermes-ops") / USER
WRAPPER = LIB / "bin" / "hermes-session-maintenance"
TOP = Path("/var/lib/hermes-ops-test-i37")  # absent before the test: the role creates it and below
METRICS = TOP / "prometheus" / "node-exporter"
PROM = "hermes_ops_%s.prom" % USER
MARKER = ".hermes-ops-created"

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def _remove_everything():
    for path in (LIB, ETC, TOP):
        shutil.rmtree(str(path), ignore_errors=True)
    if shutil.which("crontab"):
        subprocess.run(["crontab", "-r", "-u", USER], capture_output=True, check=False)


@pytest.fixture
def host():
    if not shutil.which("runuser"):
        pytest.skip("runuser is needed to list what the user can write")
    with role_host(RoleHost, USER, SPECS, _remove_everything) as h:
        yield h


# World-writable scratch directories: other processes (parallel tests among them) add and
# remove entries there all the time, and the role never writes there. The repository and its
# shared caches change under parallel runs too.
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/run/shm", "/run/lock", "/var/lock")


def writable(h):
    """Every path on the root filesystem outside the user's home (and the scratch directories'
    contents) that the user can write."""
    skip = [str(h.home), *SCRATCH, str(REPO_ROOT), os.path.realpath(str(REPO_ROOT / ".cache"))]
    pruned = []
    for path in skip:
        pruned += ["-path", path + ("/*" if path in SCRATCH else ""), "-o"]
    proc = subprocess.run(
        ["runuser", "-u", USER, "--", "find", "/", "-xdev", "(", *pruned[:-1], ")", "-prune"]
        + ["-o", "-writable", "-print"],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert proc.stdout, proc.stderr
    return set(proc.stdout.splitlines())


def _apply(ansible_playbook, h, **extra):
    variables = h.vars(hermes_maintenance_metrics_dir=str(METRICS), hermes_maintenance_syslog=True)
    if shutil.which("crontab"):
        variables.pop("hermes_maintenance_scheduler")  # the default: cron
    rc, out = ansible_playbook("playbooks/schedule.yml", extra_vars=dict(variables, **extra))
    assert rc == 0, getattr(out, "text", out)
    return out


def _ls(path):
    st = os.lstat(str(path))
    return (stat.filemode(st.st_mode), st.st_uid, st.st_gid)


def _as_user(h, code):
    """Run python code as the user; its exit status (13: PermissionError)."""
    return subprocess.run(
        ["/usr/bin/python3", "-c", "import os\ntry:\n %s\nexcept PermissionError:\n raise SystemExit(13)" % code],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        **h.as_user(),
    )


def test_the_user_may_write_its_metrics_file_and_nothing_else_outside_its_home(ansible_playbook, host, record):
    h = host
    assert not TOP.exists()
    before = writable(h)

    _apply(ansible_playbook, h)
    applied = writable(h)
    assert applied - before == {str(METRICS / PROM)}
    assert before - applied == set()
    for path in (TOP, TOP / "prometheus", METRICS):
        assert _ls(path) == ("drwxr-xr-x", 0, 0), path
        assert _ls(path / MARKER) == ("-rw-r--r--", 0, 0), path
    assert _ls(METRICS / PROM) == ("-rw-r--r--", h.uid, h.gid)
    assert (METRICS / PROM).read_text() == ""

    # The scheduled run, as the user, writes its metrics into that one file.
    run = subprocess.run(
        [str(WRAPPER)], capture_output=True, text=True, check=False, cwd=str(h.home),
        env={"PATH": "/usr/bin:/bin", "HOME": str(h.home)}, **h.as_user(),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cannot write metrics" not in run.stderr
    assert "hermes_ops_last_run_timestamp_seconds" in (METRICS / PROM).read_text()
    assert sorted(os.listdir(str(METRICS))) == [MARKER, PROM]
    assert _ls(METRICS / PROM) == ("-rw-r--r--", h.uid, h.gid)

    # ...and can neither add, rename nor remove anything there.
    for attempt in [
        "os.mkdir(%r)" % str(METRICS / "planted-by-agent"),
        "open(%r, 'w')" % str(METRICS / "node_fake.prom"),
        "os.rename(%r, %r)" % (str(METRICS / PROM), str(METRICS / "x.prom")),
        "os.unlink(%r)" % str(METRICS / PROM),
        "os.mkdir(%r)" % str(TOP / "prometheus" / "planted-by-agent"),
        "os.symlink('/etc/shadow', %r)" % str(METRICS / "hermes_ops_other.prom"),
    ]:
        assert _as_user(h, attempt).returncode == 13, attempt

    # A re-apply changes nothing and grants nothing more.
    out = _apply(ansible_playbook, h)
    assert out["stats"]["localhost"]["changed"] == 0, [t["name"] for t in out.tasks() if any(
        r.get("_status") == "changed" for r in t["hosts"].values())]  # fmt: skip
    assert writable(h) == applied

    _apply(ansible_playbook, h, hermes_maintenance_state="absent")
    removed = writable(h)
    assert removed == before
    assert not TOP.exists()
    record(
        "agent-writable paths, root filesystem outside the home",
        before=sorted(before),
        after_apply=sorted(applied),
        after_absent=sorted(removed),
    )


@pytest.mark.parametrize("mode", [0o755, 0o1775])
def test_an_existing_metrics_directory_keeps_its_owner_mode_and_files(ansible_playbook, host, mode):
    """0755 root:root as a node_exporter package leaves it; 1775 root:USERGROUP as an older release
    of the role made it (its group write access is taken back, and stays so after absent)."""
    h = host
    METRICS.mkdir(parents=True)
    os.chmod(str(METRICS), mode)
    os.chown(str(METRICS), 0, h.gid if mode == 0o1775 else 0)
    (METRICS / "node_apt.prom").write_text("apt_upgrades_pending 0\n")
    before = writable(h)

    _apply(ansible_playbook, h)
    assert _ls(METRICS) == ("drwxr-xr-x", 0, 0)
    assert not (METRICS / MARKER).exists() and not (TOP / MARKER).exists()
    assert writable(h) - before == {str(METRICS / PROM)}

    _apply(ansible_playbook, h, hermes_maintenance_state="absent")
    assert _ls(METRICS) == ("drwxr-xr-x", 0, 0)
    assert sorted(os.listdir(str(METRICS))) == ["node_apt.prom"]
    old_grant = {str(METRICS)} if mode == 0o1775 else set()
    assert before & {str(METRICS)} == old_grant
    assert writable(h) == before - old_grant


@pytest.fixture
def record():
    """Writes what the test saw to $HERMES_RECORD_DIR/<name>.json when that is set."""
    directory = os.environ.get("HERMES_RECORD_DIR")

    def save(name, **values):
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            (Path(directory) / (name.replace(" ", "_").replace(",", "") + ".json")).write_text(
                json.dumps(values, indent=1)
            )

    return save
