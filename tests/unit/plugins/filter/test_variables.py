# Copyright: contributors to hermes_agent.ops
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filter variable_problems knows every variable the role and the playbooks read, and no more."""

import re
from pathlib import Path

from ansible_collections.hermes_agent.ops.plugins.filter import variables

REPO = Path(__file__).resolve().parents[4]
USED = re.compile(r"\b(hermes_(?:maintenance|restore|gateway)_\w+)")


def test_every_variable_the_playbooks_and_role_read_is_known_and_every_known_one_is_read():
    used = set()
    for path in [
        *REPO.glob("playbooks/**/*.yml"),
        *REPO.glob("roles/session_maintenance/**/*.yml"),
        *REPO.glob("roles/session_maintenance/templates/*.j2"),
    ]:
        used.update(USED.findall(path.read_text()))
    # the config template reads the option table's variables by name: 'hermes_maintenance_' ~ key
    used.update(variables.role_variables())
    known = variables.known_variables()
    assert sorted(used - known) == []
    assert sorted(set(variables.PLAYBOOK_VARIABLES) - used) == []


def test_problems_name_the_variable_and_the_closest_known_one():
    problems = variables.variable_problems(
        {
            "hermes_maintenance_prune_day": 90,
            "hermes_restore_profil": "work",
            "hermes_maintenance_zzz": 1,
            "hermes_other_thing": 1,  # another role's: not the collection's name space
            "hermes_maintainance_prune_days": 30,  # a misspelt name space
            "hermes_maintenance_backup_keep_count": 0,
        }
    )
    assert problems == [
        "unknown variable hermes_maintainance_prune_days: did you mean hermes_maintenance_prune_days?",
        "unknown variable hermes_maintenance_prune_day: did you mean hermes_maintenance_prune_days?",
        "unknown variable hermes_maintenance_zzz: see roles/session_maintenance/README.md for the variables",
        "unknown variable hermes_restore_profil: did you mean hermes_restore_profile?",
        "hermes_maintenance_backup_keep_count must be at least 1 (got 0)",
    ]
    assert variables.variable_problems({"hermes_maintenance_backup": "maybe"}) == [
        "hermes_maintenance_backup must be true or false (got 'maybe')"
    ]
    assert variables.variable_problems({"hermes_maintenance_vacuum_mode": "fast"}) == [
        "hermes_maintenance_vacuum_mode must be one of auto, full, incremental, never (got 'fast')"
    ]
    assert variables.variable_problems({"hermes_maintenance_prune_days": "30", "hermes_maintenance_backup": "no"}) == []


def test_release_rules_without_an_interpreter_is_refused_unless_the_role_finds_one():
    values = {"hermes_maintenance_unknown_schema": "release_rules"}
    problems = variables.variable_problems(values)
    assert len(problems) == 1 and "hermes_maintenance_hermes_python" in problems[0], problems
    # the role reads it from the Hermes entry points later (and fails there if none names one)
    assert variables.variable_problems(values, hermes_python_found=True) == []
    assert variables.variable_problems(dict(values, hermes_maintenance_hermes_python="/usr/bin/python3")) == []


def test_the_role_refuses_a_bad_mapping_at_apply_naming_the_variable():
    """prune_days_by_source at apply time (tests/unit/plugins/module_utils runs without the
    controller under ansible-test units, so the role's filter is tested here)."""
    value_problems = variables.value_problems
    name = "hermes_maintenance_prune_days_by_source"
    assert value_problems({name: {"cron": 3, "telegram": 365}}) == []
    assert value_problems({name: "cron=3"}) == ["%s must be a mapping (got 'cron=3')" % name]
    assert value_problems({name: {"cron": -1}}) == ["%s[cron] must not be negative (got -1)" % name]
    assert value_problems({name: {"cron": 0.5}, "hermes_maintenance_zombie_days": 1}) == [
        "hermes_maintenance_zombie_days (1.0) is larger than %s[cron] (0.5): a zombie would be pruned before it "
        "could be closed; use hermes_maintenance_zombie_days <= %s[cron]" % (name, name)
    ]


def test_the_role_refuses_bad_file_and_profile_retention_at_apply_naming_the_variable():
    value_problems = variables.value_problems
    files = "hermes_maintenance_file_retention"
    assert value_problems({files: {"state_snapshots": {"keep": 5}, "malformed_backup": {"days": 30}}}) == []
    (problem,) = value_problems({files: {"retired_wal": {"days": 30}}})
    assert problem.startswith("%s[retired_wal]: a retired WAL generation is reported, never removed" % files), problem
    (problem,) = value_problems({files: {"state_snapshots": {"keep": 0}}})
    assert problem.startswith("%s[state_snapshots].keep must be a whole number of at least 1" % files), problem
    profiles = "hermes_maintenance_prune_days_by_profile"
    assert value_problems({profiles: {"work": 30, "personal": {"prune_days_by_source": {"cron": 3}}}}) == []
    (problem,) = value_problems({profiles: {"work": "a month"}})
    assert problem.startswith("%s[work].prune_days must be a number of days" % profiles), problem


def test_an_engine_option_without_its_prefix_names_the_variable_meant():
    bare = ["prune_days", "zombie_days", "ansible_facts", "backup", "metrics_dir", "batch_size", "inventory_hostname"]
    assert variables.variable_problems({}, bare=bare, check_values=False) == [
        "prune_days is not a variable of the role: its variables carry the prefix hermes_maintenance_"
        " (write hermes_maintenance_prune_days)",
        "zombie_days is not a variable of the role: its variables carry the prefix hermes_maintenance_"
        " (write hermes_maintenance_zombie_days)",
    ]
    # names other roles use too are theirs; every other bare option name is flagged
    flagged = variables.bare_option_names(["hermes_home", *(o.name for o in variables.OPTIONS)])
    assert "hermes_home" not in flagged and not set(flagged) & variables.BARE_NAMES_OF_OTHERS
    assert {"prune_days", "vacuum_mode", "allow_empty_homes", "file_retention"} <= set(flagged)
