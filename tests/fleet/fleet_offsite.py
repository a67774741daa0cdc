"""The fleet's off-site repository and its disk-loss drill, run on the controller through
``podman exec`` (each step one exec: the drill adds as little time as it can to the fleet run).

    fleet_offsite.py setup  --host-container C --server-container S --repository-host NAME --password-file F
        on S (sshd, started by create.yml): a user ``restic`` that may log in with a key alone,
        /srv/restic its own; on C, as root: a key generated there (/root/.ssh/hermes-offsite,
        never in the Hermes user's home), S's host key pinned in root's known_hosts, an ssh
        config naming S as NAME, the repository's password file (root's, 0600). Run before the
        role is applied, which creates the repository through it.
    fleet_offsite.py before --host-container C --user U --work DIR
        the push forced as root (hermes-ops-offsite --json), ``restic snapshots`` listed, the
        pushed backup of the default profile counted by the real Hermes 0.22.2 on the
        controller, then the disk lost: state.db, its -wal/-shm/-journal and backups/ deleted
        (backups/ moved into root's directory, so the later phases judge the same home); the
        state kept in DIR/offsite-drill.json. The user's maintenance job is taken out of the
        crontab first: a run firing during the drill would prune the restored file.
    fleet_offsite.py after  --host-container C --user U --work DIR
        (after restore.yml -e hermes_restore_from=offsite) the restored state.db counted by the
        same release; prints the drill's log; exit 1 when the counts differ or a step failed.
"""

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "lib"))

import hermes_fixtures  # noqa: E402  (tests/lib is not a package)

RELEASE = "hermes-0.22.2.post1"
KEY = "/root/.ssh/hermes-offsite"
ASIDE = "/root/offsite-drill-aside"  # root's: where the drill puts the lost backups/ until it ends
STATE = "offsite-drill.json"


class DrillError(Exception):
    pass


def podman(container, script, stdin=None, check=True):
    """``sh -c script`` in the container, as root; its stdout."""
    proc = subprocess.run(
        ["podman", "exec", "-i", container, "sh", "-c", script],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise DrillError("%s: `%s` exited %d: %s" % (container, script[:200], proc.returncode, proc.stderr[-2000:]))
    return proc.stdout


def setup(args):
    podman(
        args.server_container,
        "id restic >/dev/null 2>&1 || useradd --create-home --shell /bin/sh restic; "
        # '*', not useradd's '!': with UsePAM=no sshd refuses any login to a locked ('!') account
        "usermod -p '*' restic; install -d -o restic -g restic -m 0700 /srv/restic /home/restic/.ssh",
    )
    podman(
        args.host_container,
        "install -d -m 0700 /root/.ssh; [ -f %s ] || ssh-keygen -q -t ed25519 -N '' -C hermes-ops-offsite -f %s"
        % (KEY, KEY),
    )
    public = podman(args.host_container, "cat %s.pub" % KEY)
    podman(
        args.server_container,
        "cat > /home/restic/.ssh/authorized_keys && chown restic: /home/restic/.ssh/authorized_keys "
        "&& chmod 0600 /home/restic/.ssh/authorized_keys",
        stdin=public,
    )
    host_key = podman(args.server_container, "cat /etc/ssh/ssh_host_ed25519_key.pub").split()
    address = subprocess.run(
        ["podman", "inspect", "--format", "{{.NetworkSettings.IPAddress}}", args.server_container],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not address:
        raise DrillError("no address for %s" % args.server_container)
    name = args.repository_host
    config = (
        "Host %s\n  HostName %s\n  User restic\n  IdentityFile %s\n  IdentitiesOnly yes\n  BatchMode yes\n"
        "  StrictHostKeyChecking yes\n  HostKeyAlias %s\n  ConnectTimeout 10\n" % (name, address, KEY, name)
    )
    podman(args.host_container, "umask 077; cat > /root/.ssh/config", stdin=config)
    podman(args.host_container, "umask 077; cat > /root/.ssh/known_hosts", stdin="%s %s %s\n" % (name, *host_key[:2]))
    podman(
        args.host_container,
        "[ -s %s ] || (umask 077; head -c 32 /dev/urandom | base64 > %s)" % (args.password_file, args.password_file),
    )
    for _attempt in range(20):  # sshd was started with the container; wait until it answers
        probe = subprocess.run(
            ["podman", "exec", args.host_container, "ssh", name, "true"], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            break
        time.sleep(0.5)
    else:
        raise DrillError("ssh %s from %s: %s" % (name, args.host_container, probe.stderr[-1000:]))
    print("off-site repository host %s (%s) reachable from %s with root's key" % (name, address, args.host_container))


def release_sessions(container, path, work):
    """The sessions the real release lists in a copy of ``path`` taken out of the container."""
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        local = Path(tmp) / "state.db"
        subprocess.run(["podman", "cp", "%s:%s" % (container, path), str(local)], check=True, capture_output=True)
        return len(hermes_fixtures.open_with_release(RELEASE, local)["sessions"])


def put_back(container, home):
    """backups/ back into the home for the phases after the drill (unless something made a new one)."""
    podman(container, f"[ -e {home}/backups ] || mv {ASIDE}/backups {home}/backups; rm -rf {ASIDE}")


def before(args):
    t0 = time.time()
    log = []
    home = podman(args.host_container, "getent passwd %s | cut -d: -f6" % shlex.quote(args.user)).strip() + "/.hermes"
    wrapper = "/usr/local/lib/hermes-ops/%s/bin/hermes-ops-offsite" % args.user
    podman(args.host_container, "crontab -r -u %s || true" % shlex.quote(args.user))
    podman(  # a run cron fired just before must end first
        args.host_container,
        "for i in $(seq 120); do pgrep -u %s -f hermes-ops >/dev/null || exit 0; "
        "sleep 0.5; done; exit 1" % shlex.quote(args.user),
    )
    pushed = json.loads(podman(args.host_container, wrapper + " --json"))
    if pushed.get("status") != "ok":
        raise DrillError("the push failed: %s" % json.dumps(pushed)[:2000])
    mine = [p for p in pushed["pushed"] if p["profile"] == "default"]
    if not mine:
        raise DrillError("the push sent no backup of profile default: %s" % json.dumps(pushed)[:2000])
    log.append(
        "push (root, forced): %d backup(s) sent, %s snapshot(s) of the host, repository %s bytes"
        % (len(pushed["pushed"]), pushed["snapshots"], pushed["repository_bytes"])
    )
    for p in pushed["pushed"]:
        log.append(
            "  pushed %s: snapshot %s, %s bytes (%s added)"
            % (p["name"], (p["snapshot"] or "")[:8], p["bytes"], p["bytes_added"])
        )
    config = json.loads(podman(args.host_container, "cat /etc/hermes-ops/%s/offsite.json" % args.user))
    listed = podman(
        args.host_container,
        "restic --no-cache -r %s --password-file %s snapshots --host %s"
        % (shlex.quote(config["repository"]), shlex.quote(config["password_file"]), shlex.quote(config["host"])),
    )
    log.append("restic snapshots --host %s (%s):" % (config["host"], config["repository"]))
    log.extend("  " + line for line in listed.rstrip().splitlines())
    backup = "%s/backups/%s" % (home, mine[0]["name"])
    held = release_sessions(args.host_container, backup, args.work)
    live = podman(args.host_container, "sqlite3 -readonly %s/state.db 'SELECT COUNT(*) FROM sessions'" % home).strip()
    log.append(
        "before the loss: the pushed backup %s holds %d sessions (Hermes 0.22.2); state.db holds %s (sqlite3; a backup "
        "holds the file as it was before the run that made it)" % (mine[0]["name"], held, live)
    )
    podman(
        args.host_container,
        "rm -rf %s && install -d -m 0700 %s && cd %s && rm -f state.db state.db-wal state.db-shm state.db-journal "
        "&& mv backups %s/" % (ASIDE, ASIDE, home, ASIDE),
    )
    left = podman(args.host_container, "cd %s && ls -A" % home).split()
    log.append("disk lost: state.db, -wal, -shm, -journal and backups/ deleted; %s now holds %s" % (home, left))
    if {"state.db", "state.db-wal", "state.db-shm", "state.db-journal", "backups"} & set(left):
        put_back(args.host_container, home)  # the later phases judge the same home
        raise DrillError("the wipe left %s" % left)
    state = {"log": log, "held": held, "home": home, "seconds_before": round(time.time() - t0, 1)}
    Path(args.work, STATE).write_text(json.dumps(state))


def after(args):
    t0 = time.time()
    state = json.loads(Path(args.work, STATE).read_text())
    log, home = state["log"], state["home"]
    record = Path(args.work, "offsite-restore.record.json")  # restore.yml's run, as run_playbook.yml keeps it
    if record.is_file():
        tasks = [t for play in json.loads(record.read_text()).get("plays", []) for t in play.get("tasks", [])]
        for task in tasks:
            if task.get("name") in ("Which snapshot", "Result"):
                for result in task.get("hosts", {}).values():
                    log.append("restore.yml, %s: %s" % (task["name"].lower(), " ".join(str(result.get("msg")).split())))
    owner = podman(args.host_container, "stat -c '%%U %%a' %s/state.db" % home, check=False).strip()
    restored = release_sessions(args.host_container, home + "/state.db", args.work)
    log.append("after the restore: state.db (%s) holds %d sessions (Hermes 0.22.2)" % (owner, restored))
    put_back(args.host_container, home)
    ok = restored == state["held"] and owner == "%s 600" % args.user
    log.append(
        "drill %s: %d of %d sessions back; drill's own steps %.1f s (restore.yml apart)"
        % ("passed" if ok else "FAILED", restored, state["held"], state["seconds_before"] + time.time() - t0)
    )
    print("\n".join("[offsite drill] " + line for line in log))
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["setup", "before", "after"])
    parser.add_argument("--host-container", required=True)
    parser.add_argument("--server-container")
    parser.add_argument("--repository-host")
    parser.add_argument("--password-file")
    parser.add_argument("--user")
    parser.add_argument("--work")
    args = parser.parse_args()
    try:
        if args.step == "setup":
            setup(args)
        elif args.step == "before":
            before(args)
        else:
            return after(args)
    except (DrillError, subprocess.SubprocessError, RuntimeError, OSError, ValueError, KeyError) as exc:
        print("[offsite drill] FAILED at %s: %s" % (args.step, exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
