# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The docs site (``make docs-site``), opened in a real browser: headless Chromium (Debian's).

Builds the site into tmp_path with scripts/docs_site.sh (the venv of ``make docs-site-setup``),
then for the index, every module page, the role page and every guide: the DOM Chromium renders
(``--dump-dom``) has the page's title, and every ``href``/``src`` in it that stays on the site
points at a file that exists and, with a ``#fragment``, at an id in that file; the role page
carries the role README's prose (not its variables table, which the parameters are, nor its
testing notes) before its parameters; the getting-started guide links the role. Screenshots of
the index and the session_maintenance module page go to build/docs-site-screenshots/.

Skipped without chromium or the docs venv, unless CI=true: then that is a failure.
"""

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS_VENV = Path(os.environ.get("HERMES_DOCS_VENV", REPO_ROOT / ".cache" / "docs-site-venv"))
SCREENSHOTS = REPO_ROOT / "build" / "docs-site-screenshots"

# page -> what its first <h1> must say (the modules', the role's, the guides' Markdown titles)
MODULES = ["session_maintenance", "session_restore", "state_db_info", "state_db_restore"]
GUIDES = [
    "getting_started", "architecture", "safety", "compatibility", "fleet",
    "benchmarks", "benchmarks_elision", "benchmarks_window",
]  # fmt: skip


def _guide_title(name):
    first = (REPO_ROOT / "docs" / (name + ".md")).read_text(encoding="utf-8").splitlines()[0]
    return first.lstrip("# ").replace("`", "")


def _pages():
    pages = {"index.html": "Hermes_Agent.Ops"}
    pages.update({f"{m}_module.html": f"hermes_agent.ops.{m} module" for m in MODULES})
    pages["session_maintenance_role.html"] = "hermes_agent.ops.session_maintenance role"
    pages.update({f"docsite/guide_{g}.html": _guide_title(g) for g in GUIDES})
    return pages


def _unavailable(reason):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


class _Dom(HTMLParser):
    """Links (href/src), ids and the first <h1>'s text of a rendered DOM."""

    def __init__(self):
        super().__init__()
        self.links, self.ids, self.h1, self._in_h1 = [], set(), None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])
        if tag == "h1" and self.h1 is None:
            self._in_h1, self.h1 = True, ""

    def handle_endtag(self, tag):
        if tag == "h1":
            self._in_h1 = False

    def handle_data(self, data):
        if self._in_h1:
            self.h1 += data


def _parse(text):
    dom = _Dom()
    dom.feed(text)
    return dom


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    exe = shutil.which("chromium")
    if exe is None:
        _unavailable("no chromium here (Debian: apt-get install chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]

    def run(*args):
        proc = subprocess.run([exe, *flags, *args], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, f"chromium {args}: rc {proc.returncode}\n{proc.stderr[-2000:]}"
        return proc.stdout

    return run


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not (DOCS_VENV / ".stamp").exists():
        _unavailable(f"no docs venv {DOCS_VENV} (make docs-site-setup)")
    work = tmp_path_factory.mktemp("docs-site")
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "docs_site.sh"), str(DOCS_VENV / "bin"), "site"],
        env={**os.environ, "DOCS_SITE_DIR": str(work)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work / "sphinx" / "build" / "html"


def test_every_page_renders_with_no_broken_link(chromium, site):
    """One test, so that a parallel run (xdist) builds the site once."""
    doms, broken = {}, []
    for page, title in _pages().items():
        dom = _parse(chromium("--dump-dom", (site / page).as_uri()))
        # Sphinx's smart quotes and the heading's permalink sign aside
        h1 = (dom.h1 or "").replace("\u2019", "'").replace("\u201c", '"').replace("\u201d", '"')
        assert title in h1, f"{page}: h1 {dom.h1!r}, expected {title!r}"
        doms[page] = dom
    for page, dom in doms.items():
        for link in dom.links:
            url = urlsplit(link)
            if url.scheme in ("http", "https", "mailto", "data", "javascript") or url.netloc:
                continue
            target = (site / page).parent / unquote(url.path) if url.path else site / page
            target = target.resolve()
            if not target.is_file() and not (target / "index.html").is_file():
                broken.append(f"{page}: {link} (no {target})")
            elif url.fragment and target.suffix == ".html":
                rel = target.relative_to(site.resolve()).as_posix()
                ids = doms[rel].ids if rel in doms else _parse(target.read_text(encoding="utf-8")).ids
                if url.fragment not in ids:
                    broken.append(f"{page}: {link} (no id {url.fragment} in {rel})")
    assert not broken, "broken links:\n" + "\n".join(broken)
    # the index lists every module, the role and every guide
    index_links = {urlsplit(link).path for link in doms["index.html"].links}
    assert set(_pages()) - {"index.html"} <= index_links
    # the guides' cross-references became links to the other guides
    assert any(urlsplit(link).path == "guide_compatibility.html" for link in doms["docsite/guide_safety.html"].links)
    # the role's page carries the role README's prose besides its parameters, converted
    role_page = (site / "session_maintenance_role.html").read_text(encoding="utf-8")
    for heading in ("What it installs (per user)", "The agent and its own maintenance", "Schedulers", "Examples"):
        assert heading in role_page, heading
    assert "hermes_maintenance_scheduler" in role_page and "Several Hermes users on one host" in role_page
    assert role_page.index("Schedulers") < role_page.index("Parameters")
    assert "Testing" not in [h.strip() for h in re.findall(r"<h\d[^>]*>([^<]*)<", role_page)]
    # the getting-started page links the role's page and the fleet guide's undo section
    started = {urlsplit(link).path for link in doms["docsite/guide_getting_started.html"].links}
    assert {"../session_maintenance_role.html", "guide_fleet.html"} <= started, started
    # screenshots of what a reader sees first
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name, page in (("index", "index.html"), ("session_maintenance", "session_maintenance_module.html")):
        png = SCREENSHOTS / f"{name}.png"
        png.unlink(missing_ok=True)
        chromium("--window-size=1280,1000", "--hide-scrollbars", f"--screenshot={png}", (site / page).as_uri())
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000, f"{png}: {len(data)} bytes"
