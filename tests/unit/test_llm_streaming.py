"""Streamed answers: the server-sent events parser, and the openai backend reading a real
loopback stream while it tells how far each call has come."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from bot.errors import LLMError
from bot.llm.base import LLMRequest, ReportsProgress
from bot.llm.batching import PROFILES, BatchedEngine
from bot.llm.openai_compat import OpenAICompatBackend
from bot.llm.simulated import SimulatedBackend
from bot.llm.streaming import StreamedAnswer, StreamError, is_event_stream

ANSWER = json.dumps({"findings": [], "summary": "Nothing to report."})


def pieces(text: str, count: int) -> list[str]:
    """`count` non-empty pieces that join to `text` padded with trailing spaces (still JSON)."""
    padded = text.ljust(count)
    size, extra = divmod(len(padded), count)
    out: list[str] = []
    start = 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        out.append(padded[start:end])
        start = end
    return out


def event(content: str | None = None, *, finish: str | None = None, **extra: Any) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": finish}
    if content is not None:
        choice["delta"] = {"content": content}
    body = {"object": "chat.completion.chunk", "choices": [choice], **extra}
    return f"data: {json.dumps(body)}\n\n".encode()


USAGE_ONLY = b'data: {"object": "chat.completion.chunk", "choices": [], "usage": ' + (
    b'{"prompt_tokens": 321, "completion_tokens": 12}}\n\n'
)


def test_a_stream_is_read_into_text_tokens_reason_and_usage() -> None:
    answer = StreamedAnswer()
    parts = pieces(ANSWER, 12)
    assert answer.feed_line(b": keep-alive\n") is False
    for index, part in enumerate(parts):
        assert answer.feed_line(event(part)) is True
        assert answer.completion_tokens == index + 1
    assert answer.feed_line(event(finish="stop")) is False
    assert answer.feed_line(USAGE_ONLY) is True
    assert answer.feed_line(b"data: [DONE]\n") is False
    assert answer.done and answer.finish_reason == "stop"
    assert json.loads(answer.text) == json.loads(ANSWER)
    assert answer.usage["prompt_tokens"] == 321 and answer.completion_tokens == 12


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"data: {not json", "not JSON"),
        (b"data: [1, 2]", "not an object"),
        (b'data: {"error": {"message": "out of KV cache"}}', "out of KV cache"),
        (b'data: {"choices": ["x"]}', "not an object"),
    ],
)
def test_a_broken_stream_is_a_clear_error(line: bytes, message: str) -> None:
    with pytest.raises(StreamError, match=message):
        StreamedAnswer().feed_line(line)


@given(st.lists(st.text(min_size=1, max_size=8), max_size=30), st.integers(0, 5))
def test_any_split_of_an_answer_reads_back_whole(parts: list[str], usage_extra: int) -> None:
    answer = StreamedAnswer()
    for part in parts:
        answer.feed_line(event(part))
    assert answer.text == "".join(parts) and answer.completion_tokens == len(parts)
    # A server's own count wins when it is at least what was seen.
    answer.feed_line(USAGE_ONLY.replace(b"12", str(len(parts) + usage_extra).encode()))
    assert answer.completion_tokens == len(parts) + usage_extra


def test_event_streams_are_told_from_json_bodies() -> None:
    assert is_event_stream("text/event-stream; charset=utf-8")
    assert not is_event_stream("application/json")
    assert not is_event_stream(None)


class StreamingServer:
    """A loopback chat-completions server that streams `tokens` pieces, pausing after `hold`
    of them until `release` is set; with `cut`, it hangs up mid-answer instead."""

    def __init__(self, *, tokens: int = 20, hold: int | None = None, cut: bool = False) -> None:
        self.tokens = tokens
        self.hold = hold
        self.cut = cut
        self.release = asyncio.Event()
        self.bodies: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if not body.get("stream"):
            return web.json_response({"error": {"message": "expected stream"}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index, part in enumerate(pieces(ANSWER, self.tokens)):
            if index == self.hold:
                if self.cut:
                    return response  # the answer stops short, with no [DONE]
                await self.release.wait()
            await response.write(event(part))
        await response.write(event(finish="stop"))
        if body.get("stream_options", {}).get("include_usage"):
            await response.write(USAGE_ONLY.replace(b"12", str(self.tokens).encode()))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

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


def request_for(chunk_id: int) -> LLMRequest:
    return LLMRequest(
        messages=[{"role": "user", "content": "review this"}],
        metadata={"job_id": 1, "chunk_id": chunk_id},
    )


async def test_a_streamed_call_tells_its_progress_and_answers_whole() -> None:
    server = StreamingServer(tokens=30, hold=7)
    await server.start()
    backend = OpenAICompatBackend([server.url], model="m", max_retries=0)
    assert isinstance(backend, ReportsProgress)
    try:
        call = asyncio.ensure_future(backend.complete(request_for(5)))
        for _ in range(500):
            progress = backend.progress(5)
            if progress is not None and progress.completion_tokens == 7:
                break
            await asyncio.sleep(0.01)
        progress = backend.progress(5)
        assert progress is not None and progress.completion_tokens == 7
        assert progress.expected_tokens is None  # a server does not say the length ahead
        assert backend.progress(6) is None
        server.release.set()
        response = await asyncio.wait_for(call, timeout=10)
    finally:
        await backend.close()
        await server.stop()
    assert json.loads(response.text) == json.loads(ANSWER)
    assert (response.prompt_tokens, response.completion_tokens) == (321, 30)
    assert response.finish_reason == "stop"
    assert server.bodies[0]["stream"] is True
    assert server.bodies[0]["stream_options"] == {"include_usage": True}
    assert backend.progress(5) is None  # the call is over


async def test_a_stream_cut_short_is_retried_then_fails() -> None:
    server = StreamingServer(tokens=10, hold=4, cut=True)
    await server.start()
    backend = OpenAICompatBackend(
        [server.url], model="m", max_retries=1, backoff_max_s=0.01, failures_to_eject=1000
    )
    try:
        with pytest.raises(LLMError, match="stream ended before the answer"):
            await backend.complete(request_for(9))
    finally:
        await backend.close()
        await server.stop()
    assert len(server.bodies) == 2
    assert backend.progress(9) is None


async def test_streaming_can_be_turned_off_for_servers_that_do_not_stream() -> None:
    server = StreamingServer()
    await server.start()
    backend = OpenAICompatBackend([server.url], model="m", max_retries=0, stream=False)
    try:
        with pytest.raises(LLMError, match="expected stream"):
            await backend.complete(request_for(1))
    finally:
        await backend.close()
        await server.stop()
    assert "stream" not in server.bodies[0] and "stream_options" not in server.bodies[0]


async def test_the_simulated_backend_tells_progress_at_an_even_pace() -> None:
    now = [100.0]
    gate = asyncio.Event()

    async def sleep(_: float) -> None:
        await gate.wait()

    backend = SimulatedBackend(overhead_s=4.0, sleep=sleep, clock=lambda: now[0])
    metadata = {"job_id": 1, "chunk_id": 3, "lines": 10, "total_lines": 10, "service_s": 4.0}
    call = asyncio.ensure_future(
        backend.complete(LLMRequest(messages=[{"role": "user", "content": ""}], metadata=metadata))
    )
    await asyncio.sleep(0)
    start = backend.progress(3)
    assert start is not None and start.completion_tokens == 0 and start.expected_tokens
    now[0] += 2.0  # half of its 4 s
    half = backend.progress(3)
    assert half is not None and half.completion_tokens == start.expected_tokens // 2
    gate.set()
    response = await call
    assert response.completion_tokens == start.expected_tokens
    assert backend.progress(3) is None


def test_the_engine_model_tells_each_calls_progress() -> None:
    profile = PROFILES["gpu-7b"]
    engine = BatchedEngine(profile)
    engine.admit("a", solo_s=10.0, lines=20, now_s=0.0)
    made, expected = engine.progress("a") or (-1, -1)
    assert made == 0 and expected > 0  # still prefilling
    prefill_s, tokens = profile.split(10.0, 20)
    engine.advance(prefill_s + (10.0 - prefill_s) / 2)
    made, expected = engine.progress("a") or (-1, -1)
    assert expected == round(tokens) and abs(made - tokens / 2) <= 1
    assert engine.progress("b") is None
