"""The queue store against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from bot.clock import VirtualClock
from bot.db import plain_url
from bot.errors import LeaseLost
from bot.model import LEVELS, ChunkState, JobState, Level
from bot.queue.sql import chunks as chunks_sql
from bot.queue.sql import statement
from bot.queue.store import QueueSettings, QueueStore, request_from_json, request_to_json
from tests.support.drain_worker import drain
from tests.support.factories import decide, make_request, plans
from tests.support.serving import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


async def _enqueue(
    store: QueueStore, clock: VirtualClock, *, number: int, level: Level, lines: tuple[int, ...]
) -> int:
    result = await store.submit_request(
        make_request(number=number, head_sha=f"{number:040d}"), decide(level), now=clock.now()
    )
    assert result.created and result.job_id is not None
    await store.plan_job(result.job_id, plans(*lines), now=clock.now())
    return result.job_id


async def test_submit_is_idempotent_by_change_and_delivery(
    store: QueueStore, clock: VirtualClock
) -> None:
    request = make_request()
    first = await store.submit_request(request, decide(), now=clock.now(), delivery_id="d-1")
    again = await store.submit_request(request, decide(), now=clock.now(), delivery_id="d-1")
    same_change = await store.submit_request(request, decide(), now=clock.now(), delivery_id="d-2")
    assert first.created and first.job_id is not None
    assert again.duplicate_delivery and again.job_id is None
    assert not same_change.created and same_change.job_id == first.job_id
    assert len(await store.list_jobs()) == 1


async def test_newer_head_supersedes_queued_review(store: QueueStore, clock: VirtualClock) -> None:
    old = await store.submit_request(make_request(head_sha="1" * 40), decide(), now=clock.now())
    assert old.job_id is not None
    await store.plan_job(old.job_id, plans(10, 10), now=clock.now())
    clock.advance(5)
    new = await store.submit_request(make_request(head_sha="2" * 40), decide(), now=clock.now())
    assert new.superseded == (old.job_id,)
    old_job = await store.get_job(old.job_id)
    assert old_job is not None and old_job.state == JobState.SUPERSEDED
    assert {c.state for c in await store.chunk_results(old.job_id)} == {ChunkState.CANCELLED}
    history = await store.job_history(old.job_id)
    assert history[-1].to_value == "superseded" and "superseded by job" in history[-1].reason


async def test_dequeue_follows_level_preference_then_rank(
    store: QueueStore, clock: VirtualClock
) -> None:
    p2 = await _enqueue(store, clock, number=1, level=Level.P2, lines=(5,))
    p1 = await _enqueue(store, clock, number=2, level=Level.P1, lines=(5,))
    p0 = await _enqueue(store, clock, number=3, level=Level.P0, lines=(5,))
    order = []
    for _ in range(3):
        leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
        assert leased is not None
        order.append(leased.chunk.job_id)
    assert order == [p0, p1, p2]
    assert await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60) is None


async def test_dequeue_prefers_the_level_the_caller_names(
    store: QueueStore, clock: VirtualClock
) -> None:
    await _enqueue(store, clock, number=1, level=Level.P1, lines=(5,))
    p3 = await _enqueue(store, clock, number=2, level=Level.P3, lines=(5,))
    leased = await store.fetch_chunk(
        levels=[Level.P3, Level.P1], owner="w", now=clock.now(), lease_s=60
    )
    assert leased is not None and leased.chunk.job_id == p3 and leased.first_start


async def test_finish_needs_the_lease(store: QueueStore, clock: VirtualClock) -> None:
    job_id = await _enqueue(store, clock, number=1, level=Level.P1, lines=(5, 6))
    leased = await store.fetch_chunk(levels=LEVELS, owner="a", now=clock.now(), lease_s=60)
    assert leased is not None
    with pytest.raises(LeaseLost):
        await store.finish_chunk(
            leased.chunk.id, owner="b", now=clock.now(), gpu_seconds=1, result={}
        )
    clock.advance(2)
    assert await store.heartbeat([leased.chunk.id], owner="a", now=clock.now(), lease_s=60) == 1
    outcome = await store.finish_chunk(
        leased.chunk.id, owner="a", now=clock.now(), gpu_seconds=2.5, result={"ok": True}
    )
    assert outcome.job_id == job_id and not outcome.job_complete
    assert outcome.level_gpu_seconds == pytest.approx(2.5)
    second = await store.fetch_chunk(levels=LEVELS, owner="a", now=clock.now(), lease_s=60)
    assert second is not None and not second.first_start
    outcome = await store.finish_chunk(
        second.chunk.id, owner="a", now=clock.now(), gpu_seconds=1.5, result={}
    )
    assert outcome.job_complete
    job = await store.get_job(job_id)
    assert job is not None and job.gpu_seconds == pytest.approx(4.0) and job.chunks_done == 2
    assert await store.finish_job(job_id, now=clock.now(), review={"posted": 1})
    assert not await store.finish_job(job_id, now=clock.now())


async def test_two_leases_racing_for_a_new_job_start_it_once(
    store: QueueStore, clock: VirtualClock
) -> None:
    job_id = await _enqueue(store, clock, number=1, level=Level.P1, lines=(5, 5))
    lease = {
        "levels": [int(level) for level in LEVELS],
        "owner": "a",
        "now": clock.now(),
        "lease_expires_at": clock.now() + timedelta(seconds=60),
        "max_rank": float("inf"),
        "engine": None,
    }
    # One dispatcher leases the first chunk and starts the job, not yet committed; another
    # leases the second chunk meanwhile, and waits for the job's row.
    async with store.engine.begin() as first:
        row = (await first.execute(chunks_sql.FETCH_CHUNK, lease)).one()
        assert row.first_start
        second = asyncio.create_task(
            store.fetch_chunk(levels=LEVELS, owner="b", now=clock.now(), lease_s=60)
        )

        async def second_waits_for_the_job() -> bool:
            waiting = await store.connector.fetch_all(
                statement(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                ),
                {},
            )
            return bool(waiting)

        await wait_until(second_waits_for_the_job, timeout_s=30, what="the second lease to wait")
    leased = await second
    assert leased is not None and leased.chunk.job_id == job_id and not leased.first_start
    starts = [e for e in await store.job_history(job_id) if e.reason == "first chunk started"]
    assert [e.actor for e in starts] == ["a"]


async def test_failure_backs_off_then_poison_job_ends_dead(
    store: QueueStore, clock: VirtualClock
) -> None:
    job_id = await _enqueue(store, clock, number=1, level=Level.P1, lines=(5, 5))
    for attempt in range(1, 4):
        leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
        assert leased is not None and leased.chunk.seq == 0 and leased.chunk.attempts == attempt
        outcome = await store.fail_chunk(
            leased.chunk.id, owner="w", now=clock.now(), error=f"boom {attempt}"
        )
        if attempt < 3:
            assert outcome.retried
            # Backing off: the other chunk is offered, not this one, until the backoff passes.
            other = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
            assert other is not None and other.chunk.seq == 1
            await store.release_chunk(other.chunk.id, owner="w", now=clock.now())
            clock.advance(5 * 2 ** (attempt - 1) + 1)
        else:
            assert outcome.job_dead
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.DEAD and job.last_error == "boom 3"
    assert [c.state for c in await store.chunk_results(job_id)] == [
        ChunkState.DEAD,
        ChunkState.CANCELLED,
    ]
    assert await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60) is None


async def test_expired_lease_is_reclaimed(store: QueueStore, clock: VirtualClock) -> None:
    await _enqueue(store, clock, number=1, level=Level.P1, lines=(5,))
    leased = await store.fetch_chunk(levels=LEVELS, owner="dead", now=clock.now(), lease_s=30)
    assert leased is not None
    assert await store.reclaim_expired(now=clock.now()) == 0
    clock.advance(31)
    assert await store.reclaim_expired(now=clock.now()) == 1
    again = await store.fetch_chunk(levels=LEVELS, owner="alive", now=clock.now(), lease_s=30)
    assert again is not None and again.chunk.id == leased.chunk.id


async def test_set_level_moves_chunks_and_writes_history(
    store: QueueStore, clock: VirtualClock
) -> None:
    job_id = await _enqueue(store, clock, number=1, level=Level.P2, lines=(5, 5))
    assert await store.set_level(job_id, Level.P1, now=clock.now(), reason="asked", actor="alice")
    assert not await store.set_level(job_id, Level.P1, now=clock.now(), reason="x", actor="a")
    assert {c.level for c in await store.chunk_results(job_id)} == {Level.P1}
    entry = (await store.job_history(job_id))[-1]
    assert (entry.kind, entry.from_value, entry.to_value, entry.actor) == (
        "level",
        "P2",
        "P1",
        "alice",
    )


async def test_aging_raises_waiting_jobs_but_never_into_p0(
    store: QueueStore, clock: VirtualClock
) -> None:
    p3 = await _enqueue(store, clock, number=1, level=Level.P3, lines=(5,))
    p1 = await _enqueue(store, clock, number=2, level=Level.P1, lines=(5,))
    p0 = await _enqueue(store, clock, number=3, level=Level.P0, lines=(5,))
    # Born at P0, moved down to P1: aging may take it back to P0.
    assert await store.set_level(p0, Level.P1, now=clock.now(), reason="test", actor="t")
    clock.advance(1799)
    assert await store.apply_aging(now=clock.now(), interval_s=1800) == 0
    clock.advance(1)
    assert await store.apply_aging(now=clock.now(), interval_s=1800) == 2
    job = await store.get_job(p3)
    assert job is not None and job.level == Level.P2
    assert (await store.job_history(p3))[-1].reason.startswith("aging")
    p1_job = await store.get_job(p1)
    assert p1_job is not None and p1_job.level == Level.P1
    p0_job = await store.get_job(p0)
    assert p0_job is not None and p0_job.level == Level.P0


async def test_dependency_waits_and_lends_its_level(store: QueueStore, clock: VirtualClock) -> None:
    base = await _enqueue(store, clock, number=1, level=Level.P2, lines=(5,))
    stacked = await store.submit_request(
        make_request(number=2, head_sha="c" * 40),
        decide(Level.P1),
        now=clock.now(),
        depends_on=[base],
    )
    assert stacked.state == JobState.WAITING and stacked.job_id is not None
    await store.plan_job(stacked.job_id, plans(5), now=clock.now())
    base_job = await store.get_job(base)
    assert base_job is not None and base_job.level == Level.P1  # inherited
    assert "inherits P1" in (await store.job_history(base))[-1].reason
    # A less urgent dependent lends nothing; a more urgent one lends its level.
    for number, level in ((3, Level.P3), (4, Level.P0)):
        dependent = await store.submit_request(
            make_request(number=number, head_sha=f"{number:040d}"),
            decide(level),
            now=clock.now(),
            depends_on=[base],
        )
        assert dependent.job_id is not None
        await store.plan_job(dependent.job_id, plans(5), now=clock.now())
        base_job = await store.get_job(base)
        assert base_job is not None and base_job.level == min(Level.P1, level)
    leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
    assert leased is not None and leased.chunk.job_id == base
    assert await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60) is None
    await store.finish_chunk(leased.chunk.id, owner="w", now=clock.now(), gpu_seconds=1, result={})
    clock.advance(3)
    await store.finish_job(base, now=clock.now())
    released = await store.get_job(stacked.job_id)
    assert released is not None and released.state == JobState.QUEUED
    assert released.ready_at == clock.now()


async def test_dequeue_uses_its_partial_index(store: QueueStore, clock: VirtualClock) -> None:
    for number in range(1, 40):
        await _enqueue(store, clock, number=number, level=Level(number % 4), lines=(5, 5))
    # The plan of the statement fetch_chunk runs, with the parameters it binds (EXPLAIN
    # without ANALYZE plans the data-modifying CTE but leases nothing).
    explain_fetch = statement("EXPLAIN " + chunks_sql.FETCH_CHUNK.text)
    async with store.engine.connect() as conn:
        await conn.execute(statement("ANALYZE review_chunks"))
        await conn.execute(statement("SET enable_seqscan = off"))
        rows = (
            await conn.execute(
                explain_fetch,
                {
                    "levels": [int(Level.P1), int(Level.P2)],
                    "owner": "w",
                    "now": clock.now(),
                    "lease_expires_at": clock.now(),
                    "max_rank": float("inf"),
                    "engine": None,
                },
            )
        ).all()
    plan = "\n".join(row[0] for row in rows)
    assert "Index Scan using ix_review_chunks_dequeue on review_chunks" in plan, plan
    assert "LockRows" in plan and "review_chunks" in plan, plan


@pytest.mark.parametrize("consumers", [8, 12])
async def test_concurrent_consumers_finish_each_chunk_exactly_once(
    db_url: str, clock: VirtualClock, consumers: int
) -> None:
    setup = QueueStore.from_url(db_url)
    try:
        for number in range(200):
            await _enqueue(setup, clock, number=number, level=Level(number % 4), lines=(1,) * 10)
    finally:
        await setup.close()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.drain_worker",
            db_url,
            f"process-{i}",
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
            env=env,
        )
        for i in range(2)
    ]
    for process in processes:  # both are connected and about to drain before we start
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), timeout=60) == b"ready\n"
    finished = await asyncio.gather(*(drain(db_url, f"task-{i}") for i in range(consumers)))
    from_processes = []
    for process in processes:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode == 0
        from_processes.append([int(line) for line in out.split()])
    everything = [chunk for batch in (*finished, *from_processes) for chunk in batch]
    counts = Counter(everything)
    assert len(counts) == 2000 and max(counts.values()) == 1
    assert all(from_processes), "each OS process took part"
    check = QueueStore.from_url(db_url)
    try:
        load = await check.level_load(now=clock.now())
        assert sum(load.ready.values()) == 0 and load.total_running == 0
    finally:
        await check.close()


async def test_killed_connection_loses_nothing(db_url: str, clock: VirtualClock) -> None:
    store = QueueStore.from_url(db_url, settings=QueueSettings(notify=False))
    victim = QueueStore.from_url(
        db_url, settings=QueueSettings(notify=False), pool_size=1, application_name="victim"
    )
    try:
        await _enqueue(store, clock, number=1, level=Level.P1, lines=(5,))
        leased = await victim.fetch_chunk(
            levels=LEVELS, owner="victim", now=clock.now(), lease_s=30
        )
        assert leased is not None
        admin = await asyncpg.connect(plain_url(db_url))
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'victim'"
            )
        finally:
            await admin.close()
        assert killed == 1
        await victim.engine.dispose()  # the consumer is gone with its connection
        # The lease outlives its holder; nobody else may take the chunk until it expires.
        assert (
            await store.fetch_chunk(levels=LEVELS, owner="b", now=clock.now(), lease_s=30) is None
        )
        clock.advance(31)
        assert await store.reclaim_expired(now=clock.now()) == 1
        again = await store.fetch_chunk(levels=LEVELS, owner="b", now=clock.now(), lease_s=30)
        assert again is not None and again.chunk.id == leased.chunk.id
        assert again.chunk.attempts == 2
        outcome = await store.finish_chunk(
            again.chunk.id, owner="b", now=clock.now(), gpu_seconds=1, result={}
        )
        assert outcome.job_complete
    finally:
        await victim.close()
        await store.close()


def test_a_stored_request_reads_back_as_it_was() -> None:
    request = make_request(labels=("hotfix",), depends_on_refs=("acme/api#3",))
    assert request_from_json(request_to_json(request)) == request
    stored = request_to_json(request)
    del stored["head_sha"]
    assert request_from_json(stored) is None
    assert request_from_json({**request_to_json(request), "unknown": 1}) == request
