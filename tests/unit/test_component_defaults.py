"""A component built without settings behaves as the unconfigured bot: the defaults agree.

Each mapping of bot.components, given the model at its defaults, must give the component's
own defaults, so a default changed in the model and not in the component (or the other way
round) fails here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace

import pytest

from bot import components
from bot.budget.ledger import BudgetSettings
from bot.commands.worker import CommandWorkerSettings
from bot.config import DEFAULTS, Settings, load_settings
from bot.db import SessionTimeouts
from bot.queue.base import QueueSettings
from bot.review.chunking import DEFAULT_LINE_BUDGET
from bot.review.planner import PlanningSettings
from bot.review.poster import PostingSettings
from bot.review.quiet_plan import QuietSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.status.publisher import StatusSettings

# Mapping -> (the mapping applied to the model, the component's defaults). Fields that several
# knobs decide are given as the mapping derives them: they have no one default to agree with.
CASES: dict[str, tuple[Callable[[Settings], object], object]] = {
    "budget_settings": (components.budget_settings, BudgetSettings()),
    "command_worker_settings": (components.command_worker_settings, CommandWorkerSettings()),
    "dispatcher_settings": (
        lambda settings: components.dispatcher_settings(settings, owner="dispatcher"),
        DispatcherSettings(),
    ),
    "planning_settings": (
        # The served model sizes the chunks; planning's defaults are the chunker's.
        lambda settings: components.planning_settings(
            settings,
            line_budget=DEFAULT_LINE_BUDGET,
            context_tokens=settings.review.context_tokens,
            backlog_line_budget=settings.scheduler.backlog_chunk_lines,
        ),
        PlanningSettings(),
    ),
    "posting_settings": (components.posting_settings, PostingSettings()),
    "queue_settings": (
        components.queue_settings,
        # Quiet reviews (the default) let a running review finish; the store alone supersedes it.
        QueueSettings(supersede_running=False),
    ),
    "quiet_settings": (components.quiet_settings, QuietSettings()),
    "session_timeouts": (components.session_timeouts, SessionTimeouts()),
    "status_settings": (
        components.status_settings,
        # Held for the lease every claim runs on, or three passes if those are longer.
        StatusSettings(lease_s=DEFAULTS.scheduler.lease_s),
    ),
}


def comparable(value: object) -> object:
    """`value` with its owner set aside: each process draws its own."""
    if (
        is_dataclass(value)
        and not isinstance(value, type)
        and any(item.name == "owner" for item in fields(value))
    ):
        return replace(value, owner="owner")
    return value


def test_every_mapping_is_checked() -> None:
    mappings = {name for name in components.__all__ if name.endswith(("_settings", "_timeouts"))}
    assert mappings == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_default_model_maps_to_the_components_defaults(name: str) -> None:
    mapping, defaults = CASES[name]
    mapped = mapping(load_settings({}))  # the environment of the process unread
    assert comparable(mapped) == comparable(defaults)
