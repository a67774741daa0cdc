#!/usr/bin/python
# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_files
short_description: Install the collection's maintenance engine on a host as the Python package hermes_ops
version_added: 0.1.0
description:
  - Installs the engine that the scheduled job of the role C(hermes_agent.ops.session_maintenance) runs (the
    collection's C(plugins/module_utils/_hermes/), its subdirectories included) and an empty C(__init__.py) into
    O(dest), in one module run where a copy per file would cost a transfer and several round trips each.
  - Each subdirectory of the engine is made in O(dest) with the owner and group of the files and their mode, with search
    where it grants read (C(0644) gives C(0755)); a symlink or a file in place of such a directory fails the run.
  - The action plugin of the same name reads the engine files on the controller, from the collection the plugin belongs
    to, and passes their contents to the module.
  - On the host each file's content, owner, group and mode are compared with what is installed and only the files that
    differ are written, each to a temporary file in O(dest) that gets its owner, group and mode and is flushed to disk
    before it is renamed over the old one; the directory is flushed to disk last. A file is never changed in place, so
    an interrupted run leaves each file either old or new, and whoever held the old file open cannot write to the new.
  - Engine files in O(dest) that the collection no longer has are reported in RV(extra), not removed.
author:
  - Hermes Agent Ops maintainers (@hermes-agent-ops)
attributes:
  action:
    description: >-
      Indicates this has a corresponding action plugin so some parts of the options can be executed on the
      controller.
    support: full
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details:
      - Names exactly the files a real run would write. O(dest) need not exist then (a first apply's dry run).
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: partial
    details:
      - Names each file written and why (new, content, owner, group, mode); the engine's source lines are not shown.
  idempotent:
    description: Run twice in a row outside check mode with the same arguments, the second run reports no change.
    support: full
options:
  dest:
    description:
      - The package directory, for example C(/usr/local/lib/hermes-ops/hermes/lib/hermes_ops). It must exist (outside
        check mode) and belong to O(owner), so that nobody else can replace what is installed there.
    type: path
    required: true
  owner:
    description:
      - User name or uid that owns each installed file. When omitted, new files belong to the user the module runs as
        and the owner of installed ones is not compared.
    type: str
  group:
    description:
      - Group name or gid of each installed file. When omitted, new files get the module user's group and the group
        of installed ones is not compared.
    type: str
  mode:
    description:
      - Permissions of each installed file, as an octal string.
    type: str
    default: "0644"
"""

EXAMPLES = r"""
- name: Install the engine as package hermes_ops, root's
  hermes_agent.ops.engine_files:
    dest: /usr/local/lib/hermes-ops/hermes/lib/hermes_ops
    owner: root
    group: "0"
    mode: "0644"
  become: true
  register: engine

- name: Name the engine files the collection no longer has
  ansible.builtin.debug:
    var: engine.extra
"""

RETURN = r"""
written:
  description: The files written (in check mode, the files a real run would write), full paths, in name order.
  returned: always
  type: list
  elements: str
  sample: ["/usr/local/lib/hermes-ops/hermes/lib/hermes_ops/maintain/run.py"]
results:
  description:
    - One entry per file written (in check mode, that a real run would write), in name order, shaped as a loop of
      C(ansible.builtin.copy) tasks would register them.
  returned: always
  type: list
  elements: dict
  contains:
    dest:
      description: The file's full path.
      type: str
      sample: /usr/local/lib/hermes-ops/hermes/lib/hermes_ops/maintain/run.py
    changed:
      description: Always true (only files written are listed).
      type: bool
      sample: true
    why:
      description: What differed from what was installed; C(new), C(not a regular file), or some of C(content),
        C(owner), C(group), C(mode).
      type: list
      elements: str
      sample: ["content"]
extra:
  description: Engine files (C(.py) files of Python names) in O(dest) and its subdirectories that the collection does
    not have, full paths, in name order.
  returned: always
  type: list
  elements: str
  sample: ["/usr/local/lib/hermes-ops/hermes/lib/hermes_ops/_hermes_old.py"]
"""

import grp
import os
import pwd
import re
import stat
import tempfile
from collections.abc import Iterator
from typing import Any, Callable, Optional, TypedDict

from ansible.module_utils.basic import AnsibleModule

# What the package holds besides the engine files: the empty marker that makes it a package.
PACKAGE_MARKER = "__init__.py"
# An engine file: its path in the package, each part a Python name ("maintain.py", "sqlite/db.py").
ENGINE_FILE = re.compile(r"^(?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py$")
# Temporary files of a write: hidden, never importable, removed by the next run if a crash left one.
TEMP_PREFIX = ".engine_files."
# Python's own caches beside the sources: neither engine files nor extra ones.
CACHE_DIR = "__pycache__"
# What a path of the package must be: its bytes (None: a directory), uid and gid (None: left as
# they are) and mode.
Wanted = tuple[Optional[bytes], Optional[int], Optional[int], int]


class InstallPlan(TypedDict):
    write: list[tuple[str, list[str]]]  # (path in the package, why it is written)
    extra: list[str]  # installed engine files the collection lacks


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            owner=dict(type="str"),
            group=dict(type="str"),
            mode=dict(type="str", default="0644"),
            # Set by the action plugin: engine file name -> its text. Not logged: half a megabyte of
            # source would go to the host's syslog on every run.
            _files=dict(type="dict", required=True, no_log=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    # The result echoes the arguments: the engine's names, not its source (half a megabyte).
    invocation = {"module_args": dict(p, _files=sorted(p["_files"]))}
    try:
        wanted = wanted_files(p["_files"], p["owner"], p["group"], p["mode"])
        plan = plan_install(p["dest"], wanted, must_exist=not module.check_mode)
        if not module.check_mode:
            write_files(p["dest"], wanted, [name for name, _why in plan["write"]])
    except (OSError, ValueError) as exc:
        module.fail_json(msg="installing the engine in %s: %s" % (p["dest"], exc), invocation=invocation)
    results: list[dict[str, Any]] = [
        dict(dest=os.path.join(p["dest"], name), changed=True, why=why) for name, why in plan["write"]
    ]
    written = [r["dest"] for r in results]
    extra = [os.path.join(p["dest"], name) for name in plan["extra"]]
    result = dict(changed=bool(written), written=written, results=results, extra=extra, invocation=invocation)
    # The diff names the files; a directory made or set on the way shows in its files' paths.
    files = [r for r, (name, _why) in zip(results, plan["write"]) if wanted[name][0] is not None]
    if module._diff and files:
        verb = "would write" if module.check_mode else "wrote"
        result["diff"] = dict(prepared="\n".join("%s %s (%s)" % (verb, r["dest"], ", ".join(r["why"])) for r in files))
    module.exit_json(**result)


def wanted_files(texts: dict[str, str], owner: str | None, group: str | None, mode: str) -> dict[str, Wanted]:
    """path -> (bytes, uid or None, gid or None, mode): the engine files, the package marker, and the
    package's subdirectories (bytes None; the mode with search where it grants read). A subdirectory
    needs no marker: it is a namespace package found only inside this one."""
    for name in texts:
        if not ENGINE_FILE.match(name) or os.path.basename(name) == PACKAGE_MARKER:
            raise ValueError("%r is not an engine file name (a .py path of Python names in the package)" % name)
    uid = None if owner is None else _id(owner, pwd.getpwnam, "pw_uid", "user")
    gid = None if group is None else _id(group, grp.getgrnam, "gr_gid", "group")
    try:
        bits = int(mode, 8)
    except ValueError:
        raise ValueError("mode %r is not an octal number such as 0644" % mode) from None
    files: dict[str, Wanted] = {name: (text.encode("utf-8"), uid, gid, bits) for name, text in texts.items()}
    files[PACKAGE_MARKER] = (b"", uid, gid, bits)
    for directory in {os.path.dirname(name) for name in texts}:
        while directory:
            files[directory] = (None, uid, gid, bits | (bits & 0o444) >> 2)
            directory = os.path.dirname(directory)
    return files


def _id(value: str, lookup: Callable[[str], object], field: str, what: str) -> int:
    if value.isdigit():
        return int(value)
    try:
        number: int = getattr(lookup(value), field)
        return number
    except KeyError:
        raise ValueError("no %s named %r on this host" % (what, value)) from None


def plan_install(dest: str, wanted: dict[str, Wanted], must_exist: bool = True) -> InstallPlan:
    """What to write, with why, and the installed engine files the collection lacks."""
    if not os.path.isdir(dest):
        if must_exist:
            raise ValueError(
                "the directory does not exist: create it first, with the owner and mode it must have"
            ) from None
        present: set[str] = set()
    else:
        present = set(_installed(dest))
    write: list[tuple[str, list[str]]] = []
    for name in sorted(wanted):
        why = _differences(os.path.join(dest, name), wanted[name]) if name in present else ["new"]
        if why:
            write.append((name, why))
    extra = sorted(n for n in present if ENGINE_FILE.match(n) and n not in wanted)
    return {"write": write, "extra": extra}


def _installed(dest: str) -> Iterator[str]:
    """Every path under DEST, relative to it (symlinks listed, not followed; caches left out)."""
    for root, dirs, files in os.walk(dest):
        dirs[:] = [d for d in dirs if d != CACHE_DIR]
        for name in dirs + files:
            yield os.path.relpath(os.path.join(root, name), dest)


def _differences(path: str, want: Wanted) -> list[str]:
    data, uid, gid, mode = want
    st = os.lstat(path)
    if data is None:
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError("%s is not a directory: remove it, the engine's package goes there" % path)
    elif not stat.S_ISREG(st.st_mode):
        return ["not a regular file"]
    why = []
    if data is not None and (st.st_size != len(data) or _read(path) != data):
        why.append("content")
    if uid is not None and st.st_uid != uid:
        why.append("owner")
    if gid is not None and st.st_gid != gid:
        why.append("group")
    if stat.S_IMODE(st.st_mode) != mode:
        why.append("mode")
    return why


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def write_files(dest: str, wanted: dict[str, Wanted], names: list[str]) -> None:
    """Write each named file atomically and durably, its directories first.

    A crash between a temporary file's creation and its rename leaves that file (hidden, never
    imported) and the old engine file, which the next run therefore rewrites: it removes the
    leftovers then.
    """
    for name in _installed(dest):
        if os.path.basename(name).startswith(TEMP_PREFIX):
            os.unlink(os.path.join(dest, name))
    changed = {dest}
    for name in names:  # in name order: a directory before what it holds
        path = os.path.join(dest, name)
        data, uid, gid, mode = wanted[name]
        if data is None:
            _directory(path, uid, gid, mode)
        else:
            _write_atomically(os.path.dirname(path), os.path.basename(path), data, uid, gid, mode)
        changed.add(os.path.dirname(path))
    for directory in sorted(changed, reverse=True):
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # the renames are on disk before anything relies on them
        finally:
            os.close(dir_fd)


def _directory(path: str, uid: int | None, gid: int | None, mode: int) -> None:
    """A directory of the package, made or set to its owner, group and mode (never through a symlink)."""
    if not os.path.lexists(path):
        os.mkdir(path, 0o700)
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if uid is not None or gid is not None:
            os.fchown(dir_fd, -1 if uid is None else uid, -1 if gid is None else gid)
        os.fchmod(dir_fd, mode)
    finally:
        os.close(dir_fd)


def _write_atomically(dest: str, name: str, data: bytes, uid: int | None, gid: int | None, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX + name + ".", dir=dest)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if uid is not None or gid is not None:
                os.fchown(f.fileno(), -1 if uid is None else uid, -1 if gid is None else gid)
            os.fchmod(f.fileno(), mode)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(dest, name))
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


if __name__ == "__main__":
    main()
