"""The commands of the operator's walk, read from the docs, one per line (tests/fresh/walk.sh).

    python3 walk_commands.py docs/getting_started.md README.md

getting_started marks each code block the walk runs with ``<!-- walk -->`` on the line before it
(``<!-- walk: WORDS -->``: only its lines containing WORDS, where the others need what a test
cannot have, such as Galaxy). A line ending in ``\\`` goes on in the next one. The commands are
printed exactly as written. The README's operator Quick start must not say anything else: each of
its commands is one of the walk's, but for the install from Galaxy, where the walk installs
from a checkout. Plain Python 3.9+ standard library.
"""

import re
import sys

MARK = re.compile(r"^<!-- walk(?::\s*(?P<words>.*?))?\s*-->$")
QUICK_START = re.compile(r"\*\*To maintain a Hermes server\*\*.*?```sh\n(?P<block>.*?)```", re.S)
GALAXY = "ansible-galaxy collection install hermes_agent.ops"


def blocks(text):
    """(filter words or None, the block's lines) for each marked block."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        mark = MARK.match(line.strip())
        if not mark:
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
            raise SystemExit("line %d: a walk mark must stand right before a ```sh block" % (i + 1))
        end = lines.index("```", i + 2)
        yield mark.group("words"), lines[i + 2 : end]


def commands(block):
    """The block's commands: continuation lines joined as the shell joins them."""
    cmd = ""
    for line in block:
        if line.endswith("\\"):
            cmd += line[:-1]
            continue
        cmd += line
        if cmd.strip():
            yield cmd.strip()
        cmd = ""


def bare(cmd):
    """A command without its trailing comment and extra blanks, to compare two docs' commands."""
    return " ".join(re.sub(r"\s+#.*$", "", cmd).split())


def main(getting_started, readme):
    with open(getting_started) as fh:
        walk = [c for words, block in blocks(fh.read()) for c in commands(block) if not words or words in c]
    if not walk:
        raise SystemExit("%s has no <!-- walk --> blocks" % getting_started)
    with open(readme) as fh:
        quick = QUICK_START.search(fh.read())
    if not quick:
        raise SystemExit("%s: no operator Quick start (**To maintain a Hermes server** and a ```sh block)" % readme)
    walked = {bare(c) for c in walk}
    for cmd in commands(quick.group("block").splitlines()):
        if bare(cmd) != GALAXY and bare(cmd) not in walked:
            raise SystemExit("README's Quick start command is not in getting_started's walk: %s" % cmd)
    sys.stdout.write("".join(c + "\n" for c in walk))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: walk_commands.py GETTING_STARTED README")
    main(*sys.argv[1:])
