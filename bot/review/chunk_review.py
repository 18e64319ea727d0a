"""Review one chunk: prompt, LLM call, parse; one stricter retry, then record it as unparsable."""

from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from bot.diff import file_lines, file_value
from bot.errors import LLMRequestRejected
from bot.llm.base import LLMBackend, LLMRequest, LLMResponse
from bot.model import DEFAULT_CONTEXT_TOKENS, Job
from bot.review.anchor import ANCHOR_OUTCOMES, index_files
from bot.review.chunking import halve_chunk
from bot.review.parse import (
    MAX_BODY_CHARS,
    MAX_FINDINGS_PER_CHUNK,
    Finding,
    ParsedChunk,
    build_retry_reminder,
    parse_review,
)
from bot.review.prompt_context import SharedContext, shared_context_for
from bot.review.prompts import build_messages, review_schema
from bot.review.repo_settings import chunk_instructions

if TYPE_CHECKING:
    # Only a type here: the in-process vLLM environment runs this module without the store's
    # database libraries installed.
    from bot.queue.store import Leased

logger = logging.getLogger(__name__)

ParseStatus = Literal["ok", "repaired", "unparsable"]
# How vLLM words a refusal for length: "This model's maximum context length is N tokens",
# "... is longer than the maximum model length of N" (newer versions).
PROMPT_OVER_CONTEXT = re.compile(r"maximum (?:context|model) length|context length", re.IGNORECASE)
RESULT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens, latency and GPU seconds summed over a chunk's attempts."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    gpu_seconds: float = 0.0

    def add(self, response: LLMResponse) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + response.prompt_tokens,
            completion_tokens=self.completion_tokens + response.completion_tokens,
            latency_s=self.latency_s + response.latency_s,
            gpu_seconds=self.gpu_seconds + response.gpu_seconds,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_s": self.latency_s,
            "gpu_seconds": self.gpu_seconds,
        }


@dataclass(frozen=True, slots=True)
class ChunkReview:
    """What one chunk's review produced; `to_result()` is what the chunk row stores."""

    paths: tuple[str, ...]
    findings: tuple[Finding, ...]
    summary: str
    status: ParseStatus
    attempts: int
    usage: Usage
    dropped: int = 0
    drop_reasons: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None
    workers: tuple[str, ...] = ()
    lines: int = 0
    anchoring: Mapping[str, int] = field(default_factory=dict)

    @property
    def gpu_seconds(self) -> float:
        return self.usage.gpu_seconds

    def to_result(self) -> dict[str, Any]:
        """A JSON-serializable dict (inverse: from_result)."""
        return {
            "version": RESULT_VERSION,
            "status": self.status,
            "paths": list(self.paths),
            "lines": self.lines,
            "findings": [finding.to_dict() for finding in self.findings],
            "summary": self.summary,
            "attempts": self.attempts,
            "dropped": self.dropped,
            "drop_reasons": dict(self.drop_reasons),
            "error": self.error,
            "workers": list(self.workers),
            "usage": self.usage.to_dict(),
            "anchoring": dict(self.anchoring),
        }

    @classmethod
    def from_result(cls, data: Mapping[str, Any]) -> ChunkReview:
        """Rebuild from a stored result; raises ValueError/KeyError on a foreign shape."""
        status = data["status"]
        if status not in ("ok", "repaired", "unparsable"):
            raise ValueError(f"unknown chunk status {status!r}")
        usage = data.get("usage") or {}
        return cls(
            paths=tuple(str(path) for path in data.get("paths", ())),
            findings=tuple(Finding.from_dict(item) for item in data.get("findings", ())),
            summary=str(data.get("summary", "")),
            status=status,
            attempts=int(data.get("attempts", 1)),
            usage=Usage(
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                latency_s=float(usage.get("latency_s", 0.0)),
                gpu_seconds=float(usage.get("gpu_seconds", 0.0)),
            ),
            dropped=int(data.get("dropped", 0)),
            drop_reasons={str(k): int(v) for k, v in (data.get("drop_reasons") or {}).items()},
            error=data.get("error"),
            workers=tuple(str(worker) for worker in data.get("workers", ())),
            lines=int(data.get("lines", 0)),
            anchoring={
                str(k): int(v)
                for k, v in (data.get("anchoring") or {}).items()
                if k in ANCHOR_OUTCOMES
            },
        )


async def review_chunk(
    backend: LLMBackend,
    chunk_files: Sequence[Mapping[str, Any] | Any],
    *,
    level: int,
    metadata: Mapping[str, Any] | None = None,
    instructions: str | None = None,
    max_tokens: int = 1024,
    temperature: float = 0.0,
    max_findings: int = MAX_FINDINGS_PER_CHUNK,
    max_body_chars: int = MAX_BODY_CHARS,
    shared: SharedContext | None = None,
) -> ChunkReview:
    """Review one chunk; bot.errors.LLMError from the backend propagates (the chunk is retried).

    A prompt the model server refuses as over its context is sent again without the pull
    request's text and code context, then in halves (files, then hunks) until each part fits:
    the tokenizer may count more tokens than the chunk budget's estimate, and a part of a
    review is never lost to that. Only a single changed line the server refuses is final.
    """
    review = functools.partial(
        _review_whole,
        backend,
        level=level,
        metadata=metadata,
        instructions=instructions,
        max_tokens=max_tokens,
        temperature=temperature,
        max_findings=max_findings,
        max_body_chars=max_body_chars,
    )
    files = list(chunk_files)
    try:
        return await review(files, shared=shared)
    except LLMRequestRejected as exc:
        if not prompt_over_context(exc):
            raise
        refusal = exc
    job_id = (metadata or {}).get("job_id")
    if shared is not None and (shared.title or shared.description or shared.files):
        logger.info(
            "chunk prompt over the model's context: sent again without the code context",
            extra={"action": "review_without_context", "job_id": job_id},
        )
        try:
            return await review(files, shared=None)
        except LLMRequestRejected as exc:
            if not prompt_over_context(exc):
                raise
            refusal = exc
    halves = halve_chunk(files)
    if halves is None:
        raise refusal
    logger.info(
        "chunk prompt over the model's context: reviewed in two parts of %d and %d lines",
        sum(file_lines(file) for file in halves[0]),
        sum(file_lines(file) for file in halves[1]),
        extra={"action": "review_halved", "job_id": job_id},
    )
    parts = [
        await review_chunk(
            backend,
            half,
            level=level,
            metadata=metadata,
            instructions=instructions,
            max_tokens=max_tokens,
            temperature=temperature,
            max_findings=max_findings,
            max_body_chars=max_body_chars,
        )
        for half in halves
    ]
    return joined_review(files, parts)


def prompt_over_context(error: LLMRequestRejected) -> bool:
    """Whether the server refused a request for its prompt's length (vLLM's words for it)."""
    return PROMPT_OVER_CONTEXT.search(str(error)) is not None


def joined_review(
    files: Sequence[Mapping[str, Any] | Any], parts: Sequence[ChunkReview]
) -> ChunkReview:
    """One chunk's review from the reviews of its parts: their findings, usage and counts
    together; unparsable only when no part parsed."""
    parsed = [part for part in parts if part.status != "unparsable"]
    errors = [f"part {n}: {part.error}" for n, part in enumerate(parts, 1) if part.error]
    status: ParseStatus = (
        "unparsable"
        if not parsed
        else "ok"
        if all(part.status == "ok" for part in parts)
        else "repaired"
    )
    usage = Usage()
    for part in parts:
        usage = Usage(
            prompt_tokens=usage.prompt_tokens + part.usage.prompt_tokens,
            completion_tokens=usage.completion_tokens + part.usage.completion_tokens,
            latency_s=usage.latency_s + part.usage.latency_s,
            gpu_seconds=usage.gpu_seconds + part.usage.gpu_seconds,
        )
    return ChunkReview(
        paths=tuple(dict.fromkeys(str(file_value(file, "path", "")) for file in files)),
        findings=tuple(finding for part in parts for finding in part.findings),
        summary=" ".join(part.summary for part in parts if part.summary),
        status=status,
        attempts=sum(part.attempts for part in parts),
        usage=usage,
        dropped=sum(part.dropped for part in parts),
        drop_reasons=dict(sum((Counter(part.drop_reasons) for part in parts), Counter())),
        error="; ".join(errors) or None,
        workers=tuple(worker for part in parts for worker in part.workers),
        lines=sum(file_lines(file) for file in files),
        anchoring=dict(sum((Counter(part.anchoring) for part in parts), Counter())),
    )


async def _review_whole(
    backend: LLMBackend,
    chunk_files: Sequence[Mapping[str, Any] | Any],
    *,
    level: int,
    metadata: Mapping[str, Any] | None,
    instructions: str | None,
    max_tokens: int,
    temperature: float,
    max_findings: int,
    max_body_chars: int,
    shared: SharedContext | None,
) -> ChunkReview:
    """One prompt for the whole chunk, one stricter retry on a broken answer."""
    files = list(chunk_files)
    index = index_files(files)
    paths = tuple(str(file_value(file, "path", "")) for file in files)
    lines = sum(file_lines(file) for file in files)
    context = dict(metadata or {})
    context.setdefault("lines", lines)
    schema = review_schema(paths, max_findings=max_findings)
    usage = Usage()
    workers: list[str] = []
    reminder: str | None = None
    parsed: ParsedChunk | None = None
    first_error: str | None = None
    attempts = 0
    for attempt in (1, 2):
        attempts = attempt
        request = LLMRequest(
            messages=build_messages(
                files, instructions=instructions, reminder=reminder, shared=shared
            ),
            max_tokens=max_tokens,
            temperature=temperature,
            priority=int(level),
            metadata={**context, "attempt": attempt},
            response_schema=schema,
        )
        response = await backend.complete(request)
        usage = usage.add(response)
        workers.append(response.worker)
        parsed = parse_review(
            response.text, index, max_findings=max_findings, max_body_chars=max_body_chars
        )
        if parsed.ok:
            break
        first_error = first_error or parsed.error
        logger.info(
            "chunk answer broke the output contract (attempt %s): %s",
            attempt,
            parsed.error,
            extra={"action": "review_unparsable", "job_id": context.get("job_id")},
        )
        reminder = build_retry_reminder(parsed.error or "invalid answer")
    assert parsed is not None
    if not parsed.ok:
        return ChunkReview(
            paths=paths,
            findings=(),
            summary="",
            status="unparsable",
            attempts=attempts,
            usage=usage,
            error=f"unparsable after {attempts} attempts: {parsed.error}",
            workers=tuple(workers),
            lines=lines,
        )
    return ChunkReview(
        paths=paths,
        findings=parsed.findings,
        summary=parsed.summary,
        status="ok" if attempts == 1 else "repaired",
        attempts=attempts,
        usage=usage,
        dropped=parsed.dropped,
        drop_reasons=dict(Counter(parsed.drop_reasons)),
        error=None if attempts == 1 else f"first answer unusable: {first_error}",
        workers=tuple(workers),
        lines=lines,
        anchoring=dict(parsed.anchoring),
    )


RequestBuilder = Callable[[Job | None, "Leased"], Awaitable[LLMRequest]]
ChunkReviewer = Callable[[Job | None, "Leased", str | None], Awaitable[ChunkReview]]


async def default_request(job: Job | None, leased: Leased) -> LLMRequest:
    """The chunk's prompt from its stored files (the chunk review's message format)."""
    chunk = leased.chunk
    return LLMRequest(
        messages=build_messages(chunk.files),
        priority=int(chunk.level),
        metadata={
            "job_id": chunk.job_id,
            "chunk_id": chunk.id,
            "lines": chunk.lines,
            "total_lines": job.total_lines if job is not None else chunk.lines,
            "attempt": chunk.attempts,
        },
    )


def chunk_reviewer(
    backend: LLMBackend,
    *,
    build_request: RequestBuilder = default_request,
    instructions: str | None = None,
    max_tokens: int = 1024,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> ChunkReviewer:
    """What the dispatcher runs for a leased chunk: prompt, call and parse it (one stricter
    retry on malformed output), with the server's and the repository's instructions, the
    pull request's title, description and code context within `context_tokens`, on the
    engine (LLM server) the chunk's lease names when there is one."""

    async def review(job: Job | None, leased: Leased, engine: str | None = None) -> ChunkReview:
        chunk = leased.chunk
        request = await build_request(job, leased)
        metadata = request.metadata
        if engine is not None:
            metadata = {**metadata, "engine": engine}
        return await review_chunk(
            backend,
            chunk.files,
            level=int(chunk.level),
            metadata=metadata,
            instructions=chunk_instructions(job, chunk.files, instructions),
            max_tokens=max_tokens,
            shared=shared_context_for(job, chunk.files, budget_tokens=context_tokens),
        )

    return review
