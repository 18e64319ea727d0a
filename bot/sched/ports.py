"""What the dispatcher is handed: the review side's chunk reviewer and planner, and callbacks.

The scheduler sees the review only through these shapes (bot/pipeline.py wires the real ones),
so it imports nothing of bot.review.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from bot.model import Job
from bot.queue.store import Leased
from bot.sched.cost import CostEstimate


class CallUsage(Protocol):
    """Tokens and time one chunk's LLM calls took."""

    @property
    def latency_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def gpu_seconds(self) -> float: ...


class ReviewedChunk(Protocol):
    """What reviewing one chunk hands back to be stored (bot.review.chunk_review.ChunkReview)."""

    @property
    def gpu_seconds(self) -> float: ...
    @property
    def usage(self) -> CallUsage: ...
    def to_result(self) -> Mapping[str, Any]: ...


class PlannedJob(Protocol):
    """What planning did to one job, as far as ranking its chunks goes (bot.review.planner)."""

    @property
    def job_id(self) -> int: ...
    @property
    def result(self) -> str: ...
    @property
    def chunk_lines(self) -> tuple[int, ...]: ...
    @property
    def ranks(self) -> tuple[float, ...]: ...
    @property
    def expected_work_s(self) -> float | None: ...


# Reviews one leased chunk (prompt, LLM call, parse) on the named engine, if any: the review
# side, injected by the pipeline.
ChunkReviewer = Callable[[Job | None, Leased, str | None], Awaitable[ReviewedChunk]]
JobCompleted = Callable[[int, datetime], Awaitable[None]]
# Told of a running chunk the dispatcher took back for P0 work (the replay drops its completion).
ChunkPreempted = Callable[[Leased, datetime], Awaitable[None]]
# Plans pending jobs (bot.review.planner through the pipeline: the diff fetched and chunked,
# forge errors retried or ending the job); gets the current cost estimate for the ranks and
# whether work queues beyond the workers (planning then cuts larger chunks), returns what it
# did to each job (a planned job's chunk sizes and ranks among it).
# Whether work queues beyond the workers now; planning asks only once it has claimed a job.
Backlogged = Callable[[], Awaitable[bool]]
PlanJobs = Callable[[datetime, CostEstimate, Backlogged], Awaitable[Sequence[PlannedJob]]]


__all__ = [
    "Backlogged",
    "CallUsage",
    "ChunkPreempted",
    "ChunkReviewer",
    "JobCompleted",
    "PlanJobs",
    "PlannedJob",
    "ReviewedChunk",
]
