"""Scripted models for `bot eval`: an oracle that knows each planted bug and answers the way
real models get positions wrong, and a null model that never finds anything.

Both speak the LLMBackend interface, so a review through them runs the same prompt, parsing
and anchoring code as a review through a real model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from bot.diff import parse_hunks
from bot.errors import LLMError
from bot.eval.plant import Mutant
from bot.llm.base import LLMRequest, LLMResponse

OracleMode = Literal[
    "right_line", "off_by_lines", "wrong_side", "quote_only", "dot_path", "hunk_relative"
]
# How often a real model names a position each way (a made-up but plausible mix: most answers
# right, the rest in the ways review bots are known to miss).
MODE_WEIGHTS: Mapping[OracleMode, float] = {
    "right_line": 0.35,
    "off_by_lines": 0.15,
    "wrong_side": 0.10,
    "quote_only": 0.15,
    "dot_path": 0.10,
    "hunk_relative": 0.15,
}
# A right-line answer quotes its line this often (models do not always quote).
QUOTE_SHARE = 0.5


def user_text(request: LLMRequest) -> str:
    """The last user turn of a chat request."""
    return next(
        (m.get("content", "") for m in reversed(request.messages) if m.get("role") == "user"), ""
    )


def hunk_position(patch: str, new_line: int) -> int | None:
    """The 1-based position of a new-file line within its hunk (counted from the line after
    the `@@` header), as a model that counts from the hunk start would name it."""
    for hunk in parse_hunks(patch):
        for index, line in enumerate(hunk.lines, start=1):
            if line.new_line == new_line:
                return index
    return None


def oracle_finding(mutant: Mutant, mode: OracleMode, rng: random.Random) -> dict[str, Any]:
    """The finding the oracle reports for a mutant, placed the way `mode` errs."""
    finding: dict[str, Any] = {
        "path": mutant.path,
        "line": mutant.first_line,
        "side": "RIGHT",
        "severity": "major",
        "body": mutant.finding,
        "quote": mutant.quote.strip(),
    }
    if mode == "right_line":
        if rng.random() >= QUOTE_SHARE:
            del finding["quote"]
    elif mode == "off_by_lines":
        offset = rng.randint(1, 5)
        below = mutant.first_line - offset >= 1 and rng.random() < 0.5
        finding["line"] = mutant.first_line - offset if below else mutant.first_line + offset
    elif mode == "wrong_side":
        finding["side"] = "LEFT"
    elif mode == "quote_only":
        del finding["line"]
    elif mode == "dot_path":
        finding["path"] = "./" + mutant.path
    elif mode == "hunk_relative":
        finding["line"] = hunk_position(mutant.patch, mutant.first_line) or mutant.first_line
    return finding


def choose_mode(seed: int, mutant_id: int) -> OracleMode:
    """The oracle's way of naming this mutant's position (fixed by the seed)."""
    rng = random.Random(f"oracle-mode:{seed}:{mutant_id}")
    modes = list(MODE_WEIGHTS)
    return rng.choices(modes, weights=[MODE_WEIGHTS[mode] for mode in modes])[0]


def respond(request: LLMRequest, text: str, worker: str) -> LLMResponse:
    prompt_chars = sum(len(message.get("content", "")) for message in request.messages)
    return LLMResponse(
        text=text,
        prompt_tokens=max(1, prompt_chars // 4),
        completion_tokens=max(1, len(text) // 4),
        latency_s=0.0,
        gpu_seconds=0.0,
        worker=worker,
        finish_reason="stop",
    )


class OracleBackend:
    """Knows every planted bug (by the request's job id) and reports it with a seeded error."""

    def __init__(self, mutants: Sequence[Mutant], *, seed: int) -> None:
        self.mutants = {mutant.id: mutant for mutant in mutants}
        self.seed = seed
        self.calls = 0
        self.closed = False

    def mode_of(self, mutant_id: int) -> OracleMode:
        return choose_mode(self.seed, mutant_id)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """One finding for the planted bug when this chunk shows its file; else none."""
        if self.closed:
            raise LLMError("oracle backend is closed", retryable=False)
        self.calls += 1
        mutant = self.mutants.get(int(request.metadata.get("job_id") or 0))
        findings: list[dict[str, Any]] = []
        if mutant is not None and mutant.path in user_text(request):
            rng = random.Random(f"oracle-finding:{self.seed}:{mutant.id}")
            findings.append(oracle_finding(mutant, self.mode_of(mutant.id), rng))
        summary = "One problem found." if findings else "Nothing to report in this part."
        return respond(request, json.dumps({"findings": findings, "summary": summary}), "oracle")

    async def close(self) -> None:
        self.closed = True


class NullBackend:
    """Answers every chunk with no findings."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    async def complete(self, request: LLMRequest) -> LLMResponse:
        if self.closed:
            raise LLMError("null backend is closed", retryable=False)
        self.calls += 1
        text = json.dumps({"findings": [], "summary": "Nothing to report."})
        return respond(request, text, "null")

    async def close(self) -> None:
        self.closed = True
