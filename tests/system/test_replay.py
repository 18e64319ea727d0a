"""Replay on real PostgreSQL through the served pipeline: the scheduler's targets on turnaround,
on smaller generated traces, against fifo and the clairvoyant reference."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bot.config import DEFAULT_POLICY_DIR
from bot.model import Level
from bot.policy import load_policy_book
from bot.sched.mlfq import MlfqSettings
from bot.sim.clairvoyant import clairvoyant, policy_levels
from bot.sim.forge_budget import limits_for
from bot.sim.metrics import RequestOutcome, summarize
from bot.sim.replay import render_text, simulate
from bot.sim.trace import Trace, TraceHeader, TraceRequest, TraceShape, generate_trace
from bot.stats import service_profile

pytestmark = pytest.mark.slow

# A 400-request morning of the same family (the public trace's density, peak and tails).
SHAPE = TraceShape(requests=400, duration_s=4320.0, peak_at_s=1440.0, peak_width_s=360.0)
# The same morning with a sharper peak (55% of arrivals around a 240 s wide peak): whole-job
# ranks and full-size first chunks kept P1's P95 wait near 120 s on it.
SHARP_SHAPE = replace(SHAPE, peak_share=0.55, peak_width_s=240.0)
LEVEL_OF = policy_levels(load_policy_book(DEFAULT_POLICY_DIR))


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


def _assert_mlfq_meets_the_targets(
    fifo: dict[str, Any], mlfq: dict[str, Any], bound: dict[str, Any]
) -> None:
    """The scheduler's targets, on turnaround (push to posted review)."""
    assert mlfq["completed"] == mlfq["posted"] == mlfq["requests"]
    mean = mlfq["all"]["turnaround"]["mean"]
    assert mean <= 1.25 * bound["all"]["turnaround"]["mean"]
    assert mean <= 0.40 * fifo["all"]["turnaround"]["mean"]
    levels = mlfq["levels"]
    # A hotfix is posted within its own service time and 10 s of becoming ready.
    assert levels["P0"]["n"] > 0 and levels["P0"]["beyond_service"]["max"] <= 10.0
    # Big reviews pay for the burst, but no more than under the clairvoyant order.
    assert levels["P2"]["turnaround"]["p95"] <= 1.10 * bound["levels"]["P2"]["turnaround"]["p95"]
    # Chunking is not free, and the replay says so; it costs at most 8 %.
    assert 1.0 < mlfq["gpu_over_service"] <= 1.08


async def test_fifo_is_faithful_and_mlfq_meets_the_targets(pg_server: str, trace: Any) -> None:
    fifo = await simulate(trace, policy="fifo", workers=8, database_url=pg_server)
    mlfq = await simulate(trace, policy="mlfq", workers=8, database_url=pg_server)
    service_sum = trace.total_service_s
    expected_fifo = _plain_fifo_mean_wait(trace, 8)
    assert fifo["completed"] == fifo["requests"] == len(trace.requests)
    assert fifo["all"]["time_to_first_chunk"]["mean"] == pytest.approx(expected_fifo, rel=0.03)
    assert fifo["gpu_s"] == pytest.approx(service_sum, rel=1e-6)
    _assert_mlfq_meets_the_targets(fifo, mlfq, clairvoyant(trace, LEVEL_OF))


async def test_mlfq_meets_the_targets_under_a_sharp_peak(pg_server: str) -> None:
    sharp = generate_trace(SHARP_SHAPE, seed=42)
    fifo = await simulate(sharp, policy="fifo", workers=8, database_url=pg_server)
    mlfq = await simulate(sharp, policy="mlfq", workers=8, database_url=pg_server)
    # the peak does overload the workers
    assert fifo["levels"]["P1"]["time_to_first_chunk"]["p95"] > 300.0
    _assert_mlfq_meets_the_targets(fifo, mlfq, clairvoyant(sharp, LEVEL_OF))


def test_the_clairvoyant_reference_reads_true_service_times(trace: Any) -> None:
    bound = clairvoyant(trace, LEVEL_OF)
    assert bound["completed"] == bound["requests"] > 0
    assert bound["gpu_over_service"] == pytest.approx(1.0)
    # shortest remaining first on true sizes: the median review never waits
    assert bound["all"]["slowdown"]["p50"] == pytest.approx(1.0, abs=0.05)
    assert bound["all"]["beyond_service"]["mean"] >= -1e-6


async def test_priority_keeps_levels_static(pg_server: str, trace: Any) -> None:
    priority = await simulate(trace, policy="priority", workers=8, database_url=pg_server)
    assert priority["completed"] == priority["requests"]
    assert priority["level_changes"] == 0
    assert priority["gpu_s"] == pytest.approx(trace.total_service_s, rel=1e-6)
    levels = priority["levels"]
    assert (
        levels["P0"]["time_to_first_chunk"]["mean"] <= levels["P1"]["time_to_first_chunk"]["mean"]
    )


def test_text_output_prints_the_service_profile_rule(trace: Any) -> None:
    profile = service_profile([r.service_s for r in trace.requests])
    outcome = RequestOutcome("r1", Level.P1, 0.0, 0.0, 2.0, 12.0, service_s=8.0)
    result = summarize([outcome], policy="mlfq", requests=1, gpu_s=8.0, workers=1)
    text = render_text(result, profile)
    assert text.splitlines()[1].startswith("turnaround: push to review posted")
    assert result["all"]["turnaround"]["mean"] == 12.0
    assert result["all"]["slowdown"]["mean"] == 1.5
    assert result["all"]["time_to_first_chunk"]["mean"] == 2.0
    assert "P99/P50" in text and "stddev/mean" in text and "rule:" in text


def _request(index: int, arrival_s: float, lines: int, service_s: float, base: str) -> TraceRequest:
    return TraceRequest(
        id=f"r{index}",
        arrival_s=arrival_s,
        forge="github",
        repo="acme/api",
        number=index,
        event="pull_request",
        action="opened",
        merged=False,
        base_ref=base,
        head_ref=f"feature/{index}",
        labels=(),
        author="dev",
        author_is_bot=False,
        draft=False,
        files_changed=1,
        additions=lines,
        deletions=0,
        file_lines=(lines,),
        service_s=service_s,
    )


def _busy_morning_with_a_hotfix() -> Trace:
    """Four slots, each running a 300 s call from t=0; a hotfix arrives at t=20."""
    requests = [_request(i, 0.1 * i, 300, 300.0, "main") for i in range(4)]
    requests.append(_request(9, 20.0, 10, 6.0, "hotfix/2026-12-01"))
    return Trace(header=TraceHeader(workers=4, requests=len(requests)), requests=tuple(requests))


async def test_a_hotfix_preempts_a_long_call_instead_of_waiting_for_it(pg_server: str) -> None:
    trace = _busy_morning_with_a_hotfix()
    service_sum = trace.total_service_s
    runs = {}
    for preempt in (False, True):
        runs[preempt] = await simulate(
            trace,
            policy="mlfq",
            workers=None,
            database_url=pg_server,
            mlfq=MlfqSettings(reserved_slots=0, preempt=preempt),
        )
    waiting, preempting = runs[False], runs[True]
    assert waiting["levels"]["P0"]["time_to_first_chunk"]["max"] > 250.0  # waited for a 300 s call
    assert waiting["preemptions"] == 0 and waiting["gpu_s"] == pytest.approx(service_sum)
    assert preempting["levels"]["P0"]["n"] == 1
    assert preempting["levels"]["P0"]["time_to_first_chunk"]["max"] == pytest.approx(0.0, abs=1e-6)
    assert preempting["preemptions"] == 1
    assert preempting["completed"] == preempting["requests"] == 5
    # the preempted call ran 20 s before it gave way, and those seconds count
    assert preempting["wasted_gpu_s"] == pytest.approx(20.0 - 0.3, abs=0.01)
    assert preempting["gpu_s"] == pytest.approx(service_sum + preempting["wasted_gpu_s"])


async def test_the_replay_posts_through_one_installations_write_budget(pg_server: str) -> None:
    """300 reviews in an hour through one GitHub installation (about 900 writes against 500 an
    hour): every review is posted, a P0's review hardly waits while P1 and P2 reviews wait up
    to the next hour, the writes keep the hour's limit, and the turnaround counts the wait."""
    hour = generate_trace(
        TraceShape(requests=300, duration_s=3600.0, peak_at_s=1800.0, peak_width_s=600.0),
        seed=26,
    )
    budgeted = await simulate(
        hour,
        policy="mlfq",
        workers=16,
        database_url=pg_server,
        forge_budget=limits_for("github"),
        record_eta=True,
    )
    stats = budgeted["forge_budget"]
    assert stats["never_posted"] == 0 and budgeted["completed"] == budgeted["requests"]
    delay = stats["posting_delay"]
    assert delay["P0"]["p95_s"] < 60 < min(delay["P1"]["p95_s"], delay["P2"]["p95_s"])
    assert stats["writes"] <= 500 * (stats["last_write_s"] / 3600 + 1)
    assert 1.0 <= stats["writes_per_review"] <= 4.0
    assert budgeted["all"]["turnaround"]["p95"] > delay["P1"]["p95_s"] / 2
    # The ETA is judged against the last chunk, the budget being played after the run: its
    # error is the queue's, not the budget's wait (which put it near 100% before).
    assert budgeted["eta"]["all"]["median_relative"] < 0.5
