"""Replay on real PostgreSQL: the scheduler's acceptance bars on a smaller generated trace."""

from __future__ import annotations

from typing import Any

import pytest

from bot.sim.metrics import service_profile
from bot.sim.replay import render_text, simulate
from bot.sim.trace import TraceShape, generate_trace

pytestmark = pytest.mark.slow

# A 400-request morning of the same family (the public trace's density, peak and tails).
SHAPE = TraceShape(requests=400, duration_s=4320.0, peak_at_s=1440.0, peak_width_s=360.0)


def _plain_fifo_mean_wait(trace: Any, workers: int) -> float:
    import heapq

    free = [0.0] * workers
    waits = []
    for request in trace.requests:
        if request.action == "closed" and not request.merged:
            continue
        start = max(heapq.heappop(free), request.arrival_s)
        waits.append(start - request.arrival_s)
        heapq.heappush(free, start + request.service_s)
    return sum(waits) / len(waits)


@pytest.fixture(scope="module")
def trace() -> Any:
    return generate_trace(SHAPE, seed=42)


async def test_fifo_is_faithful_and_mlfq_meets_the_bars(pg_server: str, trace: Any) -> None:
    fifo = await simulate(trace, policy="fifo", workers=8, database_url=pg_server)
    mlfq = await simulate(trace, policy="mlfq", workers=8, database_url=pg_server)
    service_sum = trace.total_service_s
    expected_fifo = _plain_fifo_mean_wait(trace, 8)
    assert fifo["completed"] == fifo["requests"] == len(trace.requests)
    assert fifo["all"]["wait"]["mean"] == pytest.approx(expected_fifo, rel=0.03)
    assert fifo["gpu_s"] == pytest.approx(service_sum, rel=1e-6)
    assert mlfq["completed"] == mlfq["requests"]
    assert mlfq["all"]["wait"]["mean"] <= 0.25 * fifo["all"]["wait"]["mean"]
    assert mlfq["all"]["turnaround"]["mean"] <= 0.60 * fifo["all"]["turnaround"]["mean"]
    levels = mlfq["levels"]
    assert levels["P0"]["n"] > 0 and levels["P0"]["wait"]["max"] <= 10.0
    assert levels["P1"]["wait"]["p95"] <= 60.0
    assert levels["P2"]["wait"]["p95"] <= 300.0
    assert mlfq["all"]["wait"]["max"] <= 2 * 1800.0
    assert mlfq["gpu_s"] <= 1.10 * service_sum
    assert mlfq["gpu_s"] > service_sum  # chunking is not free, and the replay says so


async def test_priority_keeps_levels_static(pg_server: str, trace: Any) -> None:
    priority = await simulate(trace, policy="priority", workers=8, database_url=pg_server)
    assert priority["completed"] == priority["requests"]
    assert priority["level_changes"] == 0
    assert priority["gpu_s"] == pytest.approx(trace.total_service_s, rel=1e-6)
    assert priority["levels"]["P0"]["wait"]["mean"] <= priority["levels"]["P1"]["wait"]["mean"]


def test_text_output_prints_the_service_profile_rule(trace: Any) -> None:
    profile = service_profile([r.service_s for r in trace.requests])
    result = {
        "policy": "mlfq",
        "requests": 1,
        "completed": 1,
        "makespan_s": 1.0,
        "gpu_s": 1.0,
        "utilization": 0.5,
        "all": {
            "wait": dict.fromkeys(("mean", "p50", "p95", "p99", "max"), 0.0),
            "turnaround": dict.fromkeys(("mean", "p50", "p95", "p99", "max"), 0.0),
        },
        "levels": {},
    }
    text = render_text(result, profile)
    assert "P99/P50" in text and "stddev/mean" in text and "rule:" in text
