"""Post a finished job's review once: assemble, look for what a crash left posted, post, finish."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from bot.budget.intent import WriteIntent, writing
from bot.clock import Clock
from bot.config import DEFAULTS
from bot.errors import ForgeError, ForgeNotFound, LeaseLost
from bot.forges.base import (
    ForgeClient,
    PostedReview,
    ReviewToPost,
    append_marker,
    guarded_writes,
    render_marker,
)
from bot.model import TERMINAL_JOB_STATES, Chunk, Job, JobState
from bot.queue.records import Fence
from bot.queue.store import QueueStore
from bot.review.anchor import index_files
from bot.review.assemble import AssembledReview, StoredChunk, assemble_review, stored_chunk
from bot.review.comments import inline_comment, review_diff
from bot.review.deferral import RetryBudget, defer_or_fail
from bot.review.parse import parse_review

log = logging.getLogger(__name__)

PostingResult = Literal[
    "posted", "already_posted", "deferred", "cancelled", "failed", "skipped", "lease_lost"
]
SEVERITY_LABEL: Mapping[str, str] = {
    "critical": "Critical",
    "major": "Major",
    "minor": "Minor",
    "info": "Note",
}


@dataclass(frozen=True, slots=True)
class PostingSettings:
    """How many inline comments at most, and how posting retries a failing forge."""

    max_comments: int = 50
    max_attempts: int = 5
    backoff_s: float = 30.0
    max_backoff_s: float = 1800.0
    # A poster claims a job for this long (the lease; its heartbeat renews it), so a
    # completion and a recovery pass never race, and a dead poster's job is taken over after.
    lease_s: float = DEFAULTS.scheduler.lease_s
    owner: str = field(default_factory=lambda: f"poster-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@dataclass(frozen=True, slots=True)
class PostingOutcome:
    """What posting did for one job."""

    job_id: int
    result: PostingResult
    review_id: int | None = None
    detail: str = ""


def lease_lost(job_id: int, fence: Fence, *, forge: str) -> PostingOutcome:
    """Log that another poster took the job over (this attempt's result is dropped)."""
    log.warning(
        "job %s (posting attempt %s): lease lost, dropping result",
        job_id,
        fence.attempt,
        extra={"action": "lease_lost", "job_id": job_id, "forge": forge},
    )
    return PostingOutcome(job_id, "lease_lost", detail="another poster took the job over")


def review_chunk_of(chunk: Chunk) -> StoredChunk:
    """A stored chunk for the assembler; a raw model answer is checked against the diff here."""
    result = chunk.result
    if result and "status" not in result and isinstance(result.get("text"), str):
        parsed = parse_review(str(result["text"]), index_files(chunk.files))
        result = {
            "status": "ok" if parsed.ok else "unparsable",
            "findings": [finding.to_dict() for finding in parsed.findings],
            "summary": parsed.summary,
            "dropped": parsed.dropped,
            "error": parsed.error,
            "anchoring": dict(parsed.anchoring),
        }
        chunk = Chunk(
            id=chunk.id,
            job_id=chunk.job_id,
            seq=chunk.seq,
            level=chunk.level,
            state=chunk.state,
            files=chunk.files,
            lines=chunk.lines,
            attempts=chunk.attempts,
            result=result,
        )
    return stored_chunk(chunk)


def render_comment(severity: str, body: str) -> str:
    """An inline comment's markdown: the severity, then the finding."""
    return f"**{SEVERITY_LABEL.get(severity, severity.title())}:** {body}"


def build_review(
    job: Job, chunks: Sequence[Chunk], *, max_comments: int = 50
) -> tuple[ReviewToPost, AssembledReview]:
    """The review to post for a job from its chunk results, marker included (pure)."""
    assembled = assemble_review(
        [review_chunk_of(chunk) for chunk in chunks],
        skipped=list(job.pull_details.get("skipped") or ()),
        max_comments=max_comments,
    )
    diff: Mapping[str, Any] = job.pull_details.get("diff") or {}
    diff_of = review_diff(file for chunk in chunks for file in chunk.files)
    head_sha = str(diff.get("head_sha") or job.head_sha)
    body = f"{assembled.summary}\n\n<sub>review-bot, commit {head_sha[:12]}</sub>"
    review = ReviewToPost(
        job_id=job.id,
        body=append_marker(body, job.id),
        comments=tuple(
            inline_comment(finding, diff_of, body=render_comment(finding.severity, finding.body))
            for finding in assembled.findings
        ),
        head_sha=head_sha,
        base_sha=str(diff["base_sha"]) if diff.get("base_sha") else None,
        start_sha=str(diff["start_sha"]) if diff.get("start_sha") else None,
    )
    return review, assembled


def review_record(posted: PostedReview, assembled: AssembledReview | None) -> dict[str, Any]:
    """What the job row keeps of the posted review."""
    record: dict[str, Any] = {
        "forge_review_id": posted.id,
        "url": posted.url,
        "inline_posted": posted.inline_posted,
        "inline_rejected": posted.inline_rejected,
        "summary_only": posted.summary_only,
        "already_posted": posted.already_posted,
    }
    if assembled is not None:
        record.update(
            findings=len(assembled.findings),
            counts=dict(assembled.counts),
            complete=assembled.complete,
            skipped=len(assembled.skipped),
            summary=assembled.summary,
            anchoring=dict(assembled.anchoring),
        )
    return record


@dataclass(frozen=True, slots=True)
class PostingClaim:
    """A finished job this poster holds the posting claim of, with the forge client to use."""

    job: Job
    client: ForgeClient
    fence: Fence


def posting_guard(
    store: QueueStore, job_id: int, fence: Fence, *, settings: PostingSettings, clock: Clock | None
) -> Callable[[], Awaitable[bool]]:
    """The check made right before each forge write of a post: this attempt still holds the
    claim and (on `clock`) the claim has not run out; each check extends it by a lease."""

    async def held() -> bool:
        now = None if clock is None else clock.now()
        return await store.holds_posting(job_id, fence, now=now, lease_s=settings.lease_s)

    return held


async def claim_finished_job(
    store: QueueStore,
    forges: Mapping[str, ForgeClient],
    job_id: int,
    *,
    now: datetime,
    settings: PostingSettings,
    can_post: Callable[[ForgeClient], bool] = lambda client: True,
) -> PostingClaim | PostingOutcome:
    """What both posters do first: a live job whose chunks all finished, a configured client
    that `can_post` (else the job fails: no client will ever come), and the posting claim;
    otherwise the outcome that says why not."""
    job = await store.get_job(job_id)
    if job is None:
        return PostingOutcome(job_id, "skipped", detail="no such job")
    if job.state in TERMINAL_JOB_STATES:
        return PostingOutcome(job_id, "skipped", detail=f"job is {job.state}: not posted")
    if not job.planned or job.chunks_done < job.chunks_total:
        return PostingOutcome(job_id, "skipped", detail="chunks are still running")
    client = forges.get(job.forge)
    if client is None or not can_post(client):
        error = f"no {job.forge} client is configured: the review cannot be posted"
        await store.finish_job(job.id, now=now, state=JobState.FAILED, error=error)
        return PostingOutcome(job_id, "failed", detail=error)
    fence = await store.claim_posting(
        job.id, owner=settings.owner, now=now, lease_s=settings.lease_s
    )
    if fence is None:
        return PostingOutcome(job_id, "skipped", detail="another poster is posting this review")
    return PostingClaim(job, client, fence)


async def posting_failed(
    store: QueueStore,
    claim: PostingClaim,
    error: LeaseLost | ForgeError,
    *,
    now: datetime,
    settings: PostingSettings,
) -> PostingOutcome:
    """What both posters do when a post fails: a lost claim leaves the job to its new holder,
    a change gone from the forge cancels the job, another forge error defers or fails it."""
    job, fence = claim.job, claim.fence
    if isinstance(error, LeaseLost):
        return lease_lost(job.id, fence, forge=job.forge)
    if isinstance(error, ForgeNotFound):
        reason = f"the change is gone on {job.forge}: {error}"
        await store.finish_job(job.id, now=now, state=JobState.CANCELLED, error=reason, fence=fence)
        log.warning(
            "job %s cancelled: %s",
            job.id,
            reason,
            extra={"action": "post_gone", "job_id": job.id, "forge": job.forge},
        )
        return PostingOutcome(job.id, "cancelled", detail=reason)
    return await _defer_or_fail(store, job, error, now=now, settings=settings, fence=fence)


async def post_job_review(
    store: QueueStore,
    forges: Mapping[str, ForgeClient],
    job_id: int,
    *,
    now: datetime,
    settings: PostingSettings | None = None,
    clock: Clock | None = None,
) -> PostingOutcome:
    """Post a finished job's review once, then end the job; forge errors never drop it silently.

    With `clock`, a forge write goes out only while the posting claim has not run out on it.

    404: cancelled with the reason. Retryable (5xx, 403/429 limits, network): the job stays
    unposted with a retry time, `failed` after `max_attempts`. Other 4xx: failed with the error.
    """
    settings = settings or PostingSettings()
    claim = await claim_finished_job(store, forges, job_id, now=now, settings=settings)
    if isinstance(claim, PostingOutcome):
        return claim
    job, client, fence = claim.job, claim.client, claim.fence
    held = posting_guard(store, job.id, fence, settings=settings, clock=clock)
    context = {"job_id": job.id, "forge": job.forge}
    assembled: AssembledReview | None = None
    client.use_installation(job.repo, job.pull_details.get("installation_id"))
    try:
        # Only an earlier attempt can have posted this job's review: a first one does not look.
        first_attempt = fence.attempt == 1
        existing = (
            None
            if first_attempt
            else await client.find_posted_review(job.repo, job.number, render_marker(job.id))
        )
        if existing is not None:
            # Posted before a crash kept us from recording it: record it, never post twice.
            if not await store.finish_job(
                job.id,
                now=now,
                state=JobState.DONE,
                review=review_record(existing, None),
                reason="review found already posted",
                fence=fence,
            ):
                return lease_lost(job.id, fence, forge=job.forge)
            log.info(
                "job %s: review %s was already posted",
                job.id,
                existing.id,
                extra={"action": "review_found", **context},
            )
            return PostingOutcome(job_id, "already_posted", review_id=existing.id)
        review, assembled = build_review(
            job, await store.chunk_results(job.id), max_comments=settings.max_comments
        )
        review = replace(review, first_attempt=first_attempt)
        # The forge write only while this attempt still holds the claim (and the job is live).
        if not await held():
            return lease_lost(job.id, fence, forge=job.forge)
        # ... and again right before each request goes out (after the forge's pacing); the
        # write spends from the forge's budget at the job's level.
        with (
            guarded_writes(held),
            writing(WriteIntent(level=int(job.level), job_id=job.id)),
        ):
            posted = await client.post_review(job.repo, job.number, review)
    except (LeaseLost, ForgeError) as exc:
        return await posting_failed(store, claim, exc, now=now, settings=settings)
    ended = await store.finish_job(
        job.id, now=now, state=JobState.DONE, review=review_record(posted, assembled), fence=fence
    )
    if not ended:
        # Taken over while the post was on the wire: the new holder finds it by its marker.
        return lease_lost(job.id, fence, forge=job.forge)
    log.info(
        "job %s: review %s posted (%d inline)",
        job.id,
        posted.id,
        posted.inline_posted,
        extra={"action": "review_posted", **context},
    )
    result: PostingResult = "already_posted" if posted.already_posted else "posted"
    return PostingOutcome(job_id, result, review_id=posted.id)


async def _defer_or_fail(
    store: QueueStore,
    job: Job,
    error: ForgeError,
    *,
    now: datetime,
    settings: PostingSettings,
    fence: Fence,
) -> PostingOutcome:
    result, detail = await defer_or_fail(
        store,
        job,
        error,
        now=now,
        stage="posting",
        message=f"posting the review failed: {error}",
        budget=RetryBudget(settings.max_attempts, settings.backoff_s, settings.max_backoff_s),
        fence=fence,
    )
    return PostingOutcome(job.id, result, detail=detail)


__all__ = [
    "PostingOutcome",
    "PostingSettings",
    "build_review",
    "claim_finished_job",
    "lease_lost",
    "post_job_review",
    "posting_guard",
    "render_comment",
    "review_chunk_of",
    "review_record",
]
