"""The one interface every LLM backend speaks: a chat request in, text plus usage out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """One chat completion: messages, limits, the job's level as priority, and context."""

    messages: Sequence[Mapping[str, str]]
    max_tokens: int = 1024
    temperature: float = 0.0
    priority: int | None = None  # the job's level 0-3; lower is served sooner
    # job_id, chunk_id, lines, total_lines; service_s for the simulated backend only
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # JSON schema of the answer, for servers that constrain decoding to it (optional).
    response_schema: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LLMResponse:
    """The model's text with its token usage, latency and GPU seconds."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    gpu_seconds: float  # measured wall seconds for real backends, charged ones when simulated
    worker: str
    finish_reason: str | None = None
    # Attempts the server refused for load (429, 503) or let time out before this answer.
    overloads: int = 0


@dataclass(frozen=True, slots=True)
class CallProgress:
    """How far a running call's answer has come: tokens made, and the total when known."""

    completion_tokens: int
    # What the whole answer will take, when the backend knows it (a cost model does; a
    # streaming server does not until it stops).
    expected_tokens: int | None = None


# Where a dispatcher reads a running chunk's progress: chunk id in, progress (or None) out.
ProgressSource = Callable[[int], CallProgress | None]


@runtime_checkable
class ReportsProgress(Protocol):
    """A backend that can say how far a running call of a chunk has come (None: unknown)."""

    def progress(self, chunk_id: int) -> CallProgress | None: ...


@runtime_checkable
class LLMBackend(Protocol):
    """A chat completion backend; raises bot.errors.LLMError when a call fails for good."""

    async def complete(self, request: LLMRequest) -> LLMResponse: ...

    async def close(self) -> None: ...
