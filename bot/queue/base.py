"""What every part of the store shares: the connector that runs SQL, and the store's knobs."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from bot.config import DEFAULTS
from bot.queue.connector import QUEUE_CHANNEL, Connector


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Store-level knobs: attempts, backoff, wake-ups."""

    max_attempts: int = DEFAULTS.queue.max_attempts
    retry_backoff_s: float = DEFAULTS.queue.retry_backoff_s
    max_backoff_s: float = 600.0
    notify: bool = True
    # A newer head supersedes the older review even while it runs. Quiet reviews turn this
    # off: a running review finishes and the next one covers what came after its head.
    supersede_running: bool = True


class StorePart:
    """A part of the queue store (jobs, chunks, history): decides the SQL, the connector runs it."""

    def __init__(self, connector: Connector, settings: QueueSettings) -> None:
        self.connector = connector
        self.settings = settings

    async def _notify(self, conn: AsyncConnection, payload: str) -> None:
        """Wake the dispatchers when `conn` commits (unless notifications are off)."""
        if self.settings.notify:
            await self.connector.notify(conn, QUEUE_CHANNEL, payload)
