#!/usr/bin/env bash
# Changelog with antsibull-changelog, without consuming the fragments.
#
# Runs `antsibull-changelog release` (galaxy.yml's version) on a scratch copy of the collection
# under build/changelog/ansible_collections/hermes_agent/ops, then checks the result: every
# fragment's entries are in the generated CHANGELOG.md, and so is every module. With --write,
# CHANGELOG.md and CHANGELOG.rst are copied to the repo root (a preview of the release notes;
# changelogs/changelog.yaml and changelogs/fragments/ are left as they are).
#
# Usage: scripts/changelog.sh ANTSIBULL_CHANGELOG [--write]
set -euo pipefail
antsibull_changelog=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
write=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo"
bin=$(dirname "$antsibull_changelog")

"$antsibull_changelog" lint
dest=$(bash scripts/ansible_test_tree.sh "$bin/ansible-test" build/changelog)
(cd "$dest" && PATH="$bin:$PATH" "$antsibull_changelog" release)

# every fragment entry and every module made it into the generated notes
"$bin/python" - "$dest" <<'PY'
import glob, os, sys, yaml
dest = sys.argv[1]
def norm(text):  # markup-free, whitespace-collapsed text
    for markup in ("<code>", "</code>", "``", "`", "\\"):
        text = text.replace(markup, "")
    return " ".join(text.split())

md = norm(open(os.path.join(dest, "CHANGELOG.md"), encoding="utf-8").read())
rst = norm(open(os.path.join(dest, "CHANGELOG.rst"), encoding="utf-8").read())
missing = []
for frag in sorted(glob.glob("changelogs/fragments/*.y*ml")):
    for section, entries in (yaml.safe_load(open(frag, encoding="utf-8")) or {}).items():
        if section == "trivial":  # changelogs/config.yaml's trivial_section_name: never in the notes
            continue
        for entry in entries if isinstance(entries, list) else [entries]:
            words = norm(str(entry))[:80]
            for name, text in (("CHANGELOG.md", md), ("CHANGELOG.rst", rst)):
                if words not in text:
                    missing.append("%s: %s (%s): %s" % (name, frag, section, words))
for module in sorted(glob.glob("plugins/modules/*.py")):
    name = "hermes_agent.ops." + os.path.basename(module)[:-3]
    if name not in md or name not in rst:
        missing.append("module " + name)
if missing:
    sys.exit("changelog: missing from the generated notes:\n  " + "\n  ".join(missing))
print("changelog: CHANGELOG.md and CHANGELOG.rst generated (%d fragments, every entry and module present)"
      % len(glob.glob("changelogs/fragments/*.y*ml")))
PY
if [ "$write" = --write ]; then
    cp "$dest/CHANGELOG.md" "$dest/CHANGELOG.rst" "$repo/"
    echo "changelog: wrote CHANGELOG.md and CHANGELOG.rst (fragments kept; \`make changelog-release\` consumes them)"
fi
