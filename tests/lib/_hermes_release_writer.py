"""Build a state.db with a REAL Hermes Agent release's own SessionDB API.

Run by tests/lib/hermes_fixtures.py under a release's venv python:

    <venv>/bin/python _hermes_release_writer.py PLAN.json

PLAN (JSON) = {
  "home": HERMES_HOME, "db_path": path of state.db,
  "mode": "build" | "init",          # init: only create the schema, no rows
  "sessions": [                      # parents before children
     {"id", "source", "create_kwargs": {...},     # passed to create_session
      "messages": [{"role", "content", "ts"}],   # appended via append_message
      "end_reason": str or None,                  # end_session() when set
      "started_at": float or str, "ended_at": float or None,   # aged afterwards
      "compression_lease": null or {"holder", "acquired_at", "expires_at"}}
  ]
}

The release stamps time.time() everywhere; the final step ages timestamps with
plain SQL UPDATEs after the SessionDB is closed. Prints one JSON line:
{"schema_version": N, "message_ids": {sid: [ids...]}, "hermes_version": "..."}.
"""

import inspect
import json
import os
import sqlite3
import sys
from pathlib import Path


def main(plan_path):
    with open(plan_path) as fh:
        plan = json.load(fh)
    home = plan["home"]
    os.environ["HERMES_HOME"] = home
    db_path = Path(plan["db_path"])
    db_path.parent.mkdir(parents=True, exist_ok=True)

    import hermes_state  # noqa: E402  (the release's own module)

    db = hermes_state.SessionDB(db_path=db_path)
    insert_fn = getattr(db, "_insert_session_row", None) or db.create_session
    accepted = set(inspect.signature(insert_fn).parameters)
    message_ids = {}
    sessions = plan.get("sessions", []) if plan.get("mode", "build") == "build" else []
    try:
        for s in sessions:
            kwargs = dict(s.get("create_kwargs") or {})
            unknown = set(kwargs) - accepted
            if unknown and not any(
                p.kind == inspect.Parameter.VAR_KEYWORD for p in inspect.signature(insert_fn).parameters.values()
            ):
                raise SystemExit("this Hermes release's create_session does not accept %s" % sorted(unknown))
            db.create_session(s["id"], s["source"], **kwargs)
            ids = []
            for m in s.get("messages", []):
                ids.append(db.append_message(s["id"], m["role"], m["content"]))
            message_ids[s["id"]] = ids
        for s in sessions:
            if s.get("end_reason"):
                db.end_session(s["id"], s["end_reason"])
        for s in sessions:
            lease = s.get("compression_lease")
            if lease:
                if not hasattr(db, "try_acquire_compression_lock"):
                    raise SystemExit("this Hermes release has no compression locks")
                if not db.try_acquire_compression_lock(s["id"], lease["holder"], 3600.0):
                    raise SystemExit("could not take compression lock on %s" % s["id"])
    finally:
        db.close()

    conn = sqlite3.connect(str(db_path), timeout=30)
    try:
        with conn:
            for s in sessions:
                conn.execute(
                    "UPDATE sessions SET started_at = ?, ended_at = ? WHERE id = ?",
                    (s["started_at"], s.get("ended_at"), s["id"]),
                )
                rows = [(m["ts"], mid) for m, mid in zip(s.get("messages", []), message_ids[s["id"]])]
                conn.executemany("UPDATE messages SET timestamp = ? WHERE id = ?", rows)
                lease = s.get("compression_lease")
                if lease:
                    conn.execute(
                        "UPDATE compression_locks SET acquired_at = ?, expires_at = ? WHERE session_id = ?",
                        (lease["acquired_at"], lease["expires_at"], s["id"]),
                    )
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    try:
        from importlib.metadata import version as _v

        hv = _v("hermes-agent")
    except Exception:
        hv = None
    print(json.dumps({"schema_version": version, "message_ids": message_ids, "hermes_version": hv}))


if __name__ == "__main__":
    main(sys.argv[1])
