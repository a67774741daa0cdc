# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""hermes_agent.ops.engine_files on real files: the collection's engine, installed in a tmp dir.

The module runs as Ansible runs it (its file, its arguments as JSON, check and diff flags), with
the arguments its action plugin builds from the collection's module_utils; a crash is a real
SIGKILL of a process in the middle of a write.
"""

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.hermes_agent.ops.plugins.action import engine_files as action
from ansible_collections.hermes_agent.ops.plugins.modules import engine_files as module

REPO = Path(__file__).resolve().parents[4]
MODULE = REPO / "plugins" / "modules" / "engine_files.py"
SOURCE = REPO / "plugins" / "module_utils" / "_hermes"
ENGINE = sorted(p.relative_to(SOURCE).as_posix() for p in SOURCE.rglob("*.py") if "__pycache__" not in p.parts)
LAYERS = sorted({os.path.dirname(name) for name in ENGINE} - {""})  # the package's subdirectories
PACKAGE = sorted(ENGINE + LAYERS + ["__init__.py"])


def run_module(dest, check=False, diff=False, **args):
    """The module's JSON result, run as a process the way Ansible runs it."""
    module_args = dict(dest=str(dest), _files=action.engine_files(), _ansible_check_mode=check, _ansible_diff=diff)
    module_args.update(args)
    proc = subprocess.run(
        [sys.executable, str(MODULE)],
        input=json.dumps({"ANSIBLE_MODULE_ARGS": module_args}),
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(proc.stdout)


def names(paths):
    """Each path in the installed package (dest is a directory named hermes_ops)."""
    return [p.split("/hermes_ops/", 1)[1] for p in paths]


def installed(dest):
    return sorted(p.relative_to(dest).as_posix() for p in Path(dest).rglob("*") if "__pycache__" not in p.parts)


def test_the_action_plugin_sends_exactly_the_collections_engine_files():
    files = action.engine_files()
    assert sorted(files) == ENGINE and "runner.py" in files and "maintain/run.py" in files
    for name, text in files.items():
        assert text.encode("utf-8") == (SOURCE / name).read_bytes()


def test_first_install_check_mode_predicts_exactly_then_installs_then_is_idempotent(tmp_path):
    dest = tmp_path / "hermes_ops"
    # A first apply's dry run: the directory is not there yet.
    check = run_module(dest, check=True, diff=True, _ansible_inject_invocation=True)
    assert check["changed"] is True and names(check["written"]) == PACKAGE, check
    assert not dest.exists()
    # Each file is named, its lines are not shown.
    prepared = check["diff"]["prepared"].splitlines()
    assert prepared == ["would write %s (new)" % (dest / name) for name in PACKAGE if name not in LAYERS]
    # The result does not echo the engine's source.
    assert check["invocation"]["module_args"]["_files"] == ENGINE

    dest.mkdir()
    first = run_module(dest, mode="0640")
    assert first["changed"] is True and first["written"] == check["written"] and first["extra"] == [], first
    assert [r["dest"] for r in first["results"]] == first["written"]
    assert installed(dest) == PACKAGE  # no temporary file left
    for name in ENGINE:
        assert (dest / name).read_bytes() == (SOURCE / name).read_bytes()
    assert (dest / "__init__.py").read_bytes() == b""
    assert {stat.S_IMODE((dest / n).stat().st_mode) for n in PACKAGE if n not in LAYERS} == {0o640}
    assert LAYERS and {stat.S_IMODE((dest / n).stat().st_mode) for n in LAYERS} == {0o750}  # search where read

    again = run_module(dest, mode="0640", diff=True)
    assert again["changed"] is False and again["written"] == [] and "diff" not in again, again
    assert run_module(dest, check=True, mode="0640")["changed"] is False


def test_only_what_differs_is_written_and_check_mode_names_it_first(tmp_path):
    dest = tmp_path / "hermes_ops"
    dest.mkdir()
    run_module(dest)
    with open(str(dest / "maintain/run.py"), "a") as f:
        f.write("# changed on the host\n")
    os.chmod(str(dest / "runner.py"), 0o600)
    (dest / "sqlite/db.py").unlink()
    (dest / "_hermes_gone.py").write_text("# a file an older collection had\n")
    before = {n: (dest / n).stat().st_ino for n in installed(dest)}

    check = run_module(dest, check=True, diff=True)
    assert names(check["written"]) == ["maintain/run.py", "runner.py", "sqlite/db.py"], check
    assert [r["why"] for r in check["results"]] == [["content"], ["mode"], ["new"]]
    assert check["diff"]["prepared"].splitlines()[0] == "would write %s (content)" % (dest / "maintain/run.py")
    assert names(check["extra"]) == ["_hermes_gone.py"]
    assert (dest / "maintain/run.py").read_text().endswith("# changed on the host\n")  # check mode wrote nothing

    real = run_module(dest, diff=True)
    assert real["written"] == check["written"] and real["extra"] == check["extra"], real
    assert real["diff"]["prepared"].splitlines()[2] == "wrote %s (new)" % (dest / "sqlite/db.py")
    after = {n: (dest / n).stat().st_ino for n in installed(dest)}
    untouched = set(PACKAGE) - {"sqlite/db.py", "maintain/run.py", "runner.py"}
    assert {n: after[n] for n in untouched} == {n: before[n] for n in untouched}
    # Replaced, not changed in place: whoever held the old file open cannot write to the new.
    assert after["maintain/run.py"] != before["maintain/run.py"]
    assert stat.S_IMODE((dest / "runner.py").stat().st_mode) == 0o644
    assert (dest / "_hermes_gone.py").exists()  # reported, left to the role
    assert run_module(dest)["changed"] is False


def test_a_symlink_in_place_of_an_engine_file_is_replaced_not_followed(tmp_path):
    dest = tmp_path / "hermes_ops"
    dest.mkdir()
    run_module(dest)
    target = tmp_path / "elsewhere.py"
    target.write_text("# not the engine\n")
    (dest / "sqlite/db.py").unlink()
    (dest / "sqlite/db.py").symlink_to(target)
    result = run_module(dest)
    assert names(result["written"]) == ["sqlite/db.py"] and result["results"][0]["why"] == ["not a regular file"]
    assert not (dest / "sqlite/db.py").is_symlink() and target.read_text() == "# not the engine\n"


def test_a_symlink_in_place_of_a_layer_directory_fails_the_run_and_is_not_followed(tmp_path):
    dest = tmp_path / "hermes_ops"
    dest.mkdir()
    run_module(dest)
    elsewhere = tmp_path / "elsewhere"
    (dest / "sqlite").rename(elsewhere)
    (dest / "sqlite").symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    for check in (True, False):
        result = run_module(dest, check=check)
        assert result.get("failed") and "%s is not a directory" % (dest / "sqlite") in result["msg"], result
    assert (dest / "sqlite").is_symlink() and sorted(p.name for p in elsewhere.iterdir()) == before


@pytest.mark.root
def test_owner_and_group_are_compared_and_set(tmp_path):
    dest = tmp_path / "hermes_ops"
    dest.mkdir()
    run_module(dest, owner="root", group="0")
    os.chown(str(dest / "plan/selection.py"), 65534, -1)
    os.chown(str(dest / "store/fence.py"), -1, 65534)
    result = run_module(dest, owner="root", group="0")
    assert list(zip(names(r["dest"] for r in result["results"]), (r["why"] for r in result["results"]))) == [
        ("plan/selection.py", ["owner"]),
        ("store/fence.py", ["group"]),
    ]
    assert {((dest / n).stat().st_uid, (dest / n).stat().st_gid) for n in PACKAGE} == {(0, 0)}
    # Given by id, as the role gives the group: the same files, nothing to write.
    assert run_module(dest, owner="0", group="0")["changed"] is False


def test_bad_arguments_fail_naming_what_to_fix(tmp_path):
    missing = run_module(tmp_path / "not-there")
    assert missing.get("failed") and str(tmp_path / "not-there") in missing["msg"], missing
    assert "the directory does not exist: create it first" in missing["msg"]
    mode = run_module(tmp_path, mode="rw")
    assert mode.get("failed") and "mode 'rw' is not an octal number" in mode["msg"], mode
    owner = run_module(tmp_path, owner="no-such-user-hermes-ops")
    assert owner.get("failed") and "no user named 'no-such-user-hermes-ops'" in owner["msg"], owner
    assert installed(tmp_path) == []  # nothing written


def _crash_in_the_middle_of_a_write(dest, wanted, names_to_write):
    """Child: killed by SIGKILL once a new file's content is written, before its rename."""
    os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
    module.write_files(dest, wanted, names_to_write)


def test_a_write_killed_before_its_rename_leaves_the_old_file_and_the_next_run_finishes(tmp_path):
    dest = tmp_path / "hermes_ops"
    dest.mkdir()
    run_module(dest)
    old = b"# the engine as an older collection had it\n"
    (dest / "maintain/run.py").write_bytes(old)

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies in the write
        try:
            wanted = module.wanted_files(action.engine_files(), None, None, "0644")
            _crash_in_the_middle_of_a_write(str(dest), wanted, ["maintain/run.py"])
        finally:
            os._exit(3)
    status = os.waitpid(pid, 0)[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status

    assert (dest / "maintain/run.py").read_bytes() == old
    leftovers = [n for n in installed(dest) if os.path.basename(n).startswith(module.TEMP_PREFIX)]
    assert len(leftovers) == 1, installed(dest)  # the new content, never renamed into place
    result = run_module(dest)
    assert names(result["written"]) == ["maintain/run.py"], result
    assert installed(dest) == PACKAGE  # the leftover is gone
    assert (dest / "maintain/run.py").read_bytes() == (SOURCE / "maintain/run.py").read_bytes()
