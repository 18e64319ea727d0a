"""How monitoring runs its statements (bot/queue/sql/monitoring.py) over an engine: one read, one
write, alerts in one transaction; driver errors become the store's own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.engine import Row
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.db import translate_database_error
from bot.queue.sql.monitoring import INSERT_ALERT


async def fetch_rows(
    engine: AsyncEngine, statement: TextClause, params: Mapping[str, Any] | None = None
) -> list[Row[Any]]:
    """Run one read; raises StoreUnavailable when the database cannot be reached."""
    try:
        async with engine.connect() as conn:
            result = await conn.execute(statement, dict(params or {}))
            return list(result.all())
    except (SQLAlchemyError, OSError) as exc:
        raise translate_database_error(exc, what="query failed") from exc


async def write_rows(
    engine: AsyncEngine, statement: TextClause, params: Mapping[str, Any]
) -> list[Row[Any]]:
    """Run one write in its own transaction and return its rows; raises StoreUnavailable."""
    try:
        async with engine.begin() as conn:
            result = await conn.execute(statement, dict(params))
            return list(result.all())
    except (SQLAlchemyError, OSError) as exc:
        raise translate_database_error(exc, what="write failed") from exc


async def insert_alerts(engine: AsyncEngine, rows: list[Mapping[str, Any]]) -> set[int]:
    """Record alerts in one transaction; returns the job ids recorded now (not before)."""
    recorded: set[int] = set()
    try:
        async with engine.begin() as conn:
            for row in rows:
                result = await conn.execute(INSERT_ALERT, dict(row))
                recorded.update(int(r.job_id) for r in result.all())
    except (SQLAlchemyError, OSError) as exc:
        raise translate_database_error(exc, what="write failed") from exc
    return recorded
