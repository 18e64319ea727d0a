"""The live dispatcher on real PostgreSQL: NOTIFY wake-up, shared database, stop releases."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence

import pytest
from aiohttp import web

from bot.clock import SystemClock
from bot.llm.openai_compat import OpenAICompatBackend
from bot.llm.simulated import SimulatedBackend
from bot.model import ChunkState, FileChange, JobState, Level
from bot.pipeline import build_pipeline
from bot.queue.store import QueueSettings, QueueStore
from bot.review.assemble import assemble_review, stored_chunk
from bot.review.planner import PlanningSettings, claim_and_plan_jobs
from bot.sched.dispatcher import Dispatcher, DispatcherSettings
from bot.sched.mlfq import MlfqSettings
from bot.sim.forge import added_lines_patch
from tests.support.factories import decide, make_request
from tests.support.memory_forge import FORGES, FORTY_LINE_CHUNKS, add_change, simulated_pipeline

pytestmark = pytest.mark.slow


def _dispatcher(store: QueueStore, owner: str, *, time_scale: float, poll_s: float) -> Dispatcher:
    backend = SimulatedBackend(
        overhead_s=3.0, seconds_per_line=0.01, sleep=asyncio.sleep, time_scale=time_scale
    )
    return build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        dispatcher=DispatcherSettings(
            owner=owner, slots=3, poll_s=poll_s, lease_s=60.0, mlfq=MlfqSettings(reserved_slots=0)
        ),
        planning=FORTY_LINE_CHUNKS,
    ).dispatcher


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    """Wait for a condition another process (the dispatcher's tasks) brings about."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if await check():
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.02)


async def _submit(
    store: QueueStore,
    number: int,
    lines: int = 120,
    files: Sequence[FileChange] | None = None,
    level: Level = Level.P1,
) -> int:
    """Enqueue a review of `lines` changed lines (in 40-line files unless `files` are given)."""
    head_sha = f"{number:040d}"
    add_change(number, lines, head_sha=head_sha, files=files)
    result = await store.submit_request(
        make_request(number=number, head_sha=head_sha, additions=lines, deletions=0),
        decide(level),
        now=SystemClock().now(),
    )
    assert result.job_id is not None
    return result.job_id


async def _all_done(store: QueueStore, job_ids: list[int]) -> bool:
    for job_id in job_ids:
        job = await store.get_job(job_id)
        if job is None or job.state != JobState.DONE:
            return False
    return True


async def test_notify_wakes_an_idle_dispatcher(db_url: str) -> None:
    store = QueueStore.from_url(db_url)
    dispatcher = _dispatcher(store, "d1", time_scale=0.001, poll_s=60.0)
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        await asyncio.sleep(0.3)  # idle in its 60 s wait, listening
        job_id = await _submit(store, 1)
        await _until(lambda: _all_done(store, [job_id]), timeout_s=10.0)
        history = await store.job_history(job_id)
        assert [entry.to_value for entry in history if entry.kind == "state"][-1] == "done"
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await store.close()


async def test_two_dispatchers_share_one_database_without_double_work(db_url: str) -> None:
    stores = [QueueStore.from_url(db_url) for _ in range(2)]
    dispatchers = [
        _dispatcher(store, f"d{i}", time_scale=0.002, poll_s=0.5) for i, store in enumerate(stores)
    ]
    runners = [asyncio.create_task(d.run(database_url=db_url)) for d in dispatchers]
    try:
        job_ids = [await _submit(stores[0], number) for number in range(10, 22)]
        await _until(lambda: _all_done(stores[0], job_ids), timeout_s=30.0)
        for job_id in job_ids:
            chunks = await stores[0].chunk_results(job_id)
            assert len(chunks) == 3
            assert all(chunk.state == ChunkState.DONE and chunk.attempts == 1 for chunk in chunks)
        calls = sum(d.backend.calls for d in dispatchers)  # type: ignore[attr-defined]
        assert calls == 3 * len(job_ids)
    finally:
        for dispatcher in dispatchers:
            dispatcher.stop()
        await asyncio.wait_for(asyncio.gather(*runners), timeout=10.0)
        for store in stores:
            await store.close()


async def test_stop_releases_what_it_holds(db_url: str) -> None:
    store = QueueStore.from_url(db_url, settings=QueueSettings())
    dispatcher = _dispatcher(store, "slow", time_scale=100.0, poll_s=0.5)
    job_ids = [await _submit(store, number) for number in (31, 32)]
    runner = asyncio.create_task(dispatcher.run(database_url=db_url, shutdown_grace_s=0.2))
    try:
        await _until(lambda: _held(dispatcher, 3), timeout_s=10.0)
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        assert dispatcher.held == {}
        states = [c.state for job_id in job_ids for c in await store.chunk_results(job_id)]
        assert states.count(ChunkState.RUNNING) == 0
        assert states.count(ChunkState.QUEUED) == 6
        load = await store.level_load(now=SystemClock().now())
        assert load.total_running == 0
    finally:
        if not runner.done():
            dispatcher.stop()
            await asyncio.wait_for(runner, timeout=10.0)
        await store.close()


async def test_a_chunk_that_ends_between_the_stop_and_the_drain_counts_as_ended(
    db_url: str,
) -> None:
    # A SIGTERM can come while a pass of the loop is under way; the calls that end before the
    # loop reaches its drain ended within the grace, and the drain says so.
    store = QueueStore.from_url(db_url)
    dispatcher = _dispatcher(store, "stopped", time_scale=0.0, poll_s=60.0)
    try:
        job_id = await _submit(store, 51)
        await dispatcher.plan_unplanned_jobs(SystemClock().now())
        leased = await dispatcher.fill_slots(SystemClock().now())
        assert len(leased) == 3
        dispatcher.stop()
        first = leased[0]
        reviewed = await dispatcher.review(await store.get_job(job_id), first)
        await dispatcher.finish_chunk(
            first,
            gpu_seconds=reviewed.usage.gpu_seconds,
            result=reviewed.to_result(),
            now=SystemClock().now(),
        )
        assert (await dispatcher.drain(grace_s=0.0)) == (1, 2)
        states = [chunk.state for chunk in await store.chunk_results(job_id)]
        assert sorted(states) == [ChunkState.DONE, ChunkState.QUEUED, ChunkState.QUEUED]
    finally:
        await store.close()


async def _held(dispatcher: Dispatcher, count: int) -> bool:
    return len(dispatcher.held) >= count


async def test_a_p0_review_with_every_slot_busy_preempts_and_the_victim_runs_once(
    db_url: str,
) -> None:
    store = QueueStore.from_url(db_url)
    # 400 lines: 43 GPU s, 4.3 s of wall time each; the hotfix's 10 lines: 4 GPU s
    backend = SimulatedBackend(
        overhead_s=3.0, seconds_per_line=0.1, sleep=asyncio.sleep, time_scale=0.1
    )
    dispatcher = build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        dispatcher=DispatcherSettings(
            owner="d1", slots=2, poll_s=0.5, lease_s=60.0, mlfq=MlfqSettings(reserved_slots=0)
        ),
        planning=PlanningSettings(line_budget=10_000),  # one chunk per job
    ).dispatcher
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        long_jobs = [await _submit(store, number, lines=400) for number in (41, 42)]
        await _until(lambda: _held(dispatcher, 2), timeout_s=10.0)
        FORGES["github"].add_change(
            "acme/payments",
            43,
            [FileChange("src/fix.py", additions=10, patch=added_lines_patch(10))],
            head_sha="c" * 40,
        )
        result = await store.submit_request(
            make_request(number=43, head_sha="c" * 40, additions=10, deletions=0),
            decide(Level.P0, "hotfix"),
            now=SystemClock().now(),
        )
        assert result.job_id is not None
        hotfix = result.job_id
        await _until(lambda: _all_done(store, [*long_jobs, hotfix]), timeout_s=20.0)
        finished = {}
        for job_id in long_jobs:
            job = await store.get_job(job_id)
            assert job is not None and job.finished_at is not None
            finished[job_id] = job.finished_at
        hot = await store.get_job(hotfix)
        assert hot is not None and hot.first_started_at is not None
        # the hotfix did not wait for a 4.3 s call to end
        assert (hot.first_started_at - hot.enqueued_at).total_seconds() < 2.0
        assert hot.first_started_at < min(finished.values())
        assert dispatcher.preemptions == 1
        preempted = []
        for job_id in long_jobs:
            history = await dispatcher.store.job_history(job_id)
            if any("preempted" in entry.reason for entry in history):
                preempted.append(job_id)
            assert [entry.to_value for entry in history].count("done") == 1
            (chunk,) = await store.chunk_results(job_id)
            # ran again and finished exactly once; the preemption counted no attempt
            assert chunk.state == ChunkState.DONE and chunk.attempts == 1
        assert len(preempted) == 1
        # three chunks, plus the call that was cancelled halfway
        assert backend.calls == 4
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await store.close()


class ContextLimitedServer:
    """An OpenAI-compatible server on loopback that refuses prompts over its context length,
    with vLLM's 400 answer, and answers the rest with a valid, empty review."""

    def __init__(self, max_prompt_chars: int) -> None:
        self.max_prompt_chars = max_prompt_chars
        self.refused = 0
        self.runner: web.AppRunner | None = None

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = "".join(str(message["content"]) for message in body["messages"])
        if len(prompt) > self.max_prompt_chars:
            self.refused += 1
            message = (
                "This model's maximum context length is 4096 tokens. However, your prompt"
                " contains at least 4097 input tokens."
            )
            return web.json_response(
                {"object": "error", "message": message, "type": "BadRequestError", "code": 400},
                status=400,
            )
        answer = json.dumps({"findings": [], "summary": "Looks fine."})
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": answer},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
            }
        )

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def _small_and_huge_files() -> list[FileChange]:
    """A small real patch, and one whose two changed lines sit in context that overflows the
    model's context."""
    small = FileChange(
        path="app/small.py", additions=1, deletions=0, patch="@@ -1 +1,2 @@\n x\n+y\n"
    )
    context = "".join(f"     value_{i} = compute_{i}(request, settings)\n" for i in range(200))
    huge_patch = "@@ -1,200 +1,202 @@\n" + context + "+a\n+b\n"
    huge = FileChange(path="app/huge.py", additions=2, deletions=0, patch=huge_patch)
    return [small, huge]


async def test_a_chunk_the_model_server_refuses_is_named_in_the_review_not_fatal(
    db_url: str,
) -> None:
    server = ContextLimitedServer(max_prompt_chars=6000)
    url = await server.start()
    store = QueueStore.from_url(db_url)
    backend = OpenAICompatBackend([url], model="review-model", max_retries=1)
    dispatcher = build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        dispatcher=DispatcherSettings(owner="d1", slots=2, poll_s=0.2, lease_s=60.0),
        planning=PlanningSettings(line_budget=2, first_budget=None),  # one file a chunk
    ).dispatcher
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    try:
        job_id = await _submit(store, 1, lines=3, files=_small_and_huge_files())
        await _until(lambda: _all_done(store, [job_id]), timeout_s=20.0)
        chunks = await store.chunk_results(job_id)
        statuses = [str((chunk.result or {}).get("status")) for chunk in chunks]
        assert statuses == ["ok", "failed"]
        assert all(chunk.state == ChunkState.DONE and chunk.attempts == 1 for chunk in chunks)
        assembled = assemble_review([stored_chunk(chunk) for chunk in chunks])
        assert not assembled.complete
        assert "app/huge.py" in assembled.summary and "context length" in assembled.summary
        # Refused whole, whole again without the pull request's title, then its first half (one
        # changed line in 200 lines of context, which cannot be cut further): that 4xx is final,
        # not retried elsewhere or later.
        assert server.refused == 3
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await backend.close()
        await store.close()
        await server.stop()


async def test_reviews_planned_while_work_queues_are_cut_in_larger_chunks(db_url: str) -> None:
    """Chunks follow the backlog: 40-line chunks while the one slot has little waiting, 80
    once more than two chunks per slot are ready (bot.sched.backlog), except a hotfix's."""
    store = QueueStore.from_url(db_url)
    pipeline = simulated_pipeline(
        store,
        dispatcher=DispatcherSettings(owner="d1", slots=1),
        planning=PlanningSettings(line_budget=40, first_budget=None, backlog_line_budget=80),
    )
    try:
        first = await _submit(store, 51, lines=120)
        assert await pipeline.dispatcher.plan_unplanned_jobs(SystemClock().now()) == 1
        assert [chunk.lines for chunk in await store.chunk_results(first)] == [40, 40, 40]
        # Three chunks ready for one slot: a backlog.
        second = await _submit(store, 52, lines=120)
        assert await pipeline.dispatcher.plan_unplanned_jobs(SystemClock().now()) == 1
        assert [chunk.lines for chunk in await store.chunk_results(second)] == [80, 40]
        hotfix = await _submit(store, 53, lines=120, level=Level.P0)
        assert await pipeline.dispatcher.plan_unplanned_jobs(SystemClock().now()) == 1
        assert [chunk.lines for chunk in await store.chunk_results(hotfix)] == [40, 40, 40]
    finally:
        await store.close()


async def test_planning_reads_the_backlog_only_once_it_has_claimed_a_job(db_url: str) -> None:
    """The dispatcher asks about the backlog on every planning pass; the load is read (one
    query) only when a job is there to plan, not on the passes that find none."""
    store = QueueStore.from_url(db_url)
    asked: list[bool] = []

    async def backlogged() -> bool:
        asked.append(True)
        return True

    settings = PlanningSettings(line_budget=40, first_budget=None, backlog_line_budget=80)
    try:
        now = SystemClock().now()
        assert (
            await claim_and_plan_jobs(
                store, FORGES, None, now=now, settings=settings, backlogged=backlogged
            )
            == []
        )
        assert asked == []
        job = await _submit(store, 54, lines=120)
        [outcome] = await claim_and_plan_jobs(
            store, FORGES, None, now=SystemClock().now(), settings=settings, backlogged=backlogged
        )
        assert outcome.result == "planned" and asked == [True]
        assert [chunk.lines for chunk in await store.chunk_results(job)] == [80, 40]
    finally:
        await store.close()
