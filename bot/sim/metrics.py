"""Summaries of a replay: waits and turnarounds per level, GPU use, the service-time profile."""

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
    started_s: float | None
    finished_s: float | None

    @property
    def wait_s(self) -> float | None:
        return None if self.started_s is None else max(0.0, self.started_s - self.ready_s)

    @property
    def turnaround_s(self) -> float | None:
        return None if self.finished_s is None else max(0.0, self.finished_s - self.arrival_s)


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


def summarize(
    outcomes: Iterable[RequestOutcome],
    *,
    policy: str,
    requests: int,
    gpu_s: float,
    workers: int,
    thresholds: Mapping[Level, float] = BREACH_THRESHOLD_S,
) -> dict[str, Any]:
    """The `bot simulate --json` object for a finished replay."""
    done = list(outcomes)
    completed = [outcome for outcome in done if outcome.finished_s is not None]
    waits = [outcome.wait_s for outcome in done if outcome.wait_s is not None]
    turnarounds = [o.turnaround_s for o in completed if o.turnaround_s is not None]
    start = min((o.arrival_s for o in done), default=0.0)
    end = max((o.finished_s for o in completed if o.finished_s is not None), default=start)
    makespan = max(0.0, end - start)
    levels: dict[str, Any] = {}
    for level in LEVELS:
        mine = [outcome for outcome in done if outcome.level == level]
        level_waits = [o.wait_s for o in mine if o.wait_s is not None]
        level_turnarounds = [o.turnaround_s for o in mine if o.turnaround_s is not None]
        threshold = thresholds.get(level)
        breaches = 0 if threshold is None else sum(1 for w in level_waits if w > threshold)
        levels[str(level)] = {
            "n": len(mine),
            "wait": describe(level_waits),
            "turnaround": describe(level_turnarounds),
            "breaches": breaches,
        }
    utilization = gpu_s / (workers * makespan) if makespan > 0 and workers > 0 else 0.0
    return {
        "policy": policy,
        "requests": requests,
        "completed": len(completed),
        "makespan_s": round(makespan, 3),
        "gpu_s": round(gpu_s, 3),
        "utilization": round(utilization, 4),
        "all": {"wait": describe(waits), "turnaround": describe(turnarounds)},
        "levels": levels,
    }
