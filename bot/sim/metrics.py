"""Summaries of a replay: turnaround (push to posted review) first, per level; slowdown, time
to first chunk, GPU use."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.model import LEVELS, Level
from bot.stats import percentile

BREACH_THRESHOLD_S: Mapping[Level, float] = {Level.P0: 10.0, Level.P1: 60.0, Level.P2: 300.0}


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What happened to one request in a replay (times in seconds since the trace start)."""

    request_id: str
    level: Level  # the level the policy gave at intake
    arrival_s: float
    ready_s: float  # arrival, or when the last dependency finished
    started_s: float | None  # its first chunk's call began
    finished_s: float | None  # its review was posted
    service_s: float = 0.0  # GPU seconds of the whole review in one call (the trace's cost)

    @property
    def wait_s(self) -> float | None:
        """Time to first chunk: from ready to the start of its first call."""
        return None if self.started_s is None else max(0.0, self.started_s - self.ready_s)

    @property
    def turnaround_s(self) -> float | None:
        """From the push (arrival) to the posted review."""
        return None if self.finished_s is None else max(0.0, self.finished_s - self.arrival_s)

    @property
    def slowdown(self) -> float | None:
        """Turnaround over the review's own service time (1.0: never waited, never sliced)."""
        turnaround = self.turnaround_s
        if turnaround is None or self.service_s <= 0:
            return None
        return turnaround / self.service_s

    @property
    def beyond_service_s(self) -> float | None:
        """From ready to posted, less its own service time: what scheduling cost it."""
        if self.finished_s is None:
            return None
        return self.finished_s - self.ready_s - self.service_s


def describe(values: Sequence[float]) -> dict[str, float]:
    """mean, p50, p95, p99, max (rounded to ms)."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "mean": round(statistics.fmean(values), 3),
        "p50": round(percentile(values, 0.50), 3),
        "p95": round(percentile(values, 0.95), 3),
        "p99": round(percentile(values, 0.99), 3),
        "max": round(max(values), 3),
    }


def _scope(outcomes: Sequence[RequestOutcome]) -> dict[str, Any]:
    """Turnaround first, then slowdown, time beyond service and time to first chunk."""
    return {
        "turnaround": describe([o.turnaround_s for o in outcomes if o.turnaround_s is not None]),
        "slowdown": describe([o.slowdown for o in outcomes if o.slowdown is not None]),
        "beyond_service": describe(
            [o.beyond_service_s for o in outcomes if o.beyond_service_s is not None]
        ),
        "time_to_first_chunk": describe([o.wait_s for o in outcomes if o.wait_s is not None]),
    }


def summarize(
    outcomes: Iterable[RequestOutcome],
    *,
    policy: str,
    requests: int,
    gpu_s: float,
    workers: int,
    thresholds: Mapping[Level, float] = BREACH_THRESHOLD_S,
) -> dict[str, Any]:
    """The `bot simulate --json` object for a finished replay.

    `breaches` count time to first chunk over the level's alert threshold (what alerts see).
    """
    done = list(outcomes)
    completed = [outcome for outcome in done if outcome.finished_s is not None]
    start = min((o.arrival_s for o in done), default=0.0)
    end = max((o.finished_s for o in completed if o.finished_s is not None), default=start)
    makespan = max(0.0, end - start)
    levels: dict[str, Any] = {}
    for level in LEVELS:
        mine = [outcome for outcome in done if outcome.level == level]
        threshold = thresholds.get(level)
        waits = [o.wait_s for o in mine if o.wait_s is not None]
        breaches = 0 if threshold is None else sum(1 for wait in waits if wait > threshold)
        levels[str(level)] = {"n": len(mine), **_scope(mine), "breaches": breaches}
    service_s = sum(outcome.service_s for outcome in done)
    utilization = gpu_s / (workers * makespan) if makespan > 0 and workers > 0 else 0.0
    return {
        "policy": policy,
        "requests": requests,
        "completed": len(completed),
        "all": _scope(done),
        "levels": levels,
        "makespan_s": round(makespan, 3),
        "gpu_s": round(gpu_s, 3),
        "gpu_over_service": round(gpu_s / service_s, 4) if service_s > 0 else 0.0,
        "utilization": round(utilization, 4),
    }
