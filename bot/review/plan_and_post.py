"""The forge side of a dispatcher: plans jobs from their diffs and posts finished reviews.

A job is planned when it arrives (bot/review/planner.py) and posted when its last chunk is
done: in full (bot/review/poster.py) or quietly, new findings and one living summary
(bot/review/quiet_post.py). Posting claims are renewed while a post runs, and what a crash
left unposted is posted again by the recovery pass.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import datetime

from bot.clock import Clock
from bot.errors import StoreError
from bot.forges.base import ForgeClient
from bot.model import JobState
from bot.obs.metrics import Metrics
from bot.outage import OutageWatch
from bot.policy import PolicyBook
from bot.queue.store import QueueStore
from bot.review.narrow import IncrementNarrower
from bot.review.planner import PlanningOutcome, PlanningSettings, claim_and_plan_jobs
from bot.review.poster import PostingOutcome, PostingSettings, post_job_review
from bot.review.quiet_post import QuietPosting, post_quiet_review
from bot.sched.cost import CostEstimate
from bot.sched.ports import Backlogged


class ReviewPipeline:
    """The forge side of a dispatcher: plans jobs from diffs, posts finished reviews."""

    def __init__(
        self,
        store: QueueStore,
        forges: Mapping[str, ForgeClient],
        policy: PolicyBook | None,
        *,
        planning: PlanningSettings | None = None,
        posting: PostingSettings | None = None,
        plan_limit: int = 20,
        metrics: Metrics | None = None,
        quiet: QuietPosting | None = None,
        clock: Clock | None = None,
    ) -> None:
        # Posting claims run out on this clock: a post checks it before each forge write.
        self.clock = clock
        self.metrics = metrics
        self.quiet = quiet
        # Quiet reviews cover what changed since the last reviewed head.
        self.scope_review = IncrementNarrower(quiet.findings, forges) if quiet is not None else None
        self.store = store
        self.forges = forges
        self.policy = policy
        self.planning = planning or PlanningSettings()
        self.posting = posting or PostingSettings()
        self.plan_limit = plan_limit
        self._posting: dict[int, int] = {}  # job id -> posts of it running in this process

    async def plan_jobs(
        self, now: datetime, estimate: CostEstimate, backlogged: Backlogged | None = None
    ) -> list[PlanningOutcome]:
        """Plan pending jobs (the dispatcher's `plan_jobs`); jobs with nothing to review post.

        While work queues beyond the workers (`backlogged`), chunks are cut larger.
        """
        outcomes = await claim_and_plan_jobs(
            self.store,
            self.forges,
            self.policy,
            now=now,
            limit=self.plan_limit,
            estimate=estimate,
            settings=self.planning,
            # Without a backlog budget the answer changes nothing: the load is not read.
            backlogged=backlogged if self.planning.backlog_line_budget is not None else None,
            scope_review=self.scope_review,
            planned=self.quiet.planned if self.quiet is not None else None,
        )
        for outcome in outcomes:
            if outcome.result == "planned" and outcome.chunks == 0 and not outcome.detail:
                await self.job_completed(outcome.job_id, now)
        return outcomes

    async def renew_claims(self, now: datetime) -> int:
        """Extend the posting claims of the jobs being posted now; returns how many."""
        return await self.store.renew_posting_claims(
            list(self._posting), owner=self.posting.owner, now=now, lease_s=self.posting.lease_s
        )

    async def release_claims(self) -> int:
        """Give up this process's planning and posting claims (shutdown): other processes
        plan and post those reviews at once instead of after the claims run out."""
        planning = await self.store.release_planning_claims(owner=self.planning.owner)
        return planning + await self.store.release_posting_claims(owner=self.posting.owner)

    async def job_completed(self, job_id: int, now: datetime) -> None:
        """Post a job whose last chunk finished (the dispatcher's `on_job_complete`)."""
        outcome = await self.post(job_id, now)
        if self.metrics is None:
            return
        job = await self.store.get_job(job_id)
        if job is None:
            return
        if outcome.result in ("failed", "deferred"):
            self.metrics.count_post_failure(job.forge)
        elif job.state == JobState.DONE and job.finished_at is not None:
            ready = job.ready_at or job.enqueued_at
            self.metrics.observe_turnaround(
                job.base_level, (job.finished_at - ready).total_seconds()
            )

    async def post(self, job_id: int, now: datetime) -> PostingOutcome:
        """Post one finished job: quietly (new findings, one living summary) when configured.

        While this runs, `renew_claims` keeps the job's posting claim alive.
        """
        self._posting[job_id] = self._posting.get(job_id, 0) + 1
        try:
            if self.quiet is None:
                return await post_job_review(
                    self.store,
                    self.forges,
                    job_id,
                    now=now,
                    settings=self.posting,
                    clock=self.clock,
                )
            return await post_quiet_review(
                self.store,
                self.quiet,
                self.forges,
                job_id,
                now=now,
                settings=self.posting,
                clock=self.clock,
            )
        finally:
            left = self._posting.pop(job_id) - 1
            if left:
                self._posting[job_id] = left

    async def recover(self, now: datetime, *, limit: int = 20) -> list[PostingOutcome]:
        """Post what a crash left unposted (its poster's claim ran out), and deferred posts
        whose retry time came."""
        return [
            await self.post(job.id, now)
            for job in await self.store.unposted_jobs(limit=limit, now=now)
        ]

    async def run_heartbeat(self, clock: Clock, *, interval_s: float, stop: asyncio.Event) -> None:
        """Renew the posting claims held by this process every `interval_s` until `stop`."""
        outage = OutageWatch("posting heartbeat")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            if stop.is_set() or not self._posting:
                continue
            try:
                await self.renew_claims(clock.now())
            except StoreError as exc:
                outage.lost(exc)  # the claims may run out; others then post, marker-guarded
            else:
                outage.recovered()

    async def run_recovery(
        self,
        clock: Clock,
        *,
        interval_s: float,
        stop: asyncio.Event,
        outage_backoff_s: float = 1.0,
    ) -> None:
        """Call `recover` at once and then every `interval_s` until `stop` is set; while the
        database is away, try again with backoff instead."""
        outage = OutageWatch("recovery", base_s=outage_backoff_s)
        while not stop.is_set():
            wait_s = interval_s
            try:
                await self.recover(clock.now())
            except StoreError as exc:
                wait_s = outage.lost(exc)
            else:
                outage.recovered()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait_s)


__all__ = ["ReviewPipeline"]
