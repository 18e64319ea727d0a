"""Intake and planning wake their listeners after the write commits, in a NOTIFY of its own
(bot/queue/wakeups.py): the write's commit never waits on PostgreSQL's notify lock, and the
listeners still hear of every new job and every stored plan, on real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg

from bot.database_url import plain_url
from bot.model import Level
from bot.queue.connector import QUEUE_CHANNEL, STATUS_CHANNEL
from bot.queue.store import QueueSettings, QueueStore
from tests.support.factories import decide, make_request, plans

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


class Heard:
    """Every NOTIFY on the store's channels, as (channel, payload), on a connection of its own."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    def __call__(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        self.notifications.append((channel, payload))
        self.changed.set()

    async def until(self, count: int) -> list[tuple[str, str]]:
        while len(self.notifications) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=5)
        return self.notifications


async def test_a_new_job_wakes_the_planner_and_the_publisher_after_its_commit(
    db_url: str,
) -> None:
    store = QueueStore.from_url(db_url, settings=QueueSettings(notify=True))
    heard = Heard()
    listener = await asyncpg.connect(plain_url(db_url))
    try:
        for channel in (QUEUE_CHANNEL, STATUS_CHANNEL):
            await listener.add_listener(channel, heard)
        result = await store.submit_request(make_request(number=3), decide(Level.P1), now=NOW)
        assert result.created
        # The insert itself NOTIFYs nothing (the status trigger's payload would be the job id):
        # both wake-ups are the connector's own, sent once the job was committed.
        assert sorted(await heard.until(2)) == [(QUEUE_CHANNEL, "wake"), (STATUS_CHANNEL, "wake")]
        assert result.job_id is not None
        assert await store.plan_job(int(result.job_id), plans(3), now=NOW)
        assert (await heard.until(3))[2] == (QUEUE_CHANNEL, "wake")
    finally:
        await listener.close()
        await store.close()


async def test_without_notifications_a_new_job_still_wakes_the_publisher(db_url: str) -> None:
    """`notify=False` turns off the dispatchers' wake-ups only; the publisher's were never
    optional (the status trigger's NOTIFY on insert is what intake's wake-up replaces)."""
    store = QueueStore.from_url(db_url, settings=QueueSettings(notify=False))
    heard = Heard()
    listener = await asyncpg.connect(plain_url(db_url))
    try:
        for channel in (QUEUE_CHANNEL, STATUS_CHANNEL):
            await listener.add_listener(channel, heard)
        await store.submit_request(make_request(number=4), decide(Level.P2), now=NOW)
        assert await heard.until(1) == [(STATUS_CHANNEL, "wake")]
    finally:
        await listener.close()
        await store.close()


async def test_a_state_change_still_wakes_the_publisher_from_the_trigger(db_url: str) -> None:
    store = QueueStore.from_url(db_url, settings=QueueSettings(notify=False))
    heard = Heard()
    listener = await asyncpg.connect(plain_url(db_url))
    try:
        result = await store.submit_request(make_request(number=5), decide(Level.P1), now=NOW)
        assert result.job_id is not None
        await store.connector.wakeups.drain()  # intake's own wake-up is not what this hears
        await listener.add_listener(STATUS_CHANNEL, heard)
        request = make_request(number=5)
        await store.cancel_pull(
            forge=request.forge, repo=request.repo, number=5, now=NOW, reason="closed", actor="t"
        )
        assert await heard.until(1) == [(STATUS_CHANNEL, str(result.job_id))]
    finally:
        await listener.close()
        await store.close()
