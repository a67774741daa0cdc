# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What both modules share: the common argument spec and the diff they show."""

from __future__ import annotations

from ._hermes_engine import DEFAULTS


def shared_argument_spec():
    """Options documented in the ``hermes_agent.ops.hermes`` doc fragment."""
    return dict(
        hermes_home=dict(type="list", elements="path"),
        profiles=dict(type="list", elements="str"),
        zombie_days=dict(type="float", default=DEFAULTS["zombie_days"]),
        prune_days=dict(type="float", default=DEFAULTS["prune_days"]),
        zombie_sources=dict(type="list", elements="str", default=list(DEFAULTS["zombie_sources"])),
        backup_dir=dict(type="path"),
        busy_timeout=dict(type="float", default=DEFAULTS["busy_timeout"]),
    )


def _figures(profile, side):
    stats = profile.get(side) or {}
    keys = ("sessions", "messages", "open_sessions", "db_bytes", "wal_bytes", "free_pages")
    lines = ["%s: %s" % (key, stats[key]) for key in keys if key in stats]
    return "\n".join(["# %s (%s)" % (profile["name"], profile["path"])] + lines) + "\n"


def diff_of(profiles):
    """One before/after pair per profile, as Ansible's diff callback expects."""
    return [
        {
            "before_header": "%s (before)" % p["path"],
            "after_header": "%s (after)" % p["path"],
            "before": _figures(p, "before"),
            "after": _figures(p, "after"),
        }
        for p in profiles
    ]
