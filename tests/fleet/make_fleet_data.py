"""Generate the Hermes homes of the fleet test on the controller, one archive per home.

    make_fleet_data.py --spec SPEC.json --out DIR [--now UNIX_TIME]

SPEC (written by molecule/fleet/prepare.yml from the inventory)::

    {"homes": [{"host": "fleet1", "user": "hermes",
                "profiles": [{"name": "default", "layout": "v30"},
                             {"name": "broken", "broken": true}]}]}

One inventory host is one Hermes user on one container (a second user on the same
container is a second inventory host). For every healthy profile the state.db is built
by ``tests/lib/hermes_fixtures.py`` (``standard_scenario(layout)`` + ``build_home``):
real schema, every selection rule, and the expected outcome for the engine defaults
(zombie_days=1, prune_days=7). A ``broken`` profile gets a ``state.db`` that is not
an SQLite file.

Writes ``DIR/<host>.tar.gz`` (paths relative to the user's home: ``.hermes/...``;
directories 0700, files 0600; ownership is set when unpacked) and
``DIR/manifest.json``: per host and profile the expected counts before and after one
maintenance run, the ids kept / pruned / closed, and the expected summary line figures.
Prints the manifest path and a one-line summary per home. Standard library only.
"""

import argparse
import json
import sqlite3
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "lib"))

import hermes_fixtures  # noqa: E402  (tests/lib is not a package)

BROKEN_CONTENT = b"this is not an SQLite database: fleet test broken profile\n"


def profile_rel(name):
    """Path of a profile's state.db relative to the Hermes home."""
    return "state.db" if name == "default" else "profiles/%s/state.db" % name


def count_rows(db_path):
    conn = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True)
    try:
        sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
        messages = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        open_sessions = conn.execute("SELECT count(*) FROM sessions WHERE ended_at IS NULL").fetchone()[0]
    finally:
        conn.close()
    return sessions, messages, open_sessions


def build_profile(hermes_home, prof, now):
    name = prof["name"]
    rel = profile_rel(name)
    entry = {"name": name, "db": ".hermes/" + rel, "broken": bool(prof.get("broken"))}
    if entry["broken"]:
        path = hermes_home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(BROKEN_CONTENT)
        entry["layout"] = None
        return entry
    layout = prof.get("layout", "v30")
    if not hermes_fixtures.layout_available(layout):
        raise SystemExit(
            "make_fleet_data: layout %s is not available here: %s"
            % (layout, hermes_fixtures.missing_venv_message(layout))
        )
    specs, expected = hermes_fixtures.standard_scenario(layout)
    db = hermes_fixtures.build_home(hermes_home, layout, specs, now=now, profile=None if name == "default" else name)
    sessions, messages, open_sessions = count_rows(db)
    zombies = sorted(expected["zombies"])
    pruned = sorted(expected["pruned"])
    kept = sorted(expected["kept"])
    entry.update(layout=layout, sessions_before=sessions, messages_before=messages, open_before=open_sessions)
    entry.update(zombies=zombies, pruned=pruned, kept=kept, orphaned=sorted(expected["orphaned"]))
    entry.update({count: expected[count] for count in ("messages_pruned", "transcripts_removed", "bad_time_rows")})
    entry.update(zombies_closed=len(zombies), sessions_pruned=len(pruned), sessions_after=sessions - len(pruned))
    entry["messages_after"] = messages - expected["messages_pruned"]
    if entry["sessions_after"] != len(kept):
        raise SystemExit(
            "make_fleet_data: %s/%s: %d sessions built, %d expected kept + %d pruned"
            % (hermes_home, name, sessions, len(kept), len(pruned))
        )
    return entry


def tar_filter(info):
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o700 if info.isdir() else 0o600
    return info


def build_home_archive(home_spec, out_dir, now):
    host = home_spec["host"]
    with tempfile.TemporaryDirectory(prefix="fleet-home-") as tmp:
        user_home = Path(tmp)
        hermes_home = user_home / ".hermes"
        hermes_home.mkdir(mode=0o700)
        profiles = [build_profile(hermes_home, p, now) for p in home_spec["profiles"]]
        archive = out_dir / ("%s.tar.gz" % host)
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(str(hermes_home), arcname=".hermes", filter=tar_filter)
    return {
        "host": host,
        "user": home_spec["user"],
        "archive": str(archive),
        "profiles": {p["name"]: p for p in profiles},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--spec", required=True, help="JSON file: {'homes': [...]}")
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--now", type=float, default=None, help="unix time the data ages count back from")
    args = parser.parse_args(argv)

    spec = json.loads(Path(args.spec).read_text())
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    now = time.time() if args.now is None else args.now
    started = time.time()
    homes = {}
    for home_spec in spec["homes"]:
        home = build_home_archive(home_spec, out_dir, now)
        homes[home["host"]] = home
        print(
            "%s (%s): %s"
            % (
                home["host"],
                home["user"],
                ", ".join(
                    "%s=%s" % (n, "BROKEN" if p["broken"] else "%s/%d sessions" % (p["layout"], p["sessions_before"]))
                    for n, p in sorted(home["profiles"].items())
                ),
            )
        )
    manifest = {"now": now, "generator": "tests/lib/hermes_fixtures.py standard_scenario", "homes": homes}
    path = out_dir / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print("manifest: %s (%.1fs)" % (path, time.time() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
