"""The settings objects each component takes, built from the one settings model (bot.config).

Every process that runs a role (`bot serve`, the demo, the benchmarks) builds its components'
settings here, the forges' write budget included, so one setting means the same everywhere.
Where a component's field is a knob, its default is the model's (bot.config.DEFAULTS), so a
component built without settings behaves as an unconfigured bot would.
"""

from __future__ import annotations

from dataclasses import replace

from bot.budget.ledger import (
    GITHUB_LIMITS,
    GITLAB_LIMITS,
    BudgetSettings,
    LocalWriteBudget,
    Now,
    Sleep,
)
from bot.commands.worker import CommandWorkerSettings
from bot.config import Settings
from bot.db import SessionTimeouts
from bot.queue.base import QueueSettings
from bot.queue.store import QueueStore
from bot.review.planner import PlanningSettings
from bot.review.poster import PostingSettings
from bot.review.quiet_plan import QuietSettings
from bot.review.quiet_post import QuietPosting
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
    settings: Settings,
    *,
    line_budget: int,
    context_tokens: int,
    backlog_line_budget: int | None = None,
) -> PlanningSettings:
    """Planning's: its claim's lease, and chunks sized to the served model."""
    return PlanningSettings(
        lease_s=settings.scheduler.lease_s,
        line_budget=line_budget,
        backlog_line_budget=backlog_line_budget,
        context_tokens=context_tokens,
    )


def posting_settings(settings: Settings) -> PostingSettings:
    """Posting's: its claim runs on the lease every other claim runs on."""
    return PostingSettings(lease_s=settings.scheduler.lease_s)


def status_settings(settings: Settings) -> StatusSettings:
    """The check run / commit status publisher's."""
    return StatusSettings(
        enabled=settings.status.enabled,
        neutral_at=settings.status.neutral_at,
        interval_s=settings.status.interval_s,
        rules=PublishRules(updates_per_hour=settings.status.updates_per_hour),
        # Held across passes: a publisher that stops passing (dead, paused) is taken over
        # after a lease, and its writes are fenced from then on.
        lease_s=max(settings.scheduler.lease_s, 3 * settings.status.interval_s),
    )


def command_worker_settings(settings: Settings) -> CommandWorkerSettings:
    """The slash-command worker's: its claims' lease, the slots its ETA counts until the
    status publisher keeps a model, its pause after the database is lost."""
    return CommandWorkerSettings(
        lease_s=min(COMMAND_CLAIM_MAX_S, settings.scheduler.lease_s),
        workers=settings.scheduler.workers,
        outage_backoff_s=settings.database.outage_backoff_s,
    )


def quiet_settings(settings: Settings) -> QuietSettings:
    """How loud a quiet review may be, before a repository's settings file says otherwise."""
    return QuietSettings(
        min_inline_severity=settings.review.min_inline_severity,
        inline_cap=settings.review.inline_cap,
    )


def quiet_posting(settings: Settings, store: QueueStore) -> QuietPosting | None:
    """Quiet posting as the settings configure it (None: every push reviewed in full)."""
    if not settings.review.quiet:
        return None
    return QuietPosting(store.findings, quiet_settings(settings))


def budget_settings(
    settings: Settings, *, post_interval_s: float = GITHUB_LIMITS.min_interval_s
) -> BudgetSettings:
    """The forges' write budget: limits per forge, from the settings.

    `post_interval_s` spaces GitHub's content-creating requests (GitHub asks for a second;
    tests and benchmarks against the emulator post at once).
    """
    return BudgetSettings(
        limits={
            "github": replace(
                GITHUB_LIMITS,
                per_minute=settings.budget.github_writes_per_minute,
                per_hour=settings.budget.github_writes_per_hour,
                min_interval_s=post_interval_s * settings.budget.window_scale,
                time_scale=settings.budget.window_scale,
                margin_s=GITHUB_LIMITS.margin_s * settings.budget.window_scale,
            ),
            "gitlab": replace(
                GITLAB_LIMITS,
                per_minute=settings.budget.gitlab_writes_per_minute,
                per_hour=settings.budget.gitlab_writes_per_hour,
                time_scale=settings.budget.window_scale,
                margin_s=GITLAB_LIMITS.margin_s * settings.budget.window_scale,
            ),
        }
    )


def local_write_budget(
    settings: Settings,
    *,
    now: Now,
    sleep: Sleep,
    post_interval_s: float = GITHUB_LIMITS.min_interval_s,
) -> LocalWriteBudget:
    """A write budget this process keeps alone (no database), with the settings' limits.

    `now` and `sleep` are the forge clients' clock, so the budget's minute is theirs.
    """
    return LocalWriteBudget(
        now=now, sleep=sleep, settings=budget_settings(settings, post_interval_s=post_interval_s)
    )


__all__ = [
    "budget_settings",
    "command_worker_settings",
    "dispatcher_settings",
    "local_write_budget",
    "planning_settings",
    "posting_settings",
    "queue_settings",
    "quiet_posting",
    "quiet_settings",
    "session_timeouts",
    "status_settings",
]
