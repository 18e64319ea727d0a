"""OpenAI-compatible chat completions over aiohttp for vLLM servers, one base URL per worker,
or one router in front of them (see bot.llm.routing)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp

from bot.errors import ConfigError, LLMError, LLMRequestRejected
from bot.llm.base import CallProgress, LLMRequest, LLMResponse
from bot.llm.routing import RouterAffinity
from bot.llm.schema import REVIEW_SCHEMA
from bot.llm.streaming import StreamedAnswer, StreamError, is_event_stream
from bot.retry import call_with_retries, exponential_delay, parse_retry_after

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
EJECT_STATUS = frozenset({502, 503, 504})
OVERLOAD_STATUS = frozenset({429, 503})
MAX_ERROR_TEXT = 300


def normalize_base_url(url: str) -> str:
    """`http://host:8000`, `.../` or `.../v1` all become `http://host:8000`; raises ConfigError."""
    cleaned = url.strip().rstrip("/")
    if not cleaned.startswith(("http://", "https://")):
        raise ConfigError(f"LLM base URL must start with http:// or https://, got {url!r}")
    return cleaned.removesuffix("/v1")


@dataclass(slots=True)
class WorkerState:
    """Rotation state and usage counters of one server."""

    base_url: str
    in_flight: int = 0
    healthy: bool = True
    down_until: float = 0.0
    down_for_s: float = 0.0
    consecutive_failures: int = 0
    calls: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "calls": self.calls,
            "failures": self.failures,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_s": round(self.latency_s, 6),
            "last_error": self.last_error,
        }


class AttemptFailed(Exception):
    """One attempt against one worker failed; `retryable` and `eject` say what to do next."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        eject: bool,
        retry_after: float | None = None,
        overloaded: bool = False,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.eject = eject
        self.retry_after = retry_after
        # The server is past what it can take (429, 503, a timeout): its window should shrink.
        self.overloaded = overloaded


class NoWorkerInRotation(AttemptFailed):
    """Every worker is out of rotation; the next try waits for the first probe that is due."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True, eject=False)


class OpenAICompatBackend:
    """Chat completions against vLLM OpenAI servers: least busy worker first, ties round robin."""

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 10.0,
        probe_after_s: float = 15.0,
        probe_max_s: float = 300.0,
        probe_timeout_s: float = 5.0,
        failures_to_eject: int = 2,
        pass_priority: bool = True,
        response_format: Literal["json_object", "json_schema"] | None = None,
        affinity: RouterAffinity | None = None,
        stream: bool = True,
        session: aiohttp.ClientSession | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if not base_urls:
            raise ConfigError("the openai LLM backend needs at least one base URL")
        if max_retries < 0 or timeout_s <= 0:
            raise ConfigError("max_retries must be >= 0 and timeout_s > 0")
        self.workers = [WorkerState(normalize_base_url(url)) for url in base_urls]
        self.model = model
        self.api_key = api_key
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
        self.probe_timeout = aiohttp.ClientTimeout(total=probe_timeout_s)
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.probe_after_s = probe_after_s
        self.probe_max_s = probe_max_s
        self.failures_to_eject = failures_to_eject
        self.pass_priority = pass_priority
        self.response_format = response_format
        # Router mode: each call carries its review's session key (and cookies) and level.
        self.affinity = affinity
        # Streamed answers tell how far each call has come (see `progress`); a server that
        # does not stream answers with one JSON body, which is read as before.
        self.stream = stream
        self._progress: dict[int, int] = {}  # chunk id -> answer tokens so far
        self.session = session
        self.owns_session = session is None
        self.sleep = sleep
        self.clock = clock
        self.rng = rng or random.Random()
        self.next_index = 0
        self.probe_lock = asyncio.Lock()

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request_headers(self, request: LLMRequest) -> dict[str, str]:
        """The headers of one call: authorization, and in router mode its routing headers."""
        headers = self.headers()
        if self.affinity is not None:
            headers.update(self.affinity.headers_for(request.metadata, request.priority))
        return headers

    def get_session(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            # No shared cookie jar: a router's affinity cookie belongs to one review, and a
            # jar would send it with every call (bot.llm.routing keeps them per review).
            self.session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
            self.owns_session = True
        return self.session

    def build_body(self, request: LLMRequest) -> dict[str, Any]:
        """The chat completions body; `priority` is vLLM's extra parameter (lower = sooner)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(message) for message in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        if self.pass_priority and request.priority is not None:
            body["priority"] = int(request.priority)
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self.response_format == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif self.response_format == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "review",
                    "schema": dict(request.response_schema or REVIEW_SCHEMA),
                },
            }
        return body

    def backoff_s(self, attempt: int) -> float:
        """Full-jitter exponential backoff, bounded by backoff_max_s."""
        ceiling = exponential_delay(
            attempt + 1, base_s=self.backoff_base_s, max_s=self.backoff_max_s
        )
        return self.rng.uniform(0.0, ceiling)

    def pinned_worker(self, request: LLMRequest, exclude: set[int]) -> WorkerState | None:
        """The worker the request's `engine` names (the dispatcher's choice), if it can serve."""
        engine = request.metadata.get("engine")
        if not isinstance(engine, str):
            return None
        try:
            wanted = normalize_base_url(engine)
        except ConfigError:
            return None
        for index, worker in enumerate(self.workers):
            if worker.base_url == wanted and worker.healthy and index not in exclude:
                return worker
        return None

    def choose_worker(self, exclude: set[int]) -> WorkerState | None:
        """The healthy worker with fewest requests in flight; ties go round robin."""
        count = len(self.workers)
        best: WorkerState | None = None
        best_index = -1
        for offset in range(count):
            index = (self.next_index + offset) % count
            worker = self.workers[index]
            if not worker.healthy or index in exclude:
                continue
            if best is None or worker.in_flight < best.in_flight:
                best, best_index = worker, index
        if best is not None:
            self.next_index = (best_index + 1) % count
        return best

    def eject(self, worker: WorkerState, reason: str) -> None:
        """Take a worker out of rotation until a probe after a growing delay finds it back."""
        worker.down_for_s = min(
            self.probe_max_s, worker.down_for_s * 2 if worker.down_for_s else self.probe_after_s
        )
        worker.down_until = self.clock() + worker.down_for_s
        if worker.healthy:
            logger.warning(
                "LLM worker %s out of rotation: %s",
                worker.base_url,
                reason,
                extra={"action": "llm_worker_down", "worker": worker.base_url},
            )
        worker.healthy = False

    async def probe(self, worker: WorkerState) -> bool:
        """GET /v1/models (then /health); True when the server answers 200."""
        session = self.get_session()
        for path in ("/v1/models", "/health"):
            try:
                async with session.get(
                    worker.base_url + path, headers=self.headers(), timeout=self.probe_timeout
                ) as response:
                    if response.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                continue
        return False

    async def probe_due_workers(self) -> None:
        """Probe every ejected worker whose delay has passed; put the ones that answer back."""
        async with self.probe_lock:
            now = self.clock()
            for worker in self.workers:
                if worker.healthy or worker.down_until > now:
                    continue
                if await self.probe(worker):
                    worker.healthy = True
                    worker.consecutive_failures = 0
                    worker.down_for_s = 0.0
                    logger.info(
                        "LLM worker %s back in rotation",
                        worker.base_url,
                        extra={"action": "llm_worker_up", "worker": worker.base_url},
                    )
                else:
                    self.eject(worker, "probe failed")

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """One chat completion with retries across workers; raises LLMError when all fail."""
        body = self.build_body(request)
        tried: set[int] = set()
        attempts = self.max_retries + 1
        last_error = "no attempt made"
        made = overloads = 0

        async def attempt_once() -> LLMResponse:
            nonlocal last_error, made, overloads
            made += 1
            await self.probe_due_workers()
            worker = (
                self.pinned_worker(request, tried)
                or self.choose_worker(tried)
                or self.choose_worker(set())
            )
            if worker is None:
                last_error = "no LLM worker is in rotation (all are down)"
                raise NoWorkerInRotation(last_error)
            tried.add(self.workers.index(worker))
            try:
                return await self.attempt(worker, body, request)
            except AttemptFailed as failure:
                last_error = f"{worker.base_url}: {failure}"
                overloads += int(failure.overloaded)
                worker.failures += 1
                worker.last_error = str(failure)
                if not failure.retryable:
                    raise
                worker.consecutive_failures += 1
                if failure.eject or worker.consecutive_failures >= self.failures_to_eject:
                    self.eject(worker, str(failure))
                logger.info(
                    "LLM call failed (attempt %s of %s): %s",
                    made,
                    attempts,
                    last_error,
                    extra={"action": "llm_retry", "job_id": request.metadata.get("job_id")},
                )
                raise

        def delay(error: BaseException, attempt: int) -> float:
            if isinstance(error, NoWorkerInRotation):
                return self.wait_for_probe_s(attempt - 1)
            wait = self.backoff_s(attempt - 1)
            if isinstance(error, AttemptFailed) and error.retry_after is not None:
                wait = max(wait, min(error.retry_after, self.backoff_max_s))
            return wait

        try:
            response = await call_with_retries(
                attempt_once,
                attempts=attempts,
                retryable=lambda error: isinstance(error, AttemptFailed) and error.retryable,
                delay=delay,
                sleep=self.sleep,
            )
        except AttemptFailed as failure:
            if not failure.retryable:
                # The request itself is wrong (e.g. 400): no other worker will take it.
                raise LLMRequestRejected(f"LLM call failed: {last_error}") from failure
            raise LLMError(
                f"LLM call failed: {last_error}", retryable=True, overloaded=overloads > 0
            ) from failure
        return replace(response, overloads=overloads) if overloads else response

    def wait_for_probe_s(self, attempt: int) -> float:
        """How long to wait when every worker is out: until the first probe is due, bounded."""
        due = min(worker.down_until for worker in self.workers) - self.clock()
        return max(0.0, min(max(due, self.backoff_s(attempt)), self.backoff_max_s))

    def progress(self, chunk_id: int) -> CallProgress | None:
        """Answer tokens a running call of the chunk has streamed so far; None if not running."""
        tokens = self._progress.get(chunk_id)
        return None if tokens is None else CallProgress(completion_tokens=tokens)

    async def attempt(
        self, worker: WorkerState, body: Mapping[str, Any], request: LLMRequest
    ) -> LLMResponse:
        """One HTTP call to one worker; raises AttemptFailed."""
        session = self.get_session()
        worker.in_flight += 1
        started = self.clock()
        chunk_id = request.metadata.get("chunk_id")
        tracked = chunk_id if isinstance(chunk_id, int) and self.stream else None
        streamed: StreamedAnswer | None = None
        try:
            async with session.post(
                worker.base_url + "/v1/chat/completions",
                json=body,
                headers=self.request_headers(request),
                timeout=self.timeout,
            ) as response:
                status = response.status
                retry_after = parse_retry_after(response.headers, now=datetime.now(UTC))
                if self.affinity is not None:
                    self.affinity.remember(
                        request.metadata, response.headers.getall("Set-Cookie", ())
                    )
                if status == 200 and is_event_stream(response.headers.get("Content-Type")):
                    streamed = StreamedAnswer()
                    if tracked is not None:
                        self._progress[tracked] = 0
                    async for line in response.content:
                        if streamed.feed_line(line) and tracked is not None:
                            self._progress[tracked] = streamed.completion_tokens
                    raw = b""
                else:
                    raw = await response.read()
        except StreamError as exc:
            raise AttemptFailed(str(exc), retryable=True, eject=False) from exc
        except TimeoutError as exc:
            raise AttemptFailed("timed out", retryable=True, eject=False, overloaded=True) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise AttemptFailed(f"connection failed: {exc}", retryable=True, eject=True) from exc
        except aiohttp.ClientError as exc:
            raise AttemptFailed(f"HTTP client error: {exc}", retryable=True, eject=False) from exc
        finally:
            worker.in_flight -= 1
            if tracked is not None:
                self._progress.pop(tracked, None)
        latency = self.clock() - started
        text = raw.decode("utf-8", "replace")
        if status != 200:
            message = f"HTTP {status}: {error_message(text)}"
            raise AttemptFailed(
                message,
                retryable=status in RETRYABLE_STATUS,
                eject=status in EJECT_STATUS,
                retry_after=retry_after,
                overloaded=status in OVERLOAD_STATUS,
            )
        if streamed is not None:
            if not streamed.done and streamed.finish_reason is None:
                raise AttemptFailed(
                    "the stream ended before the answer", retryable=True, eject=False
                )
            content, finish_reason = streamed.text, streamed.finish_reason
            usage: Mapping[str, Any] = {
                "prompt_tokens": streamed.usage.get("prompt_tokens"),
                "completion_tokens": streamed.completion_tokens,
            }
        else:
            content, finish_reason, usage = read_completion(text)
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        worker.consecutive_failures = 0
        worker.calls += 1
        worker.prompt_tokens += prompt_tokens
        worker.completion_tokens += completion_tokens
        worker.latency_s += latency
        logger.debug(
            "LLM call done in %.2fs on %s (%s+%s tokens)",
            latency,
            worker.base_url,
            prompt_tokens,
            completion_tokens,
            extra={"action": "llm_call", "job_id": request.metadata.get("job_id")},
        )
        return LLMResponse(
            text=content,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_s=latency,
            gpu_seconds=latency,
            worker=worker.base_url,
            finish_reason=finish_reason,
        )

    def stats(self) -> list[dict[str, Any]]:
        """Per-worker counters (calls, tokens, latency, health)."""
        return [worker.to_dict() for worker in self.workers]

    async def close(self) -> None:
        if self.session is not None and self.owns_session and not self.session.closed:
            await self.session.close()


def error_message(text: str) -> str:
    """The server's error message, from an OpenAI error body or the raw text, shortened."""
    try:
        document = json.loads(text)
    except ValueError:
        return text[:MAX_ERROR_TEXT]
    if isinstance(document, dict):
        error = document.get("error", document.get("detail", document.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        return str(error)[:MAX_ERROR_TEXT]
    return text[:MAX_ERROR_TEXT]


def read_completion(text: str) -> tuple[str, str | None, Mapping[str, Any]]:
    """(content, finish_reason, usage) of a chat completion; raises AttemptFailed on nonsense."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise AttemptFailed(
            f"answer is not JSON: {text[:80]!r}", retryable=True, eject=False
        ) from exc
    choices = document.get("choices") if isinstance(document, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise AttemptFailed("answer has no choices", retryable=True, eject=False)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise AttemptFailed("answer's first choice has no message", retryable=True, eject=False)
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise AttemptFailed("answer's message content is not text", retryable=True, eject=False)
    usage = document.get("usage")
    finish_reason = choices[0].get("finish_reason")
    return (
        content,
        finish_reason if isinstance(finish_reason, str) else None,
        usage if isinstance(usage, dict) else {},
    )
