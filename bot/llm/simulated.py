"""A backend that charges the trace cost model and answers with deterministic findings."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from bot.diff import changed_lines, extract_files, parse_files
from bot.errors import LLMError, LLMRequestRejected
from bot.llm.base import CallProgress, LLMRequest, LLMResponse

DEFAULT_OVERHEAD_S = 3.0
DEFAULT_SECONDS_PER_LINE = 0.15

# (pattern on an added line, severity, comment): cheap, deterministic stand-ins for a model.
RULES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"\beval\(|\bexec\("), "critical", "Evaluating dynamic code is unsafe; parse it."),
    (
        re.compile(r"(password|secret|token|api_key)\s*=\s*['\"][^'\"]+['\"]", re.I),
        "critical",
        "A credential looks hard-coded; read it from configuration or a secret store.",
    ),
    (
        re.compile(r"except\s*:|except\s+Exception\s*:\s*pass"),
        "major",
        "This swallows every error; catch the specific exception and handle or re-raise it.",
    ),
    (
        re.compile(r"\bshell\s*=\s*True"),
        "major",
        "shell=True with interpolated input allows command injection; pass an argument list.",
    ),
    (
        re.compile(r"\b(TODO|FIXME|XXX)\b"),
        "minor",
        "A TODO is left in the change; track it in an issue or finish it here.",
    ),
    (
        re.compile(r"\bprint\(|console\.log\("),
        "info",
        "Debug output left in; use the logger or remove it.",
    ),
    (
        re.compile(r"\bsleep\("),
        "minor",
        "A fixed sleep makes this slow and flaky; wait on a condition.",
    ),
)

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


def stable_fraction(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class SimulatedBackend:
    """Charges `overhead_s + f * (service_s - overhead_s)` GPU seconds a call; never sleeps."""

    def __init__(
        self,
        *,
        overhead_s: float = DEFAULT_OVERHEAD_S,
        seconds_per_line: float = DEFAULT_SECONDS_PER_LINE,
        sleep: Sleep | None = None,
        time_scale: float = 1.0,
        malformed_rate: float = 0.0,
        max_findings_per_file: int = 3,
        worker: str = "simulated",
        fault_every: int = 0,
        clock: Clock = time.monotonic,
        context_tokens: int | None = None,
    ) -> None:
        if overhead_s < 0 or seconds_per_line < 0 or time_scale < 0:
            raise ValueError("overhead_s, seconds_per_line and time_scale must be >= 0")
        if not 0.0 <= malformed_rate <= 1.0:
            raise ValueError("malformed_rate must be within [0, 1]")
        if fault_every < 0:
            raise ValueError("fault_every must be >= 0")
        # Fault drills: the first call for every `fault_every`-th chunk (by chunk id) raises an
        # error no backend contract names, as a buggy or unexpected backend would.
        self.fault_every = fault_every
        self.faulted: set[int] = set()
        # A model's context: a prompt (four characters a token) and its answer tokens over it
        # are refused in vLLM's words, before any GPU time is spent, as vLLM refuses them.
        self.context_tokens = context_tokens
        self.refused = 0
        self.overhead_s = overhead_s
        self.seconds_per_line = seconds_per_line
        self.sleep = sleep
        self.time_scale = time_scale
        self.malformed_rate = malformed_rate
        self.max_findings_per_file = max_findings_per_file
        self.worker = worker
        self.calls = 0
        self.gpu_seconds = 0.0
        self.closed = False
        self.clock = clock
        # Calls sleeping out their charge: chunk id -> (start, seconds, answer tokens), so
        # their progress can be told as a streaming server would tell it.
        self._running: dict[int, tuple[float, float, int]] = {}

    def progress(self, chunk_id: int) -> CallProgress | None:
        """Answer tokens a sleeping call has made so far, at an even pace over its time."""
        running = self._running.get(chunk_id)
        if running is None:
            return None
        started, seconds, tokens = running
        share = 1.0 if seconds <= 0 else min(1.0, max(0.0, self.clock() - started) / seconds)
        return CallProgress(completion_tokens=int(tokens * share), expected_tokens=tokens)

    def charge(self, metadata: Mapping[str, Any], prompt_lines: int) -> float:
        """GPU seconds of one call under the trace cost model."""
        lines = float(metadata.get("lines", prompt_lines) or 0)
        total = float(metadata.get("total_lines", lines) or lines)
        share = min(1.0, lines / total) if total > 0 else 1.0
        service = metadata.get("service_s")
        if service is None:
            service_s = self.overhead_s + self.seconds_per_line * total
        else:
            service_s = max(float(service), self.overhead_s)
        return self.overhead_s + share * (service_s - self.overhead_s)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer deterministically from the diff in the prompt; raises LLMError once closed."""
        if self.closed:
            raise LLMError("simulated backend is closed", retryable=False)
        user = next(
            (m.get("content", "") for m in reversed(request.messages) if m.get("role") == "user"),
            "",
        )
        files = parse_files(
            {"path": f.path, "patch": f.patch, "additions": f.additions, "deletions": f.deletions}
            for f in extract_files(user)
        )
        prompt_lines = sum(file.additions + file.deletions for file in files)
        prompt_tokens = max(1, sum(len(m.get("content", "")) for m in request.messages) // 4)
        if self.context_tokens is not None and prompt_tokens + request.max_tokens > (
            self.context_tokens
        ):
            self.refused += 1
            raise LLMRequestRejected(
                f"This model's maximum context length is {self.context_tokens} tokens. However,"
                f" you requested {prompt_tokens + request.max_tokens} tokens ({prompt_tokens} in"
                f" the messages, {request.max_tokens} in the completion)."
            )
        metadata = request.metadata
        gpu_seconds = self.charge(metadata, prompt_lines)
        self.calls += 1
        chunk_id = int(metadata.get("chunk_id") or 0)
        if self.fault_every and chunk_id % self.fault_every == 0 and chunk_id not in self.faulted:
            self.faulted.add(chunk_id)
            raise RuntimeError(f"simulated backend fault (chunk {chunk_id}, first call)")
        self.gpu_seconds += gpu_seconds
        attempt = metadata.get("attempt", 1)
        malformed = self.malformed_rate > 0 and (
            stable_fraction(metadata.get("job_id"), metadata.get("chunk_id"), attempt)
            < self.malformed_rate
        )
        if malformed:
            text = "Sure! Here are my thoughts on this change: looks mostly fine."
        else:
            text = json.dumps(self.review(files), ensure_ascii=False)
        completion_tokens = max(1, len(text) // 4)
        if self.sleep is not None and self.time_scale > 0:
            seconds = gpu_seconds * self.time_scale
            if chunk_id:
                self._running[chunk_id] = (self.clock(), seconds, completion_tokens)
            try:
                await self.sleep(seconds)
            finally:
                self._running.pop(chunk_id, None)
        return LLMResponse(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_s=gpu_seconds * self.time_scale if self.sleep is not None else gpu_seconds,
            gpu_seconds=gpu_seconds,
            worker=self.worker,
            finish_reason="stop",
        )

    def review(self, files: Any) -> dict[str, Any]:
        """Findings on real added lines that match the rules, plus a summary."""
        findings: list[dict[str, Any]] = []
        additions = deletions = 0
        for file in files:
            additions += file.additions
            deletions += file.deletions
            found = 0
            for side, line, text in changed_lines(file):
                if side != "RIGHT" or found >= self.max_findings_per_file:
                    continue
                for pattern, severity, body in RULES:
                    if pattern.search(text):
                        findings.append(
                            {
                                "path": file.path,
                                "line": line,
                                "side": side,
                                "quote": text.strip(),
                                "severity": severity,
                                "body": body,
                            }
                        )
                        found += 1
                        break
        count = len(files)
        summary = (
            f"Checked {count} file{'s' if count != 1 else ''} (+{additions}/-{deletions}); "
            f"{len(findings) or 'no'} issue{'s' if len(findings) != 1 else ''} found."
        )
        return {"findings": findings, "summary": summary}

    async def close(self) -> None:
        self.closed = True
