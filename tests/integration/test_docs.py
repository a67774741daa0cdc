"""The modules' and the role's documentation renders with ``ansible-doc`` and carries the key options.

Runs the ``ansible-doc`` next to the running Python, so each controller of the support matrix
(``make integration`` on the controller venv's core, ``make matrix-controller`` on each other one) checks its own
rendering, both as text (what an operator reads) and as JSON (options, types, defaults).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NAMESPACE = "hermes_agent.ops"

# module -> options that must be documented, with their type (and default where one matters)
MODULE_OPTIONS = {
    "session_maintenance": {
        "hermes_home": {"type": "list"},
        "profiles": {"type": "list"},
        "zombie_days": {"type": "float"},
        "prune_days": {"type": "float"},
        "backup": {"type": "bool", "default": True},
        "backup_dir": {"type": "path"},
        "vacuum_mode": {"type": "str", "default": "auto"},
        "batch_size": {"type": "int"},
        "batch_pause": {"type": "float"},
        "busy_timeout": {"type": "float"},
    },
    "state_db_info": {
        "hermes_home": {"type": "list"},
        "profiles": {"type": "list"},
        "zombie_days": {"type": "float"},
        "prune_days": {"type": "float"},
    },
    "state_db_restore": {
        "hermes_home": {"type": "path"},
        "profile": {"type": "str"},
        "backup": {"type": "str"},
    },
    "session_restore": {
        "hermes_home": {"type": "path"},
        "archive": {"type": "str"},  # one of archive and backup: neither is required alone
        "backup": {"type": "str"},
        "sessions": {"type": "list"},
        "active_after": {"type": "str"},
        "active_before": {"type": "str"},
        "sources": {"type": "list"},
        "match": {"type": "str"},
        "list_missing": {"type": "bool", "default": False},
    },
    "engine_files": {
        "dest": {"type": "path", "required": True},
        "owner": {"type": "str"},
        "group": {"type": "str"},
        "mode": {"type": "str", "default": "0644"},
    },
}
MODULE_RETURNS = {
    "session_maintenance": ["profiles", "summary", "failed_profiles"],
    "state_db_info": ["profiles"],
    "state_db_restore": ["restored", "backup"],
    "session_restore": ["archive", "backup", "sessions", "sessions_restored", "messages_restored", "backups", "notes"],
    "engine_files": ["written", "results", "extra"],
}
ROLE = "session_maintenance"
ROLE_OPTIONS = [
    "hermes_maintenance_user",
    "hermes_maintenance_homes",
    "hermes_maintenance_state",
    "hermes_maintenance_scheduler",
    "hermes_maintenance_schedule",
    "hermes_maintenance_prune_days",
    "hermes_maintenance_zombie_days",
    "hermes_maintenance_backup",
    "hermes_maintenance_vacuum_mode",
]


# ansible-core's own warnings, not about this collection's docs
UNRELATED_WARNINGS = (
    # ansible-core 2.21: its internal _protomatter collection has no MANIFEST.json (role docs)
    "ansible/_internal/ansible_collections/ansible/_protomatter' does not have a MANIFEST.json",
)


def ansible_doc(collections_path, *args):
    executable = Path(sys.executable).parent / "ansible-doc"
    if not executable.is_file():
        pytest.fail(f"ansible-doc not found next to {sys.executable}")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_path), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env.pop("ANSIBLE_DOC_FRAGMENT_PLUGINS", None)
    proc = subprocess.run(
        [str(executable), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"ansible-doc {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
    assert "[ERROR]" not in proc.stderr, proc.stderr
    warnings = [w for w in proc.stderr.split("[WARNING]")[1:] if not any(ok in w for ok in UNRELATED_WARNINGS)]
    assert not warnings, proc.stderr
    return proc.stdout


def test_collection_lists_its_modules_and_role(collections_path):
    listed = ansible_doc(collections_path, "-l", NAMESPACE)
    for module in MODULE_OPTIONS:
        assert f"{NAMESPACE}.{module}" in listed, listed
    roles = ansible_doc(collections_path, "-t", "role", "-l", NAMESPACE)
    assert f"{NAMESPACE}.{ROLE}" in roles, roles


@pytest.mark.parametrize("module", sorted(MODULE_OPTIONS))
def test_module_doc_renders_with_key_options(collections_path, module):
    fqcn = f"{NAMESPACE}.{module}"
    text = ansible_doc(collections_path, fqcn)
    assert fqcn in text.splitlines()[0], text[:500]
    for section in ("OPTIONS", "EXAMPLES", "RETURN VALUES"):
        assert section in text, f"{section} missing from the text rendering of {fqcn}"
    for option in MODULE_OPTIONS[module]:
        assert option in text, f"{option} missing from the text rendering of {fqcn}"

    doc = json.loads(ansible_doc(collections_path, "--json", fqcn))[fqcn]
    assert doc["doc"]["short_description"].strip()
    assert doc["examples"].strip()
    options = doc["doc"]["options"]
    for option, expected in MODULE_OPTIONS[module].items():
        assert option in options, f"{fqcn}: option {option} not documented"
        for key, value in expected.items():
            assert options[option].get(key) == value, f"{fqcn}: {option}.{key} is {options[option].get(key)!r}"
        assert options[option].get("description"), f"{fqcn}: {option} has no description"
    for key in MODULE_RETURNS[module]:
        assert key in (doc.get("return") or {}), f"{fqcn}: return value {key} not documented"
    # check mode support is declared (the collection's dry runs depend on it)
    assert doc["doc"].get("attributes", {}).get("check_mode", {}).get("support") in ("full", "partial")


def test_role_doc_renders_with_key_options(collections_path):
    fqcn = f"{NAMESPACE}.{ROLE}"
    text = ansible_doc(collections_path, "-t", "role", fqcn)
    assert fqcn in text.splitlines()[0], text[:500]
    assert "ENTRY POINT:" in text and "main" in text.split("ENTRY POINT:", 1)[1].splitlines()[0]
    for option in ROLE_OPTIONS:
        assert option in text, f"{option} missing from the text rendering of role {fqcn}"

    doc = json.loads(ansible_doc(collections_path, "-t", "role", "--json", fqcn))[fqcn]
    main = doc["entry_points"]["main"]
    assert main.get("short_description", "").strip()
    for option in ROLE_OPTIONS:
        assert option in main["options"], f"role {fqcn}: {option} not in meta/argument_specs.yml"
        assert main["options"][option].get("description"), f"role {fqcn}: {option} has no description"
