"""The queue's guarantees in SQL: each one holds on a queue that ran a review, and each one is
reported by name when a row breaks it; `bot check` prints them and exits 1 on a broken one."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from bot import cli
from bot.clock import VirtualClock
from bot.model import LEVELS, JobState
from bot.queue.guarantees import GUARANTEES, GuaranteeLimits, check_guarantees
from bot.queue.store import QueueStore
from tests.support.factories import decide, make_request, plans

LIMITS = GuaranteeLimits(lease_s=60.0, heartbeat_s=20.0, max_chunk_attempts=3)


async def _reviewed(store: QueueStore, clock: VirtualClock, number: int) -> int:
    """A job whose two chunks ran and whose review was posted (recorded done)."""
    submitted = await store.submit_request(
        make_request(number=number, head_sha=f"{number:040d}"),
        decide(),
        now=clock.now(),
        delivery_id=f"delivery-{number}",
    )
    assert submitted.job_id is not None
    await store.plan_job(submitted.job_id, plans(10, 20), now=clock.now())
    while (
        leased := await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
    ) is not None:
        await store.finish_chunk(
            leased.chunk.id, owner="w", now=clock.now(), gpu_seconds=1.0, result={}
        )
    assert await store.finish_job(submitted.job_id, now=clock.now(), review={"counts": {}})
    return submitted.job_id


async def _broken(store: QueueStore, clock: VirtualClock) -> dict[str, tuple[str, ...]]:
    results = await check_guarantees(store.connector, now=clock.now(), limits=LIMITS)
    assert [result.guarantee.name for result in results] == [g.name for g in GUARANTEES]
    return {result.guarantee.name: result.broken_by for result in results if not result.holds}


async def _execute(store: QueueStore, statement: str, **params: Any) -> None:
    async with store.engine.begin() as conn:
        await conn.execute(text(statement), params)


async def test_every_guarantee_holds_after_reviews_and_each_break_is_named(
    store: QueueStore, clock: VirtualClock
) -> None:
    job_id = await _reviewed(store, clock, 1)
    other = await _reviewed(store, clock, 2)
    assert await _broken(store, clock) == {}
    # A done job still holding its posting claim, and counting a chunk twice.
    await _execute(
        store,
        "UPDATE review_jobs SET posting_until = :until, chunks_done = chunks_done + 1"
        " WHERE id = :id",
        until=clock.now() + timedelta(seconds=30),
        id=job_id,
    )
    # Its posting recorded a second time.
    await _execute(
        store,
        "INSERT INTO job_history (job_id, at, kind, from_value, to_value, reason, actor)"
        " VALUES (:id, :at, 'state', 'running', 'done', 'review posted', 'stale')",
        id=other,
        at=clock.now(),
    )
    # An acknowledged delivery whose job is gone; a chunk past its attempts.
    await _execute(
        store, "UPDATE webhook_deliveries SET job_id = 999999 WHERE delivery_id = 'delivery-2'"
    )
    await _execute(store, "UPDATE review_chunks SET attempts = 4 WHERE job_id = :id", id=other)
    broken = await _broken(store, clock)
    assert broken == {
        "done_jobs_hold_no_lease": (f"job {job_id} is done and holds its posting claim",),
        "no_chunk_done_twice": (f"job {job_id} counts 3 chunks done of 2, its chunks show 2",),
        "one_posting_per_job": (f"job {other} (head 000000000000) recorded posted 2 times",),
        "acknowledged_deliveries_have_jobs": (
            "delivery delivery-2 was queued for job 999999, which does not exist",
        ),
        "attempts_within_limits": tuple(
            f"chunk {chunk.id} ran 4 attempts (at most 3)"
            for chunk in await store.chunk_results(other)
        ),
    }


async def test_a_lease_held_by_a_process_not_seen_for_a_lease_breaks_a_guarantee(
    store: QueueStore, clock: VirtualClock
) -> None:
    submitted = await store.submit_request(make_request(), decide(), now=clock.now())
    assert submitted.job_id is not None
    await store.plan_job(submitted.job_id, plans(10), now=clock.now())
    leased = await store.fetch_chunk(levels=LEVELS, owner="host-1", now=clock.now(), lease_s=300)
    assert leased is not None
    await _execute(
        store,
        "INSERT INTO dispatchers (name, started_at, last_seen) VALUES ('host-1', :at, :at)",
        at=clock.now(),
    )
    assert await _broken(store, clock) == {}
    clock.advance(LIMITS.lease_s + LIMITS.heartbeat_s + 1)  # not seen since; its lease runs on
    [detail] = (await _broken(store, clock))["no_lease_outlives_its_holder"]
    assert detail.startswith(f"chunk {leased.chunk.id} is leased to host-1 until ")
    job = await store.get_job(submitted.job_id)
    assert job is not None and job.state == JobState.RUNNING


async def test_bot_check_prints_each_guarantee_and_fails_on_a_broken_one(
    store: QueueStore,
    clock: VirtualClock,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    job_id = await _reviewed(store, clock, 3)
    status = await asyncio.to_thread(cli.main, ["check"])
    out = capsys.readouterr().out
    assert status == 0
    assert [line.split()[0] for line in out.splitlines()] == ["ok"] * len(GUARANTEES)
    await _execute(store, "UPDATE review_jobs SET chunks_done = 5 WHERE id = :id", id=job_id)
    status = await asyncio.to_thread(cli.main, ["check"])
    out = capsys.readouterr().out
    assert status == 1
    assert "FAILED  no_chunk_done_twice" in out
    assert f"job {job_id} counts 5 chunks done of 2, its chunks show 2" in out
