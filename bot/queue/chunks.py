"""Chunks and their leases: the load per level, the dequeue, heartbeats, results, failures."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from bot.errors import LeaseLost
from bot.model import LEVELS, Chunk, ChunkState, JobId, JobState, Level
from bot.queue.base import QueueSettings, StorePart
from bot.queue.connector import Connector, to_json
from bot.queue.history import write_history
from bot.queue.jobs import JobRecords
from bot.queue.records import ChunkOutcome, EngineRunning, Leased, LevelLoad, chunk_from_row
from bot.queue.sql import chunks as chunks_sql
from bot.retry import exponential_delay

log = logging.getLogger(__name__)


class ChunkLeases(StorePart):
    """Chunks leased to workers one at a time; a chunk out of attempts ends its job dead."""

    def __init__(self, connector: Connector, settings: QueueSettings, *, jobs: JobRecords) -> None:
        super().__init__(connector, settings)
        self.jobs = jobs  # a chunk out of attempts ends its job

    async def level_load(
        self,
        *,
        now: datetime,
        new_work_below: float = float("inf"),
        short_work_rank: float = float("inf"),
    ) -> LevelLoad:
        """Running and ready chunks per level, from the database (all processes).

        `new_work_below` and `short_work_rank` are the scheduler's rank bands: chunks ranked
        below the first count as new work, those at or below the second as short work.
        """
        async with self.connector.transaction() as conn:
            rows = (
                await conn.execute(
                    chunks_sql.SELECT_LEVEL_LOAD,
                    {
                        "now": now,
                        "new_work_below": new_work_below,
                        "short_work_rank": short_work_rank,
                    },
                )
            ).all()
        running = dict.fromkeys(LEVELS, 0)
        ready = dict.fromkeys(LEVELS, 0)
        ready_new_work = dict.fromkeys(LEVELS, 0)
        ready_short_work = dict.fromkeys(LEVELS, 0)
        running_long_work = 0
        for row in rows:
            running[Level(row.level)] = row.running
            ready[Level(row.level)] = row.ready
            ready_new_work[Level(row.level)] = row.ready_new_work
            ready_short_work[Level(row.level)] = row.ready_short_work
            running_long_work += row.running_long_work
        return LevelLoad(
            running=running,
            ready=ready,
            ready_new_work=ready_new_work,
            ready_short_work=ready_short_work,
            running_long_work=running_long_work,
        )

    async def engine_load(self) -> dict[str, int]:
        """Chunks running on each engine, from the database (all processes)."""
        return {name: counts.running for name, counts in (await self.engine_running()).items()}

    async def engine_running(self) -> dict[str, EngineRunning]:
        """Chunks running on each engine and the P0 ones among them (all processes)."""
        async with self.connector.single_statement() as conn:
            rows = (await conn.execute(chunks_sql.SELECT_ENGINE_LOAD)).all()
        return {str(row.engine): EngineRunning(int(row.running), int(row.p0)) for row in rows}

    async def fetch_chunk(
        self,
        *,
        levels: Sequence[Level],
        owner: str,
        now: datetime,
        lease_s: float,
        max_rank: float | None = None,
        engine: str | None = None,
    ) -> Leased | None:
        """Lease the next chunk of the first level in `levels` that has one (one statement).

        `max_rank` limits the choice to chunks ranked at most that (short work); `engine`
        names the LLM server the chunk will run on (counted by `engine_load`).
        """
        if not levels:
            return None
        rows = await self.connector.run_on_driver(
            chunks_sql.FETCH_CHUNK,
            {
                "levels": [int(level) for level in levels],
                "owner": owner,
                "now": now,
                "lease_expires_at": now + timedelta(seconds=lease_s),
                "max_rank": float("inf") if max_rank is None else max_rank,
                "engine": engine,
            },
        )
        if not rows:
            return None
        row = rows[0]
        return Leased(
            chunk=chunk_from_row(row),
            first_start=bool(row.first_start),
            extra={"rank": float(row.rank), "engine": row.engine},
        )

    async def move_chunk_engine(self, chunk_id: int, *, owner: str, engine: str | None) -> bool:
        """Name the engine a chunk `owner` holds runs on (None: none yet, it waits for one);
        False when the lease is lost."""
        async with self.connector.single_statement() as conn:
            result = await conn.execute(
                chunks_sql.MOVE_CHUNK_ENGINE,
                {"chunk_id": chunk_id, "owner": owner, "engine": engine},
            )
        return int(result.rowcount) == 1

    async def heartbeat(
        self, chunk_ids: Sequence[int], *, owner: str, now: datetime, lease_s: float
    ) -> int:
        """Extend the leases `owner` holds; returns how many it still holds."""
        if not chunk_ids:
            return 0
        async with self.connector.single_statement() as conn:
            result = await conn.execute(
                chunks_sql.HEARTBEAT,
                {
                    "chunk_ids": list(chunk_ids),
                    "owner": owner,
                    "lease_expires_at": now + timedelta(seconds=lease_s),
                },
            )
        return int(result.rowcount)

    async def finish_chunk(
        self,
        chunk_id: int,
        *,
        owner: str,
        now: datetime,
        gpu_seconds: float,
        result: Mapping[str, Any],
        attempt: int | None = None,
    ) -> ChunkOutcome:
        """Store a chunk's result; raises LeaseLost when `owner` (as lease `attempt`, when
        given) no longer holds it."""
        jobs = await self.connector.run_on_driver(
            chunks_sql.FINISH_CHUNK,
            {
                "chunk_id": chunk_id,
                "owner": owner,
                "now": now,
                "gpu_seconds": gpu_seconds,
                "result": to_json(result),
                "attempt": attempt,
            },
        )
        if not jobs:
            raise LeaseLost(f"chunk {chunk_id} is no longer leased by {owner}")
        job = jobs[0]
        return ChunkOutcome(
            job_id=JobId(job.id),
            job_complete=job.state == JobState.RUNNING and job.chunks_done >= job.chunks_total,
            level=Level(job.level),
            base_level=Level(job.base_level),
            level_gpu_seconds=job.level_gpu_seconds,
        )

    async def fail_chunk(
        self,
        chunk_id: int,
        *,
        owner: str,
        now: datetime,
        error: str,
        retryable: bool = True,
        attempt: int | None = None,
    ) -> ChunkOutcome:
        """Count a failed attempt: retry after a backoff, or end the chunk and its job dead."""
        error = error[:4000]
        async with self.connector.transaction() as conn:
            attempts_row = (
                await conn.execute(
                    chunks_sql.LOCK_LEASED_CHUNK,
                    {"chunk_id": chunk_id, "owner": owner, "attempt": attempt},
                )
            ).first()
            if attempts_row is None:
                raise LeaseLost(f"chunk {chunk_id} is no longer leased by {owner}")
            backoff = exponential_delay(
                attempts_row.attempts,
                base_s=self.settings.retry_backoff_s,
                max_s=self.settings.max_backoff_s,
            )
            row = (
                await conn.execute(
                    chunks_sql.RETRY_CHUNK,
                    {
                        "chunk_id": chunk_id,
                        "owner": owner,
                        "available_at": now + timedelta(seconds=backoff),
                        "error": error,
                        "max_attempts": self.settings.max_attempts,
                        "retryable": retryable,
                        "attempt": attempt,
                    },
                )
            ).first()
            if row is not None:
                await self._notify(conn, "retry")
                return ChunkOutcome(job_id=JobId(row.job_id), retried=True)
            row = (
                await conn.execute(
                    chunks_sql.KILL_CHUNK,
                    {
                        "chunk_id": chunk_id,
                        "owner": owner,
                        "now": now,
                        "error": error,
                        "attempt": attempt,
                    },
                )
            ).one()
            await self.jobs.kill_job(conn, row.job_id, now=now, error=error, actor=owner)
        return ChunkOutcome(job_id=JobId(row.job_id), job_dead=True)

    async def release_chunk(
        self,
        chunk_id: int,
        *,
        owner: str,
        now: datetime,
        reason: str | None = None,
        gpu_seconds: float = 0.0,
        attempt: int | None = None,
    ) -> bool:
        """Give back a chunk this worker holds but will not finish (shutdown, preemption).

        With a `reason` the release goes into the job's history (a preemption); `gpu_seconds`
        the call already used are charged to the chunk and its job (wasted work shows).
        """
        used_s = max(0.0, gpu_seconds)
        async with self.connector.transaction() as conn:
            row = (
                await conn.execute(
                    chunks_sql.RELEASE_CHUNK,
                    {
                        "chunk_id": chunk_id,
                        "owner": owner,
                        "now": now,
                        "used_s": used_s,
                        "attempt": attempt,
                    },
                )
            ).first()
            if row is not None and used_s > 0:
                await conn.execute(
                    chunks_sql.CHARGE_JOB_GPU, {"job_id": row.job_id, "used_s": used_s}
                )
            if row is not None:
                if reason is not None:
                    await write_history(
                        conn,
                        job_id=row.job_id,
                        now=now,
                        kind="state",
                        from_value="chunk running",
                        to_value="chunk queued",
                        reason=reason,
                        actor=owner,
                        detail={"chunk_id": chunk_id, "gpu_seconds": round(used_s, 3)},
                    )
                await self._notify(conn, "released")
        return row is not None

    async def rerank_continuations(self, job_id: int, *, rank: float, now: datetime) -> int:
        """Set the rank of a job's unstarted continuation chunks; returns how many changed."""
        async with self.connector.single_statement() as conn:
            result = await conn.execute(
                chunks_sql.RERANK_CONTINUATIONS, {"job_id": job_id, "rank": rank}
            )
        return int(result.rowcount)

    async def reclaim_expired(self, *, now: datetime) -> int:
        """Requeue chunks whose lease expired; those out of attempts end dead with their job."""
        async with self.connector.transaction() as conn:
            rows = (
                await conn.execute(
                    chunks_sql.RECLAIM_EXPIRED,
                    {"now": now, "max_attempts": self.settings.max_attempts},
                )
            ).all()
            for row in rows:
                if row.state == ChunkState.DEAD:
                    await self.jobs.kill_job(
                        conn,
                        row.job_id,
                        now=now,
                        error="lease expired on every attempt",
                        actor="reclaimer",
                    )
            if rows:
                await self._notify(conn, "reclaimed")
        if rows:
            log.warning("reclaimed %d expired leases", len(rows), extra={"action": "lease_reclaim"})
        return len(rows)

    async def chunk_results(self, job_id: int) -> list[Chunk]:
        rows = await self.connector.fetch_all(chunks_sql.SELECT_CHUNKS, {"job_id": job_id})
        return [chunk_from_row(row) for row in rows]

    async def chunk_lines(self, job_id: int) -> tuple[int, ...]:
        """Changed lines of each of a job's chunks, in order."""
        rows = await self.connector.fetch_all(chunks_sql.SELECT_CHUNK_LINES, {"job_id": job_id})
        return tuple(int(row.lines) for row in rows)
