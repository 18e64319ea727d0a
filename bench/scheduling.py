"""Scheduling benchmark: fifo, priority and mlfq replays on real PostgreSQL, and the bound.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python -m bench.scheduling

Runs the public trace (when ../shared is present) and four generated variants of the same
family, writes bench/results/scheduling.md (the table), scheduling.json and
wait_distributions.png (waits per level, fifo vs mlfq).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.sched_model import PUBLIC_TRACE, check_acceptance, clairvoyant, policy_levels
from bot.model import LEVELS
from bot.sched.dispatcher import SchedulingPolicy
from bot.sim.metrics import RequestOutcome
from bot.sim.replay import simulate
from bot.sim.trace import Trace, TraceShape, generate_trace, load_trace

RESULTS = Path(__file__).resolve().parent / "results"
POLICIES: tuple[SchedulingPolicy, ...] = ("fifo", "priority", "mlfq")


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


def _row(trace: str, name: str, result: dict[str, Any], service_sum: float) -> str:
    wait, levels = result["all"]["wait"], result["levels"]
    wall = result.get("wall_s")
    return (
        f"| {trace} | {name} | {wait['mean']:.1f} | {wait['p95']:.1f} | {wait['max']:.0f} "
        f"| {result['all']['turnaround']['mean']:.1f} | {levels['P0']['wait']['max']:.1f} "
        f"| {levels['P1']['wait']['p95']:.1f} | {levels['P2']['wait']['p95']:.1f} "
        f"| {result['gpu_s'] / service_sum:.3f} | {result.get('preemptions', '')} "
        f"| {_wasted(result)} | {result['completed']}/{result['requests']} "
        f"| {'' if wall is None else f'{wall:.1f}'} |"
    )


def _wasted(result: dict[str, Any]) -> str:
    wasted = result.get("wasted_gpu_s")
    return "" if wasted is None else f"{wasted:.0f}"


HEADER = (
    "| trace | policy | wait mean s | wait P95 s | wait max s | turnaround mean s | P0 max wait s "
    "| P1 P95 wait s | P2 P95 wait s | gpu_s / service | preemptions | wasted GPU s | completed "
    "| wall s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def plot_waits(outcomes: dict[str, list[RequestOutcome]], path: Path, title: str) -> None:
    """Box plots of waits per level, fifo next to mlfq."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(LEVELS), figsize=(14, 4), sharey=False)
    for axis, level in zip(axes, LEVELS, strict=True):
        data = []
        for policy in ("fifo", "mlfq"):
            waits = [o.wait_s or 0.0 for o in outcomes.get(policy, []) if o.level == level]
            data.append([max(wait, 0.01) for wait in waits] or [0.01])
        axis.boxplot(data, tick_labels=["fifo", "mlfq"], showfliers=True)
        axis.set_yscale("log")
        axis.set_title(f"{level} waits (s)")
        axis.grid(True, axis="y", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


async def run(database_url: str, *, only: Sequence[str] | None = None) -> str:
    """Run every trace under every policy; returns the markdown table."""
    level_of = policy_levels()
    rows = [HEADER]
    acceptance: list[str] = []
    everything: dict[str, Any] = {}
    for name, trace in benchmark_traces():
        if only and name not in only:
            continue
        service_sum = trace.total_service_s
        outcomes: dict[str, list[RequestOutcome]] = {}
        results: dict[str, Any] = {}
        for policy in POLICIES:
            collected: list[RequestOutcome] = []
            results[policy] = await simulate(
                trace, policy=policy, workers=None, database_url=database_url, collect=collected
            )
            outcomes[policy] = collected
            rows.append(_row(name, policy, results[policy], service_sum))
        results["clairvoyant"] = clairvoyant(trace, level_of, workers=trace.header.workers)
        rows.append(_row(name, "clairvoyant", results["clairvoyant"], service_sum))
        broken = check_acceptance(results["fifo"], results["mlfq"], service_sum)
        mlfq, fifo = results["mlfq"]["all"], results["fifo"]["all"]
        wait_ratio = mlfq["wait"]["mean"] / fifo["wait"]["mean"]
        turnaround_ratio = mlfq["turnaround"]["mean"] / fifo["turnaround"]["mean"]
        verdict = "all bars met" if not broken else "BROKEN " + ", ".join(broken)
        acceptance.append(
            f"- {name}: mlfq/fifo mean wait {wait_ratio:.3f}, "
            f"mean turnaround {turnaround_ratio:.3f}: {verdict}"
        )
        everything[name] = results
        if name == "morning-burst" or not (RESULTS / "wait_distributions.png").exists():
            plot_waits(outcomes, RESULTS / "wait_distributions.png", f"{name}: waits per level")
        plot_waits(outcomes, RESULTS / f"wait_distributions_{name}.png", f"{name}: waits per level")
        print(rows[-4], rows[-3], rows[-2], rows[-1], sep="\n", flush=True)
    table = "\n".join(rows) + "\n\nAcceptance (mlfq against fifo in the same run):\n\n"
    table += "\n".join(acceptance)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scheduling.md").write_text(table + "\n", encoding="utf-8")
    (RESULTS / "scheduling.json").write_text(json.dumps(everything, indent=1), encoding="utf-8")
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
