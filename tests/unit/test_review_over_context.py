"""A chunk whose prompt the model server refuses as over its context is reviewed anyway:
again without the pull request's text and code context, then in halves until each part fits.
On the simulated backend, which refuses in vLLM's words what does not fit its context."""

from __future__ import annotations

import pytest

from bot.errors import LLMRequestRejected
from bot.llm.simulated import SimulatedBackend
from bot.review.chunk_review import prompt_over_context, review_chunk
from bot.review.chunking import halve_chunk
from bot.review.prompt_context import SharedContext
from bot.review.prompts import build_messages

ANSWER_TOKENS = 64


def _file(index: int, lines: int) -> dict[str, object]:
    """A new file whose first line hard-codes a credential (one finding) and whose other
    lines are plain code of about 60 characters."""
    body = [f'+api_key = "k{index}-0123456789abcdef"'] + [
        f"+value_{index}_{n} = compute_something(alpha, beta, gamma, delta_{n})"
        for n in range(1, lines)
    ]
    patch = f"@@ -0,0 +1,{lines} @@\n" + "\n".join(body)
    return {"path": f"pkg/mod{index}.py", "status": "added", "lines": lines, "patch": patch}


def _prompt_tokens(files: list[dict[str, object]], shared: SharedContext | None = None) -> int:
    return sum(len(m["content"]) for m in build_messages(files, shared=shared)) // 4


async def test_a_chunk_over_the_context_is_reviewed_in_halves_and_loses_no_finding() -> None:
    files = [_file(index, 40) for index in range(4)]
    whole = _prompt_tokens(files)
    half = _prompt_tokens(files[:2])
    # The whole does not fit, each half does.
    backend = SimulatedBackend(context_tokens=(whole + half) // 2 + ANSWER_TOKENS)
    review = await review_chunk(
        backend, files, level=1, metadata={"job_id": 7}, max_tokens=ANSWER_TOKENS
    )
    assert backend.refused == 1 and backend.calls == 2
    assert review.status == "ok" and review.error is None
    assert sorted(f.path for f in review.findings) == [f"pkg/mod{i}.py" for i in range(4)]
    assert all(f.line == 1 for f in review.findings)
    assert review.paths == tuple(f"pkg/mod{i}.py" for i in range(4))
    assert review.lines == 160 and review.attempts == 2 and len(review.workers) == 2
    assert review.usage.prompt_tokens == sum(_prompt_tokens(files[i : i + 2]) for i in (0, 2))


async def test_one_file_over_the_context_is_reviewed_in_parts_of_its_lines() -> None:
    [file] = [_file(0, 120)]
    halves = halve_chunk([file])
    assert halves is not None
    quarters = halve_chunk(halves[0])
    assert quarters is not None
    half, quarter = _prompt_tokens(halves[0]), _prompt_tokens(quarters[0])
    # Halves of 60 lines do not fit; quarters of 30 do.
    backend = SimulatedBackend(context_tokens=(half + quarter) // 2 + ANSWER_TOKENS)
    review = await review_chunk(backend, [file], level=1, max_tokens=ANSWER_TOKENS)
    assert backend.refused == 3 and backend.calls == 4
    assert [f.line for f in review.findings] == [1]
    assert review.lines == 120 and review.paths == ("pkg/mod0.py",)


async def test_the_code_context_goes_before_the_diff_is_cut() -> None:
    files = [_file(index, 10) for index in range(2)]
    shared = SharedContext(title="Add modules", description="x" * 4000)
    assert _prompt_tokens(files, shared) > _prompt_tokens(files) + 900
    backend = SimulatedBackend(context_tokens=_prompt_tokens(files) + 100 + ANSWER_TOKENS)
    review = await review_chunk(backend, files, level=1, max_tokens=ANSWER_TOKENS, shared=shared)
    assert backend.refused == 1 and backend.calls == 1  # sent whole, without the context
    assert len(review.findings) == 2 and review.attempts == 1


async def test_a_single_line_over_the_context_is_refused_as_before() -> None:
    backend = SimulatedBackend(context_tokens=ANSWER_TOKENS + 10)
    with pytest.raises(LLMRequestRejected) as refused:
        await review_chunk(
            backend,
            [_file(0, 1)],
            level=1,
            max_tokens=ANSWER_TOKENS,
            shared=SharedContext(title="", description=""),  # nothing to leave out
        )
    assert prompt_over_context(refused.value)
    assert backend.refused == 1


def test_only_a_refusal_for_length_is_taken_for_one() -> None:
    assert prompt_over_context(
        LLMRequestRejected(
            "LLM call failed: HTTP 400: This model's maximum context length is 4096 tokens."
        )
    )
    assert prompt_over_context(
        LLMRequestRejected(
            "The decoder prompt (length 5000) is longer than the maximum model length of 4096."
        )
    )
    assert not prompt_over_context(
        LLMRequestRejected("LLM call failed: HTTP 400: priority must be in [0, 3]")
    )
