"""How far a review's estimated work is from what it cost: the median absolute percentage error
(MdAPE) of the scheduler's estimate over the public and generated mornings.

    .venv/bin/python -m bench.estimate_error

Each trace is walked in arrival order; every review is estimated before it is seen, then its
cost is learned (one call over the whole change, as the replay's cost model charges it). Three
estimates: the prior alone (what the dispatcher believes with no history), the dispatcher's
online line over every review (bot.sched.mlfq.ServiceEstimator), and one such line per
repository (falling back to the shared one until a repository has 8 reviews). Pure and
deterministic: no clock, no database. Writes bench/results/estimate_error.md.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from bot.sched.mlfq import ServiceEstimator
from bot.sim.shapes import shape_for
from bot.sim.trace import Trace, generate_trace, load_trace

RESULTS = Path(__file__).resolve().parent / "results"
PUBLIC_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "morning-burst.jsonl"
)
PER_REPOSITORY_AFTER = 8

# Traces the scheduler's figures are quoted on, and traces of seeds and shapes chosen before
# any measurement here and never used to set anything (held out).
SEEN: tuple[tuple[str, str, int, tuple[str, ...]], ...] = (
    ("morning-7", "morning", 7, ()),
    ("heavy-tail-23", "heavy-tail", 23, ()),
    ("hotfix-storm-31", "hotfix-storm", 31, ()),
    ("flat-5", "flat", 5, ()),
)
HELD_OUT: tuple[tuple[str, str, int, tuple[str, ...]], ...] = (
    ("heavy-tail-4242 (held out)", "heavy-tail", 4242, ("large_tail=0.3",)),
    ("refactors-9001 (held out)", "morning", 9001, ("refactor_share=0.07", "large_share=0.1")),
)

Estimate = Callable[[str, int], float]


def percentage_errors(trace: Trace, mode: str) -> list[float]:
    """|estimate - cost| / cost per review, each estimated before its own cost is learned."""
    shared = ServiceEstimator.with_prior()
    per_repository: dict[str, tuple[int, ServiceEstimator]] = {}
    errors: list[float] = []
    for request in sorted(trace.requests, key=lambda r: r.arrival_s):
        lines = max(1, request.total_lines)
        if mode == "prior":
            estimate = ServiceEstimator.with_prior().expected_service(lines)
        elif mode == "shared":
            estimate = shared.expected_service(lines)
        else:
            seen, own = per_repository.get(request.repo, (0, ServiceEstimator.with_prior()))
            chosen = own if seen >= PER_REPOSITORY_AFTER else shared
            estimate = chosen.expected_service(lines)
        errors.append(abs(estimate - request.service_s) / request.service_s)
        shared = shared.observe(chunk_lines=lines, job_lines=lines, gpu_seconds=request.service_s)
        seen, own = per_repository.get(request.repo, (0, ServiceEstimator.with_prior()))
        own = own.observe(chunk_lines=lines, job_lines=lines, gpu_seconds=request.service_s)
        per_repository[request.repo] = (seen + 1, own)
    return errors


def traces(include_public: bool = True) -> list[tuple[str, Trace]]:
    found: list[tuple[str, Trace]] = []
    if include_public and PUBLIC_TRACE.is_file():
        found.append(("morning-burst (public)", load_trace(PUBLIC_TRACE)))
    for label, shape, seed, settings in SEEN + HELD_OUT:
        found.append((label, generate_trace(shape_for(shape, settings), seed=seed)))
    return found


def render(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    lines = [
        "# Estimate error: a review's work, estimated before it runs",
        "",
        "`.venv/bin/python -m bench.estimate_error` (pure, deterministic: one run is the figure).",
        "MdAPE: median of |estimate - cost| / cost over the trace's reviews, in arrival order.",
        "",
        "| trace | prior alone | online line (dispatcher today) | line per repository |",
        "|---|---:|---:|---:|",
    ]
    for label, figures in rows:
        lines.append(
            f"| {label} | {figures['prior']:.1%} | {figures['shared']:.1%} "
            f"| {figures['repository']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    rows = [
        (label, {mode: statistics.median(percentage_errors(trace, mode)) for mode in MODES})
        for label, trace in traces()
    ]
    text = render(rows)
    print(text)
    if not args.no_write:
        (RESULTS / "estimate_error.md").write_text(text, encoding="utf-8")
    return 0


MODES = ("prior", "shared", "repository")

if __name__ == "__main__":
    raise SystemExit(main())
