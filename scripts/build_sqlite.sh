#!/usr/bin/env bash
# Build the libsqlite3.so.0 that a Debian release ships, from Debian's own source package,
# so the engine and the real Hermes releases can be tested on that SQLite on this machine.
#
# CPython's _sqlite3 module links libsqlite3.so.0 dynamically: putting the directory this
# script prints first on LD_LIBRARY_PATH swaps the SQLite of a whole Python process (check
# with `python -c 'import sqlite3; print(sqlite3.sqlite_version)'`). Debian's binary packages
# of trixie and sid need a newer glibc than bookworm's, so the library is built here from
# the source package instead, with the compile options of that package's debian/rules (FTS3/4,
# FTS5, RTREE, COLUMN_METADATA, DBSTAT_VTAB, SECURE_DELETE, ...).
#
# Usage: scripts/build_sqlite.sh SUITE [SOURCE_VERSION]
#   SUITE           a Debian suite on the mirror apt already uses (trixie, sid, ...)
#   SOURCE_VERSION  a Debian source version of sqlite3 in that suite (default: the newest)
# Prints the directory that holds libsqlite3.so.0 on its last line of stdout.
# SQLITE_WITHOUT=DBSTAT_VTAB (an SQLITE_ENABLE_* option of debian/rules, without the prefix)
# builds the same library without that option, as SQLite's own default build and some
# distributions' are, into .cache/sqlite/<suite>-without-<option>/.
#
# The result is cached in .cache/sqlite/<suite>/ (lib/libsqlite3.so.0, VERSION, FLAGS): a
# second call with the same suite (and version, if given) neither downloads nor builds.
# The source index is fetched with a private apt state (scripts/debian_apt.sh). Needs: apt-get, dpkg-source (dpkg-dev), gcc, make, tclsh
# (tcl; SQLite < 3.48 generates its amalgamation with it), zlib1g-dev is optional.
set -euo pipefail
suite=${1:?usage: build_sqlite.sh SUITE [SOURCE_VERSION]}
want=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd -P)
without=${SQLITE_WITHOUT:-}
cache=$repo/.cache/sqlite/$suite${without:+-without-$(echo "$without" | tr '[:upper:]' '[:lower:]')}
script_hash=$(sha256sum "$0" | cut -c1-16)

log() { echo "build_sqlite[$suite]: $*" >&2; }

cached_ok() {
    [ -s "$cache/lib/libsqlite3.so.0" ] && [ -f "$cache/STAMP" ] || return 1
    local stamp
    stamp=$(cat "$cache/STAMP")
    [ "${stamp%% *}" = "$script_hash" ] || return 1
    [ -z "$want" ] || [ "${stamp#* }" = "$want" ]
}

if cached_ok; then
    log "cached: SQLite $(cat "$cache/VERSION") (Debian $(cut -d' ' -f2 "$cache/STAMP"))"
    echo "$cache/lib"
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/build-sqlite.XXXXXX")
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/src"
# shellcheck source=scripts/debian_apt.sh
. "$repo/scripts/debian_apt.sh"
apt_opts=()  # set by debian_apt_state
debian_apt_state "$work" "$suite" deb-src
version=${want:-$(apt-cache "${apt_opts[@]}" showsrc sqlite3 | sed -n 's/^Version: //p' | sort -V | tail -n 1)}
[ -n "$version" ] || { log "error: no sqlite3 source package in $suite"; exit 1; }
log "apt-get source sqlite3=$version"
(cd "$work/src" && apt-get "${apt_opts[@]}" -qq source --download-only "sqlite3=$version" >&2 \
    && dpkg-source --no-check -x ./*.dsc tree >/dev/null)
tree=$work/src/tree

# Debian's compile options: the `export CFLAGS += ...` block of debian/rules (continuation
# lines included), plus the extensions its ./configure call enables (FTS4, FTS5, JSON).
flags=$(sed -n '/^export CFLAGS += /,/[^\\]$/p' "$tree/debian/rules" | sed 's/^export CFLAGS += //; s/\\$//' | tr -s ' \t\n' ' ')
case $flags in *SQLITE_ENABLE_FTS3*) ;; *)
    log "error: could not read the CFLAGS of $tree/debian/rules"
    exit 1
    ;;
esac
if [ -n "$without" ]; then
    stripped=$(echo " $flags " | sed -E "s/ -DSQLITE_ENABLE_${without}(=[^ ]*)? / /g")
    if [ "$stripped" = " $flags " ]; then
        log "error: debian/rules does not set -DSQLITE_ENABLE_$without (SQLITE_WITHOUT)"
        exit 1
    fi
    flags=$(echo "$stripped" | sed 's/^ *//; s/ *$//')
fi
log "CFLAGS from debian/rules: $flags"
(
    cd "$tree"
    CFLAGS="$flags" ./configure --enable-threadsafe --enable-load-extension --enable-fts4 --enable-fts5 \
        --disable-tcl >"$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; exit 1; }
    # Autosetup builds (3.48+) name the shared library libsqlite3.so; autoconf ones libsqlite3.la.
    if [ -f auto.def ]; then
        target=libsqlite3.so
    else
        target=libsqlite3.la
    fi
    make -j"$(nproc)" "$target" >"$work/make.log" 2>&1 || { tail -n 30 "$work/make.log" >&2; exit 1; }
)
built=$(find "$tree" -name 'libsqlite3.so*' -type f | sort | head -n 1)
[ -n "$built" ] || { log "error: the build made no libsqlite3.so"; exit 1; }

rm -rf "$cache"
mkdir -p "$cache/lib"
cp "$built" "$cache/lib/libsqlite3.so.0"
echo "$flags" >"$cache/FLAGS"
sqlite_version=$(LD_LIBRARY_PATH=$cache/lib python3 -c 'import sqlite3; print(sqlite3.sqlite_version)')
echo "$sqlite_version" >"$cache/VERSION"
echo "$script_hash $version" >"$cache/STAMP"
log "built SQLite $sqlite_version (Debian $version) in $cache/lib"
echo "$cache/lib"
