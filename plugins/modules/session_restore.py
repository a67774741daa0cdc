#!/usr/bin/python
# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: session_restore
short_description: Put pruned Hermes Agent sessions back from an archive or a backup, while the gateway runs
version_added: 0.1.0
description:
  - Restores sessions into the profile's C(state.db), in place, from an archive written by
    M(hermes_agent.ops.session_maintenance) (C(hermes-ops-archive_<profile>_<time>.db), holding the sessions a prune
    deleted, their messages and the rows tied to them, taken instead of a whole-file backup when C(state.db) is in
    rollback-journal mode and the gateway holds it) or from one of its whole-file backups
    (C(hermes-ops_<profile>_<time>.db), or C(.db.gz) with
    O(hermes_agent.ops.session_maintenance#module:backup_compress)).
    The file, its inode and its journal mode stay as they are, so a running Hermes gateway keeps writing; nothing
    has to be stopped.
  - Only a finished archive or backup of the same profile is used; a hidden C(.partial) file, another file name,
    another profile's file, a file others can write, one that fails C(quick_check) or (an archive) lacks any of the
    sessions it lists is refused, naming the reason. A compressed backup is decompressed into a private directory
    (0700, the file 0600) in the backup directory, removed afterwards.
  - Refuses a source taken from a newer C(schema_version) than the file's (an older Hermes would not know its
    columns), a file lacking a column or table the source's rows need, and a session id the source does not hold.
    Columns are matched by name, so an older backup restores into a newer file; a parent session that is neither
    in the file nor restored with its child is dropped from the row (C(parent_session_id) null), as Hermes's own
    prune orphans children.
  - The sessions are chosen by O(sessions), O(active_after) / O(active_before), O(sources) and O(match), each one
    given narrowing the choice further (AND). With each chosen session come the sessions the prune deleted together
    with it (its delegates, the compression continuations after it and the compression ancestors it
    continues). From an archive, without any of these, every session it holds. From a backup, at least one is
    required (a whole-file backup also holds sessions deleted on purpose), and only sessions C(state.db) no longer
    has come back (a session it has is never touched).
  - Parents go before their children, one session per write transaction, its messages 500 per transaction with
    a pause between, C(INSERT OR IGNORE). Restoring twice changes nothing, and a restore interrupted at any point
    is completed by running it again (from a backup, the sessions being put back are listed in
    C(.hermes-ops-restore_<profile>.pending) in the backup directory until they are complete). Hermes's own
    triggers rebuild the full-text rows, so a restored session is found by search at once.
  - O(list_missing=true) changes nothing and says, for every backup and archive of the profile, what it holds that
    C(state.db) no longer has, as sessions and messages per day and source (RV(backups)).
  - Holds the profile's maintenance lock (C(state.db.auto-maintenance.lock), shared with Hermes's own
    auto-maintenance) and refuses while Hermes repairs, quarantines or rebuilds the file (its
    C(state.db.repair.lock), C(.quarantine.lock), C(.fts_rebuild.lock) held).
  - As root on a file another user owns, the work runs in a child switched to that user.
author:
  - hermes_agent.ops contributors (!UNKNOWN)
attributes:
  check_mode:
    details:
      - Verifies the source and reads C(state.db) in short read transactions; the sessions it lists and the counts
        it returns are exactly what the real run restores. No file is created beside C(state.db) (a compressed
        backup is decompressed into the backup directory, and removed).
  diff_mode:
    support: full
    details:
      - One line per session, before and after (absent, or present with how many of its archived or backed-up
        messages).
  idempotent:
    support: full
extends_documentation_fragment:
  - hermes_agent.ops.restore
  - hermes_agent.ops.pacing
  - hermes_agent.ops.pacing.BATCH_PAUSE
options:
  archive:
    description:
      - The archive to restore from, as a path or as a file name in O(backup_dir).
      - Exactly one of O(archive) and O(backup), unless O(list_missing=true) or O(tool_payloads=true) (at most one).
    type: str
  backup:
    description:
      - The whole-file backup to restore from, as a path, a file name in O(backup_dir), or V(newest) (the profile's
        newest backup).
      - Where the profile has no whole-file backup (beside a gateway holding a rollback-journal file maintenance
        keeps an archive of the rows it deletes instead), V(newest) takes its newest archive, and the first of
        RV(notes) says so; a selection is still needed.
    type: str
  sessions:
    description:
      - The ids of the sessions to restore.
      - From an archive, omitted with every other selection option, every session the archive holds; check mode
        then lists them all in RV(sessions).
    type: list
    elements: str
  active_after:
    description:
      - Only sessions active at or after this time (their last message, or their start, not earlier).
      - Unix seconds, or an ISO 8601 date or date and time, UTC unless it names a zone (V(2026-11-24),
        V(2026-11-24T13:00:00Z), V(2026-11-24T14:00:00+01:00)).
      - With O(active_before) the day after, a day's sessions (those it touched).
    type: str
  active_before:
    description:
      - Only sessions that started before this time; the same forms as O(active_after).
    type: str
  sources:
    description:
      - Only sessions of these sources (C(sessions.source), such as V(telegram), V(discord), V(cli), V(cron)).
    type: list
    elements: str
  match:
    description:
      - Only sessions whose title contains this text (case-insensitive), or one of whose messages the source's own
        full-text index (Hermes's C(messages_fts)) finds as a phrase.
      - Where the source has no usable index (an archive, or a tokenizer this SQLite lacks), titles only; RV(notes)
        says so.
    type: str
  list_missing:
    description:
      - List, for every backup and archive of the profile, what it holds that C(state.db) no longer has; restore
        nothing. The selection options are not used.
    type: bool
    default: false
  tool_payloads:
    description:
      - Put back the tool output that O(hermes_agent.ops.session_maintenance#module:tool_payload_days) replaced with
        tombstones, byte for byte, from the payload archive O(archive) names
        (C(hermes-ops-payloads_<profile>_<time>.db)), or from the whole-file backup O(backup) names (a name, a
        path or V(newest)); with neither, from every payload archive of the profile in O(backup_dir), newest
        first, and then, for the tombstones none of them holds, from the profile's whole-file backups, newest
        first, until every tombstone is matched.
      - Only the messages of the O(sessions) given (all when omitted) that still hold the tombstone written in their
        place; a message changed since is left alone. Restoring twice changes nothing.
      - From a whole-file backup, a message is put back only from the backup's row with the same id that is the
        message the tombstone was written for. The tombstone records the body's size, tool and day but no hash of
        it, so the row must be the same message (same id, which Hermes never reuses, session, role, timestamp,
        tool name and tool call id) with a body of exactly the recorded size, not itself a tombstone, and give
        exactly that tombstone again. A body Hermes rewrote in place with the same size between the backup and
        the elision cannot be told apart; that is why the payload archive, written from the very bytes elided,
        is read first. A row that does not match, or is missing, is left alone and listed in RV(tool_payloads)
        (V(unmatched)).
      - Check mode gives the exact count and bytes (RV(tool_payloads)). The other selection options are not used
        with it.
    type: bool
    default: false
seealso:
  - module: hermes_agent.ops.session_maintenance
  - module: hermes_agent.ops.state_db_restore
"""

EXAMPLES = r"""
- name: See which sessions an archive holds and which are missing from state.db
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    archive: hermes-ops-archive_default_20261201T040001Z.db
  check_mode: true
  register: archive_plan

- name: Put two pruned sessions back while the gateway runs
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    archive: hermes-ops-archive_default_20261201T040001Z.db
    sessions:
      - 20261020_101500_ab12cd
      - 20261021_090000_ef34gh

- name: Put back the tool output tool_payload_days elided in one session
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    tool_payloads: true
    sessions:
      - 20261020_101500_ab12cd

- name: Put back elided tool output from the newest whole-file backup (the payload archive was removed)
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    tool_payloads: true
    backup: newest
  register: payloads_back

- name: What each backup holds that state.db no longer has, per day and source
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    list_missing: true
  register: missing

- name: Bring back last Tuesday's discord sessions from the newest whole-file backup
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    backup: newest
    active_after: "2026-11-24"
    active_before: "2026-11-25"
    sources: [discord]

- name: Bring back the session about the invoice, found by the backup's own full-text index
  hermes_agent.ops.session_restore:
    hermes_home: /home/hermes/.hermes
    backup: hermes-ops_default_20261125T040001Z.db.gz
    match: invoice 4711
"""

RETURN = r"""
db:
  description: The C(state.db) restored into.
  returned: always
  type: str
archive:
  description:
    - The archive, verified (V(path), V(profile) and V(source) it was taken from, V(created_at), V(schema_version),
      V(sessions) and V(messages) it holds).
  returned: success, from an archive
  type: dict
backup:
  description:
    - The whole-file backup, verified (V(path), V(profile), V(compressed), V(created_at) (its name's time),
      V(schema_version), V(sessions) and V(messages) it holds).
  returned: success, from a backup
  type: dict
db_schema_version:
  description: The C(schema_version) of C(state.db).
  returned: success
  type: int
sessions:
  description:
    - Each session to restore, parents first, as found before the restore, with V(id), V(present) (its row is in
      C(state.db)), V(messages_archived) (its messages in the source), V(messages_missing) (of those, not in
      C(state.db)), V(rows_missing) (rows of the other tables tied to it, such as C(session_model_usage), not in
      C(state.db)), V(orphaned) (its parent is gone, so it is restored without it).
    - From an archive, every session chosen (all the archive holds when none were named); from a backup, only those
      C(state.db) lacks (and those an interrupted restore left unfinished).
  returned: success
  type: list
  elements: dict
after:
  description: The same list as RV(sessions), read again after the restore. Not in check mode.
  returned: changed and not check mode
  type: list
  elements: dict
sessions_restored:
  description: Sessions whose row was put back (predicted in check mode).
  returned: success
  type: int
sessions_present:
  description:
    - Sessions chosen whose row was already there (from an archive their missing messages, if any, are still put
      back; from a backup they are left as they are).
  returned: success
  type: int
messages_restored:
  description: Messages put back (predicted in check mode).
  returned: success
  type: int
rows_restored:
  description: Rows of other tables tied to the sessions (C(session_model_usage)) put back (predicted in check mode).
  returned: success
  type: int
orphaned:
  description: Sessions restored without their parent (C(parent_session_id) set null).
  returned: success
  type: int
sessions_reopened:
  description:
    - From an archive that recorded a zombie close, the sessions chosen by id (or all, with no selection) whose
      C(ended_at) and C(end_reason) were put back as they were before the close, only where they still hold what
      the close wrote (predicted in check mode).
  returned: success
  type: int
notes:
  description:
    - What the operator should know about the choice, such as a O(match) that looked at titles only (no usable
      full-text index in the source), or a run completing an interrupted restore.
  returned: success
  type: list
  elements: str
backups:
  description:
    - With O(list_missing=true), every backup and archive of the profile, newest first, with V(path), V(kind)
      (V(file) or V(archive)), V(created_at), V(schema_version), V(sessions) and V(messages) it holds, and what of
      that C(state.db) no longer has, V(sessions_missing), V(messages_missing) and V(missing), a list of V(day)
      (the UTC day a session started), V(source), V(sessions), V(messages) and V(ids) (each session's V(id),
      V(title) and V(messages)); or V(error) for a file that fails the checks.
  returned: list_missing
  type: list
  elements: dict
listing:
  description:
    - With O(list_missing=true), RV(backups) as text, a line per file and under it one per day and source with its
      sessions and messages, then a line per session (id, messages, title; the first 20 of each day and source).
  returned: list_missing
  type: list
  elements: str
tool_payloads:
  description:
    - With O(tool_payloads=true), V(restored) (tool messages whose content was put back; in check mode, exactly
      those that will be), V(bytes) (their bytes), V(sessions) (the session ids they belong to), V(archives) (the
      payload archives read) and V(backups) (the whole-file backups read).
    - Unless O(archive) names the source, V(unmatched) (the tombstones of the chosen sessions left alone, because
      no backup row matches or no archive or backup holds them) and V(unmatched_messages), the first 100 of them with
      V(id), V(session_id) and V(reason) (such as the size the backup's body has and the one the tombstone
      records); V(notes), backups skipped because they fail the checks (only when none was named).
  returned: tool_payloads
  type: dict
msg:
  description: One line saying what was (or would be) done.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hermes_agent.ops.plugins.module_utils._ansible_support import (
    option_spec,
    restore_argument_spec,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.restore.sessions import (
    list_missing,
    restore_selected,
    restore_tool_payloads,
    selection,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError


def main():
    module = AnsibleModule(
        argument_spec=restore_argument_spec(
            archive=dict(type="str"),
            backup=dict(type="str"),
            sessions=dict(type="list", elements="str"),
            active_after=dict(type="str"),
            active_before=dict(type="str"),
            sources=dict(type="list", elements="str"),
            match=dict(type="str"),
            list_missing=dict(type="bool", default=False),
            tool_payloads=dict(type="bool", default=False),
            busy_timeout=option_spec("busy_timeout"),
            batch_pause=option_spec("batch_pause"),
        ),
        mutually_exclusive=[("archive", "backup")],
        supports_check_mode=True,
    )
    p = module.params
    db = os.path.join(p["hermes_home"], "state.db")
    for name in ("busy_timeout", "batch_pause"):
        if p[name] < 0:
            module.fail_json(msg="%s must be >= 0, got %s" % (name, p[name]), db=db)
    if p["list_missing"]:
        given = [
            n for n in ("archive", "backup", "sessions", "active_after", "active_before", "sources", "match") if p[n]
        ]
        if given:
            module.fail_json(
                msg="list_missing lists every backup and archive and restores nothing: leave %s out" % ", ".join(given),
                db=db,
            )
        try:
            result = list_missing(p["hermes_home"], p["profile"], p["backup_dir"], p["busy_timeout"])
        except (MaintenanceError, OSError) as exc:
            module.fail_json(msg="listing the backups of %s: %s" % (db, exc), db=db)
        result["msg"] = describe_listing(result)
        result["listing"] = listing(result["backups"])
        module.exit_json(changed=False, **result)
    if p["tool_payloads"]:
        restore_payloads(module, p, db)
    if not (p["archive"] or p["backup"]):
        module.fail_json(msg="name the archive or the backup to restore from (or list_missing: true)", db=db)
    try:
        select = selection(p["sessions"], p["active_after"], p["active_before"], p["sources"], p["match"])
        result = restore_selected(
            p["hermes_home"], p["profile"], archive=p["archive"], backup=p["backup"], select=select,
            backup_dir=p["backup_dir"], check_mode=module.check_mode,
            busy_timeout=p["busy_timeout"], pause=p["batch_pause"],
        )  # fmt: skip
    except (MaintenanceError, OSError) as exc:
        module.fail_json(msg="restore of sessions into %s: %s" % (db, exc), db=db)
    result.pop("done", None)
    changed = result.pop("changed")
    result["msg"] = describe(result, module.check_mode)
    if module._diff:
        result["diff"] = {
            "before_header": "%s (before)" % result["db"],
            "after_header": "%s (after)" % result["db"],
            "before": lines(result["sessions"], "backup" in result),
            "after": lines(result.get("after") or predicted(result["sessions"]), "backup" in result),
        }
    module.exit_json(changed=changed, **result)


def restore_payloads(module, p, db):
    """tool_payloads=true: the elided tool payloads of the chosen sessions back from the payload archives
    or a whole-file backup."""
    given = [n for n in ("active_after", "active_before", "sources", "match", "list_missing") if p[n]]
    if given:
        module.fail_json(
            msg="tool_payloads restores the tool output of sessions chosen by id only: leave %s out" % ", ".join(given),
            db=db,
        )
    try:
        result = restore_tool_payloads(
            p["hermes_home"], p["profile"], archive=p["archive"], backup=p["backup"], session_ids=p["sessions"],
            backup_dir=p["backup_dir"], check_mode=module.check_mode,
            busy_timeout=p["busy_timeout"], pause=p["batch_pause"],
        )  # fmt: skip
    except (MaintenanceError, OSError) as exc:
        module.fail_json(msg="restore of tool payloads into %s: %s" % (db, exc), db=db)
    done = result.pop("done", None)
    changed = result.pop("changed")
    count = done["restored"] if done else result["planned"]
    nbytes = done["bytes"] if done else result["bytes"]
    payloads = {"restored": count, "bytes": nbytes, "sessions": result["sessions"]}
    payloads.update({k: result[k] for k in ("archives", "backups", "unmatched", "unmatched_messages", "notes")})
    msg = "%s %d tool payload(s), %d bytes, of %d session(s) into %s from %d payload archive(s) and %d backup(s)" % (
        "would restore" if module.check_mode else "restored",
        count,
        nbytes,
        len(result["sessions"]),
        result["db"],
        len(result["archives"]),
        len(result["backups"]),
    )
    if result["unmatched"]:
        left = result["unmatched"]
        msg += "; %d tombstone(s) left alone (no matching backup row: tool_payloads.unmatched_messages)" % left
    module.exit_json(changed=changed, db=result["db"], tool_payloads=payloads, msg=msg)


# Sessions named per day and source in the listing's text (the result names them all).
LISTED_PER_GROUP = 20


def predicted(sessions):
    return [dict(s, present=True, messages_missing=0) for s in sessions]


def lines(sessions, backup=False):
    held = "backed-up" if backup else "archived"
    out = []
    for s in sessions:
        if not s["present"]:
            out.append("%s: absent" % s["id"])
        else:
            out.append(
                "%s: present, %d of %d %s messages"
                % (s["id"], s["messages_archived"] - s["messages_missing"], s["messages_archived"], held)
            )
    return "\n".join(out) + "\n"


def describe(result, check_mode):
    verb = "would restore" if check_mode else "restored"
    source = result.get("archive") or result["backup"]
    there = "chosen were already there, left as they are" if "backup" in result else "asked for were already there"
    text = "%s %d session(s) and %d message(s) from %s into %s; %d of the %d %s%s" % (
        verb,
        result["sessions_restored"],
        result["messages_restored"],
        source["path"],
        result["db"],
        result["sessions_present"],
        len(result["sessions"]) + (result["sessions_present"] if "backup" in result else 0),
        there,
        ", %d without their parent" % result["orphaned"] if result["orphaned"] else "",
    )
    if result.get("sessions_reopened"):
        verb = "would reopen" if check_mode else "reopened"
        text += "; %s %d closed session(s)" % (verb, result["sessions_reopened"])
    return "; ".join([text] + result.get("notes", []))


def listing(files):
    out = []
    for entry in files:
        name = os.path.basename(entry["path"])
        if "error" in entry:
            out.append("%s: refused: %s" % (name, entry["error"]))
            continue
        out.append(
            "%s (%s): %d session(s), %d message(s) that state.db no longer has"
            % (name, entry["kind"], entry["sessions_missing"], entry["messages_missing"])
        )
        for e in entry["missing"]:
            out.append("  %s %s: %d session(s), %d message(s)" % (e["day"], e["source"], e["sessions"], e["messages"]))
            out += session_lines(e.get("ids", []))
    return out


def session_lines(ids):
    """A group's sessions, one line each (id, messages, title), the first LISTED_PER_GROUP of them."""
    out = [
        "    %s (%d message(s))%s" % (s["id"], s["messages"], ": %s" % s["title"] if s.get("title") else "")
        for s in ids[:LISTED_PER_GROUP]
    ]
    if len(ids) > LISTED_PER_GROUP:
        out.append("    ... and %d more (every id is in backups[].missing[].ids)" % (len(ids) - LISTED_PER_GROUP))
    return out


def describe_listing(result):
    files = result["backups"]
    if not files:
        return "no backup or archive of %s in %s" % (result["db"], result["backup_dir"])
    newest = files[0]
    if "error" in newest:
        held = "is refused: %s" % newest["error"]
    else:
        held = "holds %d session(s) (%d messages) that state.db no longer has" % (
            newest["sessions_missing"],
            newest["messages_missing"],
        )
    return "%d backup(s) and archive(s) of %s in %s; the newest, %s, %s" % (
        len(files),
        result["db"],
        result["backup_dir"],
        os.path.basename(newest["path"]),
        held,
    )


if __name__ == "__main__":
    main()
