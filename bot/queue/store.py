"""The queue store: one object over PostgreSQL, made of parts split by what they manage.

Jobs and intake (jobs.py), job levels (levels.py), chunks and their leases (chunks.py),
posting claims (posting.py), the history (history.py) and what finished reviews cost
(costs.py) each decide their SQL from their own named statements (bot/queue/sql/: jobs,
chunks, posting, history, costs); the connector (connector.py) runs it; rows become models in
one place (records.py). Slash commands keep their inbox in bot/commands/inbox.py, review
findings theirs in findings.py.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from bot.db import SessionTimeouts, create_engine
from bot.queue.base import QueueSettings
from bot.queue.chunks import ChunkLeases
from bot.queue.connector import COMMAND_CHANNEL, QUEUE_CHANNEL, Connector
from bot.queue.costs import CostRow, JobCost, ReviewCosts
from bot.queue.history import JobHistory
from bot.queue.jobs import dedupe_key_for, request_from_json, request_to_json
from bot.queue.posting import PostingClaims
from bot.queue.records import ChunkOutcome, HistoryEntry, Leased, LevelLoad, SubmitResult


class QueueStore(ChunkLeases, PostingClaims, JobHistory, ReviewCosts):
    """Queue operations; decides what the SQL does, the connector only runs it."""

    def __init__(self, engine: AsyncEngine, *, settings: QueueSettings | None = None) -> None:
        self.engine = engine
        self.connector = Connector(engine)
        self.settings = settings or QueueSettings()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        settings: QueueSettings | None = None,
        pool_size: int = 10,
        application_name: str = "review-bot",
        timeouts: SessionTimeouts | None = None,
    ) -> QueueStore:
        engine = create_engine(
            url, pool_size=pool_size, application_name=application_name, timeouts=timeouts
        )
        return cls(engine, settings=settings)

    async def close(self) -> None:
        await self.connector.close()

    async def ping(self) -> None:
        """Check the database answers; raises StoreUnavailable."""
        await self.connector.ping()


__all__ = [
    "COMMAND_CHANNEL",
    "QUEUE_CHANNEL",
    "ChunkOutcome",
    "CostRow",
    "HistoryEntry",
    "JobCost",
    "Leased",
    "LevelLoad",
    "QueueSettings",
    "QueueStore",
    "SubmitResult",
    "dedupe_key_for",
    "request_from_json",
    "request_to_json",
]
