"""The dispatcher ranks reviews by the cost it learnt (bot.sched.cost), in `bot serve`'s
pipeline replayed on real PostgreSQL: reviews of a repository that cost four times the line
teach it so, and a later small review of it waits behind a larger one of a cheap repository."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from bot.clock import EPOCH
from bot.queue.store import QueueStore
from bot.sim.replay import replay_trace
from bot.sim.trace import Trace, TraceHeader, TraceRequest

pytestmark = pytest.mark.slow

# The dispatcher's line before it learns: 3 s a call, 10 s + 0.1 s a changed line beyond.
OVERHEAD_S = 3.0


def _line_work(lines: int) -> float:
    return 10.0 + 0.1 * lines


def _request(number: int, repo: str, arrival_s: float, lines: int, factor: float) -> TraceRequest:
    return TraceRequest(
        id=f"{repo}#{number}",
        arrival_s=arrival_s,
        forge="github",
        repo=repo,
        number=number,
        event="pull_request",
        action="opened",
        merged=False,
        base_ref="main",
        head_ref=f"feature/{number}",
        labels=(),
        author="dev",
        author_is_bot=False,
        draft=False,
        files_changed=1,
        additions=lines,
        deletions=0,
        file_lines=(lines,),
        service_s=OVERHEAD_S + factor * _line_work(lines),
    )


def _morning() -> Trace:
    # Alone on one slot, ten reviews of each repository teach what they cost.
    taught = [
        _request(number, repo, 300.0 * number + offset, 100, factor)
        for number in range(1, 11)
        for repo, factor, offset in (("acme/slow", 4.0, 0.0), ("acme/fast", 0.5, 150.0))
    ]
    # Then a long review holds the slot while a small review of acme/slow and a larger one of
    # acme/fast arrive: by lines the small one is shorter, by what each repository costs not.
    blocker = _request(100, "acme/other", 5000.0, 100, 3.0)
    small_slow = _request(101, "acme/slow", 5001.0, 60, 4.0)
    large_fast = _request(102, "acme/fast", 5002.0, 150, 0.5)
    requests = (*taught, blocker, small_slow, large_fast)
    requests = tuple(sorted(requests, key=lambda r: r.arrival_s))
    return Trace(header=TraceHeader(workers=1, requests=len(requests)), requests=requests)


@pytest.fixture
async def inspect(db_url: str) -> AsyncIterator[QueueStore]:
    store = QueueStore.from_url(db_url)
    yield store
    await store.close()


async def _started_s(store: QueueStore, number: int) -> float:
    job = await store.find_job(
        forge="github", repo="acme/slow" if number == 101 else "acme/fast", number=number
    )
    assert job is not None and job.first_started_at is not None
    return (job.first_started_at - EPOCH).total_seconds()


async def test_the_dispatcher_ranks_by_the_learned_cost(db_url: str, inspect: QueueStore) -> None:
    result = await replay_trace(_morning(), policy="mlfq", database_url=db_url, learned_costs=True)
    assert result["completed"] == result["posted"] == 23
    # The larger review of the cheap repository runs first.
    assert await _started_s(inspect, 102) < await _started_s(inspect, 101)
    async with inspect.engine.connect() as conn:
        rows = (await conn.execute(sa.text("SELECT scope, name, reviews FROM review_costs"))).all()
    learnt = {(row.scope, row.name): row.reviews for row in rows}
    assert learnt[("repo", "github:acme/slow")] == 11.0
    assert learnt[("all", "")] == 23.0
    # Every review's estimate was measured against what it took: half are within 48% here
    # (the first of each repository are not learnt yet), against 72% by the line alone.
    assert result["estimate"]["learned"] and result["estimate"]["reviews"] == 23
    assert result["estimate"]["mdape"] < 0.55


async def test_with_the_line_alone_the_smaller_review_runs_first(
    db_url: str, inspect: QueueStore
) -> None:
    result = await replay_trace(_morning(), policy="mlfq", database_url=db_url, learned_costs=False)
    assert result["completed"] == 23
    assert await _started_s(inspect, 101) < await _started_s(inspect, 102)
    async with inspect.engine.connect() as conn:
        count = (await conn.execute(sa.text("SELECT count(*) FROM review_costs"))).scalar_one()
    assert count == 0
    assert not result["estimate"]["learned"]
    assert result["estimate"]["mdape"] > 0.65
