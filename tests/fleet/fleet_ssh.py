"""The controller's SSH access to the fleet's containers, as a real fleet is reached.

    fleet_ssh.py --work DIR CONTAINER...

For each container: sshd started beside cron (no PAM: pam_loginuid cannot write
/proc/self/loginuid in a container), the controller's key (DIR/id_ed25519, made once, 0600)
in root's authorized_keys, the container's host key pinned in DIR/known_hosts under its name,
and a ``Host`` block in DIR/ssh_config that maps the name (the inventory's ansible_host) to the
container's address. The inventory points ssh at that file (ansible_ssh_common_args), so no
host key is ever accepted unseen. Clears DIR/cp, where the inventory keeps ssh's persistent
masters. Waits until every container answers over ssh.

Why not the podman connection: it cannot pipeline, so every task costs three or four
``podman exec`` (0.5 s each on a loaded 2-core machine), and the role's ~45 tasks per host made
the fleet run the longest step of CI. Over ssh with pipelining and a persistent master a task
is one round trip.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

SSHD = "mkdir -p -m 0755 /run/sshd && exec /usr/sbin/sshd -D -e -o UsePAM=no"


class SetupError(Exception):
    pass


def run(argv, stdin=None):
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise SetupError("`%s` exited %d: %s" % (" ".join(argv)[:200], proc.returncode, proc.stderr[-1000:]))
    return proc.stdout


def podman(container, script, stdin=None):
    """``sh -c script`` in the container, as root; its stdout."""
    return run(["podman", "exec", "-i", container, "sh", "-c", script], stdin=stdin)


def setup(work, containers):
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = work / "id_ed25519"
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hermes-ops-fleet-controller", "-f", str(key)])
    public = (work / "id_ed25519.pub").read_text()
    # The inventory's control_path_dir: a socket of an earlier fleet's master would lead into a
    # container that no longer exists (its master lingers for ControlPersist).
    control = work / "cp"
    if control.is_dir():
        for socket in control.iterdir():
            socket.unlink()
    config, known = [], []
    for name in containers:
        # sshd runs beside cron (the container's main process); a second start finds port 22 taken.
        if podman(name, "pgrep -x sshd || true").strip() == "":
            run(["podman", "exec", "--detach", name, "sh", "-c", SSHD])
        podman(name, "install -d -m 0700 /root/.ssh && umask 077 && cat > /root/.ssh/authorized_keys", stdin=public)
        host_key = podman(name, "cat /etc/ssh/ssh_host_ed25519_key.pub").split()
        address = run(["podman", "inspect", "--format", "{{.NetworkSettings.IPAddress}}", name]).strip()
        if not address or len(host_key) < 2:
            raise SetupError("%s: no address (%r) or no ed25519 host key" % (name, address))
        known.append("%s %s %s\n" % (name, host_key[0], host_key[1]))
        config.append(
            "Host %s\n  HostName %s\n  User root\n  IdentityFile %s\n  IdentitiesOnly yes\n  BatchMode yes\n"
            "  StrictHostKeyChecking yes\n  UserKnownHostsFile %s\n  HostKeyAlias %s\n  ConnectTimeout 10\n"
            % (name, address, key, work / "known_hosts", name)
        )
    for path, lines in ((work / "known_hosts", known), (work / "ssh_config", config)):
        path.write_text("".join(lines))
        path.chmod(0o600)
    for name in containers:
        for _attempt in range(40):  # sshd was just started; wait until it answers
            probe = subprocess.run(
                ["ssh", "-F", str(work / "ssh_config"), name, "true"], capture_output=True, text=True, check=False
            )
            if probe.returncode == 0:
                break
            time.sleep(0.25)
        else:
            raise SetupError("ssh %s: %s" % (name, probe.stderr[-1000:]))
        print("%s: reachable over ssh as root (host key pinned)" % name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("containers", nargs="+")
    args = parser.parse_args()
    try:
        setup(args.work, args.containers)
    except (SetupError, subprocess.SubprocessError, OSError) as exc:
        print("fleet ssh setup FAILED: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
