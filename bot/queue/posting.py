"""Posting a finished review: which jobs wait for it, who holds the claim, when to retry."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal

from bot.model import Job
from bot.queue.base import StorePart
from bot.queue.history import write_history
from bot.queue.records import NO_FENCE, Fence, job_from_row
from bot.queue.sql import posting as posting_sql


class PostingClaims(StorePart):
    """Finished jobs waiting to be posted, claimed by one poster at a time, deferred on failure."""

    async def unposted_jobs(self, *, limit: int = 10, now: datetime | None = None) -> list[Job]:
        """Jobs whose chunks are all done but whose review was not posted (crash recovery).

        With `now`, jobs whose last posting try set a later retry time are left out.
        """
        rows = await self.connector.fetch_all(
            posting_sql.SELECT_UNPOSTED_JOBS, {"limit": limit, "now": now}
        )
        return [job_from_row(row) for row in rows]

    async def claim_posting(
        self, job_id: int, *, owner: str, now: datetime, lease_s: float
    ) -> Fence | None:
        """Claim a running job's posting for `lease_s`, as a new attempt (its fence); None
        while another poster holds it."""
        async with self.connector.single_statement() as conn:
            row = (
                await conn.execute(
                    posting_sql.CLAIM_POSTING,
                    {
                        "job_id": job_id,
                        "owner": owner,
                        "now": now,
                        "until": now + timedelta(seconds=lease_s),
                    },
                )
            ).first()
        return None if row is None else Fence("posting", owner, int(row.posting_attempt))

    async def holds_posting(
        self,
        job_id: int,
        fence: Fence,
        *,
        now: datetime | None = None,
        lease_s: float | None = None,
    ) -> bool:
        """Whether the posting attempt `fence` still holds the job's claim (checked before
        every forge write that follows from it).

        With `now`, a claim that ran out is not held, and a held one is extended by `lease_s`
        from `now`: the write that follows cannot overlap another poster's attempt.
        """
        until = None if now is None or lease_s is None else now + timedelta(seconds=lease_s)
        async with self.connector.single_statement() as conn:
            row = (
                await conn.execute(
                    posting_sql.POSTING_HELD,
                    {
                        "job_id": job_id,
                        "owner": fence.owner,
                        "attempt": fence.attempt,
                        "now": now,
                        "until": until,
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
        async with self.connector.single_statement() as conn:
            rows = (
                await conn.execute(
                    posting_sql.RENEW_POSTING_CLAIMS,
                    {
                        "job_ids": list(job_ids),
                        "owner": owner,
                        "now": now,
                        "until": now + timedelta(seconds=lease_s),
                    },
                )
            ).all()
        return len(rows)

    async def release_posting_claims(self, *, owner: str) -> int:
        """Give up every posting claim `owner` holds (shutdown); returns how many."""
        async with self.connector.single_statement() as conn:
            rows = (await conn.execute(posting_sql.RELEASE_POSTING_CLAIMS, {"owner": owner})).all()
        return len(rows)

    async def release_planning_claims(self, *, owner: str) -> int:
        """Give up every planning claim `owner` holds (shutdown); returns how many."""
        async with self.connector.single_statement() as conn:
            rows = (await conn.execute(posting_sql.RELEASE_PLANNING_CLAIMS, {"owner": owner})).all()
        return len(rows)

    async def defer_job(
        self,
        job_id: int,
        *,
        now: datetime,
        retry_at: datetime,
        error: str,
        kind: Literal["planning", "posting"],
        fence: Fence | None = None,
    ) -> int | None:
        """Count a failed `kind` try (planning, posting) and set its retry time.

        Returns how many `kind` tries failed so far, or None when the job has ended (or the
        attempt `fence` no longer holds the job's claim).
        """
        async with self.connector.transaction() as conn:
            row = (
                await conn.execute(
                    posting_sql.DEFER_JOB,
                    {
                        "job_id": job_id,
                        "error": error[:4000],
                        "retry_at": retry_at,
                        "kind": kind,
                        **(fence.params if fence is not None else NO_FENCE),
                    },
                )
            ).first()
            if row is None:
                return None
            await write_history(
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
