"""A job's level: moved by the policy, people and aging, inherited by what it waits for."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from bot.model import Level
from bot.queue.base import StorePart
from bot.queue.history import write_history
from bot.queue.sql import jobs as jobs_sql


class JobLevels(StorePart):
    """Level changes of live jobs and their unstarted chunks, each written to the history."""

    async def change_level(
        self,
        conn: AsyncConnection,
        *,
        job_id: int,
        level: Level,
        now: datetime,
        reason: str,
        actor: str,
        base: bool = False,
        detail: Mapping[str, Any] | None = None,
    ) -> bool:
        """Move a live job to `level` in the caller's transaction, with its unstarted chunks
        and what it waits for (inheritance), written to its history; False if nothing moved."""
        row = (
            await conn.execute(
                jobs_sql.SET_JOB_LEVEL, {"job_id": job_id, "level": int(level), "now": now}
            )
        ).first()
        if base:
            await conn.execute(jobs_sql.SET_BASE_LEVEL, {"job_id": job_id, "level": int(level)})
        if row is None:
            return False
        await conn.execute(jobs_sql.SET_CHUNK_LEVEL, {"job_id": job_id, "level": int(level)})
        await write_history(
            conn,
            job_id=job_id,
            now=now,
            kind="level",
            from_value=str(Level(row.from_level)),
            to_value=str(level),
            reason=reason,
            actor=actor,
            detail=detail,
        )
        # Inheritance: what this job waits for must not run below it.
        if row.depends_on:
            dependencies = (
                await conn.execute(jobs_sql.SELECT_LIVE_DEPENDENCIES, {"ids": list(row.depends_on)})
            ).all()
            for dependency in dependencies:
                if dependency.level > level:
                    await self.change_level(
                        conn,
                        job_id=dependency.id,
                        level=level,
                        now=now,
                        reason=f"inherits {level} from job {job_id}, which waits for it",
                        actor="scheduler",
                    )
        return True

    async def set_level(
        self,
        job_id: int,
        level: Level,
        *,
        now: datetime,
        reason: str,
        actor: str,
        detail: Mapping[str, Any] | None = None,
    ) -> bool:
        """Move a live job to `level`, recorded in its history; False if nothing changed."""
        async with self.connector.transaction() as conn:
            changed = await self.change_level(
                conn,
                job_id=job_id,
                level=level,
                now=now,
                reason=reason,
                actor=actor,
                detail=detail,
            )
            if changed:
                await self._notify(conn, "level")
        return changed

    async def apply_aging(self, *, now: datetime, interval_s: float) -> int:
        """Raise jobs that waited an aging interval by one level; returns how many rose."""
        async with self.connector.transaction() as conn:
            rows = (
                await conn.execute(
                    jobs_sql.AGE_JOBS,
                    {
                        "now": now,
                        "cutoff": now - timedelta(seconds=interval_s),
                        "reason": f"aging: waited {interval_s:.0f} s without progress",
                    },
                )
            ).all()
        return len(rows)
