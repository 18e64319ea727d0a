"""The replay on batched engines (bot simulate --batching) against exclusive slots, through the
served pipeline on real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from bot.llm.batching import PROFILES
from bot.sim.replay import render_batching, simulate
from bot.sim.trace import TraceShape, generate_trace

pytestmark = pytest.mark.slow

# A short, busy morning: 150 requests in 20 minutes on 4 GPUs.
SHAPE = TraceShape(requests=150, duration_s=1200.0, peak_at_s=400.0, peak_width_s=200.0)


@pytest.fixture(scope="module")
def trace() -> Any:
    return generate_trace(SHAPE, seed=11)


async def test_batched_engines_turn_reviews_around_sooner_than_exclusive_slots(
    pg_server: str, trace: Any
) -> None:
    exclusive = await simulate(trace, policy="mlfq", workers=4, database_url=pg_server)
    batched = await simulate(
        trace, policy="mlfq", workers=4, database_url=pg_server, batching=PROFILES["gpu-7b"]
    )
    assert batched["completed"] == batched["requests"] == exclusive["requests"]
    assert batched["posted"] == exclusive["posted"]
    # Batching makes the same GPUs do more at once: the queue behind them melts. A call that
    # never waited may take a little longer in a batch than alone (its share of each step).
    assert batched["all"]["turnaround"]["mean"] < 0.6 * exclusive["all"]["turnaround"]["mean"]
    # P1 keeps the slots while work queues (P2 waits then), so on exclusive slots its queue is
    # already the shorter one and batching has less of it to melt (0.61x here, P2 0.09x).
    for name, share in (("P1", 0.7), ("P2", 0.6)):
        mean = exclusive["levels"][name]["turnaround"]["mean"]
        assert batched["levels"][name]["turnaround"]["mean"] < share * mean
    for name, level in exclusive["levels"].items():
        assert batched["levels"][name]["turnaround"]["mean"] < 1.25 * level["turnaround"]["mean"]
    # The engines' busy time is less than the calls would cost one at a time.
    assert batched["gpu_s"] < exclusive["gpu_s"]
    model = batched["batching"]
    assert set(model["engines"]) == {f"engine-{index}" for index in range(4)}
    assert all(0 < engine["utilization"] <= 1 for engine in model["engines"].values())
    # Under the burst the windows grew past their start.
    assert max(window["max"] for window in model["windows"].values()) > 4
    text = render_batching({"exclusive": exclusive, "batched": batched}, workers=4)
    assert "4 exclusive slots" in text and "gpu-7b" in text
