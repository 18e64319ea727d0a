"""The settings objects each component takes, built from the one settings model (bot.config).

Every process that runs a role (`bot serve`, the demo, the benchmarks) builds its components'
settings here, so one setting means the same everywhere. (The forges' write budget is mapped in
bot.forges.registry.budget_settings, beside the clients that spend it: bot.forges may not import
the review stages this module builds settings for.)
"""

from __future__ import annotations

from bot.commands.worker import CommandWorkerSettings
from bot.config import Settings
from bot.db import SessionTimeouts
from bot.forges.registry import budget_settings
from bot.queue.base import QueueSettings
from bot.review.planner import PlanningSettings
from bot.review.poster import PostingSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.status.decide import PublishRules
from bot.status.publisher import StatusSettings

# A paused or dead web process's command claims are taken over after the shorter of this and
# the lease every other claim runs on.
COMMAND_CLAIM_MAX_S = 120.0


def queue_settings(settings: Settings) -> QueueSettings:
    """The store's knobs: attempts per chunk, the first pause before a failed chunk's retry."""
    return QueueSettings(
        max_attempts=settings.queue.max_attempts,
        retry_backoff_s=settings.queue.retry_backoff_s,
        # Quiet reviews let a running review finish; the next covers what came after it.
        supersede_running=not settings.review.quiet,
    )


def session_timeouts(settings: Settings) -> SessionTimeouts:
    """The limits every database session of the bot runs under."""
    return SessionTimeouts(
        statement_s=settings.database.statement_timeout_s,
        lock_s=settings.database.lock_timeout_s,
        idle_in_transaction_s=settings.database.idle_in_transaction_timeout_s,
    )


def dispatcher_settings(settings: Settings, *, owner: str) -> DispatcherSettings:
    """The dispatcher's: slots, leases, heartbeats, the MLFQ, the pause after an outage."""
    return DispatcherSettings.from_scheduler(
        settings.scheduler, owner=owner, outage_backoff_s=settings.database.outage_backoff_s
    )


def planning_settings(
    settings: Settings, *, line_budget: int, context_tokens: int
) -> PlanningSettings:
    """Planning's: its claim's lease, and chunks sized to the served model."""
    return PlanningSettings(
        lease_s=settings.scheduler.lease_s,
        line_budget=line_budget,
        context_tokens=context_tokens,
    )


def posting_settings(settings: Settings) -> PostingSettings:
    """Posting's: its claim runs on the lease every other claim runs on."""
    return PostingSettings(lease_s=settings.scheduler.lease_s)


def status_settings(settings: Settings) -> StatusSettings:
    """The check run / commit status publisher's."""
    return StatusSettings(
        neutral_at=settings.status.neutral_at,
        interval_s=settings.status.interval_s,
        rules=PublishRules(updates_per_hour=settings.status.updates_per_hour),
        # Held across passes: a publisher that stops passing (dead, paused) is taken over
        # after a lease, and its writes are fenced from then on.
        lease_s=max(settings.scheduler.lease_s, 3 * settings.status.interval_s),
    )


def command_worker_settings(settings: Settings) -> CommandWorkerSettings:
    """The slash-command worker's."""
    return CommandWorkerSettings(lease_s=min(COMMAND_CLAIM_MAX_S, settings.scheduler.lease_s))


__all__ = [
    "budget_settings",
    "command_worker_settings",
    "dispatcher_settings",
    "planning_settings",
    "posting_settings",
    "queue_settings",
    "session_timeouts",
    "status_settings",
]
