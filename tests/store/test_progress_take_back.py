"""Room for a P0 on a live engine, chosen by progress: the dispatcher on real PostgreSQL reads
each call's streamed answer from a loopback server and takes back the calls with the most
left, never the one about to finish, and counts the answer tokens thrown away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from bot.clock import SystemClock
from bot.config import WindowSettings
from bot.llm.openai_compat import OpenAICompatBackend
from bot.model import FileChange, JobState, Level
from bot.obs.metrics import Metrics
from bot.pipeline import build_pipeline
from bot.queue.store import QueueStore
from bot.review.planner import PlanningSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.sched.engine_pool import EnginePool
from bot.sched.mlfq import MlfqSettings
from bot.sim.forge import added_lines_patch, memory_forges
from tests.support.factories import decide, make_request

pytestmark = pytest.mark.slow

ANSWER = json.dumps({"findings": [], "summary": "Nothing to report."}).ljust(100)
FORGES = memory_forges(SystemClock())
# Lower-level calls in order of arrival that stop after this many answer tokens until
# released; the others answer all 100 at once.
HELD = {3: 10, 4: 50, 5: 90}


def chunk(data: str) -> bytes:
    body = {"choices": [{"index": 0, "delta": {"content": data}, "finish_reason": None}]}
    return f"data: {json.dumps(body)}\n\n".encode()


class HoldingServer:
    """Streams one token (character) a chunk; records where each held call was hung up on."""

    def __init__(self) -> None:
        self.arrivals = 0
        self.release = asyncio.Event()
        self.held_running: dict[int, int] = {}  # arrival -> tokens sent, while it waits
        self.hung_up: dict[int, int] = {}  # arrival -> tokens sent when the client left
        self.finished: list[int] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        p0 = body.get("priority") == 0
        if not p0:
            self.arrivals += 1
        arrival = 0 if p0 else self.arrivals
        hold = HELD.get(arrival)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index, character in enumerate(ANSWER):
                if index == hold:
                    self.held_running[arrival] = index
                    await self.release.wait()
                await response.write(chunk(character))
        except asyncio.CancelledError:
            self.hung_up[arrival] = self.held_running.pop(arrival, -1)
            raise
        self.held_running.pop(arrival, None)
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await response.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        self.finished.append(arrival)
        await response.write_eof()
        return response

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


async def _submit(store: QueueStore, number: int, level: Level = Level.P1) -> int:
    files = [FileChange("src/app.py", additions=20, patch=added_lines_patch(20))]
    FORGES["github"].add_change("acme/payments", number, files, head_sha=f"{number:040d}")
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


async def _done(store: QueueStore, job_ids: list[int]) -> bool:
    for job_id in job_ids:
        job = await store.get_job(job_id)
        if job is None or job.state != JobState.DONE:
            return False
    return True


async def test_room_for_a_p0_takes_back_the_calls_with_most_left(db_url: str) -> None:
    store = QueueStore.from_url(db_url)
    server = HoldingServer()
    await server.start()
    metrics = Metrics()
    backend = OpenAICompatBackend([server.url], model="m", max_retries=0)
    # Three calls share the engine; beside a P0 only one may stay.
    window = WindowSettings(floor=3, ceiling=3, initial=3, p0_companions=1)
    pool = EnginePool.build([server.url], window, now=SystemClock().now())
    dispatcher = build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        dispatcher=DispatcherSettings(
            owner="d1", slots=1, poll_s=0.2, lease_s=60.0, mlfq=MlfqSettings(reserved_slots=0)
        ),
        planning=PlanningSettings(line_budget=400),
        engines=pool,
        metrics=metrics,
        answer_tokens=256,
    ).dispatcher
    assert dispatcher.progress is not None  # read from the backend's streams
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        background = [await _submit(store, number) for number in range(1, 6)]

        # Two answered (the engine's usual answer: 100 tokens), three held part way; the
        # client has read what was sent before each hold.
        def streamed() -> list[int]:
            return sorted(
                progress.completion_tokens
                for chunk_id in dispatcher.held
                if (progress := backend.progress(chunk_id)) is not None
            )

        await _until(lambda: asyncio.sleep(0, result=streamed() == sorted(HELD.values())), 20.0)
        assert set(server.held_running) == set(HELD)
        hotfix = await _submit(store, 99, Level.P0)
        await _until(lambda: _done(store, [hotfix]), 20.0)
        # The two with most left went; the one 90 tokens into 100 kept running.
        assert server.hung_up == {3: 10, 4: 50}
        assert set(server.held_running) == {5}
        assert dispatcher.recomputed_tokens == 60
        exposition = metrics.render().decode()
        assert "review_bot_recomputed_tokens_total 60.0" in exposition
        server.release.set()
        await _until(lambda: _done(store, background), 30.0)
    finally:
        server.release.set()
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await backend.close()
        await store.close()
        await server.stop()
    # Every review was answered once in the end, the two taken back on their second call.
    assert sorted(server.finished) == [0, 1, 2, 5, 6, 7]
