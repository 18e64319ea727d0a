"""How the store reaches PostgreSQL: transactions, autocommit statements, NOTIFY, its errors.

The store's parts decide what to run (bot/queue/jobs.py, chunks.py, history.py); the connector
only runs it, and translates driver errors into the store's own at this edge.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.engine import Row
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bot.db import translate_database_error
from bot.queue.sql.connection import NOTIFY, PING

QUEUE_CHANNEL = "review_bot_queue"  # wakes the dispatchers
COMMAND_CHANNEL = "review_bot_commands"  # wakes the command worker (bot.commands.worker)
# Wakes the status publisher: a trigger on review_jobs NOTIFYs it on every state change.
STATUS_CHANNEL = "review_bot_status"


@contextmanager
def database_errors() -> Iterator[None]:
    """Translate driver errors at the adapter edge into the store's own errors."""
    try:
        yield
    except (SQLAlchemyError, OSError, ConnectionError) as exc:
        raise translate_database_error(exc) from exc


def to_json(value: Any) -> str:
    """Compact JSON for a jsonb parameter (times and other values as their text)."""
    return json.dumps(value, separators=(",", ":"), default=str)


class Connector:
    """One engine, used two ways: transactions, and single statements in autocommit."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    async def close(self) -> None:
        await self.engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A transaction; connection failures become StoreUnavailable, others StoreError."""
        with database_errors():
            async with self.engine.begin() as conn:
                yield conn

    @asynccontextmanager
    async def single_statement(self) -> AsyncIterator[AsyncConnection]:
        """A connection in autocommit: one statement is one durable transaction, no BEGIN."""
        with database_errors():
            async with self._autocommit.connect() as conn:
                yield conn

    async def fetch_all(self, statement: TextClause, params: Mapping[str, Any]) -> list[Row[Any]]:
        """Every row of one read, in autocommit."""
        async with self.single_statement() as conn:
            return list((await conn.execute(statement, dict(params))).all())

    async def notify(self, conn: AsyncConnection, channel: str, payload: str) -> None:
        """NOTIFY `channel` when `conn`'s transaction commits."""
        await conn.execute(NOTIFY, {"channel": channel, "payload": payload})

    async def ping(self) -> None:
        """Check the database answers; raises StoreUnavailable."""
        async with self.transaction() as conn:
            await conn.execute(PING)
