#!/usr/bin/env bash
# Build a Python whose sqlite3 module links an SQLite free of the WAL-reset bug, the way a
# Hermes-managed install has one: a real CPython interpreter and standard library (a copy of
# BASE's), whose _sqlite3 extension finds Debian sid's libsqlite3 (scripts/build_sqlite.sh,
# 3.51.3 or later) through its own RUNPATH. No LD_LIBRARY_PATH or other environment is needed,
# so it works under `python -I -S`, from cron and as root, as an installed interpreter does.
#
# Usage: scripts/build_fixed_python.sh [BASE [DEST]]
#   BASE  the interpreter to copy (default /usr/bin/python3: Debian's, libpython built in)
#   DEST  where the prefix goes (default <repo>/.cache/fixed-python); DEST/bin/python3 is the
#         interpreter, DEST/lib/libsqlite3.so.0 the library it links
# Prints DEST on its last line of stdout. Cached: a second call with the same BASE and
# SQLite builds nothing. Needs patchelf (Debian package patchelf) and what build_sqlite.sh needs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd -P)
base=${1:-/usr/bin/python3}
dest=${2:-$repo/.cache/fixed-python}
script_hash=$(sha256sum "$0" | cut -c1-16)

log() { echo "build_fixed_python: $*" >&2; }

command -v patchelf >/dev/null || { log "error: patchelf is missing (apt-get install patchelf)"; exit 1; }
sqlite_lib=$(bash "$repo/scripts/build_sqlite.sh" sid | tail -n 1)
sqlite_version=$(cat "$sqlite_lib/../VERSION")
binary=$(readlink -f -- "$(command -v "$base")")
stamp="$script_hash $(sha256sum "$binary" | cut -c1-16) $sqlite_version"

if [ -f "$dest/STAMP" ] && [ "$(cat "$dest/STAMP")" = "$stamp" ] && [ -x "$dest/bin/python3" ]; then
    log "cached: $dest/bin/python3 with SQLite $sqlite_version"
    echo "$dest"
    exit 0
fi

# Where BASE keeps its standard library and its extension modules (lib-dynload).
read -r name stdlib dynload < <("$binary" -I -S -c '
import os, sys, sysconfig, _sqlite3
print("python%d.%d" % sys.version_info[:2], sysconfig.get_path("stdlib"), os.path.dirname(_sqlite3.__file__))')
case $dynload in
    "$stdlib"/*) ;;
    *) log "error: $binary keeps its extension modules in $dynload, outside $stdlib: not supported"; exit 1 ;;
esac

rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
cp "$binary" "$dest/bin/$name"
ln -s "$name" "$dest/bin/python3"
# The standard library without installed packages and caches: -S never reads site-packages.
tar -C "$stdlib" --exclude=site-packages --exclude=dist-packages --exclude=__pycache__ -cf - . \
    | { mkdir -p "$dest/lib/$name" && tar -C "$dest/lib/$name" -xf -; }
# An interpreter built with a shared libpython gets its own copy, found next to it.
libpython=$(ldd "$binary" | awk '/libpython/ { print $3 }')
if [ -n "$libpython" ]; then
    cp "$libpython" "$dest/lib/"
    patchelf --set-rpath "\$ORIGIN/../lib" "$dest/bin/$name"
fi
cp "$sqlite_lib/libsqlite3.so.0" "$dest/lib/libsqlite3.so.0"
module=$(find "$dest/lib/$name/${dynload#"$stdlib"/}" -maxdepth 1 -name '_sqlite3*.so')
[ -n "$module" ] || { log "error: no _sqlite3 extension module in $dynload"; exit 1; }
# lib/pythonX.Y/lib-dynload/_sqlite3.so -> lib/libsqlite3.so.0
relative=$(realpath --relative-to="$(dirname "$module")" "$dest/lib")
patchelf --set-rpath "\$ORIGIN/$relative" "$module"

got=$(env -i "$dest/bin/python3" -I -S -c 'import sqlite3; print(sqlite3.sqlite_version)')
[ "$got" = "$sqlite_version" ] || { log "error: $dest/bin/python3 links SQLite $got, not $sqlite_version"; exit 1; }
echo "$stamp" >"$dest/STAMP"
log "built $dest/bin/python3 ($name from $binary) with SQLite $got"
echo "$dest"
