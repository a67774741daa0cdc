"""The session_maintenance module run by ansible-playbook as root on a Hermes user's home (root only).

The engine's own tests (tests/unit/plugins/module_utils/test_permissions.py) show the
per-owner worker; this shows the same through Ansible's module wrapper, whose payload and
interpreter may live where the Hermes user cannot read (root's temp dir, a Python under
/root): every file the run makes is still the user's, backups 0600, directories 0700.
"""

import os
import stat
import subprocess

import pytest
from hermes_reliability import chown_tree, ensure_user, files_not_owned_by, need_root, world_traversable_dir

from hermes_fixtures import build_home

# The module run as root on another user's home.
pytestmark = [pytest.mark.root]

PLAYBOOK = """
- name: Maintain a user's home as root
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Maintain
      hermes_agent.ops.session_maintenance:
        hermes_home: ["{{ test_home }}"]
        prune_days: 7
        backup_compress: true
        vacuum_mode: full
      register: maintained
"""

SPECS = [
    {"id": "old", "source": "cli", "started_days_ago": 30, "ended_days_ago": 29, "messages": 3, "transcripts": True},
    {"id": "zombie", "source": "cli", "started_days_ago": 3, "messages": 2, "last_message_days_ago": 2},
    {"id": "new", "source": "cli", "started_days_ago": 1, "ended_days_ago": 0.5, "messages": 2},
]


def test_module_as_root_writes_only_the_users_files(ansible_playbook, tmp_path):
    need_root()
    uid, gid = ensure_user("hermes-ops-t1")
    base = world_traversable_dir("hermes-ops-module-root-")
    try:
        home = base / "home"
        for profile in (None, "work"):
            build_home(str(home), "v30", SPECS, profile=profile)
        chown_tree(home, uid, gid)
        for dirpath, _dirs, filenames in os.walk(str(home)):
            os.chmod(dirpath, 0o700)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o600)
        playbook = tmp_path / "maintain_as_root.yml"
        playbook.write_text(PLAYBOOK)
        rc, out = ansible_playbook(str(playbook), extra_vars={"test_home": str(home)})
        assert rc == 0, getattr(out, "text", out)
        profiles = out.result("Maintain")["profiles"]
        assert [(p["name"], p["status"], p["sessions_pruned"]) for p in profiles] == [
            ("default", "ok", 1),
            ("work", "ok", 1),
        ]
        assert files_not_owned_by(home, uid) == []
        backups = home / "backups"
        assert stat.S_IMODE(os.stat(str(backups)).st_mode) == 0o700
        assert len(os.listdir(str(backups))) == 2
        for name in os.listdir(str(backups)):
            assert stat.S_IMODE(os.stat(str(backups / name)).st_mode) == 0o600
        for db in (home / "state.db", home / "profiles" / "work" / "state.db"):
            assert stat.S_IMODE(os.stat(str(db)).st_mode) == 0o600
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
