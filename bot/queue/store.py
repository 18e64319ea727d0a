"""The queue store: every queue operation, as short transactions over PostgreSQL."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.engine import Row
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bot.db import create_engine, translate_database_error
from bot.errors import LeaseLost
from bot.model import (
    LEVELS,
    Chunk,
    ChunkId,
    ChunkPlan,
    ChunkState,
    Job,
    JobId,
    JobState,
    Level,
    PolicyDecision,
    ReviewRequest,
)
from bot.queue import statements as sql

log = logging.getLogger(__name__)

QUEUE_CHANNEL = "review_bot_queue"
COMMAND_CHANNEL = "review_bot_commands"  # wakes the command worker (bot.commands.worker)


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Store-level knobs: attempts, backoff, wake-ups."""

    max_attempts: int = 3
    retry_backoff_s: float = 10.0
    max_backoff_s: float = 600.0
    notify: bool = True
    # A newer head supersedes the older review even while it runs. Quiet reviews turn this
    # off: a running review finishes and the next one covers what came after its head.
    supersede_running: bool = True


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """What `submit_request` did."""

    job_id: JobId | None
    created: bool
    duplicate_delivery: bool = False
    superseded: tuple[JobId, ...] = ()
    level: Level | None = None
    level_changed: bool = False
    state: JobState | None = None


@dataclass(frozen=True, slots=True)
class LevelLoad:
    """Running and ready chunks per level, across every process sharing the database."""

    running: Mapping[Level, int]
    ready: Mapping[Level, int]
    # Rank bands (see level_load): ready first chunks, ready short work, long work running.
    fresh: Mapping[Level, int] = field(default_factory=dict)
    short_ready: Mapping[Level, int] = field(default_factory=dict)
    running_long: int = 0

    @property
    def total_running(self) -> int:
        return sum(self.running.values())


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What finishing or failing a chunk did to its job."""

    job_id: JobId
    job_complete: bool = False
    job_dead: bool = False
    retried: bool = False
    level: Level | None = None
    base_level: Level | None = None
    level_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One line of a job's append-only history."""

    job_id: JobId
    at: datetime
    kind: str
    from_value: str | None
    to_value: str | None
    reason: str
    actor: str
    detail: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Leased:
    """A leased chunk, and whether this lease was its job's first start."""

    chunk: Chunk
    first_start: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


@contextmanager
def _database_errors() -> Iterator[None]:
    """Translate driver errors at the adapter edge into the store's own errors."""
    try:
        yield
    except (SQLAlchemyError, OSError, ConnectionError) as exc:
        raise translate_database_error(exc) from exc


def dedupe_key_for(request: ReviewRequest) -> str:
    """One review per change: forge, repository, number and head sha."""
    return f"{request.forge}:{request.repo}#{request.number}@{request.head_sha}"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _job_from_row(row: Row[Any]) -> Job:
    data = row._mapping
    return Job(
        id=JobId(data["id"]),
        forge=data["forge"],
        repo=data["repo"],
        number=data["number"],
        head_sha=data["head_sha"],
        base_level=Level(data["base_level"]),
        level=Level(data["level"]),
        state=JobState(data["state"]),
        enqueued_at=data["enqueued_at"],
        ready_at=data["ready_at"],
        first_started_at=data["first_started_at"],
        finished_at=data["finished_at"],
        attempts=data["attempts"],
        last_error=data["last_error"],
        reasons=tuple(data["reasons"] or ()),
        title=data["title"],
        author=data["author"],
        base_ref=data["base_ref"],
        head_ref=data["head_ref"],
        base_sha=data["base_sha"],
        total_lines=data["total_lines"],
        chunks_total=data["chunks_total"],
        chunks_done=data["chunks_done"],
        gpu_seconds=data["gpu_seconds"],
        depends_on=tuple(data["depends_on"] or ()),
        planned=data["planned"],
        request=data["request"] or {},
    )


def _chunk_from_row(row: Row[Any]) -> Chunk:
    data = row._mapping
    return Chunk(
        id=ChunkId(data["id"]),
        job_id=JobId(data["job_id"]),
        seq=data["seq"],
        level=Level(data["level"]),
        state=ChunkState(data["state"]),
        files=tuple(data["files"] or ()),
        lines=data["lines"],
        attempts=data["attempts"],
        lease_owner=data["lease_owner"],
        lease_expires_at=data["lease_expires_at"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
        gpu_seconds=data["gpu_seconds"],
        result=data["result"],
        last_error=data["last_error"],
    )


REQUEST_FIELDS = tuple(item.name for item in fields(ReviewRequest))


def request_to_json(request: ReviewRequest) -> dict[str, Any]:
    """The request as stored with its job (the poster and re-evaluation read it back)."""
    # A shallow copy: asdict() deep-copies every field, which shows up in intake profiles.
    data = {name: getattr(request, name) for name in REQUEST_FIELDS}
    data["labels"] = list(request.labels)
    data["depends_on_refs"] = list(request.depends_on_refs)
    return data


def request_from_json(stored: Mapping[str, Any]) -> ReviewRequest | None:
    """The ReviewRequest a job stored (request_to_json's inverse); None when fields are missing."""
    known = {name: value for name, value in stored.items() if name in REQUEST_FIELDS}
    known["labels"] = tuple(known.get("labels") or ())
    known["depends_on_refs"] = tuple(known.get("depends_on_refs") or ())
    try:
        return ReviewRequest(**known)
    except TypeError:
        return None


class QueueStore:
    """Queue operations; decides what the SQL does, the engine only runs it."""

    def __init__(self, engine: AsyncEngine, *, settings: QueueSettings | None = None) -> None:
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.settings = settings or QueueSettings()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        settings: QueueSettings | None = None,
        pool_size: int = 10,
        application_name: str = "review-bot",
    ) -> QueueStore:
        engine = create_engine(url, pool_size=pool_size, application_name=application_name)
        return cls(engine, settings=settings)

    async def close(self) -> None:
        await self.engine.dispose()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        """A transaction; connection failures become StoreUnavailable, others StoreError."""
        with _database_errors():
            async with self.engine.begin() as conn:
                yield conn

    @asynccontextmanager
    async def _single_statement(self) -> AsyncIterator[AsyncConnection]:
        """A connection in autocommit: one statement is one durable transaction, no BEGIN."""
        with _database_errors():
            async with self._autocommit.connect() as conn:
                yield conn

    async def _notify(self, conn: AsyncConnection, payload: str) -> None:
        if self.settings.notify:
            await conn.execute(sql.NOTIFY, {"channel": QUEUE_CHANNEL, "payload": payload})

    @staticmethod
    async def _history(
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
        await conn.execute(
            sql.INSERT_HISTORY,
            {
                "job_id": job_id,
                "now": now,
                "kind": kind,
                "from_value": from_value,
                "to_value": to_value,
                "reason": reason,
                "actor": actor,
                "detail": _json(detail) if detail is not None else None,
            },
        )

    async def ping(self) -> None:
        """Check the database answers; raises StoreUnavailable."""
        from sqlalchemy import text

        async with self._transaction() as conn:
            await conn.execute(text("SELECT 1"))

    # --- intake ---------------------------------------------------------------------------

    async def record_delivery(
        self,
        *,
        delivery_id: str,
        forge: str,
        event: str,
        action: str | None,
        outcome: str,
        now: datetime,
        detail: Mapping[str, Any] | None = None,
        job_id: int | None = None,
    ) -> bool:
        """Record a delivery that creates no job; False when the delivery id was seen before."""
        async with self._transaction() as conn:
            row = (
                await conn.execute(
                    sql.INSERT_DELIVERY,
                    {
                        "delivery_id": delivery_id,
                        "forge": forge,
                        "event": event,
                        "action": action,
                        "now": now,
                        "outcome": outcome,
                        "detail": _json(detail) if detail is not None else None,
                        "job_id": job_id,
                    },
                )
            ).first()
            if row is not None and outcome == "command" and self.settings.notify:
                await conn.execute(sql.NOTIFY, {"channel": COMMAND_CHANNEL, "payload": "command"})
        return row is not None

    async def submit_request(
        self,
        request: ReviewRequest,
        decision: PolicyDecision,
        *,
        now: datetime,
        delivery_id: str | None = None,
        event: str = "",
        depends_on: Sequence[int] = (),
        dedupe_key: str | None = None,
        extra: Mapping[str, Any] | None = None,
        actor: str = "policy",
    ) -> SubmitResult:
        """Enqueue a review idempotently; a newer head sha supersedes older live reviews."""
        key = dedupe_key or dedupe_key_for(request)
        payload = request_to_json(request)
        if extra:
            payload["extra"] = dict(extra)
        params: dict[str, Any] = {
            "delivery_id": delivery_id,
            "event": event or request.event,
            "action": request.action,
            "forge": request.forge,
            "repo": request.repo,
            "number": request.number,
            "project_id": request.project_id,
            "installation_id": request.installation_id,
            "title": request.title,
            "author": request.author,
            "author_is_bot": request.author_is_bot,
            "base_ref": request.base_ref,
            "head_ref": request.head_ref,
            "base_sha": request.base_sha,
            "head_sha": request.head_sha,
            "files_changed": request.files_changed,
            "additions": request.additions,
            "deletions": request.deletions,
            "total_lines": request.changed_lines or 0,
            "level": int(decision.level),
            "reasons": _json(list(decision.reasons)),
            "state": JobState.QUEUED.value,
            "dedupe_key": key,
            "now": now,
            "ready_at": now,
            "depends_on": list(depends_on),
            "request": _json(payload),
            "reason": "; ".join(decision.reasons) or "review requested",
            "actor": actor,
            "detail": _json({"level": str(decision.level), "rule": decision.rule}),
            "channel": QUEUE_CHANNEL,
            "notify": self.settings.notify,
            "supersede_running": self.settings.supersede_running,
        }
        if not depends_on:
            # The common path is one statement in autocommit: one round trip, one commit.
            async with self._single_statement() as conn:
                row = (await conn.execute(sql.SUBMIT_NEW_JOB, params)).one()
            if (delivery_id is not None and not row.delivery_new) or (
                row.job_id is not None and not row.superseded
            ):
                return self._submitted(row, decision, JobState.QUEUED)
            async with self._transaction() as conn:
                return await self._after_submit(
                    conn, row, key, decision, [], now=now, delivery_id=delivery_id
                )
        async with self._transaction() as conn:
            live_dependencies = (
                await conn.execute(sql.SELECT_LIVE_DEPENDENCIES, {"ids": list(depends_on)})
            ).all()
            if live_dependencies:
                params.update(state=JobState.WAITING.value, ready_at=None)
            row = (await conn.execute(sql.SUBMIT_NEW_JOB, params)).one()
            return await self._after_submit(
                conn, row, key, decision, live_dependencies, now=now, delivery_id=delivery_id
            )

    @staticmethod
    def _submitted(row: Row[Any], decision: PolicyDecision, state: JobState) -> SubmitResult:
        if row.job_id is None:
            return SubmitResult(job_id=None, created=False, duplicate_delivery=True)
        return SubmitResult(
            job_id=JobId(row.job_id),
            created=True,
            superseded=tuple(JobId(i) for i in row.superseded),
            level=decision.level,
            state=state,
        )

    async def _after_submit(
        self,
        conn: AsyncConnection,
        row: Row[Any],
        key: str,
        decision: PolicyDecision,
        live_dependencies: Sequence[Row[Any]],
        *,
        now: datetime,
        delivery_id: str | None,
    ) -> SubmitResult:
        """The rarer consequences of a submission: re-evaluation, released and lent levels."""
        if delivery_id is not None and not row.delivery_new:
            return SubmitResult(job_id=None, created=False, duplicate_delivery=True)
        if row.job_id is None:  # the same change arrived before: only its level may move
            existing = (await conn.execute(sql.SELECT_JOB_BY_DEDUPE_KEY, {"dedupe_key": key})).one()
            result = await self._reevaluate(conn, _job_from_row(existing), decision, now=now)
            if delivery_id is not None:
                await self._link_delivery(conn, delivery_id, "duplicate_change", result.job_id)
            return result
        if row.job_id is None:
            return SubmitResult(job_id=None, created=False, duplicate_delivery=True)
        job_id = JobId(row.job_id)
        for old_id in row.superseded:
            await conn.execute(sql.RELEASE_DEPENDENTS, {"job_id": old_id, "now": now})
        for dependency in live_dependencies:
            if dependency.level > decision.level:
                await self._change_level(
                    conn,
                    job_id=dependency.id,
                    level=decision.level,
                    now=now,
                    reason=f"inherits {decision.level} from job {job_id}, which waits for it",
                    actor="scheduler",
                )
        state = JobState.WAITING if live_dependencies else JobState.QUEUED
        return self._submitted(row, decision, state)

    @staticmethod
    async def _link_delivery(
        conn: AsyncConnection, delivery_id: str, outcome: str, job_id: int | None
    ) -> None:
        await conn.execute(
            sql.UPDATE_DELIVERY_OUTCOME,
            {"delivery_id": delivery_id, "outcome": outcome, "job_id": job_id, "detail": None},
        )

    async def _reevaluate(
        self, conn: AsyncConnection, job: Job, decision: PolicyDecision, *, now: datetime
    ) -> SubmitResult:
        """The same change arrived again (label change, redelivery): only the level may move."""
        changed = False
        if job.state in (JobState.WAITING, JobState.QUEUED, JobState.RUNNING) and (
            decision.level != job.base_level
        ):
            changed = await self._change_level(
                conn,
                job_id=job.id,
                level=decision.level,
                now=now,
                reason="policy re-evaluated: " + ("; ".join(decision.reasons) or "rules changed"),
                actor="policy",
                base=True,
            )
        return SubmitResult(
            job_id=job.id,
            created=False,
            level=decision.level if changed else job.level,
            level_changed=changed,
            state=job.state,
        )

    async def cancel_pull(
        self, *, forge: str, repo: str, number: int, now: datetime, reason: str, actor: str
    ) -> list[JobId]:
        """Cancel every live review of one PR; returns the cancelled job ids."""
        async with self._transaction() as conn:
            rows = (
                await conn.execute(
                    sql.CANCEL_LIVE_JOBS,
                    {"forge": forge, "repo": repo, "number": number, "now": now, "reason": reason},
                )
            ).all()
            ids = [row.id for row in rows]
            if ids:
                await conn.execute(sql.CANCEL_PENDING_CHUNKS, {"job_ids": ids, "now": now})
            for job_id in ids:
                await self._history(
                    conn,
                    job_id=job_id,
                    now=now,
                    kind="state",
                    from_value=None,
                    to_value=JobState.CANCELLED.value,
                    reason=reason,
                    actor=actor,
                )
                await conn.execute(sql.RELEASE_DEPENDENTS, {"job_id": job_id, "now": now})
        return [JobId(i) for i in ids]

    # --- planning -------------------------------------------------------------------------

    async def fetch_unplanned_jobs(
        self,
        *,
        now: datetime,
        limit: int = 10,
        owner: str = "planner",
        lease_s: float = 300.0,
    ) -> list[Job]:
        """Claim jobs still waiting for their diff to be fetched and chunked, for `lease_s`.

        Another planner gets them only when the claim ran out (its planner died or was slow;
        storing the plan happens once either way).
        """
        async with self._single_statement() as conn:
            rows = (
                await conn.execute(
                    sql.CLAIM_UNPLANNED_JOBS,
                    {
                        "limit": limit,
                        "now": now,
                        "owner": owner,
                        "until": (now + timedelta(seconds=lease_s)).isoformat(),
                    },
                )
            ).all()
        jobs = [_job_from_row(row) for row in rows]
        jobs.sort(key=lambda job: (job.level, job.enqueued_at, job.id))
        return jobs

    async def plan_job(
        self,
        job_id: int,
        chunks: Sequence[ChunkPlan],
        *,
        now: datetime,
        decision: PolicyDecision | None = None,
        rank: float | Sequence[float] = 0.0,
        files_changed: int | None = None,
        additions: int | None = None,
        deletions: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> bool:
        """Store a job's chunks (once); a re-evaluated decision may move its level.

        `details` (skipped files, the diff's shas) is merged into the job's stored request.
        """
        ranks = [float(rank)] * len(chunks) if isinstance(rank, int | float) else list(rank)
        plans = [
            {"seq": seq, "rank": ranks[seq], "files": list(plan.files), "lines": plan.lines}
            for seq, plan in enumerate(chunks)
        ]
        async with self._transaction() as conn:
            marked = (
                await conn.execute(
                    sql.MARK_JOB_PLANNED,
                    {
                        "job_id": job_id,
                        "chunks_total": len(chunks),
                        "total_lines": sum(plan.lines for plan in chunks),
                        "files_changed": files_changed,
                        "additions": additions,
                        "deletions": deletions,
                        "details": _json(dict(details or {})),
                    },
                )
            ).first()
            if marked is None:
                return False
            if decision is not None:
                job = _job_from_row((await conn.execute(sql.SELECT_JOB, {"job_id": job_id})).one())
                if decision.level != job.base_level and decision.level != job.level:
                    await self._change_level(
                        conn,
                        job_id=job_id,
                        level=decision.level,
                        now=now,
                        reason="size known after fetching the diff: " + "; ".join(decision.reasons),
                        actor="policy",
                        base=True,
                    )
            if plans:
                await conn.execute(
                    sql.INSERT_CHUNKS, {"job_id": job_id, "plans": _json(plans), "now": now}
                )
                await self._notify(conn, "planned")
        return True

    # --- scheduling -----------------------------------------------------------------------

    async def level_load(
        self,
        *,
        now: datetime,
        fresh_below: float = float("inf"),
        short_rank: float = float("inf"),
    ) -> LevelLoad:
        """Running and ready chunks per level, from the database (all processes).

        `fresh_below` and `short_rank` are the scheduler's rank bands: chunks ranked below the
        first count as fresh, those at or below the second as short work.
        """
        async with self._transaction() as conn:
            rows = (
                await conn.execute(
                    sql.SELECT_LEVEL_LOAD,
                    {"now": now, "fresh_below": fresh_below, "short_rank": short_rank},
                )
            ).all()
        running = dict.fromkeys(LEVELS, 0)
        ready = dict.fromkeys(LEVELS, 0)
        fresh = dict.fromkeys(LEVELS, 0)
        short_ready = dict.fromkeys(LEVELS, 0)
        running_long = 0
        for row in rows:
            running[Level(row.level)] = row.running
            ready[Level(row.level)] = row.ready
            fresh[Level(row.level)] = row.fresh
            short_ready[Level(row.level)] = row.short_ready
            running_long += row.running_long
        return LevelLoad(
            running=running,
            ready=ready,
            fresh=fresh,
            short_ready=short_ready,
            running_long=running_long,
        )

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
        async with self._single_statement() as conn:
            row = (
                await conn.execute(
                    sql.FETCH_CHUNK,
                    {
                        "levels": [int(level) for level in levels],
                        "owner": owner,
                        "now": now,
                        "lease_expires_at": now + timedelta(seconds=lease_s),
                        "max_rank": float("inf") if max_rank is None else max_rank,
                        "engine": engine,
                    },
                )
            ).first()
        if row is None:
            return None
        return Leased(
            chunk=_chunk_from_row(row),
            first_start=bool(row.first_start),
            extra={"rank": float(row.rank), "engine": row.engine},
        )

    async def engine_load(self) -> dict[str, int]:
        """Chunks running on each engine, from the database (all processes)."""
        async with self._single_statement() as conn:
            rows = (await conn.execute(sql.SELECT_ENGINE_LOAD)).all()
        return {str(row.engine): int(row.running) for row in rows}

    async def heartbeat(
        self, chunk_ids: Sequence[int], *, owner: str, now: datetime, lease_s: float
    ) -> int:
        """Extend the leases `owner` holds; returns how many it still holds."""
        if not chunk_ids:
            return 0
        async with self._single_statement() as conn:
            result = await conn.execute(
                sql.HEARTBEAT,
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
    ) -> ChunkOutcome:
        """Store a chunk's result; raises LeaseLost when `owner` no longer holds it."""
        async with self._single_statement() as conn:
            job = (
                await conn.execute(
                    sql.FINISH_CHUNK,
                    {
                        "chunk_id": chunk_id,
                        "owner": owner,
                        "now": now,
                        "gpu_seconds": gpu_seconds,
                        "result": _json(result),
                    },
                )
            ).first()
        if job is None:
            raise LeaseLost(f"chunk {chunk_id} is no longer leased by {owner}")
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
    ) -> ChunkOutcome:
        """Count a failed attempt: retry after a backoff, or end the chunk and its job dead."""
        error = error[:4000]
        async with self._transaction() as conn:
            attempts_row = (
                await conn.execute(sql.LOCK_LEASED_CHUNK, {"chunk_id": chunk_id, "owner": owner})
            ).first()
            if attempts_row is None:
                raise LeaseLost(f"chunk {chunk_id} is no longer leased by {owner}")
            backoff = min(
                self.settings.retry_backoff_s * 2 ** max(attempts_row.attempts - 1, 0),
                self.settings.max_backoff_s,
            )
            row = (
                await conn.execute(
                    sql.RETRY_CHUNK,
                    {
                        "chunk_id": chunk_id,
                        "owner": owner,
                        "available_at": now + timedelta(seconds=backoff),
                        "error": error,
                        "max_attempts": self.settings.max_attempts,
                        "retryable": retryable,
                    },
                )
            ).first()
            if row is not None:
                await self._notify(conn, "retry")
                return ChunkOutcome(job_id=JobId(row.job_id), retried=True)
            row = (
                await conn.execute(
                    sql.KILL_CHUNK,
                    {"chunk_id": chunk_id, "owner": owner, "now": now, "error": error},
                )
            ).one()
            await self._kill_job(conn, row.job_id, now=now, error=error, actor=owner)
        return ChunkOutcome(job_id=JobId(row.job_id), job_dead=True)

    async def _kill_job(
        self, conn: AsyncConnection, job_id: int, *, now: datetime, error: str, actor: str
    ) -> None:
        ended = (
            await conn.execute(
                sql.FINISH_JOB,
                {
                    "job_id": job_id,
                    "state": JobState.DEAD.value,
                    "now": now,
                    "error": error,
                    "review": None,
                },
            )
        ).first()
        if ended is None:
            return
        await conn.execute(sql.CANCEL_PENDING_CHUNKS, {"job_ids": [job_id], "now": now})
        await self._history(
            conn,
            job_id=job_id,
            now=now,
            kind="state",
            from_value=None,
            to_value=JobState.DEAD.value,
            reason=f"out of attempts: {error}",
            actor=actor,
        )
        await conn.execute(sql.RELEASE_DEPENDENTS, {"job_id": job_id, "now": now})
        log.warning(
            "job %s is dead: %s", job_id, error, extra={"action": "job_dead", "job_id": job_id}
        )

    async def release_chunk(
        self,
        chunk_id: int,
        *,
        owner: str,
        now: datetime,
        reason: str | None = None,
        gpu_seconds: float = 0.0,
    ) -> bool:
        """Give back a chunk this worker holds but will not finish (shutdown, preemption).

        With a `reason` the release goes into the job's history (a preemption); `gpu_seconds`
        the call already used are charged to the chunk and its job (wasted work shows).
        """
        used_s = max(0.0, gpu_seconds)
        async with self._transaction() as conn:
            row = (
                await conn.execute(
                    sql.RELEASE_CHUNK,
                    {"chunk_id": chunk_id, "owner": owner, "now": now, "used_s": used_s},
                )
            ).first()
            if row is not None and used_s > 0:
                await conn.execute(sql.CHARGE_JOB_GPU, {"job_id": row.job_id, "used_s": used_s})
            if row is not None:
                if reason is not None:
                    await self._history(
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
        async with self._single_statement() as conn:
            result = await conn.execute(sql.RERANK_CONTINUATIONS, {"job_id": job_id, "rank": rank})
        return int(result.rowcount)

    async def reclaim_expired(self, *, now: datetime) -> int:
        """Requeue chunks whose lease expired; those out of attempts end dead with their job."""
        async with self._transaction() as conn:
            rows = (
                await conn.execute(
                    sql.RECLAIM_EXPIRED,
                    {"now": now, "max_attempts": self.settings.max_attempts},
                )
            ).all()
            for row in rows:
                if row.state == ChunkState.DEAD:
                    await self._kill_job(
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

    async def _change_level(
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
        row = (
            await conn.execute(
                sql.SET_JOB_LEVEL, {"job_id": job_id, "level": int(level), "now": now}
            )
        ).first()
        if base:
            await conn.execute(sql.SET_BASE_LEVEL, {"job_id": job_id, "level": int(level)})
        if row is None:
            return False
        await conn.execute(sql.SET_CHUNK_LEVEL, {"job_id": job_id, "level": int(level)})
        await self._history(
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
                await conn.execute(sql.SELECT_LIVE_DEPENDENCIES, {"ids": list(row.depends_on)})
            ).all()
            for dependency in dependencies:
                if dependency.level > level:
                    await self._change_level(
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
        async with self._transaction() as conn:
            changed = await self._change_level(
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
        async with self._transaction() as conn:
            rows = (
                await conn.execute(
                    sql.AGE_JOBS,
                    {
                        "now": now,
                        "cutoff": now - timedelta(seconds=interval_s),
                        "reason": f"aging: waited {interval_s:.0f} s without progress",
                    },
                )
            ).all()
        return len(rows)

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
        async with self._transaction() as conn:
            await self._history(
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

    # --- ending jobs ----------------------------------------------------------------------

    async def finish_job(
        self,
        job_id: int,
        *,
        now: datetime,
        state: JobState = JobState.DONE,
        error: str | None = None,
        review: Mapping[str, Any] | None = None,
        actor: str = "poster",
        reason: str | None = None,
    ) -> bool:
        """End a live job; dependents waiting for it become ready. False if it had ended."""
        async with self._transaction() as conn:
            ended = (
                await conn.execute(
                    sql.FINISH_JOB,
                    {
                        "job_id": job_id,
                        "state": state.value,
                        "now": now,
                        "error": error,
                        "review": _json(review) if review is not None else None,
                    },
                )
            ).first()
            if ended is None:
                return False
            if state != JobState.DONE:
                await conn.execute(sql.CANCEL_PENDING_CHUNKS, {"job_ids": [job_id], "now": now})
            await self._history(
                conn,
                job_id=job_id,
                now=now,
                kind="state",
                from_value=JobState.RUNNING.value,
                to_value=state.value,
                reason=reason or error or "review posted",
                actor=actor,
            )
            released = (
                await conn.execute(sql.RELEASE_DEPENDENTS, {"job_id": job_id, "now": now})
            ).all()
            if released:
                await self._notify(conn, "released")
        return True

    # --- reading --------------------------------------------------------------------------

    async def _fetch_all(self, statement: TextClause, params: Mapping[str, Any]) -> list[Row[Any]]:
        async with self._single_statement() as conn:
            return list((await conn.execute(statement, dict(params))).all())

    async def get_job(self, job_id: int) -> Job | None:
        rows = await self._fetch_all(sql.SELECT_JOB, {"job_id": job_id})
        return _job_from_row(rows[0]) if rows else None

    async def find_job(self, *, forge: str, repo: str, number: int) -> Job | None:
        """The newest job of a PR, live ones first."""
        rows = await self._fetch_all(
            sql.SELECT_NEWEST_JOB_OF_PULL, {"forge": forge, "repo": repo, "number": number}
        )
        return _job_from_row(rows[0]) if rows else None

    async def list_jobs(self, *, state: JobState | None = None, limit: int = 100) -> list[Job]:
        rows = await self._fetch_all(
            sql.SELECT_JOBS, {"state": state.value if state else None, "limit": limit}
        )
        return [_job_from_row(row) for row in rows]

    async def job_history(self, job_id: int) -> list[HistoryEntry]:
        rows = await self._fetch_all(sql.SELECT_HISTORY, {"job_id": job_id})
        return [
            HistoryEntry(
                job_id=JobId(row.job_id),
                at=row.at,
                kind=row.kind,
                from_value=row.from_value,
                to_value=row.to_value,
                reason=row.reason,
                actor=row.actor,
                detail=row.detail,
            )
            for row in rows
        ]

    async def chunk_results(self, job_id: int) -> list[Chunk]:
        rows = await self._fetch_all(sql.SELECT_CHUNKS, {"job_id": job_id})
        return [_chunk_from_row(row) for row in rows]

    async def chunk_lines(self, job_id: int) -> tuple[int, ...]:
        """Changed lines of each of a job's chunks, in order."""
        rows = await self._fetch_all(sql.SELECT_CHUNK_LINES, {"job_id": job_id})
        return tuple(int(row.lines) for row in rows)

    async def unposted_jobs(self, *, limit: int = 10, now: datetime | None = None) -> list[Job]:
        """Jobs whose chunks are all done but whose review was not posted (crash recovery).

        With `now`, jobs whose last posting try set a later retry time are left out.
        """
        rows = await self._fetch_all(sql.SELECT_UNPOSTED_JOBS, {"limit": limit, "now": now})
        return [_job_from_row(row) for row in rows]

    async def claim_posting(
        self, job_id: int, *, owner: str, now: datetime, lease_s: float
    ) -> bool:
        """Claim a running job's posting for `lease_s`; False while another poster holds it."""
        async with self._single_statement() as conn:
            row = (
                await conn.execute(
                    sql.CLAIM_POSTING,
                    {
                        "job_id": job_id,
                        "owner": owner,
                        "now": now,
                        "until": (now + timedelta(seconds=lease_s)).isoformat(),
                    },
                )
            ).first()
        return row is not None

    async def renew_posting_claims(
        self, job_ids: Sequence[int], *, owner: str, now: datetime, lease_s: float
    ) -> int:
        """Extend the posting claims `owner` holds on `job_ids`; returns how many it holds."""
        if not job_ids:
            return 0
        async with self._single_statement() as conn:
            rows = (
                await conn.execute(
                    sql.RENEW_POSTING_CLAIMS,
                    {
                        "job_ids": list(job_ids),
                        "owner": owner,
                        "until": (now + timedelta(seconds=lease_s)).isoformat(),
                    },
                )
            ).all()
        return len(rows)

    async def defer_job(
        self, job_id: int, *, now: datetime, retry_at: datetime, error: str, kind: str
    ) -> int | None:
        """Count a failed `kind` try (planning, posting) and set its retry time.

        Returns how many `kind` tries failed so far, or None when the job has ended.
        """
        async with self._transaction() as conn:
            row = (
                await conn.execute(
                    sql.DEFER_JOB,
                    {
                        "job_id": job_id,
                        "error": error[:4000],
                        "retry_at": retry_at.isoformat(),
                        "counter": f"{kind}_attempts",
                    },
                )
            ).first()
            if row is None:
                return None
            await self._history(
                conn,
                job_id=job_id,
                now=now,
                kind="state",
                from_value=row.state,
                to_value=row.state,
                reason=f"{kind} try {row.tries} failed, next at {retry_at.isoformat()}: {error}",
                actor=kind,
            )
        return int(row.tries)

    async def queue_position(self, job_id: int) -> int:
        """How many queued jobs are ahead of this one."""
        rows = await self._fetch_all(sql.SELECT_QUEUE_POSITION, {"job_id": job_id})
        return int(rows[0].ahead) if rows else 0


__all__ = [
    "COMMAND_CHANNEL",
    "QUEUE_CHANNEL",
    "ChunkOutcome",
    "HistoryEntry",
    "Leased",
    "LevelLoad",
    "QueueSettings",
    "QueueStore",
    "SubmitResult",
    "dedupe_key_for",
    "request_from_json",
    "request_to_json",
]
