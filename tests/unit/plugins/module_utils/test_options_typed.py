"""The run's options as the engine holds them: an ``Options`` (frozen, one field per row of the
option table, every one filled by normalize_options), one profile's by ``for_profile``."""

import dataclasses
import os

import pytest

from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.maintain.checked_options import (
    for_profile,
    normalize_options,
)
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.options import OPTIONS, Options, defaults
from ansible_collections.hermes_agent.ops.plugins.module_utils._hermes.sqlite.db import MaintenanceError


def test_options_has_one_field_per_row_of_the_table_in_its_order():
    assert [f.name for f in dataclasses.fields(Options)] == [o.name for o in OPTIONS]


def test_normalize_options_fills_every_field_from_the_table_and_leaves_out_the_rest():
    opts = normalize_options({"prune_days": 30, "batch_size": None, "not_an_option": 1})
    assert isinstance(opts, Options)
    table = defaults()
    assert opts.prune_days == 30
    assert opts.batch_size == table["batch_size"]  # None takes the default
    assert opts.zombie_sources == table["zombie_sources"]
    assert opts.hermes_home == [os.path.join(os.path.expanduser("~"), ".hermes")]
    assert opts.prune_days_by_source == {} and opts.prune_days_by_profile == {} and opts.file_retention == {}
    assert not hasattr(opts, "not_an_option")
    assert normalize_options(None) == normalize_options({})


def test_the_options_cannot_be_changed_after_the_checks():
    opts = normalize_options({"prune_days": 30})
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.prune_days = 0


def test_each_options_list_is_the_runs_own():
    first, second = normalize_options({}), normalize_options({})
    first.zombie_sources.append("telegram")
    assert "telegram" not in second.zombie_sources and "telegram" not in defaults()["zombie_sources"]


def test_for_profile_lays_the_profiles_retention_over_the_runs_and_leaves_the_runs_alone():
    opts = normalize_options(
        {
            "prune_days": 90,
            "prune_days_by_source": {"cron": 7},
            "prune_days_by_profile": {"work": 30, "bot": {"prune_days_by_source": {"telegram": 365}}},
        }
    )
    work, bot = for_profile(opts, "work"), for_profile(opts, "bot")
    assert (work.prune_days, work.prune_days_by_source) == (30.0, {"cron": 7.0})
    assert (bot.prune_days, bot.prune_days_by_source) == (90, {"telegram": 365.0})
    assert for_profile(opts, "other") is opts
    assert (opts.prune_days, opts.prune_days_by_source) == (90, {"cron": 7.0})


def test_a_profiles_retention_is_checked_against_zombie_days_like_the_runs():
    with pytest.raises(MaintenanceError, match=r"prune_days_by_profile\[work\]\.prune_days_by_source\[cron\]"):
        normalize_options({"zombie_days": 2, "prune_days_by_profile": {"work": {"prune_days_by_source": {"cron": 1}}}})
