"""Connections that cannot hold others hostage: every session of the bot runs under a statement,
lock and idle-in-transaction limit; a session stuck inside a transaction (its process paused)
delays others by at most the lock limit and is ended by the server after the idle limit. Real
PostgreSQL, real time (the server's own timers)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from bot.clock import VirtualClock
from bot.config import load_settings
from bot.db import SessionTimeouts, create_engine
from bot.errors import ConfigError, StoreError
from bot.model import LEVELS
from bot.queue.store import QueueStore
from tests.support.factories import decide, make_request, plans
from tests.support.serving import wait_until


async def test_every_session_runs_under_the_limits(db_url: str) -> None:
    engine = create_engine(db_url, timeouts=SessionTimeouts(60.0, 10.0, 30.0))
    try:
        async with engine.connect() as conn:
            shown = [
                (await conn.execute(text(f"SHOW {name}"))).scalar_one()
                for name in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                )
            ]
    finally:
        await engine.dispose()
    assert shown == ["1min", "10s", "30s"]


def test_the_limits_are_settings() -> None:
    settings = load_settings(
        {
            "REVIEW_BOT_DB_STATEMENT_TIMEOUT_S": "5",
            "REVIEW_BOT_DB_LOCK_TIMEOUT_S": "0",
            "REVIEW_BOT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S": "2.5",
        }
    )
    assert (
        settings.database.statement_timeout_s,
        settings.database.lock_timeout_s,
        settings.database.idle_in_transaction_timeout_s,
    ) == (5.0, 0.0, 2.5)
    with pytest.raises(ConfigError, match="REVIEW_BOT_DB_LOCK_TIMEOUT_S"):
        load_settings({"REVIEW_BOT_DB_LOCK_TIMEOUT_S": "-1"})


@pytest.fixture
async def quick_store(db_url: str) -> AsyncIterator[QueueStore]:
    store = QueueStore.from_url(db_url, timeouts=SessionTimeouts(lock_s=0.3))
    try:
        yield store
    finally:
        await store.close()


async def test_a_session_paused_inside_a_transaction_holds_nobody_hostage(
    db_url: str, quick_store: QueueStore, clock: VirtualClock
) -> None:
    submitted = await quick_store.submit_request(make_request(), decide(), now=clock.now())
    assert submitted.job_id is not None
    await quick_store.plan_job(submitted.job_id, plans(10), now=clock.now())
    leased = await quick_store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
    assert leased is not None
    await quick_store.finish_chunk(
        leased.chunk.id, owner="w", now=clock.now(), gpu_seconds=1.0, result={}
    )
    # Another process's session locks the job's row and stops (SIGSTOP, a GC pause, a frozen VM).
    paused = create_engine(db_url, timeouts=SessionTimeouts(idle_in_transaction_s=1.0))
    try:
        conn = await paused.connect()
        await conn.execute(
            text("SELECT id FROM review_jobs WHERE id = :id FOR UPDATE"), {"id": submitted.job_id}
        )
        started = time.monotonic()
        with pytest.raises(StoreError):
            await quick_store.claim_posting(
                submitted.job_id, owner="live", now=clock.now(), lease_s=60
            )
        waited_s = time.monotonic() - started
        assert waited_s < 1.0, f"a lock waited {waited_s:.2f} s, beyond the lock limit"

        async def claimed() -> bool:
            try:
                fence = await quick_store.claim_posting(
                    submitted.job_id, owner="live", now=clock.now(), lease_s=60
                )
            except StoreError:
                return False
            return fence is not None

        # The server ends the idle session after its limit; its lock goes with it.
        await wait_until(claimed, timeout_s=10, what="the paused session's lock to be freed")
        freed_s = time.monotonic() - started
        assert 0.9 <= freed_s < 5.0, freed_s
        await conn.invalidate()
    finally:
        await paused.dispose()
