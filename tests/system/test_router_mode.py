"""Router mode: the bot in front of one router (vLLM production-stack's session routing, or
llm-d's session-affinity cookie) that spreads calls over two OpenAI-compatible servers, all on
loopback. Each review's calls stay on one server, reviews spread over both, the level reaches
the server and the router, one window serves the router, and the router's queue moves it."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import signal
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

import aiohttp
import pytest
from aiohttp import web

from bot.clock import SystemClock
from bot.config import WindowSettings, load_settings
from bot.emulator import (
    EmulatorState,
    ForgeEmulator,
    build_github_pull_request_event,
    generate_file_changes,
    send_webhook,
)
from bot.engine_setup import engine_pool_for, metrics_probe
from bot.errors import ConfigError
from bot.forges.base import SUMMARY_MARKER
from bot.llm.base import LLMRequest
from bot.llm.factory import create_backend
from bot.llm.openai_compat import OpenAICompatBackend
from bot.llm.routing import OBJECTIVE_HEADER, RouterAffinity
from bot.model import FileChange, JobState, Level
from bot.pipeline import build_pipeline
from bot.queue.store import QueueStore
from bot.review.planner import PlanningSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.sched.engine_pool import EnginePool
from bot.sched.mlfq import MlfqSettings
from bot.sim.forge import added_lines_patch, memory_forges
from tests.support.factories import decide, make_request
from tests.support.serving import REPO_ROOT, free_port, start_serve, wait_until
from tests.support.webhook_fixtures import load_payload

ANSWER = json.dumps({"findings": [], "summary": "Nothing to report."})
OBJECTIVES = "review-p0,review-p1,review-p2,review-p3"
COOKIE = "llm-d-session"  # llm-d's session-affinity scorer's cookie
RoutingMode = Literal["header", "cookie"]
SECRET = "router-test-secret"


class StubServer:
    """An OpenAI-compatible chat server that records who called it with what."""

    def __init__(self, name: str, delay_s: float = 0.05) -> None:
        self.name = name
        self.delay_s = delay_s
        self.calls: list[dict[str, object]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(
            {
                "session": request.headers.get("x-session-id"),
                "objective": request.headers.get(OBJECTIVE_HEADER),
                "priority": body.get("priority"),
            }
        )
        await asyncio.sleep(self.delay_s)
        return web.json_response(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 300, "completion_tokens": 30},
            }
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


class StubRouter:
    """A router over two servers, as the two kinds route a session.

    "header": production-stack's session routing (`--session-key x-session-id`): a session's
    first call goes to the server with fewest calls in flight, and the session stays there.
    "cookie": llm-d's session-affinity scorer: a call carrying the `llm-d-session` cookie goes
    to the server it names; every answer sets it to the server that served it.
    Both proxy the OpenAI API and report each server's queue on /metrics (production-stack's
    router repeats vLLM's names with a `server` label).
    """

    def __init__(self, servers: list[StubServer], mode: RoutingMode) -> None:
        self.servers = servers
        self.mode = mode
        self.pinned: dict[str, int] = {}
        self.in_flight = [0] * len(servers)
        self.turn = itertools.count()
        self.waiting = [0, 0]
        self.cookies_seen = 0
        self.runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None
        self.url = ""

    def choose(self, request: web.Request) -> int:
        if self.mode == "header":
            key = request.headers.get("x-session-id")
            if key is not None and key in self.pinned:
                return self.pinned[key]
        else:
            token = request.cookies.get(COOKIE)
            if token is not None:
                self.cookies_seen += 1
                return int(base64.b64decode(token).decode().rpartition("-")[2])
        turn = next(self.turn)
        least = min(self.in_flight)
        tied = [i for i, count in enumerate(self.in_flight) if count == least]
        index = tied[turn % len(tied)]
        if self.mode == "header" and request.headers.get("x-session-id") is not None:
            self.pinned[request.headers["x-session-id"]] = index
        return index

    async def chat(self, request: web.Request) -> web.Response:
        index = self.choose(request)
        assert self.session is not None
        self.in_flight[index] += 1
        try:
            async with self.session.post(
                self.servers[index].url + "/v1/chat/completions",
                data=await request.read(),
                headers={
                    name: value
                    for name, value in request.headers.items()
                    if name.lower() in ("content-type", "x-session-id", OBJECTIVE_HEADER)
                },
            ) as answer:
                body = await answer.read()
                status = answer.status
        finally:
            self.in_flight[index] -= 1
        response = web.Response(body=body, status=status, content_type="application/json")
        if self.mode == "cookie":
            token = base64.b64encode(f"llm/vllm-{index}".encode()).decode()
            response.set_cookie(COOKIE, token, path="/", httponly=True)
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        lines = ["# TYPE vllm:num_requests_waiting gauge"]
        lines += [
            f'vllm:num_requests_waiting{{server="{server.url}"}} {waiting}'
            for server, waiting in zip(self.servers, self.waiting, strict=True)
        ]
        return web.Response(text="\n".join(lines) + "\n")

    async def start(self) -> None:
        self.session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()


@pytest.fixture
async def servers() -> AsyncIterator[list[StubServer]]:
    started = [StubServer("vllm-0"), StubServer("vllm-1")]
    for server in started:
        await server.start()
    yield started
    for server in started:
        await server.stop()


async def router_over(servers: list[StubServer], mode: RoutingMode) -> StubRouter:
    router = StubRouter(servers, mode)
    await router.start()
    return router


def served_by(servers: list[StubServer]) -> dict[str, set[str]]:
    """Session key -> the servers that served its calls."""
    seen: dict[str, set[str]] = defaultdict(set)
    for server in servers:
        for call in server.calls:
            seen[str(call["session"])].add(server.name)
    return seen


def request_of(job_id: int, level: Level) -> LLMRequest:
    return LLMRequest(
        messages=[{"role": "user", "content": f"review {job_id}"}],
        priority=int(level),
        metadata={"job_id": job_id},
    )


def router_settings(url: str, **extra: str) -> dict[str, str]:
    return {
        "REVIEW_BOT_LLM": "openai",
        "REVIEW_BOT_LLM_URLS": f"{url}/v1",
        "REVIEW_BOT_LLM_ROUTER": "true",
        "REVIEW_BOT_LLM_OBJECTIVES": OBJECTIVES,
        "REVIEW_BOT_LLM_RESPONSE_FORMAT": "none",
        **extra,
    }


@pytest.mark.parametrize("mode", ["header", "cookie"])
async def test_each_review_stays_on_one_server_and_reviews_spread(
    servers: list[StubServer], mode: RoutingMode
) -> None:
    router = await router_over(servers, mode)
    backend = create_backend(load_settings(router_settings(router.url)))
    assert isinstance(backend, OpenAICompatBackend)
    levels = {job_id: Level(job_id % 4) for job_id in range(1, 9)}
    try:
        # A review's first call, then its other chunks together (a cookie exists only once
        # the router has answered one call of the review).
        await asyncio.gather(*(backend.complete(request_of(j, lv)) for j, lv in levels.items()))
        await asyncio.gather(
            *(
                backend.complete(request_of(job_id, level))
                for job_id, level in levels.items()
                for _ in range(3)
            )
        )
    finally:
        await backend.close()
        await router.stop()
    seen = served_by(servers)
    assert set(seen) == {f"review-{job_id}" for job_id in levels}
    assert all(len(names) == 1 for names in seen.values()), seen
    assert Counter(next(iter(names)) for names in seen.values()) == {"vllm-0": 4, "vllm-1": 4}
    if mode == "cookie":
        assert router.cookies_seen == 3 * len(levels)  # every later call sent its own back
    # The level reached the server as vLLM's priority and the router as an objective.
    for server in servers:
        for call in server.calls:
            job_id = int(str(call["session"]).removeprefix("review-"))
            assert call["priority"] == int(levels[job_id])
            assert call["objective"] == OBJECTIVES.split(",")[int(levels[job_id])]


def test_router_mode_settings_are_checked() -> None:
    settings = load_settings(router_settings("http://router:8000"))
    assert settings.llm.router and settings.llm.objectives == tuple(OBJECTIVES.split(","))
    assert settings.llm.session_header == "x-session-id"
    with pytest.raises(ConfigError, match="exactly one URL"):
        load_settings(
            {"REVIEW_BOT_LLM_URLS": "http://a:8000,http://b:8000", "REVIEW_BOT_LLM_ROUTER": "1"}
        )
    with pytest.raises(ConfigError, match="four InferenceObjectives"):
        load_settings(router_settings("http://r", REVIEW_BOT_LLM_OBJECTIVES="a,b"))
    with pytest.raises(ConfigError, match="header name"):
        load_settings(router_settings("http://r", REVIEW_BOT_LLM_SESSION_HEADER="x session"))
    # Without router mode no call carries routing headers.
    plain = create_backend(
        load_settings({"REVIEW_BOT_LLM": "openai", "REVIEW_BOT_LLM_URLS": "http://a"})
    )
    assert isinstance(plain, OpenAICompatBackend) and plain.affinity is None
    assert plain.request_headers(request_of(7, Level.P1)) == {"Content-Type": "application/json"}


def test_cookies_are_kept_per_review_and_bounded() -> None:
    affinity = RouterAffinity(max_sessions=2)
    affinity.remember({"job_id": 1}, ["llm-d-session=YQ==; Path=/; HttpOnly"])
    affinity.remember({"job_id": 2}, ["llm-d-session=Yg==; Path=/"])
    assert affinity.headers_for({"job_id": 1}, 1)["Cookie"] == "llm-d-session=YQ=="
    assert "Cookie" not in affinity.headers_for({"job_id": 3}, 1)
    affinity.remember({"job_id": 3}, ["llm-d-session=Yw=="])  # job 2 is the oldest now
    assert "Cookie" not in affinity.headers_for({"job_id": 2}, 1)
    assert affinity.headers_for({"job_id": 1}, None) == {
        "x-session-id": "review-1",
        "Cookie": "llm-d-session=YQ==",
    }
    affinity.remember({"job_id": 4}, ["not a cookie at all;;="])  # ignored, nothing kept
    assert "Cookie" not in affinity.headers_for({"job_id": 4}, 0)


async def test_the_routers_queue_is_read_and_shrinks_its_window(
    servers: list[StubServer],
) -> None:
    router = await router_over(servers, "header")
    settings = load_settings(router_settings(router.url))
    backend = create_backend(settings)
    now = datetime.now(UTC)
    try:
        pool = engine_pool_for(settings, backend, now=now)
        assert pool is not None
        (engine,) = pool.engines  # one window, for the router
        assert engine.name == router.url
        probe = metrics_probe(backend)
        assert probe is not None
        router.waiting = [2, 1]
        scraped = await probe(router.url)
        assert scraped is not None and scraped.requests_waiting == 3  # summed over servers
        # A full window of calls answered while the servers queue: the window backs off.
        window = WindowSettings(floor=1, initial=4, ceiling=16, min_completions=1, min_interval_s=0)
        quick = EnginePool.build([router.url], window, now=now, probe=probe)
        (judged,) = quick.engines
        for chunk_id in range(4):
            quick.take(judged, chunk_id, now)
        for chunk_id in range(4):
            later = now + timedelta(seconds=1 + chunk_id)
            await quick.finished(chunk_id, later, prompt_tokens=300, completion_tokens=30)
        assert judged.window < 4 and judged.last_reason == "server_queue"
        # A queue met by one read only (a request on its way into the engine's next step) is
        # not the engine's limit: the interval is judged by the least of its reads.
        passing = EnginePool.build([router.url], window, now=now, probe=probe)
        (held,) = passing.engines
        for chunk_id in range(4):
            passing.take(held, chunk_id, now)
        for chunk_id in range(4):
            router.waiting = [2, 1] if chunk_id != 1 else [0, 0]
            later = now + timedelta(seconds=1 + chunk_id)
            passing.take(held, 4 + chunk_id, later)  # the window stays full
            await passing.finished(chunk_id, later, prompt_tokens=300, completion_tokens=30)
        assert held.last_reason == "baseline" and held.window == 8  # slow start's first interval
    finally:
        await backend.close()
        await router.stop()


async def test_a_router_serving_metrics_elsewhere_is_read_there(
    servers: list[StubServer],
) -> None:
    # llm-d's Endpoint Picker serves the pool's queues on a port of its own.
    picker = web.Application()

    async def picker_metrics(request: web.Request) -> web.Response:
        return web.Response(
            text='inference_pool_per_pod_queue_size{model_server_pod="a",name="p"} 4\n'
            'inference_pool_per_pod_queue_size{model_server_pod="b",name="p"} 1\n'
            'inference_pool_average_kv_cache_utilization{name="p"} 0.5\n'
        )

    picker.router.add_get("/metrics", picker_metrics)
    runner = web.AppRunner(picker)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    picker_url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    router = await router_over(servers, "cookie")
    settings = load_settings(router_settings(router.url, REVIEW_BOT_LLM_METRICS_URL=picker_url))
    backend = create_backend(settings)
    try:
        probe = metrics_probe(backend, metrics_url=settings.llm.metrics_url)
        assert probe is not None
        scraped = await probe(router.url)
        assert scraped is not None
        assert (scraped.requests_waiting, scraped.kv_cache_usage) == (5, 0.5)
    finally:
        await backend.close()
        await router.stop()
        await runner.cleanup()


FORGES = memory_forges(SystemClock())


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.05)  # real servers on loopback: poll their effects


async def test_the_dispatcher_reviews_through_the_router_one_review_per_server(
    servers: list[StubServer], db_url: str
) -> None:
    router = await router_over(servers, "header")
    settings = load_settings(router_settings(router.url))
    backend = create_backend(settings)
    store = QueueStore.from_url(db_url)
    clock = SystemClock()
    pool = engine_pool_for(settings, backend, now=clock.now())
    assert pool is not None and [engine.name for engine in pool.engines] == [router.url]
    dispatcher = build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=clock,
        dispatcher=DispatcherSettings(
            owner="d1", slots=1, poll_s=0.2, lease_s=60.0, mlfq=MlfqSettings(reserved_slots=0)
        ),
        # Three 20-line files a review, one chunk each.
        planning=PlanningSettings(line_budget=25),
        engines=pool,
        answer_tokens=256,
    ).dispatcher
    runner = asyncio.create_task(dispatcher.run(database_url=db_url, shutdown_grace_s=1.0))
    job_ids: list[int] = []
    try:
        for number in range(1, 7):
            head_sha = f"{number:040d}"
            files = [
                FileChange(f"src/module_{i}.py", additions=20, patch=added_lines_patch(20))
                for i in range(3)
            ]
            FORGES["github"].add_change("acme/payments", number, files, head_sha=head_sha)
            result = await store.submit_request(
                make_request(number=number, head_sha=head_sha, additions=60, deletions=0),
                decide(Level.P1),
                now=clock.now(),
            )
            assert result.job_id is not None
            job_ids.append(result.job_id)

        async def done() -> bool:
            jobs = [await store.get_job(job_id) for job_id in job_ids]
            return all(job is not None and job.state == JobState.DONE for job in jobs)

        await _until(done, timeout_s=60.0)
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await backend.close()
        await store.close()
        await router.stop()
    seen = served_by(servers)
    assert set(seen) == {f"review-{job_id}" for job_id in job_ids}
    # Every review's three chunks went to one server, and both servers took reviews.
    assert all(len(names) == 1 for names in seen.values()), seen
    assert {next(iter(names)) for names in seen.values()} == {"vllm-0", "vllm-1"}
    assert sum(len(server.calls) for server in servers) == 3 * len(job_ids)
    assert {call["priority"] for server in servers for call in server.calls} == {int(Level.P1)}


@pytest.mark.slow
async def test_bot_serve_in_router_mode_reviews_through_the_router(
    servers: list[StubServer], db_url: str
) -> None:
    fixture = load_payload("github/pull_request.opened.json").payload
    router = await router_over(servers, "header")
    state = EmulatorState()
    try:
        async with ForgeEmulator(state) as emulator:
            pull = state.add_pull(
                "github",
                "acme/shop",
                42,
                files=generate_file_changes(changed_lines=1500, files=8, seed=11),
                base_ref="main",
            )
            port = free_port()
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("REVIEW_BOT_")},
                **router_settings(router.url),
                "DATABASE_URL": db_url,
                "GITHUB_WEBHOOK_SECRET": SECRET,
                "GITLAB_WEBHOOK_TOKEN": SECRET,
                "GITHUB_TOKEN": "ghp-router-test",
                "GITHUB_API_URL": emulator.github_url,
                "GITLAB_URL": emulator.gitlab_url,
                "PYTHONPATH": str(REPO_ROOT),
            }
            process = await start_serve("all", port=port, env=env)
            try:

                async def listening() -> bool:
                    assert process.returncode is None, "bot serve exited early"
                    try:
                        _, writer = await asyncio.open_connection("127.0.0.1", port)
                    except OSError:
                        return False
                    writer.close()
                    await writer.wait_closed()
                    return True

                await wait_until(listening, timeout_s=60, what="bot serve to listen")
                payload = build_github_pull_request_event(
                    fixture,
                    action="opened",
                    repo="acme/shop",
                    number=42,
                    base_ref="main",
                    head_sha=pull.newest.head_sha,
                    base_sha=pull.newest.base_sha,
                    changed_files=8,
                    additions=1500,
                    deletions=0,
                )
                answer = await send_webhook(
                    f"http://127.0.0.1:{port}/webhooks/github",
                    "github",
                    "pull_request",
                    payload,
                    SECRET,
                )
                assert answer.status == 202, answer

                async def reviewed() -> bool:
                    posted = state.posted(forge="github", kind="issue_comment", number=42)
                    return any(SUMMARY_MARKER in (item.body or "") for item in posted)

                await wait_until(reviewed, timeout_s=90, what="the review to be posted")
            finally:
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        await router.stop()
    log = stderr.decode()
    assert process.returncode == 0, log[-3000:]
    assert "(1 engines with adaptive windows)" in log, log[-3000:]
    calls = [call for server in servers for call in server.calls]
    assert len(calls) >= 2, "the review was one chunk: it shows no affinity"
    # All the review's chunks went through the router to one server, its level with them.
    (session,) = {call["session"] for call in calls}
    assert str(session).startswith("review-")
    assert sum(1 for server in servers if server.calls) == 1
    assert {call["objective"] for call in calls} == {OBJECTIVES.split(",")[int(Level.P1)]}
    assert {call["priority"] for call in calls} == {int(Level.P1)}
