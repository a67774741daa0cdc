#!/usr/bin/env bash
# A CPython that pyenv does not offer here (3.14, 3.15), taken from a Debian suite's binary
# packages, unpacked into .cache/python/X.Y/ and made to run on this machine's older glibc.
#
# Debian's python3.X, its standard library and the shared libraries they link (glibc, OpenSSL,
# libffi, SQLite, ...) are unpacked with dpkg-deb under .cache/python/X.Y/root/. The
# interpreter's ELF loader is set to the unpacked glibc's and its DT_RPATH to the unpacked
# library directory (patchelf), so the interpreter and every extension module it loads use
# that suite's libraries and nothing else, with no LD_LIBRARY_PATH that would leak into the
# programs it starts (ansible-playbook runs /bin/sh, cron, restic). Debian's build records
# where ensurepip finds the pip wheel (/usr/share/python-wheels) as an absolute path: it is
# pointed at the unpacked copy, so `python -m venv` works as it does on Debian.
#
# Usage: scripts/build_debian_python.sh X.Y [SUITE]     (SUITE: default sid)
# Prints the interpreter's path on its last line of stdout. Cached (STAMP: this script's hash,
# the suite and the package version): a second call downloads nothing. Concurrent calls (the
# prepare lanes) wait for each other. Needs apt-get, dpkg-deb and patchelf.
set -euo pipefail
ver=${1:?usage: build_debian_python.sh X.Y [SUITE]}
suite=${2:-sid}
repo=$(cd "$(dirname "$0")/.." && pwd -P)
mkdir -p "$repo/.cache/python"
# The physical path: the interpreter's loader and RPATH are absolute paths written into it.
dest=$(cd "$repo/.cache/python" && pwd -P)/$ver
script_hash=$(sha256sum "$0" | cut -c1-16)
python=$dest/root/usr/bin/python$ver

log() { echo "build_debian_python[$ver]: $*" >&2; }

command -v patchelf >/dev/null || { log "error: patchelf is missing (apt-get install patchelf)"; exit 1; }
exec 9>"$dest.lock"
flock 9

if [ -x "$python" ] && [ "$(cut -d' ' -f1,2 "$dest/STAMP" 2>/dev/null)" = "$script_hash $suite" ] \
    && "$python" -c 'import sqlite3, ssl, ctypes' 2>/dev/null; then
    log "cached: $python ($(cut -d' ' -f3 "$dest/STAMP"))"
    echo "$python"
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/build-python.XXXXXX")
trap 'rm -rf "$work"' EXIT
# shellcheck source=scripts/debian_apt.sh
. "$repo/scripts/debian_apt.sh"
apt_opts=()  # set by debian_apt_state
debian_apt_state "$work" "$suite" deb

version=$(apt-cache "${apt_opts[@]}" show "python$ver" 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -n 1)
[ -n "$version" ] || { log "error: Debian $suite has no package python$ver"; exit 1; }
# The interpreter, its standard library, ensurepip's wheels, and the libraries the interpreter
# and its extension modules link (apt-cache depends python$ver, less debconf, tzdata and the
# like, which nothing here loads).
packages=("python$ver" "python$ver-minimal" "libpython$ver-minimal" "libpython$ver-stdlib" "python$ver-venv"
    python3-pip-whl python3-setuptools-whl libc6 libgcc-s1 libbz2-1.0 libdb5.3t64 libexpat1 libffi8 liblzma5
    libmpdec4 libncursesw6 libtinfo6 libreadline8t64 libsqlite3-0 libssl3t64 libuuid1 libzstd1 zlib1g)
log "apt-get download python$ver=$version and ${#packages[@]} packages from $suite"
mkdir -p "$work/debs"
(cd "$work/debs" && apt-get "${apt_opts[@]}" -qq download "${packages[@]}" >&2) \
    || { log "error: could not download ${packages[*]} from Debian $suite"; exit 1; }

rm -rf "$dest"
mkdir -p "$dest/root"
for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$dest/root"
done
libdir=$dest/root/usr/lib/x86_64-linux-gnu
if ! [ -x "$python" ] || ! [ -e "$libdir/ld-linux-x86-64.so.2" ]; then
    log "error: the packages hold no $python or no $libdir/ld-linux-x86-64.so.2"
    exit 1
fi
patchelf --set-interpreter "$libdir/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$libdir" "$python"
for config in "$dest/root/usr/lib/python$ver"/_sysconfigdata_*.py "$dest/root/usr/lib/python$ver"/_sysconfig_vars_*.json; do
    [ -e "$config" ] && sed -i "s#/usr/share/python-wheels/#$dest/root/usr/share/python-wheels/#g" "$config"
done
"$python" -c 'import sqlite3, ssl, ctypes, ensurepip' \
    || { log "error: $python does not start or lacks sqlite3, ssl or ctypes"; exit 1; }
echo "$script_hash $suite $version" >"$dest/STAMP"
log "built $python: $("$python" -c 'import sqlite3, sys; print(sys.version.split()[0], "with SQLite", sqlite3.sqlite_version)') (Debian $suite $version)"
echo "$python"
