"""What getting_started says of the walk's outcome, checked after it (tests/fresh/walk_inside.sh).

    python3 walk_check.py WALK_DIR GATEWAY_STATE_DIR HERMES_HOME JOURNAL_MODE

WALK_DIR holds ``commands`` and each command's output (``NN.out``, ``NN-check.out`` for its
``--check --diff`` run first). Checked: the dry run predicted the real run's counts and pruned
something; the real run took the backup the docs name (beside a gateway holding a rollback-journal
file, an archive of the rows it deleted), owner-only, owned by the Hermes user, and its summary
line is short; the job run by hand logged; the listing shows the pruned session of 2026-11-12 with
its title; restore_sessions brought it back from the archive (saying so); removing the schedule
kept the backups; no chat request to the gateway failed. Plain Python 3.9+ standard library.
"""

import json
import pwd
import re
import sqlite3
import sys
from pathlib import Path

from walk_gateway import RESTORE_DAY_SESSION

LINE = re.compile(r"default: zombies=(?P<z>\d+) pruned=(?P<p>\d+) [^\"\n]*")
SUMMARY_MAX = 165  # "under about 160 characters"


def outputs(walk):
    """command -> (its output, its --check --diff run's output or None, what it left behind)."""
    found = {}
    for n, cmd in enumerate((walk / "commands").read_text().splitlines(), 1):
        out, check = walk / ("%02d.out" % n), walk / ("%02d-check.out" % n)
        left = dict(line.split(" ", 1) for line in Path("%s.state" % out).read_text().splitlines())
        found[cmd] = (out.read_text(), check.read_text() if check.exists() else None, left)
    return found


def one(found, *words):
    hits = [out for cmd, out in found.items() if all(w in cmd for w in words)]
    assert len(hits) == 1, "expected one walk command with %s, got %d" % (words, len(hits))
    return hits[0]


def summary(text, what):
    lines = [m.group(0) for m in LINE.finditer(text)]
    assert lines, "%s printed no summary line:\n%s" % (what, text[-3000:])
    return lines[0]


def main(walk, state, home, journal):
    walk, state, home = Path(walk), Path(state), Path(home)
    found = outputs(walk)
    problems = []

    dry = summary(one(found, "single_server.yml", "--check")[0], "the dry run")
    real_out, _check, real_left = [found[cmd] for cmd in found if cmd.endswith("single_server.yml")][0]
    real = summary(real_out, "the real run")
    print("dry run:  %s\nreal run: %s (%d characters)" % (dry, real, len(real)))
    d, r = LINE.match(dry), LINE.match(real)
    if int(d["p"]) == 0 or int(d["z"]) == 0:
        problems.append("the dry run selected no zombie or nothing to prune: the walk tests nothing")
    if (d["z"], d["p"]) != (r["z"], r["p"]):
        problems.append("the dry run said zombies=%s pruned=%s, the run did %s/%s" % (d["z"], d["p"], r["z"], r["p"]))
    # The vacuum's estimate below its threshold keeps its long words on the line (the engine's tests
    # require them): the rest, the common line, must be short.
    common = real.split("; vacuum skipped: the prune deletes ")[0]
    if len(common) > SUMMARY_MAX:
        problems.append("the summary line has %d characters (more than %d)" % (len(common), SUMMARY_MAX))

    # The backup the docs promise: a whole-file copy, or beside a gateway holding a rollback-journal
    # file, the archive of the rows deleted ("backup=archive").
    prefix = "hermes-ops-archive_default_" if journal == "delete" else "hermes-ops_default_"
    named = re.search(r"backup=(?:archive|file) backups/(%s\S+\.db)" % prefix, real)
    owner = home.stat().st_uid
    if not named:
        problems.append("the run's line names no backups/%s...: %s" % (prefix, real))
    else:
        backup = home / "backups" / named.group(1)
        st = backup.stat() if backup.exists() else None
        if st is None:
            problems.append("the backup the line names is not there: %s" % backup)
        elif (st.st_mode & 0o777, st.st_uid) != (0o600, owner):
            mode = st.st_mode & 0o777
            problems.append("%s: mode %o owner %d (want 0600, the Hermes user)" % (backup, mode, st.st_uid))
        print("backup:   %s (%d bytes, 0600, %s)" % (backup, st.st_size, pwd.getpwuid(owner).pw_name) if st else "")

    if real_left["crontab"] != "1":
        problems.append("the real run left %s crontab entries for the job (want 1)" % real_left["crontab"])
    by_hand, _check, by_hand_left = one(found, "hermes-session-maintenance", "--dry-run")
    if "=== Session Maintenance Start ===" not in by_hand:
        problems.append("the job run by hand printed no seed header")
    log = by_hand_left["log"].split()
    if log[0] == "none" or log[1:] != ["hermes", "600"]:
        problems.append("the job run by hand left no owner-only log of the Hermes user: %s" % log)

    listing = one(found, "restore_sessions", "hermes_restore_list")[0]
    if RESTORE_DAY_SESSION not in listing or "walk: the day to restore" not in listing:
        problems.append("the listing does not show %s and its title" % RESTORE_DAY_SESSION)
    restore, restore_check, _left = one(found, "restore_sessions", "hermes_restore_backup=newest")
    if journal == "delete" and ("archive" not in restore or "archive" not in (restore_check or "")):
        problems.append("restore_sessions (and its --check --diff) did not say it took the archive")
    conn = sqlite3.connect("file:%s?mode=ro" % (home / "state.db"), uri=True)
    back = conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (RESTORE_DAY_SESSION,)).fetchone()[0]
    conn.close()
    if back != 4:
        problems.append("%s has %d of its 4 messages back after the undo" % (RESTORE_DAY_SESSION, back))
    print("undo:     %s back with %d messages" % (RESTORE_DAY_SESSION, back))

    removed = one(found, "hermes_maintenance_state=absent")[2]
    if (removed["crontab"], removed["engine"]) != ("0", "0"):
        problems.append("removing the schedule left the job (crontab %s) or the engine and config (%s)" % (
            removed["crontab"], removed["engine"]))  # fmt: skip
    if named and not (home / "backups" / named.group(1)).exists():
        problems.append("removing the schedule removed the backup")

    gateway = json.loads((state / "result.json").read_text())
    print("gateway:  %(requests)d chat requests, %(failed)d failed, worst %(worst_ms)d ms" % gateway)
    if gateway["failed"] or not gateway["requests"]:
        problems.append("chat requests failed: %s" % gateway["failures"])
    if problems:
        sys.exit("WALK FAILED:\n- " + "\n- ".join(problems))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: walk_check.py WALK_DIR GATEWAY_STATE_DIR HERMES_HOME JOURNAL_MODE")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main(*sys.argv[1:])
