# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter ``hermes_agent.ops.variable_problems``: an operator's mistakes in the collection's variables.

The role and the playbooks call it on every ``hermes_maintenance_*``, ``hermes_restore_*``
and ``hermes_gateway_*`` variable visible to the play, before they change anything::

    {{ dict(names | zip(query('ansible.builtin.vars', *names)))
       | hermes_agent.ops.variable_problems(query('ansible.builtin.varnames', '^hermes_')) }}

It returns one message per problem (an empty list when there is none): a name the collection
does not know, with the closest known one (a misspelt ``hermes_maintenance_prune_day`` would
otherwise leave the default retention in place of the one the operator meant), and a value the
scheduled run would refuse, found with the engine's own checks (the option table's bounds and
``normalize_options``), named by its role variable.

The known names are read, not kept here: the role's variables from its
``meta/argument_specs.yml`` and the option table, the playbooks' own from ``PLAYBOOK_VARIABLES``
(a unit test checks that every such name a playbook uses is in it).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Callable

import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import normalize_options
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.options import (
    NUMBER_TYPES,
    OPTIONS,
    ROLE_NONE,
    Option,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError

ROLE_PREFIX = "hermes_maintenance_"
# The name spaces checked: a variable in them that the collection does not know is a mistake.
CHECKED = re.compile(r"^hermes_(maintenance|restore|gateway)_")
# How close (difflib's ratio) a name outside them must be to a known one to count as misspelt.
MISSPELT_SPACE = 0.9
# Engine options whose bare name other roles' variables use too: never taken for a role
# variable written without its prefix (each other option's bare name is).
BARE_NAMES_OF_OTHERS = frozenset({"backup", "backup_dir", "profiles", "batch_size", "busy_timeout", "metrics_dir"})
ARGUMENT_SPECS = os.path.join(
    os.path.dirname(__file__), "..", "..", "roles", "session_maintenance", "meta", "argument_specs.yml"
)

# The playbooks' own variables (not the role's): what each playbook's header documents.
PLAYBOOK_VARIABLES = (
    "hermes_maintenance_hosts",  # maintain.yml, schedule.yml: which hosts (default all)
    "hermes_maintenance_serial",  # maintain.yml: hosts at a time
    "hermes_maintenance_become",  # every playbook: become (default true)
    "hermes_maintenance_optimize_storage",  # maintain.yml: Hermes's optimize-storage in the window
    "hermes_maintenance_optimize_storage_timeout",
    "hermes_maintenance_hermes_cli",  # maintain.yml: the user's Hermes CLI
    "hermes_gateway_service",  # maintain.yml, restore*.yml: the gateway unit(s)
    "hermes_gateway_service_manager",
    "hermes_restore_hosts",  # restore*.yml
    "hermes_restore_confirm",
    "hermes_restore_home",
    "hermes_restore_profile",
    "hermes_restore_backup",
    "hermes_restore_backup_dir",
    "hermes_restore_force",
    "hermes_restore_from",  # restore.yml: local (backup directory) or offsite (the restic repository)
    "hermes_restore_snapshot",
    "hermes_restore_archive",
    "hermes_restore_sessions",
    "hermes_restore_active_after",  # restore_sessions.yml: the selection, and the listing
    "hermes_restore_active_before",
    "hermes_restore_sources",
    "hermes_restore_match",
    "hermes_restore_list",
    "hermes_restore_all",  # restore_sessions.yml: an archive's every session, without a selection
)

_KNOWN: frozenset[str] | None = None
TYPE_WORDS = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "list": "a list",
    "str": "a string",
    "path": "a path",
    "dict": "a mapping",
}


def role_variables() -> set[str]:
    """The role's variables: its argument specs (entry point main) and the option table's."""
    with open(ARGUMENT_SPECS) as handle:
        specs = yaml.safe_load(handle)
    names: set[str] = set(specs["argument_specs"]["main"]["options"])
    names.update(ROLE_PREFIX + o.name for o in OPTIONS if o.role is not ROLE_NONE)
    return names


def known_variables() -> frozenset[str]:
    global _KNOWN
    if _KNOWN is None:
        _KNOWN = frozenset(role_variables() | set(PLAYBOOK_VARIABLES))
    return _KNOWN


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` most likely meant: by the part after its name space
    (``prune_day`` -> ``prune_days``), else, for a misspelt name space, by the whole name."""
    space = CHECKED.match(name)
    if space:
        rest = {k[space.end() :]: k for k in known if k.startswith(space.group(0))}
        close = difflib.get_close_matches(name[space.end() :], sorted(rest), n=1, cutoff=0.6)
        if close:
            return rest[close[0]]
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=MISSPELT_SPACE)
    return close[0] if close else None


def unknown_message(name: str, known: Iterable[str]) -> str:
    close = closest(name, known)
    hint = "did you mean %s?" % close if close else "see roles/session_maintenance/README.md for the variables"
    return "unknown variable %s: %s" % (name, hint)


def unknown(name: str, known: frozenset[str]) -> bool:
    """In the collection's name spaces, any name it does not know; elsewhere (another role's
    hermes_* variable) only one so close to a known name that it is a misspelling."""
    if name in known:
        return False
    return bool(CHECKED.match(name)) or bool(difflib.get_close_matches(name, known, n=1, cutoff=MISSPELT_SPACE))


def _converted(option: Option, value: Any) -> Any:
    """``value`` as the runner's config holds it (the role's template converts the same way)."""
    if option.type == "bool":
        return boolean(value, strict=True)
    if option.type == "list":
        return [value] if isinstance(value, str) else list(value)
    if option.type == "dict":
        if not isinstance(value, dict):
            raise ValueError(value)
        return dict(value)
    if option.type in NUMBER_TYPES:
        if isinstance(value, bool):
            raise ValueError(value)
        number = float(value)
        if option.type == "int" and not number.is_integer():
            raise ValueError(value)
        return int(number) if option.type == "int" else number
    return str(value)


def _role_names(text: str) -> str:
    """The engine's message with each option named by its role variable."""
    names = "|".join(sorted((o.name for o in OPTIONS if o.role is not ROLE_NONE), key=len, reverse=True))
    return re.sub(r"(?<![\w.])(%s)\b" % names, ROLE_PREFIX + r"\1", text)


def value_problems(values: Mapping[str, Any], hermes_python_found: bool = False) -> list[str]:
    """The engine's checks on the role's option variables: what the scheduled run would refuse.

    ``hermes_python_found``: the role takes hermes_python from the Hermes entry points it reads
    later (and fails there if none names one), so unknown_schema=release_rules and delete_with=hermes
    need none here."""
    problems: list[str] = []
    options: dict[str, Any] = {}
    for option in OPTIONS:
        name = ROLE_PREFIX + option.name
        if option.role is ROLE_NONE or values.get(name) in (None, ""):
            continue
        try:
            options[option.name] = _converted(option, values[name])
        except (TypeError, ValueError):
            problems.append("%s must be %s (got %r)" % (name, TYPE_WORDS[option.type], values[name]))
    if hermes_python_found and (
        options.get("unknown_schema") == "release_rules" or options.get("delete_with") == "hermes"
    ):
        options.setdefault("hermes_python", "/")  # a stand-in: the role puts the entry point's there
    if not problems:
        try:
            normalize_options(dict(options, hermes_home=["/"]))
        except (MaintenanceError, TypeError, ValueError) as exc:
            problems.append(_role_names(str(exc)))
    return problems


def bare_option_names(names: Iterable[str]) -> list[str]:
    """Among ``names``, the role's engine options written without their prefix
    (``prune_days`` for ``hermes_maintenance_prune_days``): the role would never read them."""
    options = {o.name for o in OPTIONS if o.role is not ROLE_NONE} - BARE_NAMES_OF_OTHERS
    return sorted(set(names) & options)


def bare_message(name: str) -> str:
    return "%s is not a variable of the role: its variables carry the prefix %s (write %s%s)" % (
        name,
        ROLE_PREFIX,
        ROLE_PREFIX,
        name,
    )


def variable_problems(
    values: dict[str, Any],
    names: Iterable[str] = (),
    check_values: bool = True,
    hermes_python_found: bool = False,
    bare: Iterable[str] = (),
) -> list[str]:
    """Messages for unknown names among ``values`` (name -> value) and ``names`` (every
    hermes_* name, whose values are not needed), for engine options among ``bare`` (names
    without the hermes_ prefix), then for refused values."""
    if not isinstance(values, dict):
        raise AnsibleFilterError("variable_problems expects a dict of variable names and values")
    known = known_variables()
    problems = [unknown_message(n, known) for n in sorted(set(values) | set(names)) if unknown(n, known)]
    problems += [bare_message(n) for n in bare_option_names(bare)]
    if check_values:
        problems += value_problems(values, hermes_python_found)
    return problems


class FilterModule:
    def filters(self) -> dict[str, Callable[..., list[str]]]:
        return {"variable_problems": variable_problems}
