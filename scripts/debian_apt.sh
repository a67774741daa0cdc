# shellcheck shell=bash
# Sourced by the scripts that take packages from a Debian suite other than this machine's
# (build_sqlite.sh: source packages; build_debian_python.sh: binary packages), with a private
# apt state (-o Dir::...), so the host's apt configuration and package lists are left as they are.
#
#   debian_apt_state WORK SUITE deb|deb-src    sets the array apt_opts and runs apt-get update
# Needs a function `log` (the caller's prefix on stderr).

debian_apt_state() {
    local work=$1 suite=$2 kind=$3 mirror
    # The Debian mirror apt already uses (deb822 "URIs:" or one-line "deb URL suite").
    mirror=$({ cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } \
        | sed -nE 's#^URIs:[[:space:]]*(https?://[^[:space:]]*/debian)/?[[:space:]]*$#\1#p; s#^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?(https?://[^[:space:]]*/debian)/?[[:space:]].*#\2#p' \
        | head -n 1)
    [ -n "$mirror" ] || { log "error: no Debian mirror in /etc/apt/sources.list*"; return 1; }
    mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
    echo "$kind [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >"$work/apt/sources.list"
    apt_opts=(-o Dir::Etc::SourceList="$work/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache" -o APT::Sandbox::User=root)
    log "apt-get update ($kind $mirror $suite, private state)"
    apt-get "${apt_opts[@]}" -qq update >&2
}
