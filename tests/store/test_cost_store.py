"""The learned cost estimate's sums on PostgreSQL: a finished job's measured cost, added by one
process and read back by another; a pull request keeps its last review; old ones are forgotten."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from bot.clock import VirtualClock
from bot.model import LEVELS, Level
from bot.queue.store import QueueStore
from bot.sched.cost import CostKey, ReviewFeatures, predict_cost
from bot.sched.cost_book import PULL_MEMORY, CostBook
from bot.sched.mlfq import ServiceEstimator
from tests.support.factories import decide, make_request, plans

LINE = ServiceEstimator.with_prior()


async def _finished_job(
    store: QueueStore, clock: VirtualClock, number: int, lines: tuple[int, ...], gpu_s: float
) -> int:
    """A job of `lines` chunks, each finished after `gpu_s` GPU seconds."""
    submitted = await store.submit_request(
        make_request(number=number, head_sha=f"{number:040d}"), decide(Level.P1), now=clock.now()
    )
    assert submitted.job_id is not None
    await store.plan_job(submitted.job_id, plans(*lines), now=clock.now())
    for _ in lines:
        leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
        assert leased is not None
        await store.finish_chunk(
            leased.chunk.id,
            owner="w",
            now=clock.now(),
            gpu_seconds=gpu_s,
            result={"usage": {"prompt_tokens": 1000, "completion_tokens": 50}},
        )
    return submitted.job_id


async def test_a_finished_job_is_measured_learnt_and_read_back(
    store: QueueStore, clock: VirtualClock
) -> None:
    job_id = await _finished_job(store, clock, 7, (300, 100), gpu_s=20.0)
    cost = await store.job_cost(job_id)
    assert cost is not None
    assert (cost.forge, cost.repo, cost.number, cost.chunks) == ("github", "acme/payments", 7, 2)
    assert cost.engine_s == 40.0
    assert (cost.prompt_tokens, cost.completion_tokens) == (2000, 100)
    assert [[entry["path"] for entry in files] for files in cost.chunk_files] == [
        ["src/file_0.py"],
        ["src/file_1.py"],
    ]

    book = CostBook(store)
    assert await book.learn(job_id, clock.now(), LINE)
    other = CostBook(store)
    loaded = await other.load(clock.now())
    assert loaded.tallies == book.model.tallies
    repo = loaded.tallies[CostKey("repo", "github:acme/payments")]
    assert (repo.reviews, repo.lines, repo.files, repo.chunks) == (1.0, 400.0, 2.0, 2.0)
    assert repo.prompt_per_line == pytest.approx(2000 / 400)
    features = ReviewFeatures.of(
        forge="github", repo="acme/payments", number=8, files=[("src/x.py", 400)]
    )
    assert predict_cost(loaded, features, LINE) == predict_cost(book.model, features, LINE)
    assert loaded.tallies[CostKey("language", "python")].reviews == 1.0


async def test_processes_adding_at_once_all_count(store: QueueStore, clock: VirtualClock) -> None:
    jobs = [await _finished_job(store, clock, n, (50,), gpu_s=8.0) for n in range(1, 7)]
    books = [CostBook(store) for _ in jobs]
    await asyncio.gather(
        *(book.learn(job, clock.now(), LINE) for book, job in zip(books, jobs, strict=True))
    )
    model = await CostBook(store).load(clock.now())
    assert model.tallies[CostKey("all", "")].reviews == 6.0
    assert model.tallies[CostKey("repo", "github:acme/payments")].lines == 300.0


async def test_a_pull_request_keeps_its_last_review_for_a_while(
    store: QueueStore, clock: VirtualClock
) -> None:
    book = CostBook(store)
    first = await _finished_job(store, clock, 5, (100,), gpu_s=30.0)
    await book.learn(first, clock.now(), LINE)
    clock.advance(60)
    submitted = await store.submit_request(
        make_request(number=5, head_sha="c" * 40), decide(Level.P1), now=clock.now()
    )
    assert submitted.job_id is not None
    await store.plan_job(submitted.job_id, plans(10), now=clock.now())
    leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
    assert leased is not None
    await store.finish_chunk(
        leased.chunk.id, owner="w", now=clock.now(), gpu_seconds=4.0, result={}
    )
    await book.learn(submitted.job_id, clock.now(), LINE)
    model = await CostBook(store).load(clock.now())
    pull = model.tallies[CostKey("pull", "github:acme/payments#5")]
    assert (pull.reviews, pull.lines, pull.engine_s) == (1.0, 10.0, 4.0)
    assert model.tallies[CostKey("all", "")].reviews == 2.0
    # Long after, the pull request's review is no longer read, then deleted.
    later = clock.now() + PULL_MEMORY + timedelta(days=1)
    assert CostKey("pull", "github:acme/payments#5") not in (await book.load(later)).tallies
    assert await book.forget_old(later) == 1
    assert await book.forget_old(later) == 0
