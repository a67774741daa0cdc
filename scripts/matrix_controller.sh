#!/usr/bin/env bash
# Controller matrix: the maintained ansible-core releases other than the controller venv's own
# (.venv runs the whole of make test on its core), each in a small venv
# $CONTROLLERS_DIR/core-<X.Y>-py<A.B> (requirements/controller-<X.Y>.txt: ansible-core and
# pytest, pinned) made from a Python the core runs its controller on (one core may have a leg on
# each of several Pythons), running the integration tests
# ansible-core's own code touches (CONTROLLER_TESTS: see the Makefile) with real
# ansible-playbook runs on localhost.
#
# Usage: scripts/matrix_controller.sh "2.20@3.13 2.22@3.14" "MARKERS" [pytest args...]
#        scripts/matrix_controller.sh --setup-only "2.20@3.13 ..."   only make the venvs (make prepare)
# Env: CONTROLLERS_DIR (default .cache/controllers), CONTROLLER_TESTS (the test files/ids),
#      CONTROLLER_PYTHON_TESTS (those of a core@X.Y:py leg),
#      COLLECTIONS_ROOT (build/collections).
set -uo pipefail
setup_only=0
if [ "${1:-}" = --setup-only ]; then setup_only=1; shift; set -- "$1" ""; fi
legs=$1
markers=$2
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo" || exit 1
dir=${CONTROLLERS_DIR:-.cache/controllers}
mkdir -p "$dir" build/logs
pip_filter() { grep -v 'is ignored: it is neither a file nor a directory' || true; }

declare -a rows=()
failed=0
for leg in $legs; do
    # core@X.Y:py is a core's further Python: its first leg ran the whole set, so this one runs
    # only what the controller's and the module's Python change (CONTROLLER_PYTHON_TESTS).
    tests=${CONTROLLER_TESTS:-tests/integration}
    case $leg in *:py) leg=${leg%:py} tests=${CONTROLLER_PYTHON_TESTS:-$tests} ;; esac
    core=${leg%@*} ver=${leg#*@}
    start=$(date +%s)
    echo
    echo "---------------------------------------------------------------- ansible-core $core on Python $ver"
    reqs=requirements/controller-$core.txt
    [ -f "$reqs" ] || { echo "error: $reqs is missing (the pins of the ansible-core $core controller)" >&2; exit 2; }
    if ! py=$(bash scripts/find_python.sh "$ver"); then
        bash scripts/missing_leg.sh matrix-controller "ansible-core $core on Python $ver" \
            "no python$ver here (pyenv versions/$ver.*, python$ver on PATH, or make prepare's from Debian)" || failed=$((failed + 1))
        rows+=("$(printf '%-6s %-8s %-8s %5ss' "$core" "$ver" MISSING 0)")
        continue
    fi
    venv=$dir/core-$core-py$ver
    want="$(sha256sum "$reqs" | cut -c1-16) $py"
    if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$want" ]; then
        echo "+ $py -m venv $venv; pip install -r $reqs (log: build/logs/controller-$core-py$ver-setup.log)"
        rm -rf "$venv"
        if ! { "$py" -m venv "$venv" \
            && "$venv/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off -r "$reqs" \
                >"build/logs/controller-$core-py$ver-setup.log" 2>&1 \
            && "$venv/bin/python" -m pip check >>"build/logs/controller-$core-py$ver-setup.log" 2>&1; }; then
            tail -n 25 "build/logs/controller-$core-py$ver-setup.log" | pip_filter >&2
            echo "error: could not set up $venv from $reqs" >&2
            rows+=("$(printf '%-6s %-8s %-8s %5ss' "$core" "$ver" SETUP $(($(date +%s) - start)))")
            failed=$((failed + 1))
            continue
        fi
        echo "$want" >"$venv/.stamp"
    fi
    version=$("$venv/bin/ansible" --version | sed -n 1p)
    case "$version" in
        *"core $core."*) ;;
        *) echo "error: $venv runs '$version', not ansible-core $core" >&2; failed=$((failed + 1)); continue ;;
    esac
    if [ "$setup_only" = 1 ]; then
        echo "ansible-core $core on Python $ver: $venv ready ($version, $("$venv/bin/python" --version))"
        continue
    fi
    if [ "${PYTEST_PASS:-both}" = timing ]; then
        echo "+ ansible-core $core: no timing pass (what the timing tests measure is SQLite's locking and the engine's pacing, not ansible-core: integration-timing)"
        continue
    fi
    echo "+ controller: $version, $("$venv/bin/python" --version)"
    # shellcheck disable=SC2086  # $tests is a list of test paths
    ANSIBLE_COLLECTIONS_PATH=${COLLECTIONS_ROOT:-$repo/build/collections} ANSIBLE_LOCAL_TEMP=$repo/build/ansible-tmp-$core-py$ver \
        ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 PATH=$repo/$venv/bin:$PATH \
        bash scripts/pytest_split.sh "build/logs/matrix-controller-$core-py$ver" "$markers" "$venv/bin/pytest" -- \
        $tests -p no:cacheprovider "$@"
    rc=$?
    status=ok
    [ "$rc" -eq 0 ] || { status=FAILED; failed=$((failed + 1)); }
    counts=$(tail -n 1 "build/logs/matrix-controller-$core-py$ver.parallel.log" 2>/dev/null | sed -E 's/^=+ //; s/ in [0-9.]+s.*//')
    rows+=("$(printf '%-6s %-8s %-8s %5ss  %s' "$core" "$ver" "$status" $(($(date +%s) - start)) "$counts")")
done
[ "$setup_only" = 1 ] && exit "$failed"
echo
echo "---------------------------------------------------------------- controller matrix"
printf '%-6s %-8s %-8s %6s  %s\n' core python result time tests
printf '%s\n' "${rows[@]}"
[ "$failed" -eq 0 ] || { echo "matrix-controller: $failed of $(wc -w <<<"$legs") controllers FAILED"; exit 1; }
echo "matrix-controller: all $(wc -w <<<"$legs") controllers passed"
