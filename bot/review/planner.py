"""Plan review jobs: fetch the diff from the forge, chunk it, re-evaluate the policy, store it."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from bot.config import DEFAULTS
from bot.errors import ForgeError, ForgeNotFound
from bot.forges.base import ForgeClient, PullChanges
from bot.model import (
    DEFAULT_CONTEXT_TOKENS,
    ChunkPlan,
    Job,
    JobState,
    Level,
    PolicyDecision,
    ReviewRequest,
)
from bot.policy import PolicyBook, evaluate
from bot.queue.records import Fence
from bot.queue.store import QueueStore, request_from_json
from bot.review.assemble import classify_skipped_file
from bot.review.chunking import DEFAULT_FIRST_BUDGET, DEFAULT_LINE_BUDGET, plan_chunks
from bot.review.context_fetch import read_sources, with_contexts
from bot.review.deferral import RetryBudget, defer_or_fail
from bot.review.narrow import ReviewScope
from bot.review.planned_diffs import PlannedDiffs
from bot.sched.cost import CostEstimate, ReviewFeatures, chunk_file_lines
from bot.sched.mlfq import SchedulingPolicy, queue_ranks, rank_chunks
from bot.sched.ports import Backlogged

log = logging.getLogger(__name__)

PlanningResult = Literal["planned", "deferred", "cancelled", "failed"]
# Narrows a fetched diff to what the review covers (quiet reviews: the increment).
ScopeReview = Callable[[Job, PullChanges, datetime], Awaitable[ReviewScope]]
# A line budget no review reaches: the whole change in one call.
ONE_CALL_BUDGET = 1_000_000_000


@dataclass(frozen=True, slots=True)
class PlanningSettings:
    """Chunk sizes, how chunks are ranked, and how planning retries a forge that fails."""

    line_budget: int = DEFAULT_LINE_BUDGET
    first_budget: int | None = DEFAULT_FIRST_BUDGET
    # Continuations' budget while work queues beyond the workers (bot.sched.backlog); None:
    # `line_budget` always.
    backlog_line_budget: int | None = DEFAULTS.scheduler.backlog_chunk_lines or None
    # Whether work queues beyond the workers now (set per planning pass by `for_backlog`).
    backlogged: bool = False
    # mlfq: chunks ranked by the job's expected remaining work. Without time slicing (fifo and
    # priority) a review is one call and the queue keeps arrival order (rank 0, then the id).
    time_slicing: bool = True
    max_attempts: int = 5
    backoff_s: float = 15.0
    max_backoff_s: float = 900.0
    # Planning claims a job for this long (the lease): a planner that dies loses it after.
    lease_s: float = DEFAULTS.scheduler.lease_s
    # Prompt tokens each chunk keeps for the title, description and code context; 0 reads no
    # file for context.
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    owner: str = field(default_factory=lambda: f"planner-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    @classmethod
    def for_policy(
        cls, policy: SchedulingPolicy, base: PlanningSettings | None = None
    ) -> PlanningSettings:
        """The planning a scheduling policy needs: chunks for mlfq, one call per review else."""
        settings = base or cls()
        if policy == "mlfq":
            return replace(settings, time_slicing=True)
        return replace(
            settings,
            line_budget=ONE_CALL_BUDGET,
            first_budget=None,
            backlog_line_budget=None,
            time_slicing=False,
        )

    def for_backlog(self, backlogged: bool) -> PlanningSettings:
        """These settings for a planning pass that finds work queued (or not)."""
        return replace(self, backlogged=backlogged)

    def line_budget_for(self, level: Level) -> int:
        """The continuations' budget of a review at `level`.

        While work queues, larger chunks save calls' overhead for everyone but a hotfix: a P0
        review's chunks run side by side on the slots kept for it, so shorter ones end it
        sooner (docs/benchmarks.md, "Chunk size").
        """
        if not self.backlogged or self.backlog_line_budget is None or level == Level.P0:
            return self.line_budget
        return max(self.line_budget, self.backlog_line_budget)


@dataclass(frozen=True, slots=True)
class ReviewPlan:
    """A job's chunks and ranks, what it skips and why, and the policy's second look."""

    chunks: tuple[ChunkPlan, ...]
    ranks: tuple[float, ...]
    skipped: tuple[Mapping[str, Any], ...]
    decision: PolicyDecision | None
    files_changed: int
    additions: int
    deletions: int
    diff: Mapping[str, Any]
    # The review's expected work beyond the calls' overhead that ranked it (None: not ranked).
    expected_work_s: float | None = None

    @property
    def details(self) -> dict[str, Any]:
        """What the job's stored request keeps of the plan (the poster reads it back)."""
        return {"skipped": [dict(item) for item in self.skipped], "diff": dict(self.diff)}


@dataclass(frozen=True, slots=True)
class PlanningOutcome:
    """What planning did to one job."""

    job_id: int
    result: PlanningResult
    chunks: int = 0
    skipped: int = 0
    detail: str = ""
    # A planned job's chunk sizes and `rank_chunks` ranks (the dispatcher re-ranks from them).
    chunk_lines: tuple[int, ...] = ()
    ranks: tuple[float, ...] = ()
    expected_work_s: float | None = None


def request_of(job: Job) -> ReviewRequest | None:
    """The job's stored ReviewRequest, or None when the job carries no usable request."""
    return request_from_json(job.pull_details)


def reevaluate(
    book: PolicyBook | None,
    job: Job,
    *,
    files_changed: int,
    additions: int,
    deletions: int,
) -> PolicyDecision | None:
    """The policy's decision with the sizes the diff showed (GitLab hooks carry none)."""
    if book is None:
        return None
    request = request_of(job)
    if request is None:
        return None
    sized = replace(request, files_changed=files_changed, additions=additions, deletions=deletions)
    return evaluate(book.policy_for(job.repo), sized)


def build_review_plan(
    job: Job,
    changes: PullChanges,
    book: PolicyBook | None,
    *,
    settings: PlanningSettings | None = None,
    estimate: CostEstimate | None = None,
) -> ReviewPlan:
    """Chunk a fetched diff, list skipped files with reasons, rank the chunks (pure).

    Ranks are `rank_chunks` ranks (each chunk's expected remaining work, from the review's
    cost as `estimate` predicts it); what the queue stores is `queue_ranks` of them, so a
    job's continuations share one rank.
    """
    settings = settings or PlanningSettings()
    result = plan_chunks(
        changes.files,
        line_budget=settings.line_budget_for(job.level),
        first_budget=settings.first_budget,
        skip=classify_skipped_file,
    )
    skipped: list[Mapping[str, Any]] = [
        {"path": item.path, "reason": item.reason, "lines": item.lines} for item in result.skipped
    ]
    if changes.truncated:
        listed = len(changes.files)
        total = changes.total_files if changes.total_files is not None else f"more than {listed}"
        skipped.append(
            {"path": f"({total} files; {listed} listed)", "reason": "over_limit", "lines": 0}
        )
    additions = sum(change.additions for change in changes.files)
    deletions = sum(change.deletions for change in changes.files)
    files_changed = changes.total_files or len(changes.files)
    lines = [chunk.lines for chunk in result.chunks]
    expected_work_s: float | None = None
    if settings.time_slicing:
        estimate = estimate or CostEstimate()
        features = ReviewFeatures.of(
            forge=job.forge,
            repo=job.repo,
            number=job.number,
            files=chunk_file_lines(chunk.files for chunk in result.chunks),
        )
        expected_work_s = estimate.predict(features, chunks=len(lines)).work_s
        ranks = rank_chunks(lines, estimator=estimate.fallback, expected_work_s=expected_work_s)
    else:
        ranks = (0.0,) * len(lines)
    return ReviewPlan(
        chunks=result.chunks,
        ranks=ranks,
        skipped=tuple(skipped),
        decision=reevaluate(
            book, job, files_changed=files_changed, additions=additions, deletions=deletions
        ),
        files_changed=files_changed,
        additions=additions,
        deletions=deletions,
        diff={
            "base_sha": changes.base_sha,
            "start_sha": changes.start_sha,
            "head_sha": changes.head_sha,
            "truncated": changes.truncated,
            "total_files": changes.total_files,
        },
        expected_work_s=expected_work_s,
    )


async def plan_one_job(
    store: QueueStore,
    forges: Mapping[str, ForgeClient],
    book: PolicyBook | None,
    job: Job,
    *,
    now: datetime,
    estimate: CostEstimate | None = None,
    settings: PlanningSettings | None = None,
    scope_review: ScopeReview | None = None,
    planned: PlannedDiffs | None = None,
) -> PlanningOutcome:
    """Plan one job; forge errors end it (404: cancelled) or defer it with a bounded backoff.

    Every write lands only while this planner's claim on the job (its attempt) still holds: a
    planner that resumes after its claim was taken over writes nothing.
    """
    settings = settings or PlanningSettings()
    context = {"job_id": job.id, "forge": job.forge}
    fence = Fence("planning", settings.owner, job.planning_attempt)
    client = forges.get(job.forge)
    if client is None:
        error = f"no {job.forge} client is configured (set its URL and token)"
        await store.finish_job(
            job.id, now=now, state=JobState.FAILED, error=error, actor="planner", fence=fence
        )
        log.error("job %s: %s", job.id, error, extra={"action": "plan_failed", **context})
        return PlanningOutcome(job.id, "failed", detail=error)
    try:
        changes = await client.fetch_changes(
            job.repo,
            job.number,
            project_id=job.pull_details.get("project_id"),
            installation_id=job.pull_details.get("installation_id"),
        )
        scope = await scope_review(job, changes, now) if scope_review is not None else None
        fetched = changes  # the whole pull request's diff (the scope may narrow `changes`)
    except ForgeNotFound as exc:
        reason = f"the change is gone on {job.forge}: {exc}"
        await store.finish_job(
            job.id, now=now, state=JobState.CANCELLED, error=reason, actor="planner", fence=fence
        )
        log.warning(
            "job %s cancelled: %s", job.id, reason, extra={"action": "plan_gone", **context}
        )
        return PlanningOutcome(job.id, "cancelled", detail=reason)
    except ForgeError as exc:
        return await _defer_or_fail(store, job, exc, now=now, settings=settings, fence=fence)
    if scope is not None and scope.wait_for is not None:
        detail = f"plans after review {scope.wait_for} of the same pull request"
        return PlanningOutcome(job.id, "deferred", detail=detail)
    if scope is not None and scope.cancel is not None:
        await store.finish_job(
            job.id,
            now=now,
            state=JobState.CANCELLED,
            error=scope.cancel,
            actor="planner",
            fence=fence,
        )
        return PlanningOutcome(job.id, "cancelled", detail=scope.cancel)
    if scope is not None:
        changes = scope.changes
    try:
        plan = build_review_plan(job, changes, book, settings=settings, estimate=estimate)
    except ValueError as exc:
        error = f"the diff cannot be chunked: {exc}"
        await store.finish_job(
            job.id, now=now, state=JobState.FAILED, error=error, actor="planner", fence=fence
        )
        log.error("job %s: %s", job.id, error, extra={"action": "plan_failed", **context})
        return PlanningOutcome(job.id, "failed", detail=error)
    if plan.decision is not None and not plan.decision.review:
        reason = "policy, with the diff's size known: " + "; ".join(plan.decision.reasons)
        await store.finish_job(
            job.id, now=now, state=JobState.CANCELLED, error=reason, actor="policy", fence=fence
        )
        return PlanningOutcome(job.id, "cancelled", detail=reason)
    details = plan.details
    if changes.title is not None:
        details["title"] = changes.title
    if changes.description is not None:
        details["description"] = changes.description
    if settings.context_tokens > 0 and plan.chunks:
        # The prompt shows the title and description the job will hold once `details` is
        # merged into its request (bot/review/prompt_context.shared_context_for).
        shown = {**job.pull_details, **details}
        reads = await read_sources(
            client,
            job,
            changes,
            plan.chunks,
            title=str(shown.get("title") or job.title or ""),
            description=str(shown.get("description") or ""),
            budget_tokens=settings.context_tokens,
        )
        plan = replace(plan, chunks=with_contexts(plan.chunks, reads.sources))
        details["context_reads"] = {
            "requested": reads.requested,
            "read": len(reads.sources),
            "failed": reads.failed,
            "skipped": reads.skipped,
        }
    if scope is not None:
        details = {**details, **scope.details}
        if scope.level_note and plan.decision is not None:
            reasons = (*plan.decision.reasons, scope.level_note)
            plan = replace(plan, decision=replace(plan.decision, reasons=reasons))
    stored = await store.plan_job(
        job.id,
        plan.chunks,
        now=now,
        decision=plan.decision,
        rank=queue_ranks(plan.ranks),
        files_changed=plan.files_changed,
        additions=plan.additions,
        deletions=plan.deletions,
        details=details,
        fence=fence,
    )
    if not stored:
        log.warning(
            "job %s (planning attempt %s): lease lost, dropping result",
            job.id,
            fence.attempt,
            extra={"action": "lease_lost", **context},
        )
        return PlanningOutcome(job.id, "planned", detail="planned already by another process")
    if planned is not None:
        planned.keep(job.id, fetched)
    log.info(
        "job %s planned: %d chunks, %d files skipped",
        job.id,
        len(plan.chunks),
        len(plan.skipped),
        extra={"action": "job_planned", **context},
    )
    return PlanningOutcome(
        job.id,
        "planned",
        chunks=len(plan.chunks),
        skipped=len(plan.skipped),
        chunk_lines=tuple(chunk.lines for chunk in plan.chunks),
        ranks=plan.ranks,
        expected_work_s=plan.expected_work_s,
    )


async def _defer_or_fail(
    store: QueueStore,
    job: Job,
    error: ForgeError,
    *,
    now: datetime,
    settings: PlanningSettings,
    fence: Fence,
) -> PlanningOutcome:
    result, detail = await defer_or_fail(
        store,
        job,
        error,
        now=now,
        stage="planning",
        message=f"fetching the diff failed: {error}",
        budget=RetryBudget(settings.max_attempts, settings.backoff_s, settings.max_backoff_s),
        fence=fence,
    )
    return PlanningOutcome(job.id, result, detail=detail)


async def claim_and_plan_jobs(
    store: QueueStore,
    forges: Mapping[str, ForgeClient],
    policy: PolicyBook | None,
    *,
    now: datetime,
    limit: int = 10,
    estimate: CostEstimate | None = None,
    settings: PlanningSettings | None = None,
    scope_review: ScopeReview | None = None,
    planned: PlannedDiffs | None = None,
    backlogged: Backlogged | None = None,
) -> list[PlanningOutcome]:
    """Claim and plan up to `limit` unplanned jobs (their retry time reached); returns what
    happened. `backlogged`, asked once jobs were claimed, says whether work queues beyond the
    workers (chunks are cut larger then)."""
    settings = settings or PlanningSettings()
    jobs = await store.fetch_unplanned_jobs(
        now=now, limit=limit, owner=settings.owner, lease_s=settings.lease_s
    )
    if jobs and backlogged is not None:
        settings = settings.for_backlog(await backlogged())
    return [
        await plan_one_job(
            store,
            forges,
            policy,
            job,
            now=now,
            estimate=estimate,
            settings=settings,
            scope_review=scope_review,
            planned=planned,
        )
        for job in jobs
    ]


def summarize_outcomes(outcomes: Sequence[PlanningOutcome]) -> dict[str, int]:
    """How many jobs ended in each planning result."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.result] = counts.get(outcome.result, 0) + 1
    return counts


__all__ = [
    "ONE_CALL_BUDGET",
    "PlanningOutcome",
    "PlanningSettings",
    "ReviewPlan",
    "build_review_plan",
    "claim_and_plan_jobs",
    "plan_one_job",
    "reevaluate",
    "request_of",
    "summarize_outcomes",
]
