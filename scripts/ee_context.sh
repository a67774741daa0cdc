#!/usr/bin/env bash
# Check the example execution environment (extras/execution-environment) without a
# registry: build the collection artifact, turn the definition into a build context with
# `ansible-builder create`, then do what the image build's galaxy and introspection
# stages do, on this host: install the collection from the artifact in the context
# (requirements.yml) and run ansible-builder's own introspect.py over it, which must find
# no Python and no system requirements (meta/execution-environment.yml).
#
#   scripts/ee_context.sh ANSIBLE_BUILDER ANSIBLE_GALAXY PYTHON_OF_BUILDER
set -euo pipefail
builder="$1" galaxy="$2" python="$3"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$repo/build/ee"
cd "$repo"
rm -rf "$work" && mkdir -p "$work"
"$galaxy" collection build --force --output-path "$work" . >/dev/null
artifact="$(ls "$work"/hermes_agent-ops-*.tar.gz)"
version="$(basename "$artifact" .tar.gz)"; version="${version#hermes_agent-ops-}"
grep -q "collections/hermes_agent-ops-$version.tar.gz" extras/execution-environment/requirements.yml \
    || { echo "ee: extras/execution-environment/requirements.yml does not name version $version" >&2; exit 1; }
cp extras/execution-environment/execution-environment.yml extras/execution-environment/requirements.yml "$work/"
# The file name would follow the container runtime found on the machine (Dockerfile without podman).
(cd "$work" && "$builder" create -f execution-environment.yml -c context --output-filename Containerfile)
test -f "$work/context/Containerfile"
test -f "$work/context/_build/collections/$(basename "$artifact")"
grep -q 'ansible-galaxy collection install .*-r requirements.yml' "$work/context/Containerfile"
echo "ee: build context $work/context (Containerfile + collection artifact)"
(cd "$work/context/_build" && ANSIBLE_GALAXY_DISABLE_GPG_VERIFY=1 "$galaxy" collection install \
    -r requirements.yml -p "$work/installed" >/dev/null)
installed="$work/installed/ansible_collections/hermes_agent/ops"
test -f "$installed/meta/execution-environment.yml"
deps="$("$python" "$work/context/_build/scripts/introspect.py" introspect "$work/installed")"
echo "ee: introspection of the installed collection:"; echo "$deps"
[ "$(echo "$deps" | grep -v '^---$' | tr -d ' \n')" = "python:[]system:[]" ] \
    || { echo "ee: expected no Python or system requirements" >&2; exit 1; }
echo "ee: ok (the image itself: make ee-image, on a local base image)"
