"""Jobs and intake: deliveries recorded once, reviews enqueued, planned, read and ended."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from bot.model import ChunkPlan, Job, JobId, JobState, PolicyDecision, ReviewRequest
from bot.queue.base import QueueSettings, StorePart
from bot.queue.connector import (
    COMMAND_CHANNEL,
    QUEUE_CHANNEL,
    STATUS_CHANNEL,
    Connector,
    DriverRow,
    to_json,
)
from bot.queue.history import write_history
from bot.queue.levels import JobLevels
from bot.queue.records import NO_FENCE, Fence, SubmitResult, job_from_row
from bot.queue.sql import chunks as chunks_sql
from bot.queue.sql import jobs as jobs_sql

log = logging.getLogger(__name__)


def dedupe_key_for(request: ReviewRequest) -> str:
    """One review per change: forge, repository, number and head sha."""
    return f"{request.forge}:{request.repo}#{request.number}@{request.head_sha}"


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


class JobRecords(StorePart):
    """The life of a job outside its chunks: intake, planning, reading and its end."""

    def __init__(self, connector: Connector, settings: QueueSettings, *, levels: JobLevels) -> None:
        super().__init__(connector, settings)
        self.levels = levels  # a submission or a plan may move a job's level

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
        async with self.connector.transaction() as conn:
            row = (
                await conn.execute(
                    jobs_sql.INSERT_DELIVERY,
                    {
                        "delivery_id": delivery_id,
                        "forge": forge,
                        "event": event,
                        "action": action,
                        "now": now,
                        "outcome": outcome,
                        "detail": to_json(detail) if detail is not None else None,
                        "job_id": job_id,
                    },
                )
            ).first()
            if row is not None and outcome == "command" and self.settings.notify:
                await self.connector.notify(conn, COMMAND_CHANNEL, "command")
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
            "reasons": to_json(list(decision.reasons)),
            "state": JobState.QUEUED.value,
            "dedupe_key": key,
            "now": now,
            "ready_at": now,
            "depends_on": list(depends_on),
            "request": to_json(payload),
            "reason": "; ".join(decision.reasons) or "review requested",
            "actor": actor,
            "detail": to_json({"level": str(decision.level), "rule": decision.rule}),
            "supersede_running": self.settings.supersede_running,
        }
        if not depends_on:
            # The common path is one statement in autocommit: one round trip, one commit.
            row: Row[Any] | DriverRow
            [row] = await self.connector.run_on_driver(jobs_sql.SUBMIT_NEW_JOB, params)
            if (delivery_id is not None and not row.delivery_new) or (
                row.job_id is not None and not row.superseded
            ):
                result = self._submitted(row, decision, JobState.QUEUED)
            else:
                async with self.connector.transaction() as conn:
                    result = await self._after_submit(
                        conn, row, key, decision, [], now=now, delivery_id=delivery_id
                    )
        else:
            async with self.connector.transaction() as conn:
                live_dependencies = (
                    await conn.execute(jobs_sql.SELECT_LIVE_DEPENDENCIES, {"ids": list(depends_on)})
                ).all()
                if live_dependencies:
                    params.update(state=JobState.WAITING.value, ready_at=None)
                row = (await conn.execute(jobs_sql.SUBMIT_NEW_JOB, params)).one()
                result = await self._after_submit(
                    conn, row, key, decision, live_dependencies, now=now, delivery_id=delivery_id
                )
        if result.created:
            # After the commit, not in it (bot/queue/wakeups.py): the planner and the status
            # publisher (a new job's check run is queued) look again.
            self.connector.wake(STATUS_CHANNEL, *((QUEUE_CHANNEL,) if self.settings.notify else ()))
        return result

    @staticmethod
    def _submitted(
        row: Row[Any] | DriverRow, decision: PolicyDecision, state: JobState
    ) -> SubmitResult:
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
        row: Row[Any] | DriverRow,
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
            existing = (
                await conn.execute(jobs_sql.SELECT_JOB_BY_DEDUPE_KEY, {"dedupe_key": key})
            ).one()
            result = await self._reevaluate(conn, job_from_row(existing), decision, now=now)
            if delivery_id is not None:
                await self._link_delivery(conn, delivery_id, "duplicate_change", result.job_id)
            return result
        if row.job_id is None:
            return SubmitResult(job_id=None, created=False, duplicate_delivery=True)
        job_id = JobId(row.job_id)
        for old_id in row.superseded:
            await conn.execute(jobs_sql.RELEASE_DEPENDENTS, {"job_id": old_id, "now": now})
        for dependency in live_dependencies:
            if dependency.level > decision.level:
                await self.levels.change_level(
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
            jobs_sql.UPDATE_DELIVERY_OUTCOME,
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
            changed = await self.levels.change_level(
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
        async with self.connector.transaction() as conn:
            rows = (
                await conn.execute(
                    jobs_sql.CANCEL_LIVE_JOBS,
                    {"forge": forge, "repo": repo, "number": number, "now": now, "reason": reason},
                )
            ).all()
            ids = [row.id for row in rows]
            if ids:
                await conn.execute(chunks_sql.CANCEL_PENDING_CHUNKS, {"job_ids": ids, "now": now})
            for job_id in ids:
                await write_history(
                    conn,
                    job_id=job_id,
                    now=now,
                    kind="state",
                    from_value=None,
                    to_value=JobState.CANCELLED.value,
                    reason=reason,
                    actor=actor,
                )
                await conn.execute(jobs_sql.RELEASE_DEPENDENTS, {"job_id": job_id, "now": now})
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
        async with self.connector.single_statement() as conn:
            rows = (
                await conn.execute(
                    jobs_sql.CLAIM_UNPLANNED_JOBS,
                    {
                        "limit": limit,
                        "now": now,
                        "owner": owner,
                        "until": now + timedelta(seconds=lease_s),
                    },
                )
            ).all()
        jobs = [job_from_row(row) for row in rows]
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
        fence: Fence | None = None,
    ) -> bool:
        """Store a job's chunks (once); a re-evaluated decision replaces the job's reasons
        (a guess such as "size not known yet" goes stale with the diff) and may move its level.

        `details` (skipped files, the diff's shas) is merged into the job's stored request.
        With a `fence`, only while that planning attempt still holds the job's claim.
        """
        ranks = [float(rank)] * len(chunks) if isinstance(rank, int | float) else list(rank)
        plans = [
            {"seq": seq, "rank": ranks[seq], "files": list(plan.files), "lines": plan.lines}
            for seq, plan in enumerate(chunks)
        ]
        marking = {
            "job_id": job_id,
            "chunks_total": len(chunks),
            "total_lines": sum(plan.lines for plan in chunks),
            "files_changed": files_changed,
            "additions": additions,
            "deletions": deletions,
            "details": to_json(dict(details or {})),
            **(fence.params if fence is not None else NO_FENCE),
        }
        # The common path: the job stays at its level, one statement (see the statement).
        planned = await self.connector.run_on_driver(
            jobs_sql.PLAN_JOB_AT_ITS_LEVEL,
            {
                **marking,
                "reasons": to_json(list(decision.reasons)) if decision is not None else None,
                "level": int(decision.level) if decision is not None else None,
                "plans": to_json(plans),
                "now": now,
            },
        )
        if planned:
            if plans and self.settings.notify:
                self.connector.wake(QUEUE_CHANNEL)  # after the commit: the dispatchers
            return True
        # The decision moves the level, or the claim is lost, or the job was planned already:
        # the transaction below tells which.
        async with self.connector.transaction() as conn:
            marked = (await conn.execute(jobs_sql.MARK_JOB_PLANNED, marking)).first()
            if marked is None:
                return False
            if decision is not None:
                job = job_from_row(
                    (await conn.execute(jobs_sql.SELECT_JOB, {"job_id": job_id})).one()
                )
                if list(decision.reasons) != list(job.reasons):
                    await conn.execute(
                        jobs_sql.SET_JOB_REASONS,
                        {"job_id": job_id, "reasons": to_json(list(decision.reasons))},
                    )
                if decision.level != job.base_level and decision.level != job.level:
                    await self.levels.change_level(
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
                    chunks_sql.INSERT_CHUNKS,
                    {"job_id": job_id, "plans": to_json(plans), "now": now},
                )
                await self._notify(conn, "planned")
        return True

    # --- ending ---------------------------------------------------------------------------

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
        fence: Fence | None = None,
    ) -> bool:
        """End a live job; dependents waiting for it become ready. False if it had ended, or
        when `fence` (a planning or posting attempt) no longer holds the job's claim."""
        async with self.connector.transaction() as conn:
            ended = (
                await conn.execute(
                    jobs_sql.FINISH_JOB,
                    {
                        "job_id": job_id,
                        "state": state.value,
                        "now": now,
                        "error": error,
                        "review": to_json(review) if review is not None else None,
                        **(fence.params if fence is not None else NO_FENCE),
                    },
                )
            ).first()
            if ended is None:
                return False
            if state != JobState.DONE:
                await conn.execute(
                    chunks_sql.CANCEL_PENDING_CHUNKS, {"job_ids": [job_id], "now": now}
                )
            await write_history(
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
                await conn.execute(jobs_sql.RELEASE_DEPENDENTS, {"job_id": job_id, "now": now})
            ).all()
            if released:
                await self._notify(conn, "released")
        return True

    async def kill_job(
        self, conn: AsyncConnection, job_id: int, *, now: datetime, error: str, actor: str
    ) -> None:
        """End a job dead in the caller's transaction (its chunk ran out of attempts): its
        unstarted chunks cancelled, its history written, what waited for it released."""
        ended = (
            await conn.execute(
                jobs_sql.FINISH_JOB,
                {
                    "job_id": job_id,
                    "state": JobState.DEAD.value,
                    "now": now,
                    "error": error,
                    "review": None,
                    **NO_FENCE,
                },
            )
        ).first()
        if ended is None:
            return
        await conn.execute(chunks_sql.CANCEL_PENDING_CHUNKS, {"job_ids": [job_id], "now": now})
        await write_history(
            conn,
            job_id=job_id,
            now=now,
            kind="state",
            from_value=None,
            to_value=JobState.DEAD.value,
            reason=f"out of attempts: {error}",
            actor=actor,
        )
        await conn.execute(jobs_sql.RELEASE_DEPENDENTS, {"job_id": job_id, "now": now})
        log.warning(
            "job %s is dead: %s", job_id, error, extra={"action": "job_dead", "job_id": job_id}
        )

    # --- reading --------------------------------------------------------------------------

    async def get_job(self, job_id: int) -> Job | None:
        rows = await self.connector.fetch_all(jobs_sql.SELECT_JOB, {"job_id": job_id})
        return job_from_row(rows[0]) if rows else None

    async def find_job(self, *, forge: str, repo: str, number: int) -> Job | None:
        """The newest job of a PR, live ones first."""
        rows = await self.connector.fetch_all(
            jobs_sql.SELECT_NEWEST_JOB_OF_PULL, {"forge": forge, "repo": repo, "number": number}
        )
        return job_from_row(rows[0]) if rows else None

    async def list_jobs(self, *, state: JobState | None = None, limit: int = 100) -> list[Job]:
        rows = await self.connector.fetch_all(
            jobs_sql.SELECT_JOBS, {"state": state.value if state else None, "limit": limit}
        )
        return [job_from_row(row) for row in rows]

    async def republish_status(self, job_id: int) -> None:
        """Ask the status publisher to write the job's status again (a Re-run), at once."""
        async with self.connector.transaction() as conn:
            await conn.execute(jobs_sql.REQUEST_REPUBLISH, {"job_id": job_id})

    async def queue_position(self, job_id: int) -> int:
        """How many queued jobs are ahead of this one."""
        rows = await self.connector.fetch_all(jobs_sql.SELECT_QUEUE_POSITION, {"job_id": job_id})
        return int(rows[0].ahead) if rows else 0
