"""The settings objects each component takes, built from the one settings model (bot.config)."""

from __future__ import annotations

from bot.config import Settings
from bot.db import SessionTimeouts
from bot.queue.base import QueueSettings


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
