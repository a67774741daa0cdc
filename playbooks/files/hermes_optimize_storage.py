# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run Hermes's own FTS storage upgrade where a state.db says it is available.

    hermes_optimize_storage.py --profile-home DIR [--profile-home DIR2]... --hermes-cli PATH

Run by playbooks/maintain.yml in the service window (gateway stopped, after our backup),
AS THE HERMES USER: the CLI is the user's own code and is never run as root (refused).

Per profile home (the directory of a state.db: HOME, or HOME/profiles/NAME): reads
``state_meta.fts_optimize_available`` read-only; where it is ``1`` (Hermes >= 0.20 opened a
file with the inline FTS layout of <= 0.19), runs
``HERMES_HOME=<profile home> <cli> sessions optimize-storage --yes`` (no ``--force``: the
CLI refuses while another Hermes process holds the file) and reports the size of state.db
+ WAL before and after and ``state_meta.fts_storage_version`` after. A CLI without the
command (Hermes < 0.20) is left alone and reported. Prints one JSON object; exit code 0
unless a run failed.
"""

import argparse
import json
import os
import sqlite3
import subprocess
import sys

KEYS = ("fts_optimize_available", "fts_storage_version")
OUTPUT_TAIL = 1500


def read_meta(db):
    """The FTS keys of state_meta (missing table or key: None), read-only."""
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=10)
    try:
        has = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='state_meta'").fetchone()
        if not has:
            return dict.fromkeys(KEYS)
        rows = dict(conn.execute("SELECT key, value FROM state_meta WHERE key IN (?, ?)", KEYS).fetchall())
        return {key: rows.get(key) for key in KEYS}
    finally:
        conn.close()


def db_bytes(db):
    return sum(os.path.getsize(db + side) for side in ("", "-wal") if os.path.exists(db + side))


def run_sessions_command(cli, args, env, timeout):
    """``cli sessions args...`` with no terminal input; its output captured, its exit code not checked."""
    return subprocess.run(
        [cli, "sessions", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def cli_supports(cli, env):
    """True when ``cli sessions optimize-storage --help`` exists (Hermes >= 0.20)."""
    try:
        proc = run_sessions_command(cli, ["optimize-storage", "--help"], env, 120)
    except FileNotFoundError:
        return False, "Hermes CLI %s not found: set hermes_maintenance_hermes_cli to the user's `hermes`" % cli
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, "%s: %s" % (cli, exc)
    if proc.returncode == 0 and "optimize-storage" in proc.stdout:
        return True, ""
    return False, "%s has no `sessions optimize-storage` (rc %d): a Hermes release before 0.20" % (
        cli,
        proc.returncode,
    )


def optimize(phome, cli, timeout):
    db = os.path.join(phome, "state.db")
    result = {"path": db, "action": None, "before_bytes": db_bytes(db), "after_bytes": None}
    try:
        meta = read_meta(db)
    except sqlite3.Error as exc:
        result.update(action="failed", message="cannot read state_meta of %s: %s" % (db, exc))
        return result
    result["fts_storage_version_before"] = meta["fts_storage_version"]
    if meta["fts_optimize_available"] != "1":
        result.update(action="not_needed", message="state_meta.fts_optimize_available is not set: nothing to do")
        return result
    env = dict(os.environ, HERMES_HOME=phome)
    supported, why = cli_supports(cli, env)
    if not supported:
        result.update(action="unsupported", message=why + "; left alone")
        return result
    try:
        proc = run_sessions_command(cli, ["optimize-storage", "--yes"], env, timeout)
        lines = proc.stdout.replace("\r", "\n").splitlines()
        output = "\n".join(line for line in lines if line.strip() and "Rebuilding index" not in line)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        output, rc = "timed out after %ss (safe to re-run: it resumes)" % timeout, None
    after = read_meta(db)
    result.update(
        after_bytes=db_bytes(db),
        fts_storage_version_after=after["fts_storage_version"],
        output=output[-OUTPUT_TAIL:],
        rc=rc,
    )
    # The CLI prints why it did nothing (refused, no disk, ...) but exits 0; the marker is the truth.
    if rc == 0 and after["fts_optimize_available"] != "1" and after["fts_storage_version"]:
        result.update(action="optimized", message="optimize-storage done")
    else:
        result.update(action="failed", message="optimize-storage did not finish (rc %s): %s" % (rc, output[-300:]))
    return result


def _mb(n):
    return "?" if n is None else "%.1f MB" % (n / 1e6)


def summary_line(result):
    """``PATH: optimized 56.0 MB -> 32.9 MB`` or ``PATH: not_needed: why``."""
    if result["action"] == "optimized":
        return "%s: optimized %s -> %s (fts_storage_version %s)" % (
            result["path"],
            _mb(result["before_bytes"]),
            _mb(result["after_bytes"]),
            result.get("fts_storage_version_after"),
        )
    return "%s: %s (%s): %s" % (result["path"], result["action"], _mb(result["before_bytes"]), result["message"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--profile-home", action="append", default=[])
    parser.add_argument("--hermes-cli", required=True)
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)
    if os.geteuid() == 0:
        sys.stderr.write("hermes_optimize_storage: refusing to run as root: the Hermes CLI is the user's code\n")
        return 2
    cli = os.path.expanduser(args.hermes_cli)
    results = []
    for phome in args.profile_home:
        results.append(optimize(os.path.abspath(os.path.expanduser(phome)), cli, args.timeout))
    print(json.dumps({"profiles": results, "summary": [summary_line(r) for r in results]}, sort_keys=True))
    return 1 if any(r["action"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
