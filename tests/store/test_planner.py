"""The planner on a real PostgreSQL and the forge emulator: diffs, skips, policy, forge errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.clock import VirtualClock
from bot.config import DEFAULT_POLICY_DIR
from bot.emulator import Fault, ForgeEmulator, generate_file_changes
from bot.forges.registry import ForgeRegistry
from bot.model import JobState, Level
from bot.policy import SIZE_PENDING_REASON, PolicyBook, evaluate, load_policy_book
from bot.queue.store import QueueStore
from bot.review.chunking import DEFAULT_LINE_BUDGET
from bot.review.planner import PlanningSettings, claim_and_plan_jobs
from bot.sched.mlfq import CONTINUATION_RANK_OFFSET
from tests.support.pipeline_helpers import (
    IMAGE,
    LOCK,
    SMELLY,
    emulator_forges,
    request_for,
)


@pytest.fixture
async def forges(emulator: ForgeEmulator, clock: VirtualClock) -> AsyncIterator[ForgeRegistry]:
    registry = emulator_forges(emulator, clock)
    async with registry:
        yield registry


@pytest.fixture
def book() -> PolicyBook:
    return load_policy_book(DEFAULT_POLICY_DIR)


async def submit(store: QueueStore, book: PolicyBook, clock: VirtualClock, request: object) -> int:
    decision = evaluate(book.policy_for(request.repo), request)  # type: ignore[attr-defined]
    result = await store.submit_request(request, decision, now=clock.now())  # type: ignore[arg-type]
    assert result.job_id is not None
    return result.job_id


async def test_github_diff_is_chunked_without_lock_and_binary_files(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    code = generate_file_changes(changed_lines=900, files=6, seed=3)
    pull = emulator.state.add_pull("github", "acme/shop", 5, files=[*code, LOCK, IMAGE, SMELLY])
    job_id = await submit(store, book, clock, request_for(pull))

    outcomes = await claim_and_plan_jobs(store, forges, book, now=clock.now(), limit=10)

    assert [(o.job_id, o.result) for o in outcomes] == [(job_id, "planned")]
    job = await store.get_job(job_id)
    assert job is not None and job.planned and job.state == JobState.QUEUED
    chunks = await store.chunk_results(job_id)
    assert len(chunks) == outcomes[0].chunks >= 3  # 900+ lines at the 400-line budget
    planned_paths = {file["path"] for chunk in chunks for file in chunk.files}
    assert planned_paths == {item.path for item in [*code, SMELLY]}
    assert {(s["path"], s["reason"]) for s in job.pull_details["skipped"]} == {
        ("package-lock.json", "lock_file"),
        ("docs/logo.png", "binary"),
    }
    assert job.pull_details["diff"]["head_sha"] == pull.newest.head_sha
    assert sum(chunk.lines for chunk in chunks) == job.total_lines


async def test_ranks_put_first_chunks_ahead_of_continuations(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
    db_url: str,
) -> None:
    big = emulator.state.add_pull(
        "github",
        "acme/shop",
        1,
        files=generate_file_changes(changed_lines=3 * DEFAULT_LINE_BUDGET, files=8, seed=1),
    )
    small = emulator.state.add_pull(
        "github", "acme/shop", 2, files=generate_file_changes(changed_lines=30, files=1, seed=2)
    )
    big_id = await submit(store, book, clock, request_for(big))
    small_id = await submit(store, book, clock, request_for(small))
    await claim_and_plan_jobs(store, forges, book, now=clock.now())

    from sqlalchemy import text

    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT job_id, seq, rank FROM review_chunks ORDER BY job_id, seq")
            )
        ).all()
    ranks = {(row.job_id, row.seq): row.rank for row in rows}
    # Both jobs' first chunks come before any continuation: a wait ends at the first call.
    # A first chunk ranks by its own expected cost, so the big review starts as soon as
    # the small one (its first chunk is a small probe), then continues behind new work.
    assert max(ranks[(small_id, 0)], ranks[(big_id, 0)]) < CONTINUATION_RANK_OFFSET
    continuations = [seq for job_id, seq in ranks if job_id == big_id and seq > 0]
    assert len(continuations) >= 3
    assert all(ranks[(big_id, seq)] >= CONTINUATION_RANK_OFFSET for seq in continuations)
    # The continuations share one rank (queue_ranks): they run in order, as one unit.
    assert len({ranks[(big_id, seq)] for seq in continuations}) == 1


async def test_gitlab_sizes_are_known_after_the_diff_and_move_the_level(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    files = generate_file_changes(changed_lines=2400, files=12, seed=8)
    pull = emulator.state.add_pull("gitlab", "acme/platform/api", 9, files=files)
    request = request_for(pull)
    assert request.changed_lines is None  # a GitLab hook carries no sizes
    job_id = await submit(store, book, clock, request)
    before = await store.get_job(job_id)
    assert before is not None and before.level == Level.P1

    outcomes = await claim_and_plan_jobs(store, forges, book, now=clock.now())

    assert outcomes[0].result == "planned"
    job = await store.get_job(job_id)
    assert job is not None
    assert job.level == Level.P2 and job.base_level == Level.P2
    assert job.total_lines == sum(item.changed_lines for item in files)
    history = await store.job_history(job_id)
    assert any("size known after fetching the diff" in entry.reason for entry in history)
    diff = job.pull_details["diff"]
    newest = pull.newest
    assert (diff["base_sha"], diff["start_sha"], diff["head_sha"]) == (
        newest.base_sha,
        newest.start_sha,
        newest.head_sha,
    )


async def test_a_stale_size_reason_is_replaced_once_the_diff_is_known(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    """A small merge request stays P1, but "size not known yet" is no longer true: the job's
    reasons (what its summary and status say) are decided again, in GitLab's words."""
    files = generate_file_changes(changed_lines=30, files=2, seed=2)
    pull = emulator.state.add_pull("gitlab", "acme/platform/api", 10, files=files)
    job_id = await submit(store, book, clock, request_for(pull))
    before = await store.get_job(job_id)
    assert before is not None
    assert list(before.reasons) == ["ordinary merge request", SIZE_PENDING_REASON]

    await claim_and_plan_jobs(store, forges, book, now=clock.now())

    job = await store.get_job(job_id)
    assert job is not None and job.level == Level.P1
    assert list(job.reasons) == ["ordinary merge request"]


async def test_a_missing_pull_request_cancels_the_job_with_the_reason(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 3, files=[SMELLY])
    job_id = await submit(store, book, clock, request_for(pull))
    del emulator.state.pulls[("github", "acme/shop", 3)]

    outcomes = await claim_and_plan_jobs(store, forges, book, now=clock.now())

    assert outcomes[0].result == "cancelled"
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.CANCELLED
    assert job.last_error is not None and "404" in job.last_error


async def test_a_failing_forge_defers_planning_then_it_succeeds(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 4, files=[SMELLY])
    job_id = await submit(store, book, clock, request_for(pull))
    emulator.state.add_fault("github.files", Fault.server_error(502))
    settings = PlanningSettings(backoff_s=20.0)

    first = await claim_and_plan_jobs(store, forges, book, now=clock.now(), settings=settings)
    assert first[0].result == "deferred"
    job = await store.get_job(job_id)
    assert job is not None and not job.planned and job.state == JobState.QUEUED
    assert job.last_error is not None and "502" in job.last_error
    # Not due yet: the backoff holds it back.
    clock.advance(10)
    assert await claim_and_plan_jobs(store, forges, book, now=clock.now(), settings=settings) == []
    clock.advance(11)
    again = await claim_and_plan_jobs(store, forges, book, now=clock.now(), settings=settings)
    assert [o.result for o in again] == ["planned"]
    assert len(await store.chunk_results(job_id)) == 1


async def test_planning_gives_up_after_its_attempts_and_fails_with_the_error(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("gitlab", "acme/platform/web", 2, files=[SMELLY])
    job_id = await submit(store, book, clock, request_for(pull))
    emulator.state.add_fault("gitlab.versions", Fault.server_error(503), times=10)
    settings = PlanningSettings(max_attempts=3, backoff_s=5.0)
    results = []
    for _ in range(5):
        results += [
            o.result
            for o in await claim_and_plan_jobs(
                store, forges, book, now=clock.now(), settings=settings
            )
        ]
        clock.advance(60)
    assert results == ["deferred", "deferred", "failed"]
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.FAILED
    assert job.last_error is not None and "gave up after 3 tries" in job.last_error
