# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Release artifact check (`make release-check`), run with the .venv's Python.

1. ``ansible-galaxy collection build`` of the working tree into build/release/.
2. The tarball holds what a release needs and none of the generated data, caches, venvs or
   build outputs (galaxy.yml ``build_ignore``).
3. ``ansible-galaxy collection install --offline`` of the tarball into an empty collections
   path, then ``ansible-galaxy collection verify --offline`` of the installed copy.
4. Smoke run of the INSTALLED copy only (ANSIBLE_COLLECTIONS_PATH = that path alone):
   ``ansible-playbook hermes_agent.ops.maintain --check`` against a demo Hermes home built
   with tests/lib/hermes_fixtures.py (layout v30, the standard scenario). The prediction must
   be the scenario's expected outcome, and every file of the home byte-identical afterwards.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OUT = REPO / "build" / "release"
NAMESPACE, NAME = "hermes_agent", "ops"

# Must be in the artifact (relative to the collection root).
REQUIRED = [
    "MANIFEST.json",
    "FILES.json",
    "README.md",
    "LICENSE",
    "meta/runtime.yml",
    "plugins/modules/session_maintenance.py",
    "plugins/modules/state_db_info.py",
    "plugins/module_utils/_hermes/maintain/run.py",
    "plugins/doc_fragments/hermes.py",
    "roles/session_maintenance/meta/argument_specs.yml",
    "roles/session_maintenance/tasks/main.yml",
    "playbooks/maintain.yml",
    "changelogs/changelog.yaml",
    # the README's example playbooks and the guide it points users to
    "docs/examples/single_server.yml",
    "docs/examples/fleet/fleet.yml",
    "docs/getting_started.md",
]
# Never in the artifact: any path component equal to one of these ...
FORBIDDEN_PARTS = {
    ".cache",
    ".venv",
    "build",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".git",
    ".benchmarks",
    ".ansible",
    ".ci",
    "output",  # tests/output (ansible-test results)
}
# ... or starting with one of these, or ending with one of these.
FORBIDDEN_PREFIXES = (".venv-",)
FORBIDDEN_SUFFIXES = (".pyc", ".pyo", ".tar.gz", ".db", ".db-wal", ".db-shm", ".sqlite", ".retry", ".log")


def run(cmd, env=None, check=True):
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    proc = subprocess.run(
        [str(c) for c in cmd], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if proc.stdout.strip():
        print(proc.stdout.rstrip())
    if proc.stderr.strip():
        print(proc.stderr.rstrip(), file=sys.stderr)
    if check and proc.returncode != 0:
        raise SystemExit("release-check: %s exited %d" % (cmd[0], proc.returncode))
    return proc


def fail(msg):
    raise SystemExit("release-check: FAILED: " + msg)


def tree_digest(root):
    """{relative path: (kind, mode, sha256 or link target)} of everything under root."""
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                result[rel] = ("link", st.st_mode, os.readlink(path))
            elif os.path.isdir(path):
                result[rel] = ("dir", st.st_mode, None)
            else:
                with open(path, "rb") as handle:
                    result[rel] = ("file", st.st_mode, hashlib.sha256(handle.read()).hexdigest(), st.st_mtime_ns)
    return result


def check_contents(tarball):
    with tarfile.open(tarball) as tar:
        names = [m.name[2:] if m.name.startswith("./") else m.name for m in tar.getmembers()]
    bad = []
    for name in names:
        parts = name.split("/")
        if (
            FORBIDDEN_PARTS.intersection(parts)
            or any(p.startswith(FORBIDDEN_PREFIXES) for p in parts)
            or name.endswith(FORBIDDEN_SUFFIXES)
        ):
            bad.append(name)
    if bad:
        fail(
            "the artifact holds generated data, caches or build outputs (extend build_ignore in galaxy.yml):\n  "
            + "\n  ".join(sorted(bad)[:50])
        )
    missing = [r for r in REQUIRED if r not in names]
    if missing:
        fail("the artifact lacks " + ", ".join(missing))
    print(
        "artifact: %s, %d entries, %.0f KiB; none of the ignored paths"
        % (tarball.name, len(names), tarball.stat().st_size / 1024)
    )


def main():
    version = None
    for line in (REPO / "galaxy.yml").read_text(encoding="utf-8").splitlines():
        if line.startswith("version:"):
            version = line.split(":", 1)[1].strip().strip("'\"")
    if not version:
        fail("no version in galaxy.yml")

    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_LOCAL_TEMP=str(OUT / "ansible-tmp"))
    for key in ("ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_COLLECTIONS_PATHS", "ANSIBLE_CONFIG"):
        env.pop(key, None)

    # 1. build
    run([BIN / "ansible-galaxy", "collection", "build", "--output-path", OUT, REPO], env=env)
    tarball = OUT / ("%s-%s-%s.tar.gz" % (NAMESPACE, NAME, version))
    if not tarball.is_file():
        fail("ansible-galaxy built no %s" % tarball.name)

    # 2. contents
    check_contents(tarball)

    # 3. install into an empty collections path, verify the installed files
    collections = OUT / "collections"
    collections.mkdir()
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
    env["ANSIBLE_COLLECTIONS_SCAN_SYS_PATH"] = "false"
    run([BIN / "ansible-galaxy", "collection", "install", "--offline", "-p", collections, tarball], env=env)
    installed = collections / "ansible_collections" / NAMESPACE / NAME
    manifest = json.loads((installed / "MANIFEST.json").read_text(encoding="utf-8"))
    if manifest["collection_info"]["version"] != version:
        fail("installed version %s, galaxy.yml says %s" % (manifest["collection_info"]["version"], version))
    run(
        [
            BIN / "ansible-galaxy",
            "collection",
            "verify",
            "--offline",
            "-p",
            collections,
            "%s.%s:%s" % (NAMESPACE, NAME, version),
        ],
        env=env,
    )
    listed = run([BIN / "ansible-galaxy", "collection", "list", "-p", collections, "--format", "json"], env=env).stdout
    if "%s.%s" % (NAMESPACE, NAME) not in listed:
        fail("ansible-galaxy collection list does not show the installed copy")

    # 4. smoke run of the installed copy against a demo home
    sys.path.insert(0, str(REPO / "tests" / "lib"))
    from hermes_fixtures import build_home, standard_scenario  # (after the sys.path entry above)

    home = OUT / "demo-home"
    specs, expected = standard_scenario("v30")
    build_home(str(home), "v30", specs)
    before = tree_digest(home)

    results = OUT / "smoke-results.json"
    env.update(
        {
            "ANSIBLE_STDOUT_CALLBACK": "hermes_test_json",
            "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "tests" / "integration" / "callback_plugins"),
            "HERMES_TEST_JSON_OUT": str(results),
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
        }
    )
    # the scenario's home is laid out for the seed script's 7 days (the role's default keeps 90)
    extra = {
        "hermes_maintenance_homes": [str(home)],
        "hermes_maintenance_become": False,
        "hermes_maintenance_prune_days": 7,
    }
    (OUT / "smoke-vars.json").write_text(json.dumps(extra), encoding="utf-8")
    proc = run(
        [
            BIN / "ansible-playbook",
            "-i",
            "localhost,",
            "-c",
            "local",
            "%s.%s.maintain" % (NAMESPACE, NAME),
            "--check",
            "-e",
            "@" + str(OUT / "smoke-vars.json"),
        ],
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        fail("ansible-playbook hermes_agent.ops.maintain --check exited %d" % proc.returncode)

    record = json.loads(results.read_text(encoding="utf-8"))
    tasks = [t for play in record.get("plays", []) for t in play.get("tasks", [])]
    maintain = [t for t in tasks if t.get("name") == "Maintain"]
    if not maintain:
        fail("no 'Maintain' task in the run: %s" % [t.get("name") for t in tasks])
    result = maintain[-1]["hosts"]["localhost"]
    profiles = {p["name"]: p for p in result.get("profiles", [])}
    default = profiles.get("default")
    if default is None:
        fail("no profile 'default' in the prediction: %s" % result)
    predicted = {"sessions_pruned": default.get("sessions_pruned"), "zombies_closed": default.get("zombies_closed")}
    wanted = {"sessions_pruned": len(expected["pruned"]), "zombies_closed": len(expected["zombies"])}
    if predicted != wanted or result.get("changed") is not True:
        fail(
            "check mode predicted %s (changed=%s), the scenario expects %s" % (predicted, result.get("changed"), wanted)
        )
    if "messages_pruned" in default and default["messages_pruned"] != expected["messages_pruned"]:
        fail("predicted messages_pruned %s, expected %s" % (default["messages_pruned"], expected["messages_pruned"]))

    after = tree_digest(home)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        fail("check mode changed the demo home: %s" % changed)

    # ANSIBLE_COLLECTIONS_PATH named only the install path: the playbook and modules were the installed copy's
    print(
        "release-check: passed (%s built, installed to %s, `hermes_agent.ops.maintain --check` from the installed "
        "copy predicted %s for the demo home, which stayed byte-identical)" % (tarball.name, collections, predicted)
    )


if __name__ == "__main__":
    main()
