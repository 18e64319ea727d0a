"""Review each planted bug through the bot's own review path and collect what it posted.

One mutant is one pull request: the planner builds its plan from the diff (skip rules, chunks)
and adds the code around each hunk from the file at the head, the dispatcher's chunk reviewer
prompts the model (title, description, context, numbered diff), parses and anchors its answer,
and the poster's `build_review` turns the chunk results into the review that would be posted.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from bot.eval.plant import Mutant
from bot.forges.base import PullChanges, ReviewToPost
from bot.llm.base import LLMBackend
from bot.model import Chunk, ChunkId, ChunkState, FileChange, Job, JobId, JobState, Level
from bot.queue.records import Leased
from bot.review.chunk_review import chunk_reviewer
from bot.review.context_fetch import with_contexts
from bot.review.planner import PlanningSettings, build_review_plan
from bot.review.poster import build_review

EVAL_REPO = "review-bot-eval/mutants"
# Jobs need a time; the review path takes none from it.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
LEVEL = Level.P2
# Every mutant's pull request says as little as many do.
DESCRIPTION = "Small cleanup."


@dataclass(frozen=True, slots=True)
class ReviewOutcome:
    """What the review of one mutant produced, with its cost."""

    mutant: Mutant
    change: FileChange
    review: ReviewToPost
    # (path, side, line) of every inline comment the review would post.
    inline: tuple[tuple[str, str, int], ...]
    summary_only: int  # findings the bot could not anchor, listed in the summary instead
    dropped: int  # findings the parser dropped (off the diff, malformed, duplicates)
    unparsable_chunks: int
    chunks: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    anchoring: Mapping[str, int]


def sha_of(mutant: Mutant, side: str) -> str:
    """A stable 40-hex commit id for the mutant's base or head."""
    return hashlib.sha1(f"{side}:{mutant.id}:{mutant.path}:{mutant.patch}".encode()).hexdigest()


def change_of(mutant: Mutant) -> FileChange:
    return FileChange(
        path=mutant.path,
        additions=mutant.additions,
        deletions=mutant.deletions,
        patch=mutant.patch,
        status="modified",
    )


def job_of(mutant: Mutant) -> Job:
    return Job(
        id=JobId(mutant.id),
        forge="github",
        repo=EVAL_REPO,
        number=mutant.id,
        head_sha=sha_of(mutant, "head"),
        base_level=LEVEL,
        level=LEVEL,
        state=JobState.RUNNING,
        enqueued_at=EPOCH,
        title=f"Change {mutant.path}",
        base_sha=sha_of(mutant, "base"),
        total_lines=mutant.additions + mutant.deletions,
        planned=True,
    )


def result_counts(result: Mapping[str, Any], key: str) -> dict[str, int]:
    """A chunk result's counter field (absent in older results: empty)."""
    value = result.get(key) or {}
    return (
        {str(name): int(count) for name, count in value.items()}
        if isinstance(value, Mapping)
        else {}
    )


async def review_mutant(
    mutant: Mutant,
    backend: LLMBackend,
    *,
    planning: PlanningSettings | None = None,
    answer_tokens: int = 1024,
) -> ReviewOutcome:
    """Plan, review and assemble one mutant's pull request as the bot would; LLMError from the
    backend propagates."""
    change = change_of(mutant)
    job = job_of(mutant)
    changes = PullChanges(
        base_sha=job.base_sha, head_sha=job.head_sha, start_sha=job.base_sha, files=(change,)
    )
    settings = planning or PlanningSettings()
    plan = build_review_plan(job, changes, None, settings=settings)
    chunk_plans = plan.chunks
    if settings.context_tokens > 0:
        # What planning adds from the file read at the head sha (bot.review.planner does the
        # read through the forge; here the text is the mutant's own).
        chunk_plans = with_contexts(chunk_plans, {mutant.path: mutant.head_text})
    request = {**plan.details, "title": job.title, "description": DESCRIPTION}
    job = replace(job, pull_details=request, chunks_total=len(chunk_plans))
    reviewer = chunk_reviewer(
        backend, max_tokens=answer_tokens, context_tokens=settings.context_tokens
    )
    started = time.perf_counter()
    chunks: list[Chunk] = []
    prompt_tokens = completion_tokens = 0
    for seq, planned in enumerate(chunk_plans, start=1):
        chunk = Chunk(
            id=ChunkId(mutant.id * 1000 + seq),
            job_id=job.id,
            seq=seq,
            level=LEVEL,
            state=ChunkState.RUNNING,
            files=planned.files,
            lines=planned.lines,
            attempts=1,
        )
        reviewed = await reviewer(job, Leased(chunk=chunk), None)
        prompt_tokens += reviewed.usage.prompt_tokens
        completion_tokens += reviewed.usage.completion_tokens
        chunks.append(replace(chunk, state=ChunkState.DONE, result=reviewed.to_result()))
    seconds = time.perf_counter() - started
    review, assembled = build_review(job, chunks)
    anchoring: dict[str, int] = {}
    for chunk in chunks:
        for name, count in result_counts(chunk.result or {}, "anchoring").items():
            anchoring[name] = anchoring.get(name, 0) + count
    return ReviewOutcome(
        mutant=mutant,
        change=change,
        review=review,
        inline=tuple((item.path, item.side, item.line) for item in review.comments),
        summary_only=anchoring.get("summary_only", 0),
        dropped=assembled.dropped,
        unparsable_chunks=sum(
            1 for chunk in chunks if (chunk.result or {}).get("status") == "unparsable"
        ),
        chunks=len(chunks),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        seconds=seconds,
        anchoring=anchoring,
    )


async def review_mutants(
    mutants: Sequence[Mutant],
    backend: LLMBackend,
    *,
    planning: PlanningSettings | None = None,
    answer_tokens: int = 1024,
) -> list[ReviewOutcome]:
    """Review every mutant in turn (one pull request at a time, as a user's model would)."""
    return [
        await review_mutant(mutant, backend, planning=planning, answer_tokens=answer_tokens)
        for mutant in mutants
    ]
