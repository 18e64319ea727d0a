"""The OpenAI-compatible client against real loopback servers speaking chat completions."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from bot.errors import LLMError
from bot.llm.base import LLMRequest
from bot.llm.openai_compat import OpenAICompatBackend
from bot.review.chunk_review import review_chunk
from tests.support.serving import free_port

ANSWER = json.dumps(
    {
        "findings": [
            {"path": "a.py", "line": 2, "side": "RIGHT", "severity": "major", "body": "Bug @bob."}
        ],
        "summary": "One issue.",
    }
)
FILES = [{"path": "a.py", "patch": "@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = x / 0"}]


def completion(text: str, prompt_tokens: int = 11, completion_tokens: int = 7) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


Behaviour = Callable[[dict[str, Any]], Awaitable[web.StreamResponse]]


@dataclass
class FakeServer:
    """A loopback chat completions server whose answer is set per test."""

    behaviour: str = "ok"
    answers: list[str] = field(default_factory=lambda: [ANSWER])
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    probes: int = 0
    runner: web.AppRunner | None = None
    url: str = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.behaviour == "503":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if self.behaviour == "500":
            return web.Response(status=500, text="Internal Server Error")
        if self.behaviour == "429":
            return web.json_response(
                {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "3"}
            )
        if self.behaviour == "400":
            return web.json_response(
                {"error": {"message": "priority not allowed", "type": "BadRequestError"}},
                status=400,
            )
        if self.behaviour == "nonsense":
            return web.Response(text="<html>gateway says hi</html>", content_type="text/html")
        if self.behaviour == "no_choices":
            return web.json_response({"object": "chat.completion", "choices": []})
        if self.behaviour == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        index = min(len(self.bodies) - 1, len(self.answers) - 1)
        return web.json_response(completion(self.answers[index]))

    async def models(self, request: web.Request) -> web.Response:
        self.probes += 1
        if self.behaviour in ("503", "nonsense"):
            return web.Response(status=503)
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def start(self, port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        bound = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{bound}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


@pytest.fixture
async def servers() -> AsyncIterator[Callable[..., Awaitable[FakeServer]]]:
    started: list[FakeServer] = []

    async def make(behaviour: str = "ok", **kwargs: Any) -> FakeServer:
        server = FakeServer(behaviour=behaviour, **kwargs)
        await server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def backend(urls: list[str], clock: FakeClock | None = None, **kwargs: Any) -> OpenAICompatBackend:
    clock = clock or FakeClock()
    kwargs.setdefault("max_retries", 3)
    return OpenAICompatBackend(
        urls,
        model="m",
        api_key="secret-key",
        timeout_s=5.0,
        sleep=clock.sleep,
        clock=clock,
        rng=random.Random(1),
        **kwargs,
    )


def request(priority: int | None = 1) -> LLMRequest:
    return LLMRequest(
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        max_tokens=64,
        priority=priority,
        metadata={"job_id": 3},
    )


async def test_request_shape_priority_and_usage(servers: Any) -> None:
    server = await servers()
    client = backend([server.url + "/v1/"])
    response = await client.complete(request(priority=2))
    await client.close()
    body = server.bodies[0]
    assert body["model"] == "m" and body["priority"] == 2 and body["max_tokens"] == 64
    assert body["messages"][0] == {"role": "system", "content": "s"}
    assert "response_format" not in body
    assert server.headers[0]["Authorization"] == "Bearer secret-key"
    assert response.text == ANSWER
    assert (response.prompt_tokens, response.completion_tokens) == (11, 7)
    assert response.finish_reason == "stop"
    assert response.worker == server.url
    assert response.latency_s == response.gpu_seconds
    stats = client.stats()[0]
    assert stats["calls"] == 1 and stats["prompt_tokens"] == 11


async def test_priority_omitted_when_disabled_or_unknown(servers: Any) -> None:
    server = await servers()
    client = backend([server.url], pass_priority=False)
    await client.complete(request(priority=0))
    await client.close()
    client = backend([server.url])
    await client.complete(request(priority=None))
    await client.close()
    assert all("priority" not in body for body in server.bodies)


async def test_json_schema_response_format(servers: Any) -> None:
    server = await servers()
    client = backend([server.url], response_format="json_schema")
    await review_chunk(client, FILES, level=0, metadata={"job_id": 1}, max_findings=4)
    await client.close()
    schema = server.bodies[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["findings"]["maxItems"] == 4
    assert schema["properties"]["findings"]["items"]["properties"]["path"] == {"enum": ["a.py"]}
    assert server.bodies[0]["priority"] == 0


async def test_round_robin_spreads_calls(servers: Any) -> None:
    first, second = await servers(), await servers()
    client = backend([first.url, second.url])
    workers = [(await client.complete(request())).worker for _ in range(4)]
    await client.close()
    assert workers == [first.url, second.url, first.url, second.url]


@pytest.mark.parametrize("behaviour", ["503", "500", "nonsense", "no_choices", "drop"])
async def test_failing_worker_is_retried_elsewhere(servers: Any, behaviour: str) -> None:
    bad, good = await servers(behaviour), await servers()
    clock = FakeClock()
    client = backend([bad.url, good.url], clock)
    responses = [await client.complete(request()) for _ in range(3)]
    await client.close()
    assert all(r.worker == good.url for r in responses)
    assert len(bad.bodies) in (1, 2)  # tried until it was taken out of rotation
    bad_state = client.workers[0]
    assert bad_state.failures == len(bad.bodies) and not bad_state.healthy
    assert all(0 <= delay <= client.backoff_max_s for delay in clock.slept)


async def test_down_worker_is_ejected_then_probed_back(servers: Any) -> None:
    port = free_port()
    good = await servers()
    clock = FakeClock()
    client = backend([f"http://127.0.0.1:{port}", good.url], clock, probe_after_s=15.0)
    first = await client.complete(request())
    assert first.worker == good.url
    assert not client.workers[0].healthy
    # Within the probe delay the dead worker is not even tried.
    clock.now += 5
    await client.complete(request())
    assert not client.workers[0].healthy
    # It comes back; after the delay a probe returns it to rotation.
    revived = FakeServer()
    await revived.start(port)
    try:
        clock.now += 11
        workers = {(await client.complete(request())).worker for _ in range(2)}
        assert client.workers[0].healthy
        assert revived.probes >= 1
        assert workers == {f"http://127.0.0.1:{port}", good.url}
    finally:
        await client.close()
        await revived.stop()


async def test_probe_failure_doubles_the_delay(servers: Any) -> None:
    bad, good = await servers("503"), await servers()
    clock = FakeClock()
    client = backend([bad.url, good.url], clock, probe_after_s=10.0)
    await client.complete(request())
    await client.complete(request())
    assert client.workers[0].down_for_s == 10.0
    clock.now += 10
    await client.complete(request())
    assert bad.probes >= 1
    assert client.workers[0].down_for_s == 20.0 and not client.workers[0].healthy
    await client.close()


async def test_all_down_raises_retryable_after_bounded_retries() -> None:
    clock = FakeClock()
    client = backend([f"http://127.0.0.1:{free_port()}"], clock, max_retries=2)
    with pytest.raises(LLMError) as caught:
        await client.complete(request())
    await client.close()
    assert caught.value.retryable
    assert len(clock.slept) == 2
    assert all(delay <= client.backoff_max_s for delay in clock.slept)


async def test_bad_request_is_not_retried(servers: Any) -> None:
    server = await servers("400")
    client = backend([server.url])
    with pytest.raises(LLMError, match="priority not allowed") as caught:
        await client.complete(request())
    await client.close()
    assert not caught.value.retryable
    assert len(server.bodies) == 1
    assert client.workers[0].healthy  # a bad request says nothing about the server


async def test_rate_limit_honours_retry_after(servers: Any) -> None:
    server = await servers("429")
    clock = FakeClock()
    client = backend([server.url], clock, max_retries=1, failures_to_eject=5)
    with pytest.raises(LLMError, match="429") as caught:
        await client.complete(request())
    await client.close()
    assert caught.value.retryable
    assert clock.slept == [3.0]
    assert len(server.bodies) == 2


async def test_engine_over_http_parses_and_records_usage(servers: Any) -> None:
    server = await servers(answers=["Sorry, I can't.", ANSWER])
    client = backend([server.url])
    review = await review_chunk(client, FILES, level=1, metadata={"job_id": 5, "chunk_id": 6})
    await client.close()
    assert review.status == "repaired" and review.attempts == 2
    assert [(f.line, f.body) for f in review.findings] == [(2, "Bug `@bob`.")]
    assert review.usage.prompt_tokens == 22 and review.usage.completion_tokens == 14
    assert "IMPORTANT: your previous answer" in server.bodies[1]["messages"][-1]["content"]
    assert server.bodies[0]["messages"][0] == server.bodies[1]["messages"][0]


async def test_a_request_goes_to_the_engine_the_dispatcher_named(servers: Any) -> None:
    first, second = await servers(), await servers()
    client = backend([first.url, second.url])
    pinned = LLMRequest(
        messages=request().messages, metadata={"job_id": 3, "engine": second.url + "/v1"}
    )
    for _ in range(3):
        response = await client.complete(pinned)
        assert response.worker == second.url
    await client.close()
    assert (len(first.bodies), len(second.bodies)) == (0, 3)


async def test_refusals_for_load_are_reported_to_the_engine_window(servers: Any) -> None:
    busy, good = await servers("429"), await servers()
    client = backend([busy.url, good.url])
    pinned = LLMRequest(messages=request().messages, metadata={"engine": busy.url})
    response = await client.complete(pinned)
    # Answered by the other server after one refusal for load: the window hears of it.
    assert response.worker == good.url and response.overloads == 1
    fine = await client.complete(
        LLMRequest(messages=request().messages, metadata={"engine": good.url})
    )
    assert fine.overloads == 0
    await client.close()
    overloaded = backend([(await servers("503")).url], max_retries=1)
    with pytest.raises(LLMError) as caught:
        await overloaded.complete(request())
    await overloaded.close()
    assert caught.value.overloaded
    broken = backend([(await servers("500")).url], max_retries=1)
    with pytest.raises(LLMError) as failed:
        await broken.complete(request())
    await broken.close()
    assert not failed.value.overloaded  # a server error is not load
