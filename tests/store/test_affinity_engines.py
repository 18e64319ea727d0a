"""Prefix affinity live: the dispatcher on real PostgreSQL keeps each review's chunks on the
loopback server that ran its first chunk, waiting for a place there rather than spilling."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
import sqlalchemy as sa
from aiohttp import web

from bot.clock import SystemClock
from bot.config import WindowSettings
from bot.llm.openai_compat import OpenAICompatBackend
from bot.model import FileChange, JobState, Level
from bot.pipeline import build_pipeline
from bot.queue.store import QueueStore
from bot.review.planner import PlanningSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.sched.engine_pool import EnginePool
from bot.sched.mlfq import MlfqSettings
from bot.sim.forge import added_lines_patch, memory_forges
from tests.support.factories import decide, make_request

pytestmark = pytest.mark.slow

ANSWER = json.dumps({"findings": [], "summary": "Nothing to report."})
FORGES = memory_forges(SystemClock())


class SlowServer:
    """Answers every call after `delay_s`, whole (not streamed), once `gate` is open."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.served = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def chat(self, request: web.Request) -> web.Response:
        await request.json()
        await self.gate.wait()
        await asyncio.sleep(self.delay_s)
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
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def _submit(store: QueueStore, number: int, files: int) -> int:
    changes = [
        FileChange(f"src/m{index}.py", additions=20, patch=added_lines_patch(20))
        for index in range(files)
    ]
    FORGES["github"].add_change("acme/payments", number, changes, head_sha=f"{number:040d}")
    result = await store.submit_request(
        make_request(number=number, head_sha=f"{number:040d}", additions=20 * files, deletions=0),
        decide(Level.P1, "ordinary pull request"),
        now=SystemClock().now(),
    )
    assert result.job_id is not None
    return result.job_id


async def _until_done(store: QueueStore, job_ids: list[int], timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        jobs = [await store.get_job(job_id) for job_id in job_ids]
        if all(job is not None and job.state == JobState.DONE for job in jobs):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"reviews {job_ids} not done within {timeout_s} s")
        await asyncio.sleep(0.05)


async def _running_engines(store: QueueStore, job_id: int) -> Counter[str | None]:
    """Review `job_id`'s running chunks by the engine the database says each runs on."""
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.text(
                    "SELECT engine FROM review_chunks WHERE job_id = :job AND state = 'running'"
                ),
                {"job": job_id},
            )
        ).all()
    return Counter(row.engine for row in rows)


async def _until_home_and_waiting(
    store: QueueStore, job_id: int, *, waiting: int, timeout_s: float
) -> str:
    """Until review `job_id` runs two chunks on one engine (its home, returned) and `waiting`
    more wait for it, leased but on no engine."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        running = await _running_engines(store, job_id)
        homes = [engine for engine in running if engine is not None]
        if len(homes) == 1 and running[homes[0]] == 2 and running[None] == waiting:
            return str(homes[0])
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"review {job_id} runs {dict(running)}")
        await asyncio.sleep(0.05)


async def _engines_by_job(store: QueueStore, job_ids: list[int]) -> dict[int, list[str]]:
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.text(
                    "SELECT job_id, engine FROM review_chunks"
                    " WHERE job_id = ANY(:ids) ORDER BY job_id, seq"
                ),
                {"ids": job_ids},
            )
        ).all()
    found: dict[int, list[str]] = {}
    for row in rows:
        found.setdefault(int(row.job_id), []).append(str(row.engine))
    return found


@pytest.mark.parametrize("prefill_s", [30.0, 0.0])
async def test_a_reviews_chunks_stay_on_the_engine_of_its_first(
    db_url: str, prefill_s: float
) -> None:
    store = QueueStore.from_url(db_url)
    servers = [SlowServer(0.3), SlowServer(0.3)]
    for server in servers:
        await server.start()
    backend = OpenAICompatBackend([s.url for s in servers], model="m", max_retries=0)
    # Two places per engine; a chunk is one 20-line file, a review four of them.
    window = WindowSettings(floor=2, ceiling=2, initial=2, affinity_prefill_s=prefill_s)
    pool = EnginePool.build([s.url for s in servers], window, now=SystemClock().now())
    dispatcher = build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        dispatcher=DispatcherSettings(
            owner="d1", slots=1, poll_s=0.2, lease_s=60.0, mlfq=MlfqSettings(reserved_slots=0)
        ),
        planning=PlanningSettings(line_budget=25, first_budget=None),
        engines=pool,
        answer_tokens=256,
    ).dispatcher
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        # One-chunk reviews first, so that each engine has answered and its pace is known.
        warm = [await _submit(store, number, files=1) for number in (1, 2)]
        await _until_done(store, warm, 20.0)
        assert all(engine.completed > 0 for engine in pool.engines)
        if prefill_s > 0:
            # The engines hold their answers while both reviews start, so what runs where is
            # seen as it stands, however slow the machine.
            for server in servers:
                server.gate.clear()
            first = await _submit(store, 10, files=4)
            # Two chunks run at its home; two wait for it, leased but on no engine.
            first_home = await _until_home_and_waiting(store, first, waiting=2, timeout_s=30.0)
            second = await _submit(store, 11, files=4)
            # The waiting chunks are not counted on the other engine, whose places are free:
            # the second review starts there at once (the rest of it waits in the queue).
            second_home = await _until_home_and_waiting(store, second, waiting=0, timeout_s=30.0)
            assert first_home != second_home
            for server in servers:
                server.gate.set()
            reviews = [first, second]
        else:
            reviews = [await _submit(store, number, files=4) for number in (10, 11)]
        await _until_done(store, reviews, 60.0)
    finally:
        for server in servers:
            server.gate.set()
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await backend.close()
        for server in servers:
            await server.stop()
    placed = await _engines_by_job(store, reviews)
    await store.close()
    assert all(len(engines) == 4 for engines in placed.values())
    if prefill_s > 0:
        # Waiting a call's fraction of a second beats a 30 s prefill: every chunk goes home,
        # and the two reviews have different homes.
        assert all(len(set(engines)) == 1 for engines in placed.values()), placed
        assert placed[reviews[0]][0] != placed[reviews[1]][0]
    else:
        # A prefill that costs nothing is never worth a wait: chunks spill to a free place.
        assert any(len(set(engines)) > 1 for engines in placed.values()), placed
    assert sum(server.served for server in servers) == 2 + 8
