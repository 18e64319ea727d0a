"""The estimate-error benchmark's arithmetic on a small generated morning."""

from __future__ import annotations

import statistics

from bench.estimate_error import percentage_errors
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
