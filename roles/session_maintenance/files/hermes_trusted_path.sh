#!/bin/sh
# Copyright: Contributors to the hermes_agent.ops collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# hermes_trusted_path.sh PATH...
#
# Exit 0 when no one but root can change what PATH runs: PATH, every symlink on the way
# to the file it names, that file, every directory above each of them and, for a
# directory (or an interpreter's standard library), everything in it must be owned by
# root and writable by no one else (symlinks only need a root owner: their own mode
# means nothing). Otherwise print the first path that fails, with the reason, and exit 1.
#
# Root runs the maintenance wrapper only after this passed for the interpreter, its
# standard library and the engine: whatever another account can write is untrusted.

fail() {
    printf '%s\n' "$1"
    exit 1
}

# One path itself (not followed): root's, and not writable by group or others.
check_entry() {
    meta=$(stat -c '%u %a' -- "$1" 2>/dev/null) || fail "$1: cannot stat it"
    uid=${meta% *}
    mode=${meta#* }
    [ "$uid" -eq 0 ] || fail "$1: owned by uid $uid, not root"
    [ -L "$1" ] && return 0
    [ $((0$mode & 022)) -eq 0 ] || fail "$1: mode $mode lets group or others write it"
}

# The path and every directory above it. (sh has no local variables: each function
# keeps its own names.)
check_chain() {
    chain=$1
    while :; do
        check_entry "$chain"
        [ "$chain" = / ] && return 0
        chain=$(dirname -- "$chain")
    done
}

# Everything under a directory (one find; symlinks checked for their owner only).
check_tree() {
    bad=$(find "$1" \( ! -user 0 -o \( ! -type l -perm /022 \) \) -print -quit 2>&1) || fail "$1: cannot search it"
    [ -z "$bad" ] || fail "$bad: under $1, not root's alone"
}

# The chain of every symlink on the way from $1 to the file it names, then that file's.
check_followed() {
    p=$1
    hops=0
    while [ -L "$p" ]; do
        check_chain "$p"
        target=$(readlink -- "$p")
        case $target in
            /*) p=$target ;;
            *) p=$(dirname -- "$p")/$target ;;
        esac
        hops=$((hops + 1))
        [ "$hops" -le 40 ] || fail "$1: too many symlinks"
    done
    real=$(readlink -f -- "$1") || fail "$1: cannot resolve it"
    check_chain "$real"
    [ -d "$real" ] && check_tree "$real"
    return 0
}

# The standard library next to an interpreter (PREFIX/bin/pythonX.Y -> PREFIX/lib/pythonX.Y).
check_stdlib() {
    binary=$(readlink -f -- "$1")
    name=$(basename -- "$binary")
    case $name in
        python[0-9]*) ;;
        *) return 0 ;;
    esac
    stdlib=$(dirname -- "$(dirname -- "$binary")")/lib/$name
    [ -d "$stdlib" ] || return 0
    check_chain "$stdlib"
    check_tree "$stdlib"
}

# A virtualenv's pyvenv.cfg (next to the interpreter or one directory up, where Python looks
# for it at start, -I -S or not) names the home its standard library is found from: the file
# and that home must be root's alone too.
check_venv() {
    bindir=$(dirname -- "$1")
    for cfg in "$bindir/pyvenv.cfg" "$(dirname -- "$bindir")/pyvenv.cfg"; do
        [ -e "$cfg" ] || continue
        check_chain "$cfg"
        home=$(sed -n 's/^[[:space:]]*home[[:space:]]*=[[:space:]]*//p' "$cfg" | head -n 1)
        [ -n "$home" ] || continue
        case $home in
            /*) check_followed "$home" ;;
            *) fail "$cfg: its home $home is not an absolute path" ;;
        esac
    done
}

# The shared libraries the interpreter and its extension modules load (libpython, the
# libsqlite3 that _sqlite3 finds through its RUNPATH, ...), wherever they are. ldd only runs
# on files the checks above already showed to be root's.
check_libraries() {
    command -v ldd >/dev/null 2>&1 || fail "$1: ldd is missing, so the libraries it loads cannot be checked"
    binary=$(readlink -f -- "$1")
    dynload=$(dirname -- "$(dirname -- "$binary")")/lib/$(basename -- "$binary")/lib-dynload
    libraries=$(for object in "$binary" "$dynload"/*.so; do
        [ -f "$object" ] || continue
        ldd -- "$object" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
    done | sort -u)
    saved_ifs=$IFS
    IFS='
'
    for library in $libraries; do
        IFS=$saved_ifs
        check_followed "$library"
    done
    IFS=$saved_ifs
}

[ $# -gt 0 ] || fail "usage: hermes_trusted_path.sh PATH..."
for path in "$@"; do
    case $path in
        /*) ;;
        *) fail "$path: not an absolute path" ;;
    esac
    [ -e "$path" ] || fail "$path: does not exist"
    check_followed "$path"
    if [ -f "$path" ] && [ -x "$path" ]; then
        check_stdlib "$path"
        check_venv "$path"
        check_libraries "$path"
    fi
done
exit 0
