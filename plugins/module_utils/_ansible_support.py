# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the modules share: argument specs read from the option table, and the diff they show."""

from __future__ import annotations

from ._hermes.options import BY_NAME, MAINTENANCE, SHARED, options_in


def _spec(option):
    spec = dict(type=option.type)
    if option.elements:
        spec["elements"] = option.elements
    if option.default is not None:
        spec["default"] = list(option.default) if isinstance(option.default, list) else option.default
    if option.choices:
        spec["choices"] = list(option.choices)
    return spec


def shared_argument_spec():
    """Options documented in the ``hermes_agent.ops.hermes`` doc fragment."""
    return {option.name: _spec(option) for option in options_in(SHARED)}


def maintenance_argument_spec():
    """Every option of ``session_maintenance``: the shared ones and its own."""
    spec = shared_argument_spec()
    spec.update((option.name, _spec(option)) for option in options_in(MAINTENANCE))
    return spec


def option_spec(name):
    """The argument spec of one option of the table, so its type and default are written only there."""
    return _spec(BY_NAME[name])


def restore_argument_spec(**own):
    """Where the file to restore into is (the ``hermes_agent.ops.restore`` doc fragment), and a module's own options."""
    spec = dict(
        hermes_home=dict(type="path", required=True),
        profile=dict(type="str", default="default"),
        backup_dir=dict(type="path"),
    )
    spec.update(own)
    return spec


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
