#!/usr/bin/env bash
# The collection's docs site as antsibull-docs builds it for every collection.
#
#   scripts/docs_site.sh DOCS_VENV_BIN lint|site
#
# Both steps work on a copy of the collection in build/docs-site/collections (or
# $DOCS_SITE_DIR/collections: the files antsibull-docs reads) in which scripts/md_to_rst.py
# has written the guides' RST (docs/docsite/rst/guide_*.rst, from docs/*.md: the one source),
# and the role README's prose as RST ($work/role-prose.rst, for the role's page).
#   lint: antsibull-docs lint-collection-docs on that copy: plugin and role docs, the
#         extra docs (extra-docs.yml, links.yml, RST) and every reference in them.
#   site: lint, then `antsibull-docs sphinx-init` into build/docs-site/sphinx and the
#         build.sh it writes, with one step added between antsibull-docs and Sphinx: the role
#         README's prose spliced into the role's page. HTML in build/docs-site/sphinx/build/html.
set -euo pipefail
bin="$1" step="$2"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${DOCS_SITE_DIR:-$repo/build/docs-site}"   # the test builds into its tmp_path
root="$work/collections"
copy="$root/ansible_collections/hermes_agent/ops"
t0=$(date +%s)
stamp() { echo "[docs-site] $(($(date +%s) - t0))s: $*"; }
export PATH="$bin:$PATH" ANSIBLE_COLLECTIONS_PATH="$root" ANSIBLE_NOCOLOR=1 ANSIBLE_LOCAL_TEMP="$work/ansible-tmp"

rm -rf "$root" && mkdir -p "$copy"
(cd "$repo" && cp -r galaxy.yml README.md LICENSE meta plugins roles playbooks docs changelogs "$copy/")
# benchmarks.md links the bench's raw data (bench/results/): there for md_to_rst's check that it exists
mkdir -p "$copy/bench" && cp -r "$repo/bench/results" "$copy/bench/"
find "$copy" -name __pycache__ -prune -exec rm -rf {} +
"$bin/python" "$repo/scripts/md_to_rst.py" "$copy" "$work/role-prose.rst"
stamp "collection copied, guides and the role's prose converted"

antsibull-docs lint-collection-docs --plugin-docs --check-extra-docs-refs --validate-collection-refs all "$copy"
stamp "lint-collection-docs: ok"
[ "$step" = lint ] && exit 0

site="$work/sphinx"
rm -rf "$site" && mkdir -p "$site"
# The theme's "documentation home" link: the Ansible docs (its default, "/", is this
# site's server root, which a site served from a sub-path or from files does not have).
# No --intersphinx: no inventory is reachable from here, and nitpicky + -W would fail on it.
antsibull-docs sphinx-init --use-current --squash-hierarchy --fail-on-error --dest-dir "$site" \
    --project hermes_agent.ops --copyright "Hermes Agent operations maintainers" \
    --title "hermes_agent.ops" \
    --extra-html-theme-options documentation_home_url=https://docs.ansible.com/ hermes_agent.ops >/dev/null
sed -i '/^intersphinx_mapping = {/,/^}/d' "$site/conf.py"
# The labels of ansible-core's docs that ansible-doc's generic text refers to (the action
# attribute of a module with an action plugin links action_plugins): plain text here, as no
# inventory of docs.ansible.com is reachable.
echo 'nitpick_ignore = [("ref", "ansible_configuration_settings"), ("ref", "common_return_values"), ("ref", "action_plugins")]' >>"$site/conf.py"
# The role's page is antsibull-docs' (its argument specs); the role README's prose (what it
# installs, the schedulers, examples) goes into it once antsibull-docs has written it.
"$bin/python" - "$site/build.sh" "$bin/python" "$repo/scripts/md_to_rst.py" "$work/role-prose.rst" <<'PY'
import shlex, sys
build_sh, python, script, prose = sys.argv[1:]
text = open(build_sh).read()
marker = "# Build Sphinx site\n"
if text.count(marker) != 1:
    sys.exit("docs_site.sh: %s has no one %r line to add the role's prose before" % (build_sh, marker.strip()))
step = " ".join(shlex.quote(a) for a in (python, script, "--splice-role", "rst/session_maintenance_role.rst", prose))
open(build_sh, "w").write(text.replace(marker, "# The role README's prose into the role's page\n%s\n\n%s" % (step, marker)))
PY
stamp "sphinx-init: $site"
bash "$site/build.sh" >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; exit 1; }
html="$site/build/html"
test -f "$html/index.html"
stamp "site: $html/index.html ($(find "$html" -name '*.html' | wc -l) pages; log $work/build.log)"
