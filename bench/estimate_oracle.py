"""How much turnaround a perfect cost estimate would buy: mlfq replayed with the dispatcher's
estimate of each review's work replaced by the trace's own cost for its size, against the
estimate it learns today.

    .venv/bin/python -m bench.estimate_oracle   # DATABASE_URL, else the local server

The oracle knows, for every changed-line count in the trace, the mean cost of the trace's
reviews of that size (the scheduler never reads costs otherwise); everything else is the
served pipeline (bot.sim.replay.simulate). Virtual clock, deterministic: one run is the figure.
Writes bench/results/estimate_oracle.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bot.config import DEFAULT_POLICY_DIR
from bot.policy import load_policy_book
from bot.sched.mlfq import ServiceEstimator
from bot.sim.clairvoyant import clairvoyant, policy_levels
from bot.sim.replay import simulate
from bot.sim.trace import Trace, TraceShape, generate_trace, load_trace

RESULTS = Path(__file__).resolve().parent / "results"
PUBLIC_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "morning-burst.jsonl"
)


@dataclass(frozen=True, slots=True)
class OracleEstimator(ServiceEstimator):
    """The learned line, except for sizes whose true work it is told (work beyond overhead)."""

    work_by_lines: Mapping[int, float] = field(default_factory=dict)

    def expected_work(self, lines: int) -> float:
        known = self.work_by_lines.get(lines)
        return known if known is not None else ServiceEstimator.expected_work(self, lines)


def oracle_for(trace: Trace) -> OracleEstimator:
    """An oracle over `trace`: each line count's mean cost beyond the per-call overhead."""
    costs: dict[int, list[float]] = defaultdict(list)
    for request in trace.requests:
        costs[request.total_lines].append(request.service_s - trace.header.overhead_s)
    prior = ServiceEstimator.with_prior()
    return OracleEstimator(
        overhead_s=prior.overhead_s,
        weight=prior.weight,
        sum_x=prior.sum_x,
        sum_y=prior.sum_y,
        sum_xx=prior.sum_xx,
        sum_xy=prior.sum_xy,
        work_by_lines={lines: sum(found) / len(found) for lines, found in costs.items()},
    )


def traces() -> list[tuple[str, Trace]]:
    found: list[tuple[str, Trace]] = []
    if PUBLIC_TRACE.is_file():
        found.append(("morning-burst", load_trace(PUBLIC_TRACE)))
    # bench.scheduling's heavy-tail trace.
    heavy = TraceShape(large_share=0.06, large_tail=0.7, large_max_files=220)
    found.append(("heavy-tail", generate_trace(heavy, seed=23)))
    return found


async def run(database_url: str) -> str:
    level_of = policy_levels(load_policy_book(DEFAULT_POLICY_DIR))
    lines = [
        "# Turnaround with a perfect cost estimate",
        "",
        "`.venv/bin/python -m bench.estimate_oracle` (virtual clock, deterministic).",
        "",
        "| trace | bound mean s | learned: mean s | / bound | P2 P95 / bound's "
        "| oracle: mean s | / bound | P2 P95 / bound's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, trace in traces():
        bound = clairvoyant(trace, level_of)
        row = [name, f"{bound['all']['turnaround']['mean']:.1f}"]
        for estimator in (None, oracle_for(trace)):
            result = await simulate(
                trace, policy="mlfq", workers=None, database_url=database_url, estimator=estimator
            )
            mean = result["all"]["turnaround"]["mean"]
            p2 = result["levels"]["P2"]["turnaround"]["p95"]
            row += [
                f"{mean:.1f}",
                f"{mean / bound['all']['turnaround']['mean']:.3f}",
                f"{p2 / bound['levels']['P2']['turnaround']['p95']:.3f}",
            ]
        lines.append("| " + " | ".join(row) + " |")
        print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args(argv)
    text = asyncio.run(run(args.database_url))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "estimate_oracle.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
