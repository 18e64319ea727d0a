"""The learned cost estimate (bot.sched.cost) against the line over changed lines it falls back
on: how far each is from what reviews cost, and what mlfq's mean turnaround becomes with each,
against the clairvoyant bound, on the public morning and on mornings never used to tune it.

    .venv/bin/python -m bench.learned_estimate   # DATABASE_URL, else the local server

Two figures of error. Walked: every review of the trace in arrival order, estimated before it
is seen, then learnt as one call over the whole change (as bench.estimate_error does), from the
same pure functions the dispatcher calls. Replayed: mlfq through the served pipeline
(bot.sim.replay.simulate), which learns from each finished review's chunks as the cost model
charged them and counts each review's error against what its chunks took. A replay runs on a
virtual clock and is deterministic: one run is the figure. Writes
bench/results/learned_estimate.md (and each trace's replays in bench/results/learned_estimate/;
`--only TRACE` replays one, so traces can run in separate processes, `--render` only renders).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.held_out_scheduling import two_peaks
from bot.config import DEFAULT_POLICY_DIR
from bot.policy import load_policy_book
from bot.sched.cost import CostModel, MeasuredCost, ReviewFeatures, learn_cost, predict_cost
from bot.sched.mlfq import ServiceEstimator
from bot.sim.clairvoyant import clairvoyant, policy_levels
from bot.sim.forge import trace_files
from bot.sim.replay import simulate
from bot.sim.shapes import shape_for
from bot.sim.trace import Trace, generate_trace, load_trace

RESULTS = Path(__file__).resolve().parent / "results"
# Each trace's replayed figures, so traces can be replayed in separate processes.
ROWS = RESULTS / "learned_estimate"
PUBLIC_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "morning-burst.jsonl"
)

# Seeds and shapes picked before anything here was measured, and never used to set the
# estimate's constants (bot.sched.cost: four pseudo-reviews a group, one a pull request).
HELD_OUT: dict[str, tuple[str, Callable[[], Trace]]] = {
    "heavy-tail-5151": (
        "`bot trace generate --shape heavy-tail --seed 5151`",
        lambda: generate_trace(shape_for("heavy-tail"), seed=5151),
    ),
    "two-peaks-2468": (
        "two mornings of 500 (bench.held_out_scheduling.two_peaks, seeds 2468 and 2469)",
        lambda: two_peaks(2468),
    ),
    "refactors-8080": (
        "`bot trace generate --shape morning --seed 8080 --set refactor_share=0.07 "
        "--set large_share=0.1`",
        lambda: generate_trace(
            shape_for("morning", ("refactor_share=0.07", "large_share=0.1")), seed=8080
        ),
    ),
}


def traces() -> list[tuple[str, str, Trace]]:
    found: list[tuple[str, str, Trace]] = []
    if PUBLIC_TRACE.is_file():
        found.append(("morning-burst", "the public morning", load_trace(PUBLIC_TRACE)))
    found += [(name, what, make()) for name, (what, make) in HELD_OUT.items()]
    return found


def walked_errors(trace: Trace) -> tuple[float, float]:
    """(line, learned) median absolute percentage error, each review estimated before seen."""
    line = ServiceEstimator.with_prior()
    model = CostModel()
    line_errors: list[float] = []
    learned_errors: list[float] = []
    for request in trace.requests:
        lines = max(1, request.total_lines)
        features = ReviewFeatures.of(
            forge=request.forge,
            repo=request.repo,
            number=request.number,
            files=[(change.path, change.additions) for change in trace_files(request)],
        )
        learned = predict_cost(model, features, line).engine_s
        line_errors.append(
            abs(line.expected_service(lines) - request.service_s) / request.service_s
        )
        learned_errors.append(abs(learned - request.service_s) / request.service_s)
        model = learn_cost(model, features, MeasuredCost(1, request.service_s, 0, 0), line)
        line = line.observe(chunk_lines=lines, job_lines=lines, gpu_seconds=request.service_s)
    return statistics.median(line_errors), statistics.median(learned_errors)


async def replay_row(name: str, trace: Trace, database_url: str) -> dict[str, Any]:
    """Bound, and mlfq with the line and with the learned estimate, replayed on one trace."""
    level_of = policy_levels(load_policy_book(DEFAULT_POLICY_DIR))
    bound = clairvoyant(trace, level_of)
    row: dict[str, Any] = {
        "bound_mean": bound["all"]["turnaround"]["mean"],
        "bound_p2_p95": bound["levels"]["P2"]["turnaround"]["p95"],
    }
    for mode, learned in (("line", False), ("learned", True)):
        result = await simulate(
            trace, policy="mlfq", workers=None, database_url=database_url, learned_costs=learned
        )
        row[mode] = {
            "mean": result["all"]["turnaround"]["mean"],
            "p2_p95": result["levels"]["P2"]["turnaround"]["p95"],
            "mdape": result["estimate"]["mdape"],
        }
        print(name, mode, row[mode], flush=True)
    return row


def render(rows: Sequence[tuple[str, str, tuple[float, float], dict[str, Any]]]) -> str:
    lines = [
        "# The learned cost estimate against the line it falls back on",
        "",
        "`.venv/bin/python -m bench.learned_estimate` (pure walk and virtual-clock replays:",
        "deterministic, one run is the figure). MdAPE: median of |estimate - cost| / cost of a",
        "review's engine seconds. Walked: in arrival order, each review estimated before it is",
        "learnt (one call over the whole change). Replayed: mlfq through `bot serve`'s pipeline,",
        "each review's estimate at planning against what its chunks took.",
        "",
        "| trace | what | walked MdAPE line | learned | replayed MdAPE line | learned "
        "| bound mean s | line: mean s | / bound | learned: mean s | / bound "
        "| P2 P95 / bound's: line | learned |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, what, (walk_line, walk_learned), row in rows:
        line, learned = row["line"], row["learned"]
        lines.append(
            f"| {name} | {what} | {walk_line:.1%} | {walk_learned:.1%} "
            f"| {line['mdape']:.1%} | {learned['mdape']:.1%} | {row['bound_mean']:.1f} "
            f"| {line['mean']:.1f} | {line['mean'] / row['bound_mean']:.3f} "
            f"| {learned['mean']:.1f} | {learned['mean'] / row['bound_mean']:.3f} "
            f"| {line['p2_p95'] / row['bound_p2_p95']:.3f} "
            f"| {learned['p2_p95'] / row['bound_p2_p95']:.3f} |"
        )
    return "\n".join(lines) + "\n"


async def run(database_url: str, only: Sequence[str]) -> None:
    """Replay the traces (all, or those named) one after another; each row is kept as JSON."""
    ROWS.mkdir(parents=True, exist_ok=True)
    for name, _, trace in traces():
        if only and name not in only:
            continue
        row = await replay_row(name, trace, database_url)
        (ROWS / f"{name}.json").write_text(json.dumps(row, indent=1), encoding="utf-8")


def render_all() -> str:
    """The table of every trace whose replays are kept."""
    rows = []
    for name, what, trace in traces():
        kept = ROWS / f"{name}.json"
        if kept.is_file():
            rows.append((name, what, walked_errors(trace), json.loads(kept.read_text())))
    return render(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument(
        "--only", action="append", default=[], metavar="TRACE", help="replay only this trace"
    )
    parser.add_argument("--render", action="store_true", help="only render the kept rows")
    args = parser.parse_args(argv)
    if not args.render:
        asyncio.run(run(args.database_url, args.only))
    text = render_all()
    (RESULTS / "learned_estimate.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
