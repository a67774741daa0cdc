# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guides (docs/*.md) as antsibull-docs extra docs, and the role README's prose on the
role's page, converted at build time.

    md_to_rst.py COLLECTION_DIR [ROLE_PROSE_RST]
    md_to_rst.py --splice-role ROLE_PAGE_RST ROLE_PROSE_RST

For each guide named in COLLECTION_DIR/docs/docsite/extra-docs.yml (``guide_<name>``,
source docs/<name>.md) writes docs/docsite/rst/guide_<name>.rst. The Markdown stays the
one source (GitHub renders it, the README links it); the RST exists only in the copy
the docs site is built from. pandoc (pypandoc-binary's) parses GitHub Markdown into its
AST; the links are rewritten before pandoc writes RST:

- to another guide or a heading of one (``safety.md#section``, ``#section``): a
  ``:ref:`` to the label set on that heading, so Sphinx and ``antsibull-docs
  lint-collection-docs --check-extra-docs-refs`` check every one;
- to the role's README: the role's page;
- to any other file of the repository: galaxy.yml's ``repository`` + ``/blob/main/``, or
  the link's text and the path as literal text when galaxy.yml names no repository; an image
  (benchmarks.md's plots) likewise, with ``/raw/main/``.

With ROLE_PROSE_RST, roles/session_maintenance/README.md is converted the same way, but for
its title and the sections the role's page already has from meta/argument_specs.yml
(ROLE_SKIPPED: the variables) or that are for contributors, into ROLE_PROSE_RST; its
headings sit below the page's own (``^``, then ``'``). ``--splice-role``, run by the site's
build.sh between antsibull-docs and Sphinx, puts that RST into the role's page after its
synopsis.
"""

import json
import os
import re
import sys

import pypandoc
import yaml

LABEL = "ansible_collections.hermes_agent.ops.docsite."
ROLE_LABEL = "ansible_collections.hermes_agent.ops.session_maintenance_role"
ROLE_README = "roles/session_maintenance/README.md"
ROLE_PAGE = "role_session_maintenance"  # the label prefix of the role README's headings
ROLE_SKIPPED = ("Variables", "Testing")  # the page's parameters already; for contributors
ROLE_SPLICE_BEFORE = "\n.. Options\n"  # antsibull-docs' marker after the role's synopsis


def stringify(inlines):
    """Plain text of a list of pandoc inlines."""
    out = []
    for node in inlines:
        kind, content = node["t"], node.get("c")
        if kind == "Str":
            out.append(content)
        elif kind in ("Space", "SoftBreak", "LineBreak"):
            out.append(" ")
        elif kind in ("Code", "Math", "RawInline"):
            out.append(content[1])
        elif kind in ("Emph", "Strong", "Strikeout", "Underline", "SmallCaps"):
            out.append(stringify(content))
        elif kind in ("Link", "Span", "Image"):
            out.append(stringify(content[1]))
        elif kind == "Quoted":
            out.append('"%s"' % stringify(content[1]))
    return "".join(out)


def github_slug(text):
    """The anchor GitHub gives a heading (what the Markdown links use)."""
    slug = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return slug.replace(" ", "-")


def heading_slugs(blocks):
    """Per block, the GitHub anchor of a heading (repeated ones get -1, -2...), else None."""
    seen, slugs = {}, []
    for block in blocks:
        if block["t"] != "Header":
            slugs.append(None)
            continue
        slug = github_slug(stringify(block["c"][2]))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slugs.append(slug if count == 0 else "%s-%d" % (slug, count))
    return slugs


def heading_label(guide, slug):
    return "%s%s.%s" % (LABEL, guide, slug)


def raw(text):
    return {"t": "RawInline", "c": ["rst", text]}


def ref(text, label):
    # :ref: text cannot hold markup; < and > would end it early.
    text = text.replace("`", "").replace("<", "\\<").replace(">", "\\>")
    return raw(":ref:`%s <%s>`" % (text, label))


def walk(node, fn):
    """Apply fn to every dict node (bottom-up); fn returns a replacement or None."""
    if isinstance(node, list):
        return [walk(item, fn) for item in node]
    if isinstance(node, dict):
        node = {key: walk(value, fn) for key, value in node.items()}
        replacement = fn(node)
        return node if replacement is None else replacement
    return node


class Converter:
    def __init__(self, collection, guides, repository):
        self.collection = collection
        self.guides = guides  # markdown file name -> guide name (guide_<x>)
        self.repository = repository.rstrip("/") if repository else None
        self.slugs = {}  # guide name -> set of heading slugs
        self.base = {}  # guide name -> the directory its links are relative to (default docs)

    def ast(self, md_file, base="docs"):
        with open(os.path.join(self.collection, base, md_file), encoding="utf-8") as f:
            text = f.read()
        return json.loads(pypandoc.convert_text(text, "json", format="gfm"))

    def link(self, node, guide, view="blob"):
        text, (target, _title) = node["c"][1], node["c"][2]
        if re.match(r"^[a-z]+:", target):
            return None
        path, _sep, fragment = target.partition("#")
        name = os.path.normpath(os.path.join(self.base.get(guide, "docs"), path)) if path else None
        if name is None or (name.startswith("docs/") and name[5:] in self.guides):
            target_guide = self.guides[name[5:]] if name else guide
            if fragment and fragment not in self.slugs[target_guide]:
                sys.exit("md_to_rst: %s links to #%s: no such heading in %s" % (guide, fragment, target_guide))
            label = heading_label(target_guide, fragment) if fragment else LABEL + target_guide
            return ref(stringify(text), label)
        if name == ROLE_README:
            return ref(stringify(text), ROLE_LABEL)
        if not os.path.exists(os.path.join(self.collection, name)):
            sys.exit("md_to_rst: %s links to %s: no such file in the collection" % (guide, target))
        if self.repository:
            node["c"][2][0] = "%s/%s/main/%s%s" % (self.repository, view, name, "#" + fragment if fragment else "")
            return None
        # the link's text, then the path it named
        code = {"t": "Code", "c": [["", [], []], name]}
        path_note = [{"t": "Space"}, {"t": "Str", "c": "("}, code, {"t": "Str", "c": ")"}]
        return {"t": "Span", "c": [["", [], []], text + path_note]}

    def fix(self, node, guide):
        if node.get("t") == "Link":
            return self.link(node, guide)
        if node.get("t") == "Image":  # a file of the repository too (the site has no copy of it)
            return self.link(node, guide, view="raw")
        content = node.get("c")
        if node.get("t") == "CodeBlock" and not content[0][1]:
            content[0][1] = ["text"]  # not the site's default YAML+Jinja highlighting
        elif node.get("t") == "CodeBlock" and "python" in content[0][1]:
            try:
                compile(content[1], "<guide>", "exec")
            except SyntaxError:  # a signature sketch, not code: lint would reject it as python
                content[0][1] = ["text"]
        if node.get("t") in ("Plain", "Para") and content and content[0]["t"] == "Str":
            # A table cell or paragraph starting with "- " would be read as a bullet list.
            if re.match(r"^[-*+]$", content[0]["c"]) and len(content) > 1 and content[1]["t"] == "Space":
                content[0] = raw("\\" + content[0]["c"])
        return None

    def convert(self, doc, md_file, guide, title_label=True):
        blocks = []
        for block, slug in zip(doc["blocks"], heading_slugs(doc["blocks"])):
            if block["t"] == "Header":
                block["c"][1][0] = ""  # pandoc's own ids would become labels without the prefix
                if block["c"][0] == 1 and title_label:  # the guide's title: the guide's own label too
                    blocks.append({"t": "RawBlock", "c": ["rst", ".. _%s%s:" % (LABEL, guide)]})
                blocks.append({"t": "RawBlock", "c": ["rst", ".. _%s:" % heading_label(guide, slug)]})
            blocks.append(block)
        doc["blocks"] = walk(blocks, lambda node: self.fix(node, guide))
        rst = pypandoc.convert_text(json.dumps(doc), "rst", format="json", extra_args=["--wrap=preserve"])
        # pandoc puts no blank line between a raw block and the heading after it
        rst = re.sub(r"^(\.\. _%s[^\n]*:)\n(?=\S)" % re.escape(LABEL), r"\1\n\n", rst, flags=re.M)
        source = md_file if "/" in md_file else "docs/%s" % md_file
        header = ".. Generated from %s by scripts/md_to_rst.py at docs-site build time: edit the Markdown.\n\n" % source
        return header + rst

    def run(self):
        docs = {md_file: self.ast(md_file) for md_file in self.guides}
        for md_file, guide in self.guides.items():
            self.slugs[guide] = set(filter(None, heading_slugs(docs[md_file]["blocks"])))
        out_dir = os.path.join(self.collection, "docs", "docsite", "rst")
        os.makedirs(out_dir, exist_ok=True)
        for md_file, guide in self.guides.items():
            with open(os.path.join(out_dir, guide + ".rst"), "w", encoding="utf-8") as f:
                f.write(self.convert(docs[md_file], md_file, guide))
            print("md_to_rst: docs/%s -> docs/docsite/rst/%s.rst" % (md_file, guide))

    def role_prose(self, out_path):
        base, md_file = os.path.split(ROLE_README)
        doc = self.ast(md_file, base=base)
        blocks, skipping = [], False
        for block in doc["blocks"]:
            if block["t"] == "Header" and block["c"][0] == 1:
                continue  # the page has its own title; the text under it follows the synopsis
            if block["t"] == "Header" and block["c"][0] == 2:
                skipping = stringify(block["c"][2]) in ROLE_SKIPPED
            if not skipping:
                blocks.append(block)
        for block in blocks:
            if block["t"] == "Header":
                block["c"][0] += 2  # ## -> ^ and ### -> ' below the page's own headings
        doc["blocks"] = blocks
        self.base[ROLE_PAGE] = base
        self.slugs[ROLE_PAGE] = set(filter(None, heading_slugs(blocks)))
        rst = self.convert(doc, ROLE_README, ROLE_PAGE, title_label=False)
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(rst)
        print("md_to_rst: %s -> %s" % (ROLE_README, out_path))


def splice_role(page_path, prose_path):
    """The role README's prose into the role's page, after the synopsis."""
    with open(page_path, encoding="utf-8") as f:
        page = f.read()
    with open(prose_path, encoding="utf-8") as f:
        prose = f.read()
    if page.count(ROLE_SPLICE_BEFORE) != 1:
        sys.exit(
            "md_to_rst: %s: expected one %r marker (antsibull-docs' role page changed?)"
            % (page_path, ROLE_SPLICE_BEFORE.strip())
        )
    with open(page_path, "w", encoding="utf-8") as f:
        f.write(page.replace(ROLE_SPLICE_BEFORE, "\n" + prose + ROLE_SPLICE_BEFORE))
    print("md_to_rst: %s spliced into %s" % (prose_path, page_path))


def main(collection, role_prose=None):
    with open(os.path.join(collection, "docs", "docsite", "extra-docs.yml"), encoding="utf-8") as f:
        extra = yaml.safe_load(f)
    guides = {}
    for section in extra["sections"]:
        for entry in section["toctree"]:
            name = entry if isinstance(entry, str) else entry["ref"]
            if not name.startswith("guide_") or not os.path.exists(os.path.join(collection, "docs", name[6:] + ".md")):
                sys.exit("md_to_rst: extra-docs.yml names %s: expected guide_<x> with docs/<x>.md" % name)
            guides[name[6:] + ".md"] = name
    with open(os.path.join(collection, "galaxy.yml"), encoding="utf-8") as f:
        repository = yaml.safe_load(f).get("repository")
    converter = Converter(collection, guides, repository)
    converter.run()
    if role_prose:
        converter.role_prose(role_prose)


if __name__ == "__main__":
    if sys.argv[1] == "--splice-role":
        splice_role(sys.argv[2], sys.argv[3])
    else:
        main(*sys.argv[1:3])
