"""The poster on a real PostgreSQL and the forge emulator: once, and never silently dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from bot.clock import VirtualClock
from bot.config import DEFAULT_POLICY_DIR
from bot.emulator import Fault, ForgeEmulator, generate_file_changes
from bot.forges.base import find_marker, render_marker
from bot.forges.registry import ForgeRegistry
from bot.model import JobState
from bot.policy import PolicyBook, evaluate, load_policy_book
from bot.queue.store import QueueStore
from bot.review.plan_and_post import ReviewPipeline
from bot.review.poster import PostingSettings, build_review, post_job_review
from tests.support.pipeline_helpers import (
    LOCK,
    SMELLY,
    emulator_forges,
    request_for,
    reviewed_job,
    reviews_of,
)


@pytest.fixture
async def forges(emulator: ForgeEmulator, clock: VirtualClock) -> AsyncIterator[ForgeRegistry]:
    registry = emulator_forges(emulator, clock, attempts=3)
    async with registry:
        yield registry


@pytest.fixture
def book() -> PolicyBook:
    return load_policy_book(DEFAULT_POLICY_DIR)


async def test_github_review_is_posted_once_with_inline_comments_and_marker(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    files = [*generate_file_changes(changed_lines=60, files=2, seed=4), SMELLY, LOCK]
    pull = emulator.state.add_pull("github", "acme/shop", 11, files=files)
    job_id = await reviewed_job(store, forges, book, clock, pull)

    outcome = await post_job_review(store, forges, job_id, now=clock.now())

    assert outcome.result == "posted"
    [record] = emulator.state.posted(kind="review", repo="acme/shop", number=11)
    assert record.data["event"] == "COMMENT"
    assert record.data["commit_id"] == pull.newest.head_sha
    assert find_marker(record.body) == job_id
    assert "package-lock.json" in (record.body or "") and "lock file" in (record.body or "")
    comments = record.data["comments"]
    assert comments and {c["path"] for c in comments} == {"app/handler.py"}
    assert any("Critical" in c["body"] for c in comments)  # the hard-coded token
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.DONE
    # A second call (a redelivered completion) changes nothing.
    again = await post_job_review(store, forges, job_id, now=clock.now())
    assert again.result == "skipped"
    assert len(reviews_of(emulator, pull)) == 1


async def test_gitlab_review_posts_positioned_discussions_and_one_summary_note(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("gitlab", "acme/platform/api", 4, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)

    outcome = await post_job_review(store, forges, job_id, now=clock.now())

    assert outcome.result == "posted"
    discussions = emulator.state.posted(kind="discussion", repo=pull.repo, number=4)
    assert discussions
    for record in discussions:
        position = record.data["position"]
        assert position["head_sha"] == pull.newest.head_sha
        assert position["base_sha"] == pull.newest.base_sha
        assert position["new_path"] == "app/handler.py"
    [summary] = reviews_of(emulator, pull)
    assert find_marker(summary) == job_id


async def test_a_crash_between_post_and_commit_never_duplicates(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 12, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    job = await store.get_job(job_id)
    assert job is not None
    # The review reached GitHub under a posting claim, then the process died before
    # finish_job; the claim runs out and recovery's attempt looks for the review first.
    assert await store.claim_posting(job_id, owner="died", now=clock.now(), lease_s=60)
    review, _ = build_review(job, await store.chunk_results(job_id))
    await forges["github"].post_review(pull.repo, pull.number, replace(review, first_attempt=True))
    clock.advance(61)
    assert [j.id for j in await store.unposted_jobs(now=clock.now())] == [job_id]

    outcomes = await ReviewPipeline(store, forges, book).recover(clock.now())

    assert [(o.job_id, o.result) for o in outcomes] == [(job_id, "already_posted")]
    assert len(reviews_of(emulator, pull)) == 1
    finished = await store.get_job(job_id)
    assert finished is not None and finished.state == JobState.DONE
    assert await store.unposted_jobs(now=clock.now()) == []


async def test_a_superseded_review_is_never_posted(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 13, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    emulator.state.push("github", "acme/shop", 13)
    newer = request_for(pull, action="synchronize")
    result = await store.submit_request(
        newer, evaluate(book.policy_for(newer.repo), newer), now=clock.now()
    )
    assert result.superseded == (job_id,)

    outcome = await post_job_review(store, forges, job_id, now=clock.now())

    assert outcome.result == "skipped" and "superseded" in outcome.detail
    assert reviews_of(emulator, pull) == []


@pytest.mark.parametrize(
    ("fault", "route"),
    [
        (Fault.server_error(502), "github.reviews.create"),
        (Fault.lost_response(502), "github.reviews.create"),
        (Fault.secondary_rate_limit(retry_after=7), "github.reviews.create"),
        (Fault.server_error(500), "github.reviews.list"),
    ],
    ids=["5xx", "lost-response", "secondary-limit", "5xx-on-lookup"],
)
async def test_forge_faults_end_in_exactly_one_review(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
    fault: Fault,
    route: str,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 14, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    if route == "github.reviews.list":
        # Only an attempt after one that ran out looks for an earlier review.
        assert await store.claim_posting(job_id, owner="died", now=clock.now(), lease_s=60)
        clock.advance(61)
    emulator.state.add_fault(route, fault)

    outcome = await post_job_review(store, forges, job_id, now=clock.now())
    assert not emulator.state.faults[route]  # the fault was met

    assert outcome.result in ("posted", "already_posted")
    assert len(reviews_of(emulator, pull)) == 1
    if fault.retry_after is not None:
        assert fault.retry_after in clock.sleeps  # Retry-After obeyed
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.DONE


async def test_a_forge_down_for_long_defers_then_posts_once(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 15, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    emulator.state.add_fault("github.reviews.create", Fault.server_error(503), times=3)
    settings = PostingSettings(backoff_s=30.0)

    first = await post_job_review(store, forges, job_id, now=clock.now(), settings=settings)

    assert first.result == "deferred"
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.RUNNING
    assert job.last_error is not None and "503" in job.last_error
    recovery = ReviewPipeline(store, forges, book, posting=settings)
    assert await recovery.recover(clock.now()) == []
    clock.advance(31)
    later = await recovery.recover(clock.now())
    assert [o.result for o in later] == ["posted"]
    assert len(reviews_of(emulator, pull)) == 1


async def test_a_deleted_pull_request_cancels_and_a_refusal_fails(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    gone = emulator.state.add_pull("github", "acme/shop", 16, files=[SMELLY])
    refused = emulator.state.add_pull("github", "acme/shop", 17, files=[SMELLY])
    gone_id = await reviewed_job(store, forges, book, clock, gone)
    refused_id = await reviewed_job(store, forges, book, clock, refused)
    del emulator.state.pulls[("github", "acme/shop", 16)]
    cancelled = await post_job_review(store, forges, gone_id, now=clock.now())
    refusal = Fault(status=403, message="Resource not accessible by integration")
    emulator.state.add_fault("github.reviews.create", refusal)
    failed = await post_job_review(store, forges, refused_id, now=clock.now())

    assert cancelled.result == "cancelled" and failed.result == "failed"
    gone_job = await store.get_job(gone_id)
    refused_job = await store.get_job(refused_id)
    assert gone_job is not None and gone_job.state == JobState.CANCELLED
    assert gone_job.last_error is not None and "404" in gone_job.last_error
    assert refused_job is not None and refused_job.state == JobState.FAILED
    assert refused_job.last_error is not None and "403" in refused_job.last_error
    assert emulator.state.posted(kind="review") == []
    assert render_marker(refused_id) not in str(emulator.state.records)


async def test_a_review_refused_for_auth_is_deferred_then_posted(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    """A 401 (a clock off, credentials rotated) may pass: the review waits, it is not failed."""
    pull = emulator.state.add_pull("github", "acme/shop", 19, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    emulator.state.add_fault("github.reviews.create", Fault(status=401, message="Bad credentials"))

    first = await post_job_review(store, forges, job_id, now=clock.now())
    assert first.result == "deferred"
    job = await store.get_job(job_id)
    assert job is not None and job.state != JobState.FAILED
    assert job.last_error is not None and "401" in job.last_error

    clock.advance(3600)
    second = await post_job_review(store, forges, job_id, now=clock.now())
    assert second.result == "posted"
    assert len(emulator.state.posted(kind="review", number=19)) == 1


async def test_a_completion_racing_a_recovery_pass_posts_once(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 18, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    # A slow POST: the other poster looks (and finds nothing) while this one is in flight.
    emulator.state.add_fault("github.reviews.create", Fault.slow(0.5))

    # One pipeline shares one PostingSettings (one owner) between completion and recovery.
    settings = PostingSettings()
    completion, recovery = await asyncio.gather(
        post_job_review(store, forges, job_id, now=clock.now(), settings=settings),
        ReviewPipeline(store, forges, book, posting=settings).recover(clock.now()),
    )

    results = [completion.result, *(o.result for o in recovery)]
    # Whoever claims first posts; the other finds it claimed or done (or not unposted at all).
    assert results.count("posted") == 1
    assert set(results) <= {"posted", "skipped"}
    assert len(reviews_of(emulator, pull)) == 1
