"""Wait alerts: the pure decision, once per job across processes, the webhook and its limit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import text

from bot.clock import EPOCH, VirtualClock
from bot.config import AlertSettings
from bot.db import create_engine
from bot.model import Level
from bot.obs.alerts import (
    Alert,
    AlertMonitor,
    WaitingJob,
    decide_alerts,
    render_webhook_payload,
    setup_alerts,
    webhook_due,
)
from bot.obs.metrics import Metrics
from bot.queue.connector import Connector
from bot.queue.monitoring import MonitoringRecords
from bot.queue.store import QueueStore
from bot.sched.presence import Presence
from tests.support.factories import decide, make_request, plans

THRESHOLDS = {Level.P0: 10.0, Level.P1: 60.0, Level.P2: 300.0}
ServerMaker = Callable[..., Awaitable[TestServer]]


# --- pure ----------------------------------------------------------------------------------


def _waiting(job_id: int, level: Level, waited_s: float) -> WaitingJob:
    return WaitingJob(
        job_id=job_id, level=level, ready_at=EPOCH - timedelta(seconds=waited_s), repo="a/b"
    )


def test_decide_alerts_per_level_threshold() -> None:
    waiting = [
        _waiting(1, Level.P0, 10.0),  # exactly at the threshold: not yet
        _waiting(2, Level.P0, 10.5),
        _waiting(3, Level.P1, 59.0),
        _waiting(4, Level.P1, 61.0),
        _waiting(5, Level.P2, 301.0),
        _waiting(6, Level.P3, 86400.0),  # P3 has no threshold
        _waiting(7, Level.P0, 50.0),  # alerted before
    ]
    alerts = decide_alerts(waiting, now=EPOCH, thresholds=THRESHOLDS, alerted={7})
    assert [(a.job_id, a.level, a.threshold_s) for a in alerts] == [
        (2, Level.P0, 10.0),
        (4, Level.P1, 60.0),
        (5, Level.P2, 300.0),
    ]
    assert alerts[0].waited_s == pytest.approx(10.5)
    assert "P0 review" in alerts[0].message and "job 2" in alerts[0].message


def test_webhook_rate_limit_and_batching() -> None:
    assert webhook_due(last_sent_at=None, now=EPOCH, min_interval_s=30)
    assert not webhook_due(
        last_sent_at=EPOCH, now=EPOCH + timedelta(seconds=29.9), min_interval_s=30
    )
    assert webhook_due(last_sent_at=EPOCH, now=EPOCH + timedelta(seconds=30), min_interval_s=30)
    alerts = [
        Alert(job_id=i, level=Level(i % 3), waited_s=100.0 + i, threshold_s=10.0, message=f"m{i}")
        for i in range(25)
    ]
    payload = render_webhook_payload(alerts, max_lines=20)
    lines = payload["text"].splitlines()
    assert list(payload) == ["text"]
    assert lines[0] == "review-bot: 25 review(s) waiting past their threshold"
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "… and 5 more"
    assert lines[1] == "• m24"  # P0 first, the longest wait first


# --- against the database ------------------------------------------------------------------


async def _submit(store: QueueStore, number: int, level: Level, clock: VirtualClock) -> int:
    result = await store.submit_request(
        make_request(number=number, head_sha=f"{number:040x}"), decide(level), now=clock.now()
    )
    assert result.job_id is not None
    return result.job_id


async def _alert_rows(connector: Connector) -> list[Any]:
    return await connector.fetch_all(text("SELECT job_id, level, waited_s FROM alerts"))


@pytest.fixture
async def connectors(db_url: str) -> AsyncIterator[tuple[Connector, Connector]]:
    """Two connectors on one database, each with its own pool: two processes' alert loops."""
    first = Connector(create_engine(db_url, pool_size=2))
    second = Connector(create_engine(db_url, pool_size=2))
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


def _alerts_counted(metrics: Metrics, level: str) -> float:
    value = metrics.registry.get_sample_value("review_bot_wait_alerts_total", {"level": level})
    return value or 0.0


async def test_alert_fires_while_waiting_exactly_once_across_two_loops(
    store: QueueStore,
    clock: VirtualClock,
    connectors: tuple[Connector, Connector],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = AlertSettings(threshold_s=THRESHOLDS)
    metrics = (Metrics(), Metrics())
    monitors = [
        AlertMonitor(monitoring=MonitoringRecords(connector), settings=settings, metrics=m)
        for connector, m in zip(connectors, metrics, strict=True)
    ]
    hotfix = await _submit(store, 1, Level.P0, clock)
    ordinary = await _submit(store, 2, Level.P1, clock)
    started = await _submit(store, 3, Level.P0, clock)
    await store.plan_job(started, plans(10), now=clock.now())
    clock.advance(5)
    chunk = await store.fetch_chunk(levels=[Level.P0], owner="w1", now=clock.now(), lease_s=60.0)
    assert chunk is not None and chunk.chunk.job_id == started

    clock.advance(4)  # 9 s: nothing is due
    assert [await m.run_once(now=clock.now()) for m in monitors] == [[], []]

    clock.advance(2)  # 11 s: the hotfix is past 10 s and has not started
    with caplog.at_level(logging.WARNING, logger="bot.obs.alerts"):
        fired = await asyncio.gather(*(m.run_once(now=clock.now()) for m in monitors))
    assert sorted(alert.job_id for alerts in fired for alert in alerts) == [hotfix]
    job = await store.get_job(hotfix)
    assert job is not None and job.first_started_at is None, "it fired while still waiting"
    records = [r for r in caplog.records if getattr(r, "action", None) == "wait_alert"]
    assert [(r.job_id, r.level) for r in records] == [(hotfix, "P0")]  # type: ignore[attr-defined]
    assert sum(_alerts_counted(m, "P0") for m in metrics) == 1

    clock.advance(50)  # 61 s: the P1 job too; the hotfix not again
    fired = await asyncio.gather(*(m.run_once(now=clock.now()) for m in monitors))
    assert sorted(alert.job_id for alerts in fired for alert in alerts) == [ordinary]
    clock.advance(600)
    fired = await asyncio.gather(*(m.run_once(now=clock.now()) for m in monitors))
    assert fired == [[], []]
    rows = await _alert_rows(connectors[0])
    assert sorted((row.job_id, row.level) for row in rows) == [(hotfix, 0), (ordinary, 1)]
    assert {row.job_id: row.waited_s for row in rows}[hotfix] == pytest.approx(11.0)
    assert sum(_alerts_counted(m, "P1") for m in metrics) == 1


async def _dispatcher_alive(store: QueueStore, clock: VirtualClock) -> None:
    """A dispatcher's heartbeat at the clock's now (fresh for three heartbeats)."""
    presence = Presence(store.monitoring, name="d1", slots=2, engines=lambda: [], running=lambda: 0)
    await presence.beat(now=clock.now())


class Receiver:
    """A loopback Slack-compatible webhook that records what it is sent."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.fail_next = 0
        self.received = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        if self.fail_next:
            self.fail_next -= 1
            return web.Response(status=500, text="boom")
        self.messages.append(await request.json())
        self.received.set()
        return web.Response(text="ok")


@pytest.fixture
async def receiver(aiohttp_server: ServerMaker) -> tuple[Receiver, str]:
    hook = Receiver()
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    server = await aiohttp_server(app)
    return hook, str(server.make_url("/hook"))


async def test_webhook_posts_batched_and_rate_limited(
    store: QueueStore,
    clock: VirtualClock,
    connectors: tuple[Connector, Connector],
    receiver: tuple[Receiver, str],
) -> None:
    hook, url = receiver
    await _dispatcher_alive(store, clock)  # these posts are about waits, not a missing dispatcher
    settings = AlertSettings(threshold_s=THRESHOLDS, webhook_url=url, min_interval_s=30.0)
    metrics = Metrics()
    async with aiohttp.ClientSession() as session:
        monitor = AlertMonitor(
            monitoring=MonitoringRecords(connectors[0]),
            settings=settings,
            metrics=metrics,
            session=session,
        )
        first = [await _submit(store, n, Level.P0, clock) for n in (10, 11)]
        clock.advance(11)
        assert len(await monitor.run_once(now=clock.now())) == 2
        assert len(hook.messages) == 1  # two alerts, one message
        assert all(f"job {job_id})" in hook.messages[0]["text"] for job_id in first)

        late = await _submit(store, 12, Level.P0, clock)
        clock.advance(11)  # 22 s: due, but only 11 s after the last post
        assert [a.job_id for a in await monitor.run_once(now=clock.now())] == [late]
        assert len(hook.messages) == 1 and len(monitor.pending) == 1

        hook.fail_next = 1
        clock.advance(19)  # 41 s: the interval has passed; the receiver fails once
        await monitor.run_once(now=clock.now())
        assert len(hook.messages) == 1 and len(monitor.pending) == 1
        clock.advance(10)  # the failed post also counts against the limit
        await monitor.run_once(now=clock.now())
        assert len(hook.messages) == 1
        clock.advance(20)  # 71 s: 30 s after the failed try
        await monitor.run_once(now=clock.now())
    assert len(hook.messages) == 2 and monitor.pending == []
    assert f"job {late})" in hook.messages[1]["text"]
    assert hook.messages[1]["text"].startswith("review-bot: 1 review(s)")
    sent = metrics.registry.get_sample_value("review_bot_alert_posts_total", {"outcome": "sent"})
    failed = metrics.registry.get_sample_value(
        "review_bot_alert_posts_total", {"outcome": "failed"}
    )
    assert (sent, failed) == (2.0, 1.0)


async def test_alert_loop_runs_as_cleanup_ctx(
    store: QueueStore, clock: VirtualClock, db_url: str, receiver: tuple[Receiver, str]
) -> None:
    hook, url = receiver
    await _dispatcher_alive(store, clock)
    job_id = await _submit(store, 20, Level.P0, clock)
    clock.advance(30)
    connector = Connector(create_engine(db_url, pool_size=2))
    app = web.Application()
    setup_alerts(
        app,
        monitoring=MonitoringRecords(connector),
        settings=AlertSettings(threshold_s=THRESHOLDS, webhook_url=url),
        clock=clock,
        interval_s=0.02,
    )
    server = TestServer(app)
    await server.start_server()
    try:
        # The loop ticks on real time (every 20 ms); the time it reads is virtual.
        await asyncio.wait_for(hook.received.wait(), timeout=10)
    finally:
        await server.close()
        await connector.close()
    assert [row.job_id for row in await _alert_rows(store.connector)] == [job_id]
    assert len(hook.messages) == 1 and "waited 30 s" in hook.messages[0]["text"]
