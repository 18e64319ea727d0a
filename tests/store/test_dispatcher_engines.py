"""The live dispatcher with engines: windows of chunks per LLM server on real PostgreSQL,
through the openai backend to loopback servers that count what runs on them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
import sqlalchemy as sa
from aiohttp import web

from bot.clock import SystemClock
from bot.config import WindowSettings
from bot.llm.openai_compat import OpenAICompatBackend
from bot.model import FileChange, JobState, Level
from bot.obs.metrics import Metrics
from bot.pipeline import build_pipeline
from bot.queue.store import QueueStore
from bot.review.planner import PlanningSettings
from bot.sched.dispatcher import Dispatcher, DispatcherSettings
from bot.sched.engine_pool import EnginePool
from bot.sched.mlfq import MlfqSettings
from bot.sim.forge import added_lines_patch, memory_forges
from tests.support.factories import decide, make_request

pytestmark = pytest.mark.slow

ANSWER = json.dumps({"findings": [], "summary": "Nothing to report."})


class CountingServer:
    """A loopback chat-completions server that answers after `delay_s` and counts what runs.

    With `shared`, it is compute-bound: the calls in flight share it, so a call's `delay_s`
    of work takes `delay_s` alone and n times that beside n - 1 others. A client that hangs
    up ends its call at once, as vLLM aborts a sequence on disconnect.
    """

    def __init__(
        self, delay_s: float, *, refuse_above: int | None = None, shared: bool = False
    ) -> None:
        self.delay_s = delay_s
        self.refuse_above = refuse_above
        self.shared = shared
        self.p0_latencies: list[float] = []
        self.in_flight = 0
        self.most = 0
        self.served = 0
        self.refused = 0
        self.priorities: list[int] = []
        self.max_tokens: set[int] = set()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.refuse_above is not None and self.in_flight >= self.refuse_above:
            self.refused += 1
            return web.json_response({"error": {"message": "too many requests"}}, status=429)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.priorities.append(int(body.get("priority", -1)))
        self.max_tokens.add(int(body["max_tokens"]))
        started = asyncio.get_running_loop().time()
        try:
            if self.shared:
                # The time that really passed is shared, not the tick asked for: a loaded
                # machine wakes a sleeper late, and counting ticks would bill it as work.
                loop = asyncio.get_running_loop()
                left, last = self.delay_s, loop.time()
                while left > 0:
                    await asyncio.sleep(0.01)
                    now = loop.time()
                    left -= (now - last) / max(1, self.in_flight)
                    last = now
            else:
                await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if int(body.get("priority", -1)) == 0:
            self.p0_latencies.append(asyncio.get_running_loop().time() - started)
        self.served += 1
        return web.json_response(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 500, "completion_tokens": 40},
            }
        )

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


# Every change is one 20-line file: one chunk a review.
FORGES = memory_forges(SystemClock())


async def _submit(store: QueueStore, number: int, level: Level = Level.P1) -> int:
    head_sha = f"{number:040d}"
    files = [FileChange("src/app.py", additions=20, patch=added_lines_patch(20))]
    FORGES["github"].add_change("acme/payments", number, files, head_sha=head_sha)
    result = await store.submit_request(
        make_request(number=number, head_sha=f"{number:040d}", additions=20, deletions=0),
        decide(level, "hotfix" if level == Level.P0 else "ordinary pull request"),
        now=SystemClock().now(),
    )
    assert result.job_id is not None
    return result.job_id


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.02)


async def _all_done(store: QueueStore, job_ids: list[int]) -> bool:
    for job_id in job_ids:
        job = await store.get_job(job_id)
        if job is None or job.state != JobState.DONE:
            return False
    return True


def _dispatcher(
    store: QueueStore, servers: list[CountingServer], window: WindowSettings, **kwargs: object
) -> Dispatcher:
    # Short backoffs, and no server taken out of rotation for refusing: the window answers it.
    backend = OpenAICompatBackend(
        [s.url for s in servers],
        model="m",
        max_retries=2,
        backoff_max_s=0.3,
        failures_to_eject=1000,
    )
    pool = EnginePool.build(
        [s.url for s in servers],
        window,
        now=SystemClock().now(),
        metrics=kwargs.pop("metrics", None),  # type: ignore[arg-type]
    )
    return build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        dispatcher=DispatcherSettings(
            owner="d1", slots=1, poll_s=0.2, lease_s=60.0, mlfq=MlfqSettings(reserved_slots=0)
        ),
        planning=PlanningSettings(line_budget=400, backlog_line_budget=None),
        engines=pool,
        answer_tokens=256,
    ).dispatcher


async def test_each_engine_runs_a_window_of_chunks_and_no_more(db_url: str) -> None:
    store = QueueStore.from_url(db_url)
    servers = [CountingServer(0.3), CountingServer(0.3)]
    for server in servers:
        await server.start()
    metrics = Metrics()
    window = WindowSettings(floor=3, ceiling=3, initial=3)
    dispatcher = _dispatcher(store, servers, window, metrics=metrics)
    # Plain slots say 1; the engines' windows (3 + 3) are what counts.
    assert dispatcher.total_slots == 6
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        jobs = [await _submit(store, number) for number in range(1, 19)]
        await _until(lambda: _all_done(store, jobs), timeout_s=30.0)
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await dispatcher.backend.close()
    for server in servers:
        assert server.most == 3  # the window filled, and never more
        assert server.max_tokens == {256}  # the configured answer budget
        assert server.served >= 6  # both engines did their share
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.text(
                    "SELECT engine, count(*), sum(gpu_seconds),"
                    " sum(extract(epoch FROM finished_at - started_at))"
                    " FROM review_chunks GROUP BY 1"
                )
            )
        ).all()
    assert {row[0] for row in rows} == {s.url for s in servers}
    # Each chunk is charged its share of the engine, not its latency: the charges add up to
    # the time the engines were busy, far less than the chunks' own times added up, since the
    # windows filled and the calls overlapped. (On a loaded machine a call takes longer
    # than the server's 0.3 s, so the chunks' recorded times are the measure, not 18 x 0.3 s.)
    total_gpu_s = sum(float(row[2]) for row in rows)
    chunk_times_s = sum(float(row[3]) for row in rows)
    assert dispatcher.engines is not None
    engines = [dispatcher.engines.by_name(server.url) for server in servers]
    busy_s = sum(engine.busy_s for engine in engines if engine is not None)
    assert None not in engines
    assert total_gpu_s == pytest.approx(busy_s, rel=0.01, abs=0.01)
    # About a third with three calls at a time; a chunk charged its own latency would be ~1.
    assert total_gpu_s < 0.7 * chunk_times_s
    exposition = metrics.render().decode()
    assert f'review_bot_engine_window{{engine="{servers[0].url}"}} 3.0' in exposition
    assert dispatcher.engines is not None
    first = dispatcher.engines.by_name(servers[0].url)
    assert first is not None
    companions = float(first.p0_companions)
    assert (
        f'review_bot_engine_p0_companions{{engine="{servers[0].url}"}} {companions}' in exposition
    )
    assert "review_bot_engine_busy_seconds_total" in exposition
    await store.close()
    for server in servers:
        await server.stop()


async def test_a_p0_review_takes_a_place_above_a_full_window_without_preempting(
    db_url: str,
) -> None:
    store = QueueStore.from_url(db_url)
    # Four-second calls: the P0's call must reach the server while both window calls still
    # run; with two-second calls a loaded make test once sent it after they had ended.
    server = CountingServer(4.0)
    await server.start()
    dispatcher = _dispatcher(store, [server], WindowSettings(floor=2, ceiling=2, initial=2))
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        # The engine answers a call alone, then two at a time as fast: a P0 beside the
        # window loses nothing, so nothing is taken back for it.
        background = [await _submit(store, 1)]
        await _until(lambda: _all_done(store, background), timeout_s=20.0)
        background += [await _submit(store, number) for number in range(2, 10)]
        await _until(
            lambda: asyncio.sleep(0, result=server.served >= 3 and server.in_flight == 2),
            timeout_s=20.0,
        )
        assert dispatcher.engines is not None
        assert dispatcher.engines.engines[0].p0_companions == 2  # the whole window
        hotfix = await _submit(store, 99, Level.P0)
        await _until(lambda: _all_done(store, [hotfix]), timeout_s=10.0)
        hot = await store.get_job(hotfix)
        assert hot is not None and hot.first_started_at is not None
        # It did not wait for a two-second call to end: it ran beside the full window.
        assert (hot.first_started_at - hot.enqueued_at).total_seconds() < 1.0
        assert server.most == 3
        assert 0 in server.priorities  # sent as vLLM's priority 0
        assert dispatcher.preemptions == 0
        await _until(lambda: _all_done(store, background), timeout_s=60.0)
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await dispatcher.backend.close()
        await store.close()
        await server.stop()


async def test_a_p0_review_on_a_compute_bound_engine_runs_without_the_batch(
    db_url: str,
) -> None:
    store = QueueStore.from_url(db_url)
    # Every call is 2 s of work shared by all in flight: beside three others a P0 takes
    # 8 s, alone 2 s (a loaded machine adds a fraction of a second, not two). The window's
    # three calls take 6 s together, so the P0 is placed long before any of them answers
    # (with 1 s calls a loaded run once placed it after the first answer, pace known).
    server = CountingServer(2.0, shared=True)
    await server.start()
    dispatcher = _dispatcher(store, [server], WindowSettings(floor=3, ceiling=3, initial=3))
    assert dispatcher.engines is not None
    (engine,) = dispatcher.engines.engines
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        background = [await _submit(store, number) for number in range(1, 13)]
        await _until(lambda: asyncio.sleep(0, result=server.in_flight == 3), timeout_s=10.0)
        # Nothing answered yet: the engine's pace alone is unknown, so the P0 runs alone.
        assert engine.pace == {}
        hotfix = await _submit(store, 99, Level.P0)
        await _until(lambda: _all_done(store, [hotfix]), timeout_s=10.0)
        assert dispatcher.preemptions == 3  # the whole window gave way
        assert len(server.p0_latencies) == 1 and server.p0_latencies[0] < 4.0
        await _until(lambda: _all_done(store, background), timeout_s=90.0)
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await dispatcher.backend.close()
    async with store.engine.connect() as conn:
        released = (
            await conn.execute(
                sa.text(
                    "SELECT count(*) FROM job_history"
                    " WHERE reason = 'room for a P0 call on its engine'"
                )
            )
        ).scalar()
    assert released == 3
    # Every background review was still reviewed once (each is one chunk).
    assert server.served == 12 + 1
    await store.close()
    await server.stop()


async def _settled(store: QueueStore, job_ids: list[int]) -> bool:
    for job_id in job_ids:
        job = await store.get_job(job_id)
        if job is None or job.state in (JobState.QUEUED, JobState.RUNNING, JobState.WAITING):
            return False
    return True


async def test_a_server_that_refuses_for_load_gets_a_smaller_window(db_url: str) -> None:
    store = QueueStore.from_url(db_url)
    # It takes two at a time and answers 429 above that; the window starts at eight. Calls
    # last long enough that four in flight overlap even on a loaded machine: a window that
    # sees no refusal holds (it no longer grows from a baseline unjudged), so the refusals
    # must come at four.
    busy = CountingServer(0.6, refuse_above=2)
    await busy.start()
    dispatcher = _dispatcher(store, [busy], WindowSettings(floor=1, ceiling=16, initial=8))
    assert dispatcher.engines is not None
    (engine,) = dispatcher.engines.engines
    runner = asyncio.create_task(dispatcher.run(database_url=db_url, shutdown_grace_s=1.0))
    try:
        # Work enough for the intervals the window is judged on, even when a loaded machine
        # lets fewer calls overlap (and fewer be refused) in each.
        jobs = [await _submit(store, number) for number in range(1, 41)]
        await _until(lambda: asyncio.sleep(0, result=engine.window <= 2), timeout_s=60.0)
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await dispatcher.backend.close()
        await store.close()
        await busy.stop()
    assert busy.refused > 0
    assert [window for _, window in engine.history][:2] == [8, 4]
    assert engine.last_reason == "overload"
    assert jobs
