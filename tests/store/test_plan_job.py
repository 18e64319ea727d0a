"""Storing a job's plan on real PostgreSQL: the common path (the job keeps its level) is one
statement, and it keeps every rule of the transaction it stands for: once per job, only under
its planning claim, the policy's reasons, the dispatchers woken; a decision that moves the
level moves it with its history."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy import text

from bot.model import ChunkState, Level, PolicyDecision
from bot.queue.connector import QUEUE_CHANNEL
from bot.queue.records import Fence
from bot.queue.store import QueueSettings, QueueStore
from tests.support.factories import decide, make_request, plans

NOW = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


async def submitted(store: QueueStore, level: Level = Level.P1, number: int = 7) -> int:
    result = await store.submit_request(make_request(number=number), decide(level), now=NOW)
    assert result.job_id is not None
    return int(result.job_id)


async def chunk_levels(store: QueueStore, job_id: int) -> list[tuple[int, str]]:
    rows = await store.connector.fetch_all(
        text("SELECT level, state FROM review_chunks WHERE job_id = :id ORDER BY seq"),
        {"id": job_id},
    )
    return [(int(row.level), str(row.state)) for row in rows]


async def test_a_plan_is_stored_once_with_its_chunks_at_the_jobs_level(store: QueueStore) -> None:
    job_id = await submitted(store, Level.P2)
    assert await store.plan_job(job_id, plans(10, 20, 30), now=NOW, details={"diff": {"x": 1}})
    assert not await store.plan_job(job_id, plans(5), now=NOW)
    assert await chunk_levels(store, job_id) == [(2, ChunkState.QUEUED.value)] * 3
    job = await store.get_job(job_id)
    assert job is not None and job.planned and job.chunks_total == 3 and job.total_lines == 60
    assert job.pull_details["diff"] == {"x": 1}


async def test_a_plan_under_a_lost_claim_stores_nothing(store: QueueStore) -> None:
    job_id = await submitted(store)
    stale = Fence("planning", "somebody-else", 1)
    assert not await store.plan_job(job_id, plans(10), now=NOW, fence=stale)
    assert await chunk_levels(store, job_id) == []
    job = await store.get_job(job_id)
    assert job is not None and not job.planned


async def test_the_policys_second_look_replaces_the_reasons_at_the_same_level(
    store: QueueStore,
) -> None:
    job_id = await submitted(store, Level.P1)
    second = PolicyDecision(level=Level.P1, reasons=("ordinary pull request", "12 files"))
    assert await store.plan_job(job_id, plans(10), now=NOW, decision=second)
    job = await store.get_job(job_id)
    assert job is not None and list(job.reasons) == ["ordinary pull request", "12 files"]
    assert not [entry for entry in await store.job_history(job_id) if entry.kind == "level"]


async def test_a_decision_that_moves_the_level_moves_the_chunks_and_says_why(
    store: QueueStore,
) -> None:
    job_id = await submitted(store, Level.P1)
    larger = PolicyDecision(level=Level.P2, reasons=("large refactor",))
    assert await store.plan_job(job_id, plans(10, 10), now=NOW, decision=larger)
    assert await chunk_levels(store, job_id) == [(2, ChunkState.QUEUED.value)] * 2
    moves = [entry for entry in await store.job_history(job_id) if entry.kind == "level"]
    assert moves and "size known after fetching the diff" in (moves[-1].reason or "")


async def test_a_stored_plan_wakes_the_dispatchers(db_url: str) -> None:
    store = QueueStore.from_url(db_url, settings=QueueSettings(notify=True))
    woken = asyncio.Event()
    try:
        job_id = await submitted(store)
        listener = await store.connector.listen(QUEUE_CHANNEL, woken.set)
        try:
            assert await store.plan_job(job_id, plans(10), now=NOW)
            await asyncio.wait_for(woken.wait(), timeout=5)
        finally:
            await listener.close()
    finally:
        await store.close()
