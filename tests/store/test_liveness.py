"""Dispatcher heartbeats: who is alive, in /healthz, /metrics and /admin, and the alert when
work waits with no dispatcher alive."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import text

from bot.app import create_app
from bot.clock import EPOCH, VirtualClock
from bot.config import AlertSettings, ForgeSettings, Settings, WebSettings
from bot.llm.openai_compat import OpenAICompatBackend
from bot.llm.simulated import SimulatedBackend
from bot.model import Level
from bot.obs.alerts import AlertMonitor, render_webhook_payload
from bot.obs.liveness import (
    DispatcherBeat,
    no_dispatcher_message,
    read_liveness,
    summarize_liveness,
)
from bot.obs.metrics import Metrics
from bot.queue.store import QueueStore
from bot.review.chunk_review import chunk_reviewer
from bot.sched.dispatcher import Dispatcher, DispatcherSettings
from bot.sched.presence import Presence, backend_engines
from tests.support.factories import decide, make_request
from tests.support.web import ClientMaker

THRESHOLDS = {Level.P0: 10.0, Level.P1: 60.0, Level.P2: 300.0}
STALE_S = 90.0
ServerMaker = Callable[..., Awaitable[TestServer]]


# --- pure ----------------------------------------------------------------------------------


def _beat(name: str, seen_s_ago: float, engines: dict[str, bool], **extra: Any) -> DispatcherBeat:
    return DispatcherBeat(
        name=name, last_seen=EPOCH - timedelta(seconds=seen_s_ago), engines=engines, **extra
    )


def test_alive_dispatchers_and_engines_counted_once() -> None:
    beats = [
        _beat("a", 10, {"http://gpu1": True, "http://gpu2": False}),
        _beat("b", 89, {"http://gpu1": True, "http://gpu2": True, "http://gpu3": False}),
        _beat("stale", 91, {"http://gpu4": True}),
        _beat("stopped", 1, {"http://gpu5": True}, stopped_at=EPOCH),
    ]
    liveness = summarize_liveness(beats, now=EPOCH, stale_after_s=STALE_S)
    # gpu2 is ejected at a but in rotation at b: alive; gpu4/gpu5 belong to dead dispatchers.
    assert (liveness.dispatchers, liveness.engines, liveness.engines_known) == (2, 2, 3)
    assert liveness.to_dict() == {"dispatchers_alive": 2, "engines_alive": 2, "engines_known": 3}
    empty = summarize_liveness([], now=EPOCH, stale_after_s=STALE_S)
    assert (empty.dispatchers, empty.engines) == (0, 0)


def test_no_dispatcher_message_waits_for_one_stale_window_of_watching() -> None:
    none = summarize_liveness([], now=EPOCH, stale_after_s=6.0)

    def message(watched_s: float) -> str | None:
        return no_dispatcher_message(
            none,
            waiting_jobs=7,
            oldest_wait_s=300.0,
            grace_s=10.0,
            watched_s=watched_s,
            stale_after_s=6.0,
        )

    assert message(0.0) is None  # just started: a dispatcher beside it may not have beaten
    assert message(5.9) is None
    assert message(6.0) is not None


async def test_a_monitor_started_beside_its_dispatcher_raises_no_false_alarm(
    store: QueueStore, clock: VirtualClock
) -> None:
    """Work already waits when the web process starts, and the dispatcher started with it has
    not beaten yet: no alert; it beats within the window and none is raised after either."""
    settings = AlertSettings(threshold_s=THRESHOLDS)
    await store.submit_request(make_request(number=5), decide(Level.P1), now=clock.now())
    clock.advance(120)  # waiting long past every threshold
    monitor = AlertMonitor(monitoring=store.monitoring, settings=settings, dispatcher_stale_s=6.0)
    assert await monitor.check_dispatchers(now=clock.now()) is None
    clock.advance(2)
    await _presence(store, "host-1", []).beat(now=clock.now())
    clock.advance(5)
    assert await monitor.check_dispatchers(now=clock.now()) is None  # alive: no alarm
    clock.advance(30)  # the dispatcher died: three heartbeats passed without a beat
    message = await monitor.check_dispatchers(now=clock.now())
    assert message is not None and "no dispatcher is alive and 1 review(s)" in message


def test_no_dispatcher_message_only_when_work_waits_past_the_grace() -> None:
    none = summarize_liveness([], now=EPOCH, stale_after_s=STALE_S)
    some = summarize_liveness([_beat("a", 1, {})], now=EPOCH, stale_after_s=STALE_S)
    assert no_dispatcher_message(none, waiting_jobs=0, oldest_wait_s=0, grace_s=10) is None
    assert no_dispatcher_message(none, waiting_jobs=2, oldest_wait_s=9, grace_s=10) is None
    assert no_dispatcher_message(some, waiting_jobs=2, oldest_wait_s=99, grace_s=10) is None
    message = no_dispatcher_message(none, waiting_jobs=2, oldest_wait_s=11, grace_s=10)
    assert message is not None and message.startswith("no dispatcher is alive and 2 review(s)")
    payload = render_webhook_payload([], notes=[message])
    assert payload == {"text": "review-bot: " + message}


async def test_backend_engines_name_each_server_and_its_rotation() -> None:
    backend = OpenAICompatBackend(["http://gpu1:8000", "http://gpu2:8000"], model="m")
    try:
        backend.workers[1].healthy = False
        engines = backend_engines(backend)
    finally:
        await backend.close()
    assert [(engine["alive"]) for engine in engines] == [True, False]
    assert all(engine["name"].startswith("http://gpu") for engine in engines)
    assert backend_engines(SimulatedBackend()) == [{"name": "SimulatedBackend", "alive": True}]


# --- the database and the web role ---------------------------------------------------------


def _presence(store: QueueStore, name: str, engines: list[dict[str, Any]]) -> Presence:
    return Presence(
        store.monitoring, name=name, slots=4, engines=lambda: engines, running=lambda: 1
    )


async def test_heartbeats_come_and_go(store: QueueStore, clock: VirtualClock) -> None:
    first = _presence(store, "host-1", [{"name": "http://gpu1", "alive": True}])
    second = _presence(store, "host-2", [{"name": "http://gpu1", "alive": True}])
    await first.beat(now=clock.now())
    await second.beat(now=clock.now())
    liveness = await read_liveness(store.monitoring, now=clock.now(), stale_after_s=STALE_S)
    assert (liveness.dispatchers, liveness.engines) == (2, 1)
    assert {beat.name: beat.running for beat in liveness.beats} == {"host-1": 1, "host-2": 1}
    await second.leave(now=clock.now())
    clock.advance(60)
    await first.beat(now=clock.now())
    liveness = await read_liveness(store.monitoring, now=clock.now(), stale_after_s=STALE_S)
    assert liveness.dispatchers == 1
    clock.advance(91)  # host-1 crashed after its last beat
    liveness = await read_liveness(store.monitoring, now=clock.now(), stale_after_s=STALE_S)
    assert (liveness.dispatchers, liveness.engines) == (0, 0)


async def test_each_engines_prefix_cache_hit_rate_reaches_the_dashboard(
    store: QueueStore, clock: VirtualClock
) -> None:
    from bot.obs.dashboard import DashboardView, EngineWork, render_dashboard
    from bot.obs.metrics import read_queue_snapshot

    older = _presence(
        store,
        "host-1",
        [
            {"name": "http://gpu1", "alive": True, "prefix_cache_hit_rate": 0.25},
            {"name": "http://gpu2", "alive": True, "prefix_cache_hit_rate": None},
        ],
    )
    await older.beat(now=clock.now())
    clock.advance(5)
    newer = _presence(
        store, "host-2", [{"name": "http://gpu1", "alive": True, "prefix_cache_hit_rate": 0.75}]
    )
    await newer.beat(now=clock.now())
    liveness = await read_liveness(store.monitoring, now=clock.now(), stale_after_s=STALE_S)
    # The freshest report wins; an engine whose server says nothing has no rate.
    assert liveness.prefix_cache_hit_rate == {"http://gpu1": 0.75}
    now = clock.now()
    page = render_dashboard(
        DashboardView(
            now=now,
            since=now - timedelta(hours=1),
            queue=await read_queue_snapshot(store.monitoring, now=now),
            waits=[],
            alerts=[],
            engines=[
                EngineWork("http://gpu1", chunks=3, busy_s=9.0, tokens=300,
                           prefix_cache_hit_rate=0.75),
                EngineWork("http://gpu2", chunks=1, busy_s=2.0, tokens=40),
            ],
        )
    )  # fmt: skip
    assert "<th>prefix cache hits</th>" in page
    assert "<td>75%</td></tr>" in page and "<td>-</td></tr>" in page


async def test_a_running_dispatcher_beats_and_says_goodbye(store: QueueStore, db_url: str) -> None:
    clock = VirtualClock()
    backend = SimulatedBackend()
    dispatcher = Dispatcher(
        store,
        backend,
        plan_jobs=_plan_nothing,
        reviewer=chunk_reviewer(backend),
        settings=DispatcherSettings(owner="dispatch-test", slots=3, heartbeat_s=0.05, poll_s=0.05),
        clock=clock,
    )
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        for _ in range(200):  # the loop beats on real time; wait for its first row
            liveness = await read_liveness(store.monitoring, now=clock.now(), stale_after_s=STALE_S)
            if liveness.dispatchers:
                break
            await asyncio.sleep(0.02)
        assert (liveness.dispatchers, liveness.engines) == (1, 1)
        assert [(beat.name, beat.slots) for beat in liveness.beats] == [("dispatch-test", 3)]
    finally:
        dispatcher.stop()
        await runner
    liveness = await read_liveness(store.monitoring, now=clock.now(), stale_after_s=STALE_S)
    assert liveness.dispatchers == 0 and liveness.beats[0].stopped_at is not None


async def _plan_nothing(now: Any, estimator: Any, backlogged: Any) -> list[Any]:
    return []  # no job is submitted in this test


SETTINGS = Settings(
    forges=ForgeSettings(github_webhook_secret="s", gitlab_webhook_token="t"),
    web=WebSettings(admin_token="admin-secret"),
)


async def test_healthz_metrics_and_dashboard_say_who_is_alive(
    store: QueueStore, aiohttp_client: ClientMaker, clock: VirtualClock
) -> None:
    client = await aiohttp_client(create_app(SETTINGS, store=store, clock=clock))
    health = await (await client.get("/healthz")).json()
    assert health["status"] == "ok"
    assert (health["dispatchers_alive"], health["engines_alive"]) == (0, 0)
    assert health["warning"].startswith("no dispatcher is alive")
    page = await (await client.get("/admin", headers=_admin())).text()
    assert 'id="liveness" class="alarm"' in page and "no dispatcher takes work" in page

    engines = [{"name": "http://gpu1", "alive": True}, {"name": "http://gpu2", "alive": False}]
    await _presence(store, "host-1", engines).beat(now=clock.now())
    response = await client.get("/healthz")
    health = await response.json()
    assert response.status == 200
    assert (health["dispatchers_alive"], health["engines_alive"], health["engines_known"]) == (
        1,
        1,
        2,
    )
    assert "warning" not in health
    metrics = await (await client.get("/metrics")).text()
    assert "review_bot_dispatchers_alive 1.0" in metrics
    assert "review_bot_engines_alive 1.0" in metrics
    page = await (await client.get("/admin", headers=_admin())).text()
    assert "dispatchers alive: <b>1</b>" in page and "engines in rotation: <b>1</b> of 2" in page

    clock.advance(STALE_S + 1)
    metrics = await (await client.get("/metrics")).text()
    assert "review_bot_dispatchers_alive 0.0" in metrics


def _admin() -> dict[str, str]:
    return {"Authorization": "Bearer admin-secret"}


class _Hook:
    def __init__(self) -> None:
        self.messages: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.messages.append((await request.json())["text"])
        return web.Response(text="ok")


async def test_alert_when_work_waits_and_no_dispatcher_is_alive(
    store: QueueStore, clock: VirtualClock, aiohttp_server: ServerMaker, db_url: str
) -> None:
    hook = _Hook()
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    server = await aiohttp_server(app)
    settings = AlertSettings(
        threshold_s=THRESHOLDS, webhook_url=str(server.make_url("/hook")), min_interval_s=0
    )
    metrics = Metrics()
    await store.submit_request(make_request(number=1), decide(Level.P2), now=clock.now())
    async with aiohttp.ClientSession() as session:
        monitors = [
            AlertMonitor(
                monitoring=store.monitoring,
                settings=settings,
                metrics=metrics,
                session=session,
                dispatcher_stale_s=6.0,
            ),
            AlertMonitor(
                monitoring=store.monitoring,
                settings=settings,
                session=session,
                dispatcher_stale_s=6.0,
            ),
        ]
        assert [await m.check_dispatchers(now=clock.now()) for m in monitors] == [None, None]
        clock.advance(9)  # not past the smallest threshold yet
        assert [await m.check_dispatchers(now=clock.now()) for m in monitors] == [None, None]
        clock.advance(2)
        first = await monitors[0].check_dispatchers(now=clock.now())
        again = await monitors[1].check_dispatchers(now=clock.now())
        assert first is not None and "no dispatcher is alive and 1 review(s)" in first
        assert again is None  # once per outage, whichever process saw it first
        await monitors[0].flush(now=clock.now())
        assert hook.messages == ["review-bot: " + first]
        clock.advance(60)
        assert await monitors[0].check_dispatchers(now=clock.now()) is None  # still open

        await _presence(store, "host-1", []).beat(now=clock.now())
        assert await monitors[1].check_dispatchers(now=clock.now()) is None
        await monitors[1].flush(now=clock.now())
        assert hook.messages[-1] == "review-bot: a dispatcher is alive again (1 now)"
    async with store.engine.connect() as conn:
        rows = (await conn.execute(text("SELECT kind, resolved_at FROM operational_alerts"))).all()
    assert [(row.kind, row.resolved_at) for row in rows] == [("no_dispatcher", clock.now())]
    counted = metrics.registry.get_sample_value(
        "review_bot_service_alerts_total", {"kind": "no_dispatcher"}
    )
    assert counted == 1.0
