# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine's layers, read from its imports: no file imports a layer above its own, and no
private name (``_x``) is imported from another file. docs/architecture.md draws the same order."""

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "plugins" / "module_utils" / "_hermes"
# Lowest first. A file may import its own layer and the ones before it, never one after it.
LAYERS = (
    "options", "results",  # the option and result tables
    "sqlite",  # connections, locks, ranged reads, durability, holders, where a file's bytes are
    "store",  # what Hermes keeps in state.db: schema, catalogue, fence, release rules
    "host",  # profiles, the profile lock, owners, Hermes's processes and locks
    "plan",  # read-only decisions: what a run would close, prune and free
    "backup",  # whole-file backups and archives
    "apply",  # paced writes: prune, elision, files, reclaim, Hermes's deletes, storage upgrade, window
    "restore",  # a whole file from a backup, sessions from an archive or backup
    "maintain",  # one run over a host's profiles: checked options, the action plan, the orchestration
    "report",  # gather_info, metrics
    "runner", "offsite",  # the scheduled jobs' entry points
)  # fmt: skip
RANK = {"options": 0, "results": 0, "runner": len(LAYERS), "offsite": len(LAYERS)}
RANK.update((name, rank) for rank, name in enumerate(LAYERS) if name not in RANK)


def layer(module):
    """The layer of a module given as its parts under the package ("apply", "prune")."""
    return module[0]


def imports(path):
    """(line, module parts under the package, names) of each relative import in PATH."""
    package = list(path.relative_to(ENGINE).parent.parts)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            yield node.lineno, target, [alias.name for alias in node.names]


def engine_files():
    files = sorted(p for p in ENGINE.rglob("*.py") if "__pycache__" not in p.parts)
    assert len(files) > 20, files  # the engine is there
    return files


def test_every_file_sits_in_a_known_layer():
    unknown = [
        p.relative_to(ENGINE).as_posix()
        for p in engine_files()
        if p.relative_to(ENGINE).parts[0].removesuffix(".py") not in RANK
    ]
    assert unknown == [], "add the layer to LAYERS (and docs/architecture.md), in its place: %s" % unknown


def test_no_file_imports_a_layer_above_its_own():
    back_edges = []
    for path in engine_files():
        own = path.relative_to(ENGINE).with_suffix("").parts
        for line, target, _names in imports(path):
            if RANK[layer(target)] > RANK[layer(own)]:
                back_edges.append("%s:%d imports %s" % ("/".join(own), line, ".".join(target)))
    assert back_edges == [], back_edges


def test_no_private_name_is_imported_from_another_file():
    private = []
    for path in engine_files():
        for line, target, names in imports(path):
            private += [
                "%s:%d: %s from %s" % (path.relative_to(ENGINE), line, n, ".".join(target))
                for n in names
                if n.startswith("_")
            ]
    assert private == [], private
