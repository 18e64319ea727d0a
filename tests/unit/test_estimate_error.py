"""The estimate-error benchmark's arithmetic on a small generated morning."""

from __future__ import annotations

import statistics

from bench.estimate_error import percentage_errors
from bench.estimate_oracle import oracle_for
from bot.sched.mlfq import ServiceEstimator
from bot.sim.shapes import shape_for
from bot.sim.trace import generate_trace


def test_learning_from_history_beats_the_prior_and_every_review_is_counted() -> None:
    trace = generate_trace(shape_for("morning"), seed=3)
    errors = {mode: percentage_errors(trace, mode) for mode in ("prior", "shared", "repository")}
    assert all(len(found) == len(trace.requests) for found in errors.values())
    assert all(error >= 0 for found in errors.values() for error in found)
    # The first review is estimated from the prior alone, whatever the mode.
    assert errors["prior"][0] == errors["shared"][0] == errors["repository"][0]
    assert statistics.median(errors["shared"]) < statistics.median(errors["prior"])


def test_the_oracle_knows_each_size_and_keeps_learning_the_rest() -> None:
    trace = generate_trace(shape_for("small"), seed=3)
    oracle = oracle_for(trace)
    request = trace.requests[0]
    same_size = [r for r in trace.requests if r.total_lines == request.total_lines]
    expected = statistics.mean(r.service_s - trace.header.overhead_s for r in same_size)
    assert oracle.expected_work(request.total_lines) == expected
    learned = oracle.observe(chunk_lines=50, job_lines=50, gpu_seconds=500.0)
    # What it was told survives learning; sizes it was not told follow the learned line.
    assert learned.expected_work(request.total_lines) == expected
    unknown = 1 + max(r.total_lines for r in trace.requests)
    plain = ServiceEstimator.with_prior().observe(chunk_lines=50, job_lines=50, gpu_seconds=500.0)
    assert learned.expected_work(unknown) == plain.expected_work(unknown)
    assert learned.expected_work(unknown) != oracle.expected_work(unknown)
