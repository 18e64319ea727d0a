"""Scheduling benchmark: turnaround under fifo, priority and mlfq, replayed through the served
pipeline on real PostgreSQL, next to the clairvoyant reference.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python -m bench.scheduling

Runs the public trace (when ../shared is present) and six generated variants of the same
family; writes bench/results/scheduling.md (the table and the targets), scheduling.json and
turnaround_distributions.png (turnaround per level, fifo against mlfq).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bot.config import DEFAULT_POLICY_DIR
from bot.model import LEVELS
from bot.policy import load_policy_book
from bot.sched.mlfq import SchedulingPolicy
from bot.sim.clairvoyant import clairvoyant, clairvoyant_outcomes, policy_levels
from bot.sim.metrics import RequestOutcome
from bot.sim.replay import simulate
from bot.sim.trace import Trace, TraceShape, generate_trace, load_trace

RESULTS = Path(__file__).resolve().parent / "results"
PUBLIC_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "morning-burst.jsonl"
)
POLICIES: tuple[SchedulingPolicy, ...] = ("fifo", "priority", "mlfq")

# The targets mlfq is held to on every trace (see `targets`).
MEAN_OVER_BOUND = 1.25
MEAN_OVER_FIFO = 0.40
P0_BEYOND_SERVICE_S = 10.0
P2_P95_OVER_BOUND = 1.10
GPU_OVER_SERVICE = 1.08


def benchmark_traces(include_public: bool = True) -> list[tuple[str, Trace]]:
    """The public trace and variants: another seed, a longer and larger morning, a heavier tail
    of big changes, a sharper peak (55% of arrivals around a 600 s peak), a light morning
    (FIFO waits ~90 s) and one with three times the hotfixes."""
    traces: list[tuple[str, Trace]] = []
    if include_public and PUBLIC_TRACE.is_file():
        traces.append(("morning-burst", load_trace(PUBLIC_TRACE)))
    traces.append(("seed-7", generate_trace(seed=7)))
    longer = TraceShape(requests=1400, duration_s=15000, peak_at_s=5000, peak_width_s=1200)
    traces.append(("1400-long", generate_trace(longer, seed=11)))
    heavy = TraceShape(large_share=0.06, large_tail=0.7, large_max_files=220)
    traces.append(("heavy-tail", generate_trace(heavy, seed=23)))
    sharp = TraceShape(peak_share=0.55, peak_width_s=600)
    traces.append(("sharp-peak", generate_trace(sharp, seed=5)))
    traces.append(("light-seed-5", generate_trace(seed=5)))
    traces.append(("hotfixes", generate_trace(TraceShape(hotfix_per_1000=60), seed=31)))
    return traces


def targets(
    mlfq: dict[str, Any], fifo: dict[str, Any], bound: dict[str, Any]
) -> list[tuple[str, float, float, bool]]:
    """Each target as (name, measured, floor, met): mean turnaround against the clairvoyant
    bound and against fifo, P0 beyond its own service time, P2's P95 against the bound's, GPU
    time against one call per review."""
    mean = mlfq["all"]["turnaround"]["mean"]
    checks = [
        (
            "mean turnaround / clairvoyant",
            mean / bound["all"]["turnaround"]["mean"],
            MEAN_OVER_BOUND,
        ),
        ("mean turnaround / fifo", mean / fifo["all"]["turnaround"]["mean"], MEAN_OVER_FIFO),
        (
            "P0 max (ready to posted - service) s",
            mlfq["levels"]["P0"]["beyond_service"]["max"],
            P0_BEYOND_SERVICE_S,
        ),
        (
            "P2 P95 turnaround / clairvoyant's",
            mlfq["levels"]["P2"]["turnaround"]["p95"]
            / max(1e-9, bound["levels"]["P2"]["turnaround"]["p95"]),
            P2_P95_OVER_BOUND,
        ),
        ("GPU s / one call per review", mlfq["gpu_over_service"], GPU_OVER_SERVICE),
    ]
    completed = float(mlfq["completed"] == mlfq["requests"])
    result = [(name, value, floor, value <= floor) for name, value, floor in checks]
    return [*result, ("all reviews posted", completed, 1.0, completed == 1.0)]


HEADER = (
    "| trace | policy | turnaround mean s | P50 | P95 | P99 | mean slowdown "
    "| P0 max beyond service s | P1 P95 turnaround | P2 P95 turnaround | P3 P95 turnaround "
    "| time to first chunk mean s | P95 | GPU / service | preemptions | posted | wall s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _row(trace: str, name: str, result: dict[str, Any]) -> str:
    turnaround, first = result["all"]["turnaround"], result["all"]["time_to_first_chunk"]
    levels = result["levels"]
    wall = result.get("wall_s")
    return (
        f"| {trace} | {name} | {turnaround['mean']:.1f} | {turnaround['p50']:.1f} "
        f"| {turnaround['p95']:.1f} | {turnaround['p99']:.1f} "
        f"| {result['all']['slowdown']['mean']:.2f} "
        f"| {levels['P0']['beyond_service']['max']:.1f} "
        f"| {levels['P1']['turnaround']['p95']:.1f} | {levels['P2']['turnaround']['p95']:.1f} "
        f"| {levels['P3']['turnaround']['p95']:.1f} "
        f"| {first['mean']:.1f} | {first['p95']:.1f} | {result['gpu_over_service']:.3f} "
        f"| {result.get('preemptions', '')} | {result.get('posted', result['completed'])}"
        f"/{result['requests']} | {'' if wall is None else f'{wall:.1f}'} |"
    )


def plot_turnarounds(outcomes: dict[str, list[RequestOutcome]], path: Path, title: str) -> None:
    """Box plots of turnaround per level, fifo next to mlfq next to the clairvoyant reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in ("fifo", "mlfq", "clairvoyant") if name in outcomes]
    figure, axes = plt.subplots(1, len(LEVELS), figsize=(14, 4), sharey=False)
    for axis, level in zip(axes, LEVELS, strict=True):
        data = []
        for name in names:
            times = [o.turnaround_s or 0.0 for o in outcomes[name] if o.level == level]
            data.append([max(time, 0.01) for time in times] or [0.01])
        axis.boxplot(data, tick_labels=names, showfliers=True)
        axis.set_yscale("log")
        axis.set_title(f"{level} turnaround (s)")
        axis.grid(True, axis="y", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


async def run(database_url: str, *, only: Sequence[str] | None = None) -> str:
    """Run every trace under every policy; returns the markdown table and the targets."""
    level_of = policy_levels(load_policy_book(DEFAULT_POLICY_DIR))
    rows = [HEADER]
    verdicts: list[str] = []
    everything: dict[str, Any] = {}
    for name, trace in benchmark_traces():
        if only and name not in only:
            continue
        outcomes: dict[str, list[RequestOutcome]] = {}
        results: dict[str, Any] = {}
        for policy in POLICIES:
            collected: list[RequestOutcome] = []
            results[policy] = await simulate(
                trace, policy=policy, workers=None, database_url=database_url, collect=collected
            )
            outcomes[policy] = collected
            rows.append(_row(name, policy, results[policy]))
        results["clairvoyant"] = clairvoyant(trace, level_of)
        outcomes["clairvoyant"] = clairvoyant_outcomes(
            trace.requests, level_of, workers=trace.header.workers
        )
        rows.append(_row(name, "clairvoyant", results["clairvoyant"]))
        checks = targets(results["mlfq"], results["fifo"], results["clairvoyant"])
        parts = [
            f"{check} {value:.3f} (<= {floor:g}{'' if met else ', MISSED'})"
            for check, value, floor, met in checks[:-1]
        ]
        missed = [check for check, _, _, met in checks if not met]
        verdicts.append(f"- {name}: " + "; ".join(parts) + (": all met" if not missed else ""))
        everything[name] = results
        if name == "morning-burst":
            plot_turnarounds(
                outcomes, RESULTS / "turnaround_distributions.png", f"{name}: turnaround"
            )
        print(*rows[-4:], sep="\n", flush=True)
    table = "\n".join(rows)
    table += "\n\nTargets (mlfq, every figure at or under its floor):\n\n" + "\n".join(verdicts)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not only:
        (RESULTS / "scheduling.md").write_text(table + "\n", encoding="utf-8")
        (RESULTS / "scheduling.json").write_text(json.dumps(everything, indent=1), "utf-8")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--only", nargs="*", default=None, help="trace names to run")
    args = parser.parse_args(argv)
    print(HEADER)
    table = asyncio.run(run(args.database_url, only=args.only))
    print("\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
