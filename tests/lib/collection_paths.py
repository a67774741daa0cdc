"""Where the tests find the collection and their helpers; imported by both conftest files.

``import ansible_collections.hermes_agent.ops...`` needs the repo at a path ending in
``ansible_collections/hermes_agent/ops``. Under ansible-test (or an installed copy) the repo
already sits there; otherwise ``build/collections/ansible_collections/hermes_agent/ops`` is
made a symlink to the repo root (as ``make collection-link`` does). Importing this module puts
that collections root and ``tests/lib`` on ``sys.path``.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _collections_root(repo):
    if repo.parent.name == "hermes_agent" and repo.parent.parent.name == "ansible_collections":
        return repo.parents[2]  # already inside ansible_collections/ (ansible-test, installed copy)
    root = repo / "build" / "collections"
    link = root / "ansible_collections" / "hermes_agent" / "ops"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():  # dangling
            link.unlink()
        try:
            link.symlink_to(Path("..", "..", "..", ".."), target_is_directory=True)
        except FileExistsError:  # created meanwhile by a parallel worker
            pass
    return root


COLLECTIONS_ROOT = _collections_root(REPO_ROOT)
for _path in (str(COLLECTIONS_ROOT), str(REPO_ROOT / "tests" / "lib")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
