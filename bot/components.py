"""The settings objects each component takes, built from the one settings model (bot.config)."""

from __future__ import annotations

from bot.config import Settings
from bot.db import SessionTimeouts
from bot.queue.base import QueueSettings


def queue_settings(settings: Settings) -> QueueSettings:
    """The store's knobs: attempts per chunk, the first pause before a failed chunk's retry."""
    return QueueSettings(
        max_attempts=settings.scheduler.max_attempts,
        retry_backoff_s=settings.scheduler.retry_backoff_s,
        # Quiet reviews let a running review finish; the next covers what came after it.
        supersede_running=not settings.quiet_reviews,
    )


def session_timeouts(settings: Settings) -> SessionTimeouts:
    """The limits every database session of the bot runs under."""
    return SessionTimeouts(
        statement_s=settings.db_statement_timeout_s,
        lock_s=settings.db_lock_timeout_s,
        idle_in_transaction_s=settings.db_idle_in_transaction_timeout_s,
    )
