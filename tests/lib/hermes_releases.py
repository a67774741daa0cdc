"""The releases' own prune, run beside ours on the same file, and why the two differ.

Plain Python 3.8+ standard library. ``random_rule_specs`` makes a file's worth of session
specs (for ``hermes_fixtures.build_home``) that mixes every rule the releases and the engine
have: compression lineages, delegates, branches, pins, hidden and archived rows, turn leases,
compression locks, recovery deadlines, messaging and non-messaging sources, sessions Hermes's
orphan sweep closed. ``release_prune`` runs the release's own ``prune_sessions`` on a copy;
``explain`` names the documented rule behind every session pruned by one side only
(docs/architecture.md, "Where we differ from a release's own prune").
"""

import json
import os
import random
import sqlite3
from pathlib import Path

from hermes_fixtures import (
    DEFAULT_ZOMBIE_SOURCES,
    LAYOUT_FEATURES,
    LAYOUTS,
    hermes_python,
    missing_venv_message,
    run_release_code,
)


def hermes_python_for(layout, base):
    """The release's code under an interpreter the Hermes user can run: the venv's python lives
    under /root here, so a wrapper runs the system python3 (same 3.11 ABI) on the venv's packages."""
    # the venv's own Python version (3.11 from pyenv here, Debian 13's 3.13 in the fresh-machine container)
    site = sorted((Path(hermes_python(layout)).parent.parent / "lib").glob("python3*/site-packages"))[0]
    wrapper = Path(base) / "hermes-python"
    wrapper.write_text('#!/bin/sh\nPYTHONPATH=%s exec /usr/bin/python3 "$@"\n' % site)
    wrapper.chmod(0o755)
    return str(wrapper)


def unreachable_packages(layout):
    """The first directory above ``layout``'s packages that others cannot search, or None."""
    site = sorted((Path(hermes_python(layout)).parent.parent / "lib").glob("python3*/site-packages"))[0]
    closed = [str(d) for d in [site, *site.parents] if not os.stat(str(d)).st_mode & 0o001]
    return closed[0] if closed else None


#: Releases whose own prune the engine is checked against.
RULE_RELEASES = LAYOUTS[LAYOUTS.index("hermes-0.19.0") : LAYOUTS.index("hermes-0.22.2.post1") + 1]  # 0.19.0 on
PRUNE_DAYS = 30.0
# Ages in days, far from both cutoffs (1 day for zombies, PRUNE_DAYS for the prune), so the
# seconds between the two runs never move a session across one.
AGES = (0.2, 3.0, 12.0, 45.0, 80.0)
SOURCES = ("cli", "cli", "telegram", "discord", "cron", "api_server")
END_REASONS = ("user_exit", "session_reset", "agent_close", "startup_orphan_reap")

RELEASE_PRUNE = r"""
import inspect, json, sys
from pathlib import Path
import hermes_state
db = hermes_state.SessionDB(db_path=Path(sys.argv[1]))
try:
    kwargs = {}
    if "exclude_active_write_guards" in inspect.signature(db.prune_sessions).parameters:
        kwargs["exclude_active_write_guards"] = True
    count = db.prune_sessions(older_than_days=float(sys.argv[2]), **kwargs)
finally:
    db.close()
print(json.dumps({"count": count, "guards": bool(kwargs)}))
"""


def random_rule_specs(layout, seed, conversations=16):
    """Session specs for one file: ``conversations`` random conversations (parents first)."""
    rng = random.Random("%s-%d" % (layout, seed))
    feats = LAYOUT_FEATURES[layout]
    specs = []
    for i in range(conversations):
        kind = rng.choice(("single", "single", "chain", "branch", "delegate"))
        conv = _conversation(rng, "s%d-c%d" % (seed, i), kind, feats)
        _decorate(rng, conv, feats)
        specs.extend(conv)
    return specs


def _times(rng, started):
    """(last message, ended) ages for a session started ``started`` days ago."""
    last = rng.choice([a for a in AGES if a <= started] + [started])
    ended = last if rng.random() < 0.6 else rng.choice([a for a in AGES if a <= last])
    return last, ended


def _session(rng, sid, started, open_ok=True, **extra):
    last, ended = _times(rng, started)
    spec = {
        "id": sid,
        "source": rng.choice(SOURCES),
        "started_days_ago": started,
        "messages": rng.choice((0, 1, 2, 3)),
        "last_message_days_ago": last,
        "ended_days_ago": None if open_ok and rng.random() < 0.3 else ended,
    }
    if spec["ended_days_ago"] is not None:
        spec["end_reason"] = rng.choice(END_REASONS)
    spec.update(extra)
    return spec


def _conversation(rng, prefix, kind, feats):
    started = rng.choice(AGES[1:])
    if kind == "single":
        return [_session(rng, prefix, started)]
    if kind == "chain":  # root -> ... -> tip, each segment ended with 'compression' but the tip
        chain, parent, begin = [], None, started
        for depth in range(rng.choice((2, 3))):
            last = depth == 2 or rng.random() < 0.4
            spec = _session(rng, "%s-%d" % (prefix, depth), begin, open_ok=last, parent=parent)
            if not last:
                spec["end_reason"] = "compression"
                spec["source"] = chain[0]["source"] if chain else spec["source"]
            chain.append(spec)
            parent, begin = spec["id"], spec["ended_days_ago"] or spec["last_message_days_ago"]
            if last:
                break
        return chain
    root = _session(rng, prefix, started)
    if kind == "branch":
        root.update(ended_days_ago=root["last_message_days_ago"], end_reason="branched")
        return [root, _session(rng, prefix + "-branch", rng.choice(AGES), parent=prefix)]
    if not feats["delegate"]:
        return [root, _session(rng, prefix + "-child", rng.choice(AGES), parent=prefix)]
    kids = [
        _session(rng, "%s-deleg%d" % (prefix, k), rng.choice(AGES), parent=prefix, delegate=True, source="subagent")
        for k in range(rng.choice((1, 2)))
    ]
    return [root] + kids


def _decorate(rng, conv, feats):
    """Pins, flags, one lease per conversation (a turn lease covers the whole lineage)."""
    for spec in conv:
        if feats["pinned"] and rng.random() < 0.12:
            spec["pinned"] = True
        if feats["hidden"] and feats["pinned"] and rng.random() < 0.15:
            spec["hidden"] = True
        if feats["archived"] and feats["pinned"] and rng.random() < 0.15:
            spec["archived"] = True
        if feats["last_activity"] and rng.random() < 0.3:
            spec["last_activity_days_ago"] = rng.choice([a for a in AGES if a <= spec["started_days_ago"]])
        if feats["recovery_deadline"] and rng.random() < 0.15:
            spec["recovery_deadline_days"] = 0.5
        if feats["routing"] and spec["source"] in ("telegram", "discord") and rng.random() < 0.4:
            spec["routing_key"] = "agent:main:%s:dm:%s" % (spec["source"], spec["id"])
    if feats["compression_locks"] and rng.random() < 0.25:
        kinds = ["compression"] + (["turn", "turn"] if feats["turn_leases"] else [])
        rng.choice(conv)["lease"] = rng.choice(kinds)


def release_prune(layout, db_path, days=PRUNE_DAYS):
    """Run the release's own ``prune_sessions`` on ``db_path`` (a copy); return the ids it deleted."""
    py = hermes_python(layout)
    if py is None:
        raise RuntimeError(missing_venv_message(layout))
    before = session_ids(db_path)
    proc = run_release_code(py, RELEASE_PRUNE, db_path, str(days))
    if proc.returncode != 0:
        raise RuntimeError("%s prune_sessions failed:\n%s" % (layout, proc.stderr[-4000:]))
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    pruned = before - session_ids(db_path)
    if out["count"] != len(pruned):
        raise RuntimeError("%s reported %d pruned, %d rows went" % (layout, out["count"], len(pruned)))
    return pruned


def session_ids(db_path):
    conn = sqlite3.connect(str(db_path))
    try:
        return {row[0] for row in conn.execute("SELECT id FROM sessions")}
    finally:
        conn.close()


class Rules:
    """What the generated specs say about each session, for naming a difference's rule."""

    def __init__(self, specs, prune_days=PRUNE_DAYS):
        self.by_id = {s["id"]: s for s in specs}
        self.children = {}
        for s in specs:
            if s.get("parent"):
                self.children.setdefault(s["parent"], []).append(s["id"])
        self.prune_days = prune_days

    def lineage(self, sid):
        """sid and its compression ancestors (one conversation)."""
        out = [sid]
        parent = self.by_id[sid].get("parent")
        while parent and self.by_id[parent].get("end_reason") == "compression":
            out.append(parent)
            parent = self.by_id[parent].get("parent")
        return out

    def pinned(self, sid):
        return any(self.by_id[a].get("pinned") for a in self.lineage(sid))

    def leased(self, sid):
        return any(self.by_id[a].get("lease") for a in self.lineage(sid))

    def active(self, sid):
        """Last activity (messages, last_activity_at, start) within the prune window."""
        s = self.by_id[sid]
        ages = [s["started_days_ago"]]
        if s.get("messages", 2):  # the newest message, as hermes_fixtures places it
            newest = s.get("last_message_days_ago")
            if newest is None:
                newest = s["started_days_ago"] if s.get("ended_days_ago") is None else s["ended_days_ago"]
            ages.append(newest)
        if s.get("last_activity_days_ago") is not None:
            ages.append(s["last_activity_days_ago"])
        return min(ages) < self.prune_days

    def explain_ours_only(self, sid, ours):
        """Why we prune a session the release keeps (None: no documented rule)."""
        s = self.by_id[sid]
        if self.pinned(sid) or self.leased(sid) or s.get("routing_key"):
            return None  # the release protects it: never explained
        zombie_source = s.get("source", "cli") in DEFAULT_ZOMBIE_SOURCES
        if s.get("ended_days_ago") is None and zombie_source and not self.active(sid):
            return "zombie closed first"
        if s.get("delegate") and s.get("parent") in ours:
            return "delegate leaves with its parent"
        return None

    def explain_release_only(self, sid, ours_kept):
        """Why we keep a session the release prunes (None: no documented rule)."""
        s = self.by_id[sid]
        if self.pinned(sid):
            return "pinned (or a continuation of a pinned session)"
        if self.leased(sid):
            return "live lease on its conversation"
        if s.get("routing_key"):
            return "named by the gateway's routing index"
        if self.active(sid):
            return "last activity within the window"
        if s.get("end_reason") == "compression" and any(k in ours_kept for k in self.children.get(sid, ())):
            return "compression ancestor of a continuation that stays"
        if any(self.by_id[k].get("delegate") and k in ours_kept for k in self.children.get(sid, ())):
            return "parent of a delegate that stays"
        if s.get("end_reason") == "startup_orphan_reap" and s["ended_days_ago"] < self.prune_days:
            return "closed by Hermes's orphan sweep within the window"
        return None


def rule_cases(layout):
    """One session for each rule where the releases and the engine part ways (fixed, not random)."""
    feats = LAYOUT_FEATURES[layout]
    old = {"started_days_ago": 80, "ended_days_ago": 60, "last_message_days_ago": 60}
    cases = [
        # Hermes's orphan sweep closed it 3 days ago: 0.22 ages it from the close
        dict(old, id="case-orphan-swept", ended_days_ago=3, end_reason="startup_orphan_reap"),
        # a lease on the root of a lineage covers its continuation (0.20+ key turn leases by the root)
        dict(
            old, id="case-lease-root", end_reason="compression", lease="turn" if feats["turn_leases"] else "compression"
        ),
        dict(old, id="case-lease-cont", parent="case-lease-root", ended_days_ago=45, last_message_days_ago=45),
        # an old compression ancestor of a recent continuation
        dict(old, id="case-chain-root", end_reason="compression"),
        dict(id="case-chain-tip", parent="case-chain-root", started_days_ago=60, ended_days_ago=2),
        # an old open cli session: we close it, then prune it
        {"id": "case-zombie", "started_days_ago": 80, "last_message_days_ago": 70},
        # a messaging session idle as long: never closed, so never pruned
        {"id": "case-telegram-open", "source": "telegram", "started_days_ago": 80, "last_message_days_ago": 70},
    ]
    if feats["delegate"]:
        cases += [
            dict(old, id="case-deleg-parent"),
            {
                "id": "case-deleg-kid",
                "source": "subagent",
                "parent": "case-deleg-parent",
                "delegate": True,
                "started_days_ago": 2,
                "ended_days_ago": 1,
            },
        ]
    if feats["pinned"]:
        cases += [
            dict(old, id="case-pinned-root", end_reason="compression", pinned=True),
            dict(old, id="case-pinned-cont", parent="case-pinned-root", ended_days_ago=45, last_message_days_ago=45),
        ]
    if feats["last_activity"]:
        cases.append(dict(old, id="case-activity", last_activity_days_ago=5))
    if feats["routing"]:  # the chat's routing entry still names this ended session
        cases.append(dict(old, id="case-routed", source="telegram", routing_key="agent:main:telegram:dm:case-routed"))
    return cases
