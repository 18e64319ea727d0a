"""A live job as the ETA's dry run sees it: its calls' ranks and expected lengths. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.model import Level
from bot.review.chunking import DEFAULT_FIRST_BUDGET, DEFAULT_LINE_BUDGET
from bot.sched.mlfq import Rank, ServiceEstimator, expected_chunk_s
from bot.status.eta import Arrivals, JobLoad, QueuedCall

# A review whose size is not known yet (a GitLab hook carries none) is planned as this many lines.
UNKNOWN_SIZE_LINES = 200


@dataclass(frozen=True, slots=True)
class LiveCalls:
    """What the queue holds of one live job."""

    job_id: int
    level: Level
    started: bool
    planned: bool
    total_lines: int  # planned size (0 before planning)
    request_lines: int | None  # the size the forge reported, if any
    queued_ranks: Sequence[float] = ()
    queued_lines: Sequence[int] = ()
    running_lines: Sequence[int] = ()
    running_started: Sequence[datetime] = ()
    done_lines: int = 0
    done_calls: int = 0
    done_gpu_s: float = 0.0
    waits_for: tuple[int, ...] = ()  # the jobs it waits for while `waiting` (stacked PRs)


def call_seconds(
    lines: int, *, calls: LiveCalls, estimator: ServiceEstimator, total_lines: int
) -> float:
    """Expected length of one call of `lines`; the job's own finished calls beat the estimate."""
    if calls.done_calls > 0 and calls.done_lines > 0:
        per_line = max(0.0, calls.done_gpu_s - calls.done_calls * estimator.overhead_s)
        return estimator.overhead_s + per_line / calls.done_lines * lines
    return expected_chunk_s(chunk_lines=lines, job_lines=total_lines, estimator=estimator)


def job_load(
    calls: LiveCalls,
    *,
    estimator: ServiceEstimator,
    now: datetime,
    line_budget: int = DEFAULT_LINE_BUDGET,
    first_budget: int | None = DEFAULT_FIRST_BUDGET,
) -> JobLoad:
    """The dry run's view of a job: planned calls as stored, an unplanned one as it will be cut
    (at the planner's `line_budget`, its first call at `first_budget`)."""
    if not calls.planned:
        return _unplanned(
            calls, estimator=estimator, line_budget=line_budget, first_budget=first_budget
        )
    total = max(1, calls.total_lines)
    queued = tuple(
        QueuedCall(rank, call_seconds(lines, calls=calls, estimator=estimator, total_lines=total))
        for rank, lines in zip(calls.queued_ranks, calls.queued_lines, strict=True)
    )
    running = []
    for lines, started_at in zip(calls.running_lines, calls.running_started, strict=True):
        expected = call_seconds(lines, calls=calls, estimator=estimator, total_lines=total)
        elapsed = max(0.0, (now - started_at).total_seconds())
        # A call that overran its estimate is expected to need a little longer still.
        running.append(max(expected - elapsed, estimator.overhead_s))
    return JobLoad(
        calls.job_id,
        calls.level,
        started=calls.started,
        queued=queued,
        running_s=tuple(running),
        waits_for=calls.waits_for,
    )


def unplanned_sizes(lines: int, *, line_budget: int, first_budget: int | None) -> list[int]:
    """Lines per call of a review of `lines` as the chunker will cut it: one call when it fits,
    else a small first call, then the rest in even calls of at most `line_budget` (pure)."""
    if lines <= line_budget:
        return [lines]
    first = min(first_budget, lines) if first_budget is not None else 0
    if first >= line_budget:
        first = 0
    rest = lines - first
    count = math.ceil(rest / line_budget)
    return ([first] if first else []) + [math.ceil(rest / count)] * count


def _unplanned(
    calls: LiveCalls, *, estimator: ServiceEstimator, line_budget: int, first_budget: int | None
) -> JobLoad:
    """Cut an unplanned job the way the chunker will: a small first call, then full ones."""
    lines = calls.request_lines if calls.request_lines else UNKNOWN_SIZE_LINES
    sizes = unplanned_sizes(lines, line_budget=line_budget, first_budget=first_budget)
    seconds = [
        expected_chunk_s(chunk_lines=size, job_lines=lines, estimator=estimator) for size in sizes
    ]
    remaining = sum(seconds[1:])
    queued = [QueuedCall(seconds[0], seconds[0])]
    queued += [
        QueuedCall(Rank(continuation=True, seconds=remaining).packed, s) for s in seconds[1:]
    ]
    return JobLoad(
        calls.job_id, calls.level, started=False, queued=tuple(queued), waits_for=calls.waits_for
    )


# How far back the recent stream of each level is read, and how many reviews make one.
ARRIVALS_WINDOW_S = 900.0
MIN_ARRIVALS = 3


def arrivals_of(
    recent: Sequence[tuple[Level, int | None]],
    *,
    window_s: float = ARRIVALS_WINDOW_S,
    estimator: ServiceEstimator,
    line_budget: int = DEFAULT_LINE_BUDGET,
    first_budget: int | None = DEFAULT_FIRST_BUDGET,
) -> Arrivals | None:
    """The stream the last `window_s` brought (each review's level and size), as a dry run
    plays it on for as long again: per level with at least MIN_ARRIVALS reviews, one of the
    median size every window / count seconds. None when nothing arrives often enough."""
    sizes: dict[Level, list[int]] = {}
    for level, lines in recent:
        sizes.setdefault(level, []).append(lines if lines else UNKNOWN_SIZE_LINES)
    every: dict[Level, float] = {}
    calls: dict[Level, tuple[QueuedCall, ...]] = {}
    for level, found in sizes.items():
        if len(found) < MIN_ARRIVALS:
            continue
        typical = sorted(found)[len(found) // 2]
        every[level] = window_s / len(found)
        unplanned = LiveCalls(
            job_id=0, level=level, started=False, planned=False, total_lines=0,
            request_lines=typical,
        )  # fmt: skip
        calls[level] = _unplanned(
            unplanned, estimator=estimator, line_budget=line_budget, first_budget=first_budget
        ).queued
    # The stream is assumed to go on only as long as it was watched: a burst ends.
    return Arrivals(every, calls, horizon_s=window_s) if every else None


__all__ = [
    "UNKNOWN_SIZE_LINES",
    "LiveCalls",
    "arrivals_of",
    "call_seconds",
    "job_load",
    "unplanned_sizes",
]
