"""The prune archive is flushed to disk as it grows, not all at once at the end.

Written with ``synchronous=OFF``, a large archive used to leave its whole size as dirty pages
for the kernel to write back in one lump in the middle of the prune (at 5 GB a gateway commit
then waited 520-640 ms for its own fsync). ``take_archive`` now fdatasyncs the partial file each
time it has grown by BACKUP_STEP_BYTES (so does the tool payloads' archive: test_tool_payloads.py).
Here on a real 0.22.2 file, with the step made small so that a small archive crosses it many
times: the archive is complete and verified, and it was flushed once per step it grew, on its own
descriptor.
"""

import sqlite3

from hermes_markers import release_module_marks
from hermes_reliability import record_fdatasync
from hermes_rollback import RELEASE, make_big_rollback_home

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup import (
    whole_file as hermes_backup_whole_file,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.backup.archive import (
    archived_sessions,
    take_archive,
)

pytestmark = release_module_marks(RELEASE)
STEP = 256 * 1024


def test_a_growing_archive_is_flushed_every_step(tmp_path, monkeypatch):
    home = tmp_path / "home"
    db = make_big_rollback_home(home, 40, 200, seed=3)
    backups = tmp_path / "backups"
    backups.mkdir(mode=0o700)
    conn = sqlite3.connect(str(db))
    old = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE ended_at IS NOT NULL ORDER BY id")]
    counts = dict(conn.execute("SELECT session_id, COUNT(*) FROM messages GROUP BY session_id"))
    must_contain = {sid: counts.get(sid, 0) for sid in old}

    monkeypatch.setattr(hermes_backup_whole_file, "BACKUP_STEP_BYTES", STEP)
    flushed = record_fdatasync(monkeypatch)  # (descriptor's file, its size then) of each fdatasync
    try:
        backup = take_archive(conn, str(db), str(backups), "default", old, must_contain)
    finally:
        conn.close()

    assert backup["kind"] == "archive" and backup["verified"] is True
    assert set(archived_sessions(backup["path"])) == set(old)
    partials = [(path, size) for path, size in flushed if path.endswith(".partial")]
    assert len(partials) >= backup["bytes"] // STEP - 1, (backup["bytes"], flushed)
    sizes = [size for _path, size in partials]
    assert sizes == sorted(sizes) and all(b - a >= STEP for a, b in zip(sizes, sizes[1:])), sizes
    assert len(partials) >= 3 and sum(must_contain.values()) >= 20 * 200
