# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's options: the table's defaults filled in, every value checked, naming the option."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from ..apply.files import check_rules
from ..apply.window import check_window_options
from ..options import OPTIONS, Options, ProfileRetention, check_option, defaults
from ..sqlite.db import MaintenanceError

# Options that need the installed Hermes's interpreter (hermes_python) for one of their values.
NEEDS_HERMES_PYTHON = (("delete_with", "hermes"), ("unknown_schema", "release_rules"))


def normalize_options(options: Mapping[str, Any] | None) -> Options:
    """The run's Options: the table's defaults filled in, every value checked, refusing nonsense
    with a message that names the option. ``options`` is the caller's dict of option name to value
    (None values and names that are no option are left out)."""
    raw = defaults()
    raw.update({k: v for k, v in (options or {}).items() if v is not None})
    raw["hermes_home"] = _homes(raw["hermes_home"])
    for option in OPTIONS:
        problem = check_option(option, raw[option.name])
        if problem:
            raise MaintenanceError(problem)
    for name, value in NEEDS_HERMES_PYTHON:
        if raw[name] == value and not raw["hermes_python"]:
            raise MaintenanceError(
                "%s=%s needs hermes_python: the interpreter of the Hermes installed on the host" % (name, value)
            )
    opts = Options(**{option.name: raw[option.name] for option in OPTIONS})
    problem = check_window_options(opts)
    if problem:
        raise MaintenanceError(problem)
    opts = dataclasses.replace(
        opts,
        prune_days_by_source=_by_source(raw["prune_days_by_source"]),
        prune_days_by_profile=_by_profile(raw["prune_days_by_profile"]),
        file_retention=check_rules(raw["file_retention"]),
    )
    _check_retentions(opts, "")
    for profile in sorted(opts.prune_days_by_profile):
        _check_retentions(for_profile(opts, profile), "prune_days_by_profile[%s]." % profile)
    return opts


def _homes(value: object) -> object:
    """hermes_home as a list: one path given as a string is a list of one; none is ~/.hermes."""
    if not value:
        return [os.path.join(os.path.expanduser("~"), ".hermes")]
    if isinstance(value, str):
        return [value]
    return value


def _check_retentions(opts: Options, prefix: str) -> None:
    retentions = [(prefix + "prune_days", opts.prune_days)]
    retentions += [
        ("%sprune_days_by_source[%s]" % (prefix, k), v) for k, v in sorted(opts.prune_days_by_source.items())
    ]
    for name, days in retentions:
        if float(opts.zombie_days) > float(days):
            raise MaintenanceError(
                "zombie_days (%s) is larger than %s (%s): a zombie would be pruned before it could be closed; "
                "use zombie_days <= %s" % (opts.zombie_days, name, days, name)
            )


def _days_value(name: str, days: object) -> float:
    """A retention in days as a float; anything else is refused, naming the entry."""
    if isinstance(days, bool) or not isinstance(days, (int, float, str)):
        raise MaintenanceError("%s must be a number of days (got %r)" % (name, days))
    try:
        number = float(days)
    except ValueError:
        raise MaintenanceError("%s must be a number of days (got %r)" % (name, days)) from None
    if math.isnan(number) or number < 0:
        raise MaintenanceError("%s must not be negative (got %s)" % (name, days))
    return number


def _by_source(value: object, name: str = "prune_days_by_source") -> dict[str, float]:
    """prune_days_by_source as {source: float days}; anything else is refused, naming the entry."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MaintenanceError("%s must be a mapping of source to days, such as {cron: 3} (got %r)" % (name, value))
    out: dict[str, float] = {}
    for source, days in value.items():
        if not isinstance(source, str) or not source:
            raise MaintenanceError("%s: %r is no session source name" % (name, source))
        out[source] = _days_value("%s[%s]" % (name, source), days)
    return out


def _by_profile(value: object) -> dict[str, ProfileRetention]:
    """prune_days_by_profile as {profile: {"prune_days"?, "prune_days_by_source"?}}, refusing nonsense."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MaintenanceError("prune_days_by_profile must be a mapping of profile name to days (got %r)" % (value,))
    out: dict[str, ProfileRetention] = {}
    for profile, rule in value.items():
        name = "prune_days_by_profile[%s]" % profile
        if not isinstance(profile, str) or not profile:
            raise MaintenanceError("prune_days_by_profile: %r is no profile name" % (profile,))
        if not isinstance(rule, dict):
            rule = {"prune_days": rule}
        unknown = set(rule) - {"prune_days", "prune_days_by_source"}
        if unknown or not rule:
            raise MaintenanceError(
                "%s takes days, or a mapping with prune_days and/or prune_days_by_source (got %r)" % (name, rule)
            )
        out[profile] = {}
        if "prune_days" in rule:
            out[profile]["prune_days"] = _days_value(name + ".prune_days", rule["prune_days"])
        if "prune_days_by_source" in rule:
            out[profile]["prune_days_by_source"] = _by_source(
                rule["prune_days_by_source"], name + ".prune_days_by_source"
            )
    return out


def for_profile(opts: Options, name: str) -> Options:
    """The options one profile runs with: its prune_days_by_profile entry over the run's retention."""
    rule = opts.prune_days_by_profile.get(name)
    if not rule:
        return opts
    return dataclasses.replace(opts, **rule)


def installed_python(opts: Options) -> str:
    """hermes_python, for a step that runs the installed Hermes: normalize_options already refused
    the values that need it without it, so a missing one here is a caller's bug, named."""
    if not opts.hermes_python:
        raise MaintenanceError("hermes_python is needed here: the interpreter of the Hermes installed on the host")
    return opts.hermes_python
