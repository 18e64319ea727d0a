"""ETA accuracy: the ETA a review's status shows at enqueue against when it really finished.

    .venv/bin/python -m bench.eta_accuracy   # DATABASE_URL, or a local server

Replays the public morning (when ../shared is present), generated variants and a low-load
morning (150 reviews spread evenly over three hours: the queue is mostly empty) through the real
policy, queue, dispatcher and status ETA (`bot simulate`), and writes
bench/results/eta_accuracy.md: per trace and level, the median and P90 of the absolute error
and of the error relative to the review's actual turnaround, and which trace and level meet
the goal (median error under a quarter of the turnaround).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from bench.held_out_scheduling import two_peaks
from bench.scheduling import benchmark_traces
from bot.sim.replay import simulate
from bot.sim.trace import Trace, TraceShape, generate_trace

RESULTS = Path(__file__).resolve().parent / "results"
TRACES = ("morning-burst", "seed-7", "sharp-peak", "heavy-tail", "hotfixes")
GOAL = 0.25  # median error under a quarter of the turnaround
# A quiet morning: as many reviews an hour as the burst brings in a minute and a half.
LOW_LOAD = TraceShape(requests=150, peak_share=0.0)


def eta_traces() -> list[tuple[str, Trace]]:
    """The burst traces, then the low-load morning."""
    traces = [(name, trace) for name, trace in benchmark_traces() if name in TRACES]
    return [*traces, ("low-load", generate_trace(LOW_LOAD, seed=3))]


def held_out_traces() -> list[tuple[str, Trace]]:
    """Mornings picked before the ETA was tuned on the others and never used to set anything:
    another seed of the default morning, two peaks in one day, another low-load seed."""
    return [
        ("held-out seed-1234", generate_trace(seed=1234)),
        ("held-out two-peaks-4321", two_peaks(4321)),
        ("held-out low-load-17", generate_trace(LOW_LOAD, seed=17)),
    ]


HEADER = (
    "| trace | level | reviews | median error s | P90 error s | median error / turnaround "
    "| P90 error / turnaround | mean turnaround s |\n|---|---|---:|---:|---:|---:|---:|---:|"
)


def rows(name: str, result: dict[str, Any]) -> list[str]:
    lines = []
    for level, row in result["eta"].items():
        if not row["n"]:
            continue
        turnaround = (result["all"] if level == "all" else result["levels"][level])["turnaround"][
            "mean"
        ]
        label = f"**{level}**" if level == "all" else level
        lines.append(
            f"| {name} | {label} | {row['n']} | {row['median_error_s']:.1f} "
            f"| {row['p90_error_s']:.1f} | {row['median_relative']:.1%} "
            f"| {row['p90_relative']:.1%} | {turnaround:.1f} |"
        )
    return lines


def misses(name: str, result: dict[str, Any]) -> list[str]:
    """The levels of a trace whose median error is not under the goal (ten reviews or more)."""
    return [
        f"{name} {level} ({row['median_relative']:.1%} of {row['n']})"
        for level, row in result["eta"].items()
        if row["n"] >= 10 and row["median_relative"] >= GOAL
    ]


async def section(database_url: str, traces: list[tuple[str, Trace]]) -> str:
    """The table of `traces` and which levels miss the goal."""
    table = [HEADER]
    missed: list[str] = []
    for name, trace in traces:
        result = await simulate(
            trace, policy="mlfq", workers=None, database_url=database_url, record_eta=True
        )
        table += rows(name, result)
        missed += misses(name, result)
        print("\n".join(rows(name, result)), flush=True)
    verdict = (
        "Every trace and level with ten reviews or more meets the goal."
        if not missed
        else "Not under the goal (levels with ten reviews or more): " + "; ".join(missed) + "."
    )
    return "\n".join(table) + f"\n\n{verdict}"


async def run(database_url: str) -> str:
    tuned = await section(database_url, eta_traces())
    held_out = await section(database_url, held_out_traces())
    return (
        f"{tuned}\n\n## Held out\n\nMornings picked before the ETA was tuned and never used "
        f"to set anything (bench/eta_accuracy.py, held_out_traces).\n\n{held_out}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args(argv)
    if not args.database_url:
        from bot import devdb

        with devdb.provision_server() as url:
            table = asyncio.run(run(url))
    else:
        table = asyncio.run(run(args.database_url))
    RESULTS.mkdir(exist_ok=True)
    intro = (
        "# ETA accuracy\n\n"
        "`python -m bench.eta_accuracy`: the ETA each review's check run or commit status shows "
        "when it is first queued, against when its review was really finished, replayed through "
        "the real policy, queue, dispatcher and status ETA (mlfq, 8 slots, simulated backend). "
        "The ETA is the scheduler's dry run with the recent stream of each level still arriving, "
        "scaled per level by what it learnt of its misses (bot/status/calibrate.py). Goal: median "
        "error under 25% of the turnaround, overall and per level.\n\n"
    )
    (RESULTS / "eta_accuracy.md").write_text(intro + table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
