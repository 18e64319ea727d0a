"""Every stage is claimed with a lease that runs out: planning, chunks, posting. Under the
VirtualClock, on real PostgreSQL and the forge emulator: a dead process's claim stops counting
after the lease, a live one's heartbeat keeps it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bot.clock import VirtualClock
from bot.config import DEFAULT_POLICY_DIR
from bot.emulator import ForgeEmulator
from bot.emulator.state import Fault
from bot.errors import LeaseLost
from bot.forges.registry import ForgeRegistry
from bot.llm.simulated import SimulatedBackend
from bot.model import LEVELS, ChunkState, JobState
from bot.pipeline import build_pipeline
from bot.policy import PolicyBook, evaluate, load_policy_book
from bot.queue.records import Fence
from bot.queue.store import QueueStore
from bot.review.plan_and_post import ReviewPipeline
from bot.review.planner import PlanningSettings, claim_and_plan_jobs
from bot.review.poster import PostingSettings, post_job_review
from bot.sched.dispatcher import DispatcherSettings
from tests.support.factories import plans
from tests.support.pipeline_helpers import (
    SMELLY,
    emulator_forges,
    request_for,
    reviewed_job,
    reviews_of,
)
from tests.support.serving import wait_until

LEASE_S = 10.0


@pytest.fixture
async def forges(emulator: ForgeEmulator, clock: VirtualClock) -> AsyncIterator[ForgeRegistry]:
    registry = emulator_forges(emulator, clock, attempts=3)
    async with registry:
        yield registry


@pytest.fixture
def book() -> PolicyBook:
    return load_policy_book(DEFAULT_POLICY_DIR)


async def test_a_planning_claim_keeps_other_planners_off_until_its_lease_runs_out(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pulls = [emulator.state.add_pull("github", "acme/shop", n, files=[SMELLY]) for n in (1, 2)]
    for pull in pulls:
        request = request_for(pull)
        await store.submit_request(
            request, evaluate(book.policy_for(request.repo), request), now=clock.now()
        )
    # A planner claims both, then dies before storing a plan.
    dead = await store.fetch_unplanned_jobs(now=clock.now(), owner="dead", lease_s=LEASE_S)
    assert len(dead) == 2
    survivor = PlanningSettings(lease_s=LEASE_S, owner="survivor")
    clock.advance(LEASE_S - 0.5)
    assert await claim_and_plan_jobs(store, forges, book, now=clock.now(), settings=survivor) == []
    clock.advance(1.0)
    outcomes = await claim_and_plan_jobs(store, forges, book, now=clock.now(), settings=survivor)
    assert [(o.job_id, o.result) for o in outcomes] == [(job.id, "planned") for job in dead]
    # Planned jobs are never claimed again.
    clock.advance(LEASE_S * 2)
    assert await store.fetch_unplanned_jobs(now=clock.now(), owner="late", lease_s=LEASE_S) == []


async def test_a_dead_posters_claim_runs_out_and_the_review_is_posted_once(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 3, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    # The process that finished the last chunk claimed the posting, then died.
    assert await store.claim_posting(job_id, owner="dead", now=clock.now(), lease_s=LEASE_S)
    pipeline = ReviewPipeline(
        store, forges, book, posting=PostingSettings(lease_s=LEASE_S, owner="survivor")
    )
    assert await pipeline.recover(clock.now()) == []
    clock.advance(LEASE_S - 0.5)
    assert await pipeline.recover(clock.now()) == []
    assert reviews_of(emulator, pull) == []
    clock.advance(1.0)
    outcomes = await pipeline.recover(clock.now())
    assert [(o.job_id, o.result) for o in outcomes] == [(job_id, "posted")]
    assert len(reviews_of(emulator, pull)) == 1
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.DONE


async def test_a_live_posters_heartbeat_keeps_its_claim(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pulls = [emulator.state.add_pull("github", "acme/shop", n, files=[SMELLY]) for n in (4, 5)]
    held, free = [await reviewed_job(store, forges, book, clock, pull) for pull in pulls]
    assert await store.claim_posting(held, owner="a", now=clock.now(), lease_s=LEASE_S)
    # Claimed jobs do not fill the recovery batch: the unclaimed one is found with limit 1.
    assert [job.id for job in await store.unposted_jobs(limit=1, now=clock.now())] == [free]
    clock.advance(LEASE_S * 0.8)
    assert await store.renew_posting_claims([held], owner="a", now=clock.now(), lease_s=LEASE_S)
    assert not await store.renew_posting_claims([held], owner="b", now=clock.now(), lease_s=LEASE_S)
    clock.advance(LEASE_S * 0.4)  # past the first claim, within the renewed one
    assert not await store.claim_posting(held, owner="b", now=clock.now(), lease_s=LEASE_S)
    assert held not in [job.id for job in await store.unposted_jobs(now=clock.now())]
    clock.advance(LEASE_S)
    assert await store.claim_posting(held, owner="b", now=clock.now(), lease_s=LEASE_S)


async def test_each_heartbeat_reclaims_the_chunks_of_a_dead_dispatcher(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 6, files=[SMELLY])
    request = request_for(pull)
    await store.submit_request(
        request, evaluate(book.policy_for(request.repo), request), now=clock.now()
    )
    await claim_and_plan_jobs(store, forges, book, now=clock.now())
    leased = await store.fetch_chunk(levels=LEVELS, owner="dead", now=clock.now(), lease_s=LEASE_S)
    assert leased is not None
    survivor = build_pipeline(
        store,
        forges=forges,
        policies=book,
        backend=SimulatedBackend(),
        clock=clock,
        dispatcher=DispatcherSettings(owner="survivor", lease_s=LEASE_S, heartbeat_s=LEASE_S / 3),
    ).dispatcher
    ticks = []
    for _ in range(4):  # heartbeats at 1/3, 2/3, 3/3 and 4/3 of the lease
        clock.advance(LEASE_S / 3 + 0.01)
        ticks.append(await survivor.heartbeat(clock.now()))
    assert ticks == [0, 0, 1, 0]
    [chunk] = await store.chunk_results(leased.chunk.job_id)
    assert chunk.state == ChunkState.QUEUED and chunk.lease_owner is None
    assert "lease expired (worker dead stopped)" in (await _chunk_error(store, chunk.id))


async def _chunk_error(store: QueueStore, chunk_id: int) -> str:
    from sqlalchemy import text

    async with store.engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT last_error FROM review_chunks WHERE id = :id"), {"id": chunk_id}
            )
        ).one()
    return str(row.last_error)


# --- fencing: a process that resumes after its lease was taken over writes nothing ----------


async def test_a_chunk_finished_by_a_stale_lease_attempt_is_dropped(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 8, files=[SMELLY])
    request = request_for(pull)
    await store.submit_request(
        request, evaluate(book.policy_for(request.repo), request), now=clock.now()
    )
    await claim_and_plan_jobs(store, forges, book, now=clock.now())
    first = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=LEASE_S)
    assert first is not None
    clock.advance(LEASE_S + 1)
    assert await store.reclaim_expired(now=clock.now()) == 1
    # The same process takes the chunk again: only its newer attempt may finish it.
    second = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=LEASE_S)
    assert second is not None and second.chunk.id == first.chunk.id
    assert second.chunk.lease_attempt == first.chunk.lease_attempt + 1
    with pytest.raises(LeaseLost):
        await store.finish_chunk(
            first.chunk.id,
            owner="w",
            now=clock.now(),
            gpu_seconds=1.0,
            result={"stale": True},
            attempt=first.chunk.lease_attempt,
        )
    assert not await store.release_chunk(
        first.chunk.id, owner="w", now=clock.now(), attempt=first.chunk.lease_attempt
    )
    await store.finish_chunk(
        second.chunk.id,
        owner="w",
        now=clock.now(),
        gpu_seconds=1.0,
        result={"fresh": True},
        attempt=second.chunk.lease_attempt,
    )
    [chunk] = await store.chunk_results(first.chunk.job_id)
    assert chunk.state == ChunkState.DONE and chunk.result == {"fresh": True}


async def test_a_stale_planning_attempt_stores_no_plan(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 9, files=[SMELLY])
    request = request_for(pull)
    await store.submit_request(
        request, evaluate(book.policy_for(request.repo), request), now=clock.now()
    )
    [stale] = await store.fetch_unplanned_jobs(now=clock.now(), owner="stale", lease_s=LEASE_S)
    clock.advance(LEASE_S + 1)
    [fresh] = await store.fetch_unplanned_jobs(now=clock.now(), owner="fresh", lease_s=LEASE_S)
    assert fresh.planning_attempt == stale.planning_attempt + 1
    stale_fence = Fence("planning", "stale", stale.planning_attempt)
    assert not await store.plan_job(stale.id, plans(10), now=clock.now(), fence=stale_fence)
    assert not await store.finish_job(
        stale.id, now=clock.now(), state=JobState.FAILED, error="stale", fence=stale_fence
    )
    fence = Fence("planning", "fresh", fresh.planning_attempt)
    assert await store.plan_job(fresh.id, plans(10, 20), now=clock.now(), fence=fence)
    assert [chunk.lines for chunk in await store.chunk_results(fresh.id)] == [10, 20]


async def an_earlier_attempt_ran_out(store: QueueStore, job_id: int, clock: VirtualClock) -> None:
    """A poster claimed the job and died before it wrote anything: the attempts after it look
    on the forge for the review first (a first attempt has nothing to look for)."""
    assert await store.claim_posting(job_id, owner="died", now=clock.now(), lease_s=LEASE_S)
    clock.advance(LEASE_S + 1)


@pytest.mark.parametrize("pause", ["before the post", "post on the wire"])
async def test_a_poster_resuming_after_a_takeover_posts_and_records_nothing(
    pause: str,
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    number = 10 if pause == "before the post" else 11
    pull = emulator.state.add_pull("github", "acme/shop", number, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    await an_earlier_attempt_ran_out(store, job_id, clock)
    # The stale poster hangs on the forge (a paused process looks the same from outside):
    # after its look for an earlier review found none, or after the forge took its review.
    route = "github.reviews.list" if pause == "before the post" else "github.reviews.create"
    emulator.state.add_fault(route, Fault.late_answer(1.0))
    stale = asyncio.create_task(
        post_job_review(
            store,
            forges,
            job_id,
            now=clock.now(),
            settings=PostingSettings(lease_s=LEASE_S, owner="stale"),
        )
    )

    async def hanging() -> bool:
        return not emulator.state.faults[route]

    await wait_until(hanging, timeout_s=10, what="the stale poster to reach the forge")
    clock.advance(LEASE_S + 1)
    fresh = await post_job_review(
        store, forges, job_id, now=clock.now(), settings=PostingSettings(owner="fresh")
    )
    expected = "posted" if pause == "before the post" else "already_posted"
    assert fresh.result == expected
    outcome = await stale
    assert outcome.result == "lease_lost"
    assert len(reviews_of(emulator, pull)) == 1
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.DONE
    history = [entry for entry in await store.job_history(job_id) if entry.to_value == "done"]
    assert len(history) == 1


async def test_a_poster_resuming_after_its_claim_ran_out_writes_nothing_even_before_a_takeover(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 12, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    await an_earlier_attempt_ran_out(store, job_id, clock)
    # Paused on its look for an earlier review, past its lease; nobody has taken over yet, so
    # only the claim's expiry can stop it (another poster may claim it any moment now).
    route = "github.reviews.list"
    emulator.state.add_fault(route, Fault.late_answer(1.0))
    stale_settings = PostingSettings(lease_s=LEASE_S, owner="stale")
    stale = asyncio.create_task(
        post_job_review(
            store, forges, job_id, now=clock.now(), settings=stale_settings, clock=clock
        )
    )

    async def hanging() -> bool:
        return not emulator.state.faults[route]

    await wait_until(hanging, timeout_s=10, what="the stale poster to reach the forge")
    clock.advance(LEASE_S + 1)
    assert (await stale).result == "lease_lost"
    assert reviews_of(emulator, pull) == []
    # Its heartbeat does not revive the claim that ran out ...
    assert not await store.renew_posting_claims(
        [job_id], owner="stale", now=clock.now(), lease_s=LEASE_S
    )
    # ... and the next attempt posts the review, once.
    survivor = ReviewPipeline(
        store, forges, book, posting=PostingSettings(lease_s=LEASE_S, owner="survivor"), clock=clock
    )
    outcomes = await survivor.recover(clock.now())
    assert [(o.job_id, o.result) for o in outcomes] == [(job_id, "posted")]
    assert len(reviews_of(emulator, pull)) == 1


async def test_each_check_before_a_forge_write_extends_the_posting_claim_by_a_lease(
    store: QueueStore,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    book: PolicyBook,
    clock: VirtualClock,
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 13, files=[SMELLY])
    job_id = await reviewed_job(store, forges, book, clock, pull)
    fence = await store.claim_posting(job_id, owner="a", now=clock.now(), lease_s=LEASE_S)
    assert fence is not None
    clock.advance(LEASE_S * 0.9)
    assert await store.holds_posting(job_id, fence, now=clock.now(), lease_s=LEASE_S)
    # The write that follows the check has a whole lease: nobody may claim the job in it.
    clock.advance(LEASE_S * 0.9)
    assert not await store.claim_posting(job_id, owner="b", now=clock.now(), lease_s=LEASE_S)
    clock.advance(LEASE_S * 0.2)
    assert not await store.holds_posting(job_id, fence, now=clock.now(), lease_s=LEASE_S)
    assert await store.claim_posting(job_id, owner="b", now=clock.now(), lease_s=LEASE_S)
