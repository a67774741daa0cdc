"""Crash states of a recorded run: what the disk may hold after a power loss, rebuilt from strace.

The method of ALICE (OSDI 2014) and CrashMonkey (OSDI 2018), in small. A real run (a Python
snippet calling the engine) is recorded with ``strace -f`` (the file system calls only). Every
call that changes a file or a directory under ``root`` becomes an operation on a model of the
tree: data (write, pwrite64, sendfile, ftruncate, fallocate) on an inode, entries (create, link,
unlink, rename, mkdir, rmdir) on a directory, and ``sync`` (fsync, fdatasync of a file or of a
directory). The tree ``root`` held before the run is the durable starting point. A ``-shm`` is
left out of every state: SQLite rebuilds it from the ``-wal`` when the first connection opens.

A crash state is the starting tree with a subset of the operations replayed in order. Crash
points: just before each sync, and the end of the run. At a crash point an operation is durable
when a later sync (before the point) covered it: its inode's fsync for data, its directory's for
an entry (a rename: both directories'). Two persistence models say which other subsets exist:

* ``strict`` (POSIX as written: only what was fsynced survives, the rest in any subset): the
  durable operations alone; all operations; and for each group of the others (each entry
  operation on its own, each inode's un-synced data together) all operations but that group,
  and the durable ones plus that group; and all operations but a ``-wal``'s frames after each of
  its commits (the first commits written back, the later ones not).
* ``ext4`` (data=ordered, one journal): entry operations reach the disk in order, and a sync of
  anything commits every entry operation before it; data not fsynced is there up to the cut, or
  not at all. States: each prefix of the entry operations since the last sync, with and without
  the un-synced data written before the cut.

Identical trees are checked once. The caller's ``check(state_root, final)`` returns the
violations of one tree (``final``: the durable state once the run has returned, where whatever the
run reported done must be on disk).

Out of scope: torn sector writes (a write is all or nothing), a disk cache that acknowledges a
flush it did not do, memory-mapped writes (only the ``-shm`` uses them), and processes other than
the recorded one writing under ``root``.
"""

import hashlib
import os
import re
import shutil
import subprocess
import tempfile

SYSCALLS = (
    "open,openat,creat,close,write,pwrite64,lseek,sendfile,ftruncate,truncate,fallocate,"
    "fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat,rmdir,mkdir,mkdirat,link,linkat"
)
META = ("link", "unlink", "rename", "mkdir", "rmdir")
DATA = ("write", "trunc")
_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+|\?)")
_UNFINISHED = re.compile(r"^(?P<pid>\d+)\s+(?P<head>.*) <unfinished \.\.\.>$")
_RESUMED = re.compile(r"^(?P<pid>\d+)\s+<\.\.\. (?P<call>\w+) resumed>(?P<tail>.*)$")


def record(script, args, root, trace_path, env=None, cwd=None, wrapper=()):
    """Run ``python3 -c script args`` under strace; returns its completed process.

    ``wrapper``: a command the child is started through (``["eatmydata"]``: its LD_PRELOAD turns
    fsync and fdatasync into no-ops in the libc, so the trace holds none and nothing is durable)."""
    import sys

    command = [
        "strace", "-f", "-qq", "-s", str(1 << 28), "-xx", "-e", "trace=" + SYSCALLS, "-e", "signal=none",
        "-o", trace_path,
    ] + list(wrapper) + [sys.executable, "-c", script] + list(args)  # fmt: skip
    return subprocess.run(command, env=env, cwd=cwd or root, capture_output=True, text=True, timeout=600, check=False)


def _split_args(text):
    """Top-level comma-separated arguments of a strace line (strings, arrays, structs kept whole)."""
    out, depth, current, in_str, i = [], 0, [], False, 0
    while i < len(text):
        ch = text[i]
        if in_str:
            current.append(ch)
            if ch == "\\":
                current.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            current.append(ch)
        elif ch in "[{(":
            depth += 1
            current.append(ch)
        elif ch in "]})":
            depth -= 1
            current.append(ch)
        elif ch == "," and depth == 0:
            out.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    if current:
        out.append("".join(current).strip())
    return out


def _bytes(arg):
    """A strace string argument (``-xx``: every byte as \\xHH) as bytes."""
    assert arg.startswith('"') and not arg.endswith('"...'), "string cut short: %s" % arg[:60]
    body = arg[1:-1]
    return bytes(int(h, 16) for h in re.findall(r"\\x([0-9a-f]{2})", body))


def _int(arg):
    return int(arg.split()[0].strip("[]"), 0)


class Tree:
    """The model: directories {ino: {name: ino}}, files {ino: bytearray}."""

    def __init__(self):
        self.dirs, self.files, self.next_ino = {}, {}, 1

    def new(self, kind):
        ino, self.next_ino = self.next_ino, self.next_ino + 1
        if kind == "d":
            self.dirs[ino] = {}
        else:
            self.files[ino] = bytearray()
        return ino

    def copy(self):
        other = Tree()
        other.dirs = {d: dict(e) for d, e in self.dirs.items()}
        other.files = {f: bytearray(b) for f, b in self.files.items()}
        other.next_ino = self.next_ino
        return other

    def apply(self, op):
        kind = op[0]
        if kind == "write":
            _ino, offset, data = op[1:]
            buf = self.files[op[1]]
            if len(buf) < offset:
                buf.extend(b"\0" * (offset - len(buf)))
            buf[offset : offset + len(data)] = data
        elif kind == "trunc":
            buf = self.files[op[1]]
            if op[2] < len(buf):
                del buf[op[2] :]
            else:
                buf.extend(b"\0" * (op[2] - len(buf)))
        # An entry in a directory whose mkdir this state dropped cannot be on disk either.
        elif kind == "link" and op[1] in self.dirs:
            self.dirs[op[1]][op[2]] = op[3]
        elif kind in ("unlink", "rmdir") and op[1] in self.dirs:
            self.dirs[op[1]].pop(op[2], None)
        elif kind == "rename" and op[1] in self.dirs and op[3] in self.dirs:
            ino = self.dirs[op[1]].pop(op[2], None)
            if ino is not None:
                self.dirs[op[3]][op[4]] = ino
        elif kind == "mkdir" and op[1] in self.dirs:
            self.dirs.setdefault(op[3], {})
            self.dirs[op[1]][op[2]] = op[3]

    def walk(self, ino=None, prefix=""):
        """(relative path, ino) of everything reachable, directories first."""
        for name, child in sorted(self.dirs[ino or ROOT_INO].items()):
            path = prefix + name
            yield path, child
            if child in self.dirs:
                yield from self.walk(child, path + "/")

    def materialize(self, target):
        for rel, ino in self.walk():
            path = os.path.join(target, rel)
            if ino in self.dirs:
                os.mkdir(path, 0o700)
            else:
                with open(path, "wb") as handle:
                    handle.write(self.files[ino])
                os.chmod(path, 0o600)

    def digest(self):
        h = hashlib.sha256()
        for rel, ino in self.walk():
            h.update(rel.encode() + b"\0")
            h.update(hashlib.sha256(self.files[ino]).digest() if ino in self.files else b"/")
        return h.hexdigest()


ROOT_INO = 1


def snapshot(root):
    """The tree under root as it is on disk now (the run's durable starting point)."""
    tree = Tree()
    assert tree.new("d") == ROOT_INO
    by_path = {root: ROOT_INO}
    for base, dirs, files in os.walk(root):
        parent = by_path[base]
        for name in sorted(dirs):
            ino = tree.new("d")
            tree.dirs[parent][name] = ino
            by_path[os.path.join(base, name)] = ino
        for name in sorted(files):
            if name.endswith("-shm"):
                continue
            ino = tree.new("f")
            tree.dirs[parent][name] = ino
            with open(os.path.join(base, name), "rb") as handle:
                tree.files[ino] = bytearray(handle.read())
    return tree


class Recording:
    """The operations of one strace log, replayed on ``live`` (the tree as the run saw it)."""

    def __init__(self, root, start, trace_path):
        self.root = os.path.realpath(root)
        self.start = start
        self.live = start.copy()
        self.ops = []
        self.fds = {}  # fd -> [ino or None (outside root), position]; one process: threads share them
        self.cwd = self.root
        with open(trace_path) as handle:
            self._parse(handle)

    # --- path resolution in the live tree
    def _lookup(self, dirfd, path):
        """(parent dir ino, name) of a path, None when it lies outside root."""
        if not path.startswith("/"):
            if dirfd in (None, "AT_FDCWD"):
                path = os.path.join(self.cwd, path)
            else:
                base = self.fds.get(int(dirfd))
                if base is None or base[0] is None:
                    return None
                return self._in_dir(base[0], path)
        path = os.path.normpath(path)
        if path != self.root and not path.startswith(self.root + "/"):
            return None
        rel = os.path.relpath(path, self.root)
        if rel == ".":
            return None
        return self._in_dir(ROOT_INO, rel)

    def _in_dir(self, ino, rel):
        parts = [p for p in rel.split("/") if p and p != "."]
        for part in parts[:-1]:
            ino = self.live.dirs.get(ino, {}).get(part)
            if ino is None or ino not in self.live.dirs:
                return None
        return (ino, parts[-1]) if parts else None

    def _ino(self, dirfd, path):
        if not path.startswith("/") and dirfd not in (None, "AT_FDCWD") and path in ("", "."):
            base = self.fds.get(int(dirfd))
            return base[0] if base else None
        path_abs = path if path.startswith("/") else os.path.join(self.cwd, path)
        if os.path.normpath(path_abs) == self.root and (dirfd in (None, "AT_FDCWD") or path.startswith("/")):
            return ROOT_INO
        where = self._lookup(dirfd, path)
        return self.live.dirs.get(where[0], {}).get(where[1]) if where else None

    def _emit(self, op):
        self.ops.append(op)
        self.live.apply(op)

    # --- the calls
    def _parse(self, handle):
        pending = {}
        for line in handle:
            line = line.rstrip("\n")
            m = _UNFINISHED.match(line)
            if m:
                pending[m.group("pid")] = m.group("head")
                continue
            m = _RESUMED.match(line)
            if m:
                line = "%s %s%s" % (m.group("pid"), pending.pop(m.group("pid")), m.group("tail"))
            m = _LINE.match(line)
            if not m or m.group("ret") == "?" or int(m.group("ret")) < 0:
                continue
            getattr(self, "_" + m.group("call"), lambda a, r: None)(_split_args(m.group("args")), int(m.group("ret")))

    def _open(self, args, ret):
        self._openat(["AT_FDCWD"] + args, ret)

    def _creat(self, args, ret):
        self._openat(["AT_FDCWD", args[0], "O_WRONLY|O_CREAT|O_TRUNC"], ret)

    def _openat(self, args, fd):
        path, flags = _bytes(args[1]).decode(), args[2]
        where = self._lookup(args[0], path)
        if where is None:
            self.fds[fd] = [self._ino(args[0], path), 0]
            return
        parent, name = where
        ino = self.live.dirs[parent].get(name)
        if ino is None and "O_CREAT" in flags:
            if name.endswith("-shm"):
                self.fds[fd] = [None, 0]
                return
            ino = self.live.new("f")
            self.start.new("f")  # keep inode numbers in step: states replay on copies of start
            self.start.files[ino] = bytearray()
            self._emit(("link", parent, name, ino))
        elif ino is not None and "O_TRUNC" in flags and ino in self.live.files:
            self._emit(("trunc", ino, 0))
        self.fds[fd] = [ino, len(self.live.files[ino]) if ino in self.live.files and "O_APPEND" in flags else 0]

    def _close(self, args, ret):
        self.fds.pop(_int(args[0]), None)

    def _file(self, fd):
        entry = self.fds.get(fd)
        return entry if entry and entry[0] in self.live.files else None

    def _write(self, args, ret):
        entry = self._file(_int(args[0]))
        if entry:
            self._emit(("write", entry[0], entry[1], _bytes(args[1])[:ret]))
            entry[1] += ret

    def _pwrite64(self, args, ret):
        entry = self._file(_int(args[0]))
        if entry:
            self._emit(("write", entry[0], _int(args[3]), _bytes(args[1])[:ret]))

    def _lseek(self, args, ret):
        entry = self.fds.get(_int(args[0]))
        if entry:
            entry[1] = ret

    def _sendfile(self, args, ret):
        out, src = self._file(_int(args[0])), self.fds.get(_int(args[1]))
        if not out:
            return
        offset = _int(args[2].split("=>")[0]) if args[2] != "NULL" else src[1]
        assert src and src[0] in self.live.files, "sendfile from a file outside the model"
        data = bytes(self.live.files[src[0]][offset : offset + ret])
        self._emit(("write", out[0], out[1], data))
        out[1] += ret

    def _ftruncate(self, args, ret):
        entry = self._file(_int(args[0]))
        if entry:
            self._emit(("trunc", entry[0], _int(args[1])))

    def _truncate(self, args, ret):
        ino = self._ino(None, _bytes(args[0]).decode())
        if ino in self.live.files:
            self._emit(("trunc", ino, _int(args[1])))

    def _fallocate(self, args, ret):
        entry = self._file(_int(args[0]))
        if entry and "KEEP_SIZE" not in args[1]:
            end = _int(args[2]) + _int(args[3])
            if end > len(self.live.files[entry[0]]):
                self._emit(("trunc", entry[0], end))

    def _fsync(self, args, ret):
        entry = self.fds.get(_int(args[0]))
        if entry and entry[0] is not None:
            self._emit(("sync", entry[0]))

    _fdatasync = _fsync

    def _renameat2(self, args, ret):
        src = self._lookup(args[0], _bytes(args[1]).decode())
        dst = self._lookup(args[2], _bytes(args[3]).decode())
        if src and dst:
            self._emit(("rename", src[0], src[1], dst[0], dst[1]))
        else:
            assert not (src or dst), "a rename across root's edge: %s" % args

    _renameat = _renameat2

    def _rename(self, args, ret):
        self._renameat2(["AT_FDCWD", args[0], "AT_FDCWD", args[1]], ret)

    def _unlinkat(self, args, ret):
        where = self._lookup(args[0], _bytes(args[1]).decode())
        if where:
            self._emit(("rmdir" if "AT_REMOVEDIR" in args[2] else "unlink", where[0], where[1]))

    def _unlink(self, args, ret):
        self._unlinkat(["AT_FDCWD", args[0], "0"], ret)

    def _rmdir(self, args, ret):
        self._unlinkat(["AT_FDCWD", args[0], "AT_REMOVEDIR"], ret)

    def _mkdirat(self, args, ret):
        where = self._lookup(args[0], _bytes(args[1]).decode())
        if where:
            ino = self.live.next_ino
            self.live.next_ino += 1
            self.start.next_ino = self.live.next_ino
            self._emit(("mkdir", where[0], where[1], ino))

    def _mkdir(self, args, ret):
        self._mkdirat(["AT_FDCWD"] + args, ret)

    def _linkat(self, args, ret):
        src = self._ino(args[0], _bytes(args[1]).decode())
        dst = self._lookup(args[2], _bytes(args[3]).decode())
        if src is not None and dst:
            self._emit(("link", dst[0], dst[1], src))

    def _link(self, args, ret):
        self._linkat(["AT_FDCWD", args[0], "AT_FDCWD", args[1], "0"], ret)


def _touches(op):
    """The directories an entry operation changes, or the inode a data operation writes."""
    if op[0] == "rename":
        return {op[1], op[3]}
    return {op[1]}


def _durable(ops, end):
    """Indices before ``end`` made durable by a sync before ``end`` (strict model)."""
    synced, durable = set(), set()
    for i in range(end - 1, -1, -1):
        op = ops[i]
        if op[0] == "sync":
            synced.add(op[1])
        elif _touches(op) <= synced:
            durable.add(i)
    return durable


def crash_points(ops):
    return [i for i, op in enumerate(ops) if op[0] == "sync"] + [len(ops)]


def strict_states(ops, end):
    durable = _durable(ops, end)
    loose = [i for i in range(end) if ops[i][0] != "sync" and i not in durable]
    groups = [[i] for i in loose if ops[i][0] in META]
    by_ino = {}
    for i in loose:
        if ops[i][0] in DATA:
            by_ino.setdefault(ops[i][1], []).append(i)
    groups += list(by_ino.values())
    everything = durable | set(loose)
    yield "all", everything
    yield "synced only", set(durable)
    for group in groups:
        yield "all but %s" % _name(ops, group), everything - set(group)
        yield "synced and %s" % _name(ops, group), durable | set(group)
    for group in by_ino.values():  # a -wal written back in order: its first commits only
        for j in range(len(group) - 1):
            if _wal_commit_header(ops[group[j]]):
                later = {i for i in group if i > group[j + 1]}
                if later:
                    yield "all but the -wal after the commit at #%d" % group[j + 1], everything - later


def ext4_states(ops, end):
    durable = _durable(ops, end)
    last_sync = max([i for i in range(end) if ops[i][0] == "sync"], default=-1)
    journal = {i for i in range(last_sync) if ops[i][0] in META}  # committed by that sync
    later = [i for i in range(last_sync + 1, end) if ops[i][0] in META]
    loose_data = [i for i in range(end) if ops[i][0] in DATA and i not in durable]
    for k in range(len(later) + 1):
        cut = later[k - 1] if k else last_sync
        base = durable | journal | set(later[:k])
        yield "entries to #%d, with data" % k, base | {i for i in loose_data if i < cut}
        yield "entries to #%d, no data" % k, set(base)


def _wal_commit_header(op):
    """SQLite writes a -wal frame as its 24-byte header, then the page; a commit's last frame
    has the database size in pages (bytes 4-7) set."""
    return op[0] == "write" and len(op[3]) == 24 and op[3][4:8] != b"\0\0\0\0"


def _name(ops, group):
    op = ops[group[0]]
    return "%s#%d" % (op[0], group[0]) if len(group) == 1 else "data of inode %d (%d writes)" % (op[1], len(group))


def build(start, ops, chosen):
    tree = start.copy()
    for i in sorted(chosen):
        tree.apply(ops[i])
    return tree


def explore(recording, check, model, workdir, limit_points=None):
    """Check every distinct crash state of ``model``; returns {states, violations: [(where, text)]}."""
    ops, start = recording.ops, recording.start
    states = strict_states if model == "strict" else ext4_states
    points = crash_points(ops)
    if limit_points:
        points = points[:: max(1, len(points) // limit_points)] + [len(ops)]
    seen, violations = {}, []
    # The checks' own commits fsync: in memory they cost nothing (the trees are throwaway).
    scratch = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else workdir)
    for point in sorted(set(points)):
        final = point == len(ops)
        for label, chosen in states(ops, point):
            tree = build(start, ops, chosen)
            key = (tree.digest(), final and label == "synced only")
            if key in seen:
                continue
            target = tempfile.mkdtemp(dir=scratch)
            try:
                tree.materialize(target)
                found = check(target, final and label in ("synced only", "entries to #0, no data"))
            finally:
                shutil.rmtree(target, ignore_errors=True)
            seen[key] = found
            for text in found:
                violations.append(("crash before op %d (%s)" % (point, label), text))
    shutil.rmtree(scratch, ignore_errors=True)
    return {"states": len(seen), "violations": violations}
