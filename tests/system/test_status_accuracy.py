"""The ETA's honesty: errors against the real finish, and a replay through the real queue."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.clock import EPOCH
from bot.model import Level
from bot.sim.replay import simulate
from bot.sim.trace import TraceShape, generate_trace
from bot.status.accuracy import Promise, eta_errors, render_eta_errors


def test_errors_are_absolute_and_relative_to_the_turnaround() -> None:
    promises = {
        1: Promise(Level.P1, EPOCH, EPOCH + timedelta(seconds=100)),  # finished at 120: 20 s
        2: Promise(Level.P1, EPOCH, EPOCH + timedelta(seconds=50)),  # finished at 40: 10 s
        3: Promise(Level.P2, EPOCH, EPOCH + timedelta(seconds=300)),  # never finished
    }
    finished = {1: EPOCH + timedelta(seconds=120), 2: EPOCH + timedelta(seconds=40)}
    summary = eta_errors(promises, finished)
    assert summary["P1"]["n"] == 2 and summary["P2"]["n"] == 0
    assert summary["P1"]["median_error_s"] == pytest.approx(15.0)
    assert summary["P1"]["p90_error_s"] == pytest.approx(19.0)
    # 20/120 and 10/40: a sixth and a quarter
    assert summary["P1"]["median_relative"] == pytest.approx((1 / 6 + 1 / 4) / 2, abs=1e-4)
    text = render_eta_errors(summary)
    assert "P1" in text and "P2" not in text


@pytest.mark.slow
async def test_a_replayed_morning_gets_etas_within_a_quarter_of_the_turnaround(
    pg_server: str,
) -> None:
    shape = TraceShape(requests=300, duration_s=3240.0, peak_at_s=1080.0, peak_width_s=270.0)
    trace = generate_trace(shape, seed=42)
    result = await simulate(
        trace, policy="mlfq", workers=8, database_url=pg_server, record_eta=True
    )
    eta = result["eta"]
    assert eta["all"]["n"] == result["completed"] == result["requests"]
    # An ETA of "now" would be off by the whole turnaround (100 %); the dry run is not.
    assert eta["all"]["median_relative"] < 0.25
    assert eta["P1"]["median_relative"] < 0.25
    without = await simulate(trace, policy="mlfq", workers=8, database_url=pg_server)
    assert "eta" not in without
