# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The README is a user's five minutes: short, its playbook the one the tests run, its
prerequisites enough for the role; what contributors need is in CONTRIBUTING.md."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_short():
    assert len(README.splitlines()) <= 200


def test_prerequisites_and_the_two_commands_come_first():
    block = re.search(r"<!-- prerequisites -->(.*?)<!-- /prerequisites -->", README, re.S).group(1)
    packages = re.search(r"apt-get install ([^\n`]+)", block).group(1).split()
    assert {"python3", "python3-venv", "make", "git", "cron"} <= set(packages)
    start = README.index("<!-- /prerequisites -->")
    assert README.index("make demo", start) < README.index("make test", start) < README.index("\n## What it does")
    assert re.search(r"make test .*\d+-\d+ minutes", README)  # says how long it takes
    assert "make lint unit" in README  # and what the quick check is


def test_the_single_server_playbook_is_the_tested_one():
    example = (REPO / "docs/examples/single_server.yml").read_text(encoding="utf-8")
    play = example[example.index("- name:") :]
    shown = re.search(r"```yaml\n(- name: Hermes Agent maintenance on one server\n.*?)```", README, re.S).group(1)
    # the README leaves out the blank lines between the tasks, nothing else
    assert shown == "\n".join(line for line in play.splitlines() if line.strip()) + "\n"


def test_links_to_files_exist():
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (REPO / target).exists(), target


def test_contributors_find_what_left_the_readme():
    contributing = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    for heading in ("## Set-up", "## Support matrix", "## Development", "## CI and its budget", "## The test layout"):
        assert heading in contributing, heading
    for target in ("make prepare", "make release-check", "make fresh-machine", ".ci/budgets", "PYTEST_MARKERS"):
        assert target in contributing, target
