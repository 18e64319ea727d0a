"""A job's append-only history: state, level and command entries, written and read."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from bot.queue.base import StorePart
from bot.queue.connector import to_json
from bot.queue.records import HistoryEntry, history_from_row
from bot.queue.sql import history as history_sql


async def write_history(
    conn: AsyncConnection,
    *,
    job_id: int,
    now: datetime,
    kind: str,
    from_value: str | None,
    to_value: str | None,
    reason: str,
    actor: str,
    detail: Mapping[str, Any] | None = None,
) -> None:
    """Append one entry to a job's history, in the caller's transaction."""
    await conn.execute(
        history_sql.INSERT_HISTORY,
        {
            "job_id": job_id,
            "now": now,
            "kind": kind,
            "from_value": from_value,
            "to_value": to_value,
            "reason": reason,
            "actor": actor,
            "detail": to_json(detail) if detail is not None else None,
        },
    )


class JobHistory(StorePart):
    """Reading a job's history, and recording what people asked of it."""

    async def job_history(self, job_id: int) -> list[HistoryEntry]:
        """A job's history, oldest first."""
        rows = await self.connector.fetch_all(history_sql.SELECT_HISTORY, {"job_id": job_id})
        return [history_from_row(row) for row in rows]

    async def record_command(
        self,
        job_id: int,
        *,
        now: datetime,
        actor: str,
        command: str,
        outcome: str,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Append a slash command (accepted or refused) to a job's history."""
        async with self.connector.transaction() as conn:
            await write_history(
                conn,
                job_id=job_id,
                now=now,
                kind="command",
                from_value=None,
                to_value=outcome,
                reason=command,
                actor=actor,
                detail=detail,
            )
