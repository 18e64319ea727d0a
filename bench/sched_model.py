"""A pure-Python discrete-event model of the scheduler, to tune it fast, plus the clairvoyant bound.

The model uses the same pure decisions as the dispatcher (bot.sched.mlfq, bot.review.chunking)
and the trace cost model, but keeps the queue in memory. The shipped scheduler is measured by
`bot simulate` (bot.sim.replay) against real PostgreSQL; this file only explores parameters.

    .venv/bin/python -m bench.sched_model [--trace FILE] [--budget 400] ...
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bot.model import LEVELS, Level
from bot.review.chunking import DEFAULT_FIRST_BUDGET, plan_chunks_from_lines
from bot.sched.mlfq import (
    CONTINUATION_RANK_OFFSET,
    MlfqSettings,
    ServiceEstimator,
    apply_aging,
    apply_feedback,
    choose_slot,
    rank_chunks,
)
from bot.sim.metrics import RequestOutcome, summarize
from bot.sim.trace import Trace, TraceRequest, generate_trace, load_trace, to_review_request

PUBLIC_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "morning-burst.jsonl"
)


def policy_levels() -> Callable[[TraceRequest], Level | None]:
    """Level per trace request from the real policy (None: not reviewed)."""
    from bot.config import DEFAULT_POLICY_DIR
    from bot.policy import evaluate, load_policy_book

    book = load_policy_book(DEFAULT_POLICY_DIR)

    def level_of(request: TraceRequest) -> Level | None:
        review_request = to_review_request(request)
        if review_request is None:
            return None
        decision = evaluate(book.policy_for(review_request.repo), review_request)
        return decision.level if decision.review else None

    return level_of


@dataclass
class ModelConfig:
    policy: str = "mlfq"  # fifo | priority | mlfq
    workers: int = 8
    overhead_s: float = 3.0
    line_budget: int = 400
    first_budget: int | None = DEFAULT_FIRST_BUDGET
    mlfq: MlfqSettings = field(default_factory=MlfqSettings)
    aging_check_s: float = 60.0
    update_rank: bool = True
    new_work_first: bool = True
    fresh_tier: bool = True
    fresh_by_first_chunk: bool = True


@dataclass
class _Job:
    request: TraceRequest
    index: int
    base_level: Level
    level: Level
    chunks: list[int]
    ready_s: float | None = None
    next_chunk: int = 0
    running: int = 0
    done_chunks: int = 0
    done_lines: int = 0
    done_gpu: float = 0.0
    level_gpu: float = 0.0
    last_progress: float = 0.0
    ranks: list[float] = field(default_factory=list)
    started_s: float | None = None
    finished_s: float | None = None
    dependents: list[int] = field(default_factory=list)
    waiting_on: int = 0
    history: list[str] = field(default_factory=list)

    @property
    def rank(self) -> float:
        return self.ranks[self.next_chunk - len(self.chunks) + len(self.ranks)]

    @property
    def total_lines(self) -> int:
        return sum(self.chunks)

    def has_ready_chunk(self) -> bool:
        return self.ready_s is not None and self.next_chunk < len(self.chunks)


def _chunk_cost(job: _Job, lines: int, overhead: float) -> float:
    total = job.total_lines
    share = lines / total if total > 0 else 1.0
    return overhead + share * (max(job.request.service_s, overhead) - overhead)


def simulate(
    trace: Trace,
    config: ModelConfig,
    level_of: Callable[[TraceRequest], Level | None],
    collect: list[RequestOutcome] | None = None,
) -> dict[str, Any]:
    """Run the model; returns the same object as `bot simulate --json` (`collect`: outcomes)."""
    overhead = config.overhead_s
    settings = config.mlfq
    estimator = ServiceEstimator.with_prior(overhead_s=overhead)
    jobs: list[_Job] = []
    by_id: dict[str, int] = {}
    for request in trace.requests:
        level = level_of(request)
        if level is None:
            continue
        if config.policy == "mlfq":
            chunks = [
                c.lines
                for c in plan_chunks_from_lines(
                    request.file_lines,
                    line_budget=config.line_budget,
                    first_budget=config.first_budget,
                ).chunks
            ]
        else:
            chunks = [request.total_lines]
        if config.policy == "fifo":
            level = Level.P1
        job = _Job(request, len(jobs), level, level, chunks)
        by_id[request.id] = job.index
        jobs.append(job)
    intake_level = {job.index: job.base_level for job in jobs}
    events: list[tuple[float, int, int, int, int]] = []  # time, kind, seq, job, chunk lines
    sequence = 0
    for job in jobs:
        heapq.heappush(events, (job.request.arrival_s, 1, sequence, job.index, 0))
        sequence += 1
    free = config.workers
    gpu_total = 0.0
    next_aging = config.aging_check_s
    arrived: set[int] = set()
    running_ranks: dict[int, float] = {}

    def set_level(job: _Job, level: Level, reason: str, now: float) -> None:
        if level == job.level:
            return
        job.history.append(f"{now:.0f} {job.level}->{level}: {reason}")
        job.level = level
        job.level_gpu = 0.0
        job.last_progress = now

    def rerank(job: _Job, planning: bool = False) -> None:
        if config.policy == "fifo":
            job.ranks = [job.ready_s or 0.0] * len(job.chunks)
            return
        if config.policy == "priority":
            job.ranks = [job.request.arrival_s] * len(job.chunks)
            return
        if not planning and not config.update_rank:
            return
        job.ranks = list(
            rank_chunks(
                job.chunks,
                estimator=estimator,
                done_lines=job.done_lines,
                done_chunks=job.done_chunks,
                done_gpu_s=job.done_gpu,
                first_seq=job.next_chunk,
                new_work_first=config.new_work_first,
                fresh_by_first_chunk=config.fresh_by_first_chunk,
            )
        )

    def fill(now: float) -> None:
        nonlocal free, sequence, gpu_total
        while free > 0:
            running = [0, 0, 0, 0]
            ready = [0, 0, 0, 0]
            short = [0, 0, 0, 0]
            fresh = [0, 0, 0, 0]
            running_long = sum(1 for rank in running_ranks.values() if rank > settings.short_work_s)
            best: dict[Level, _Job] = {}
            best_short: dict[Level, _Job] = {}
            for job in jobs:
                running[job.level] += job.running
                if job.has_ready_chunk():
                    ready[job.level] += len(job.chunks) - job.next_chunk
                    key = (job.rank, job.index)
                    current = best.get(job.level)
                    if current is None or key < (current.rank, current.index):
                        best[job.level] = job
                    if job.rank < CONTINUATION_RANK_OFFSET:
                        fresh[job.level] += 1
                    if job.rank <= settings.short_work_s:
                        short[job.level] += 1
                        current = best_short.get(job.level)
                        if current is None or key < (current.rank, current.index):
                            best_short[job.level] = job
            if config.policy == "mlfq":
                choice = choose_slot(
                    running=running,
                    ready=ready,
                    free_slots=free,
                    total_slots=config.workers,
                    settings=settings,
                    short_ready=short,
                    fresh=fresh if config.fresh_tier else None,
                    running_long=running_long,
                )
                if choice is None:
                    return
                pool = best_short if choice.max_rank is not None else best
                picked = next((pool[level] for level in choice.levels if level in pool), None)
            else:
                picked = next((best[level] for level in LEVELS if level in best), None)
            if picked is None:
                return
            lines = picked.chunks[picked.next_chunk]
            running_ranks[sequence] = picked.rank
            picked.next_chunk += 1
            picked.running += 1
            if picked.started_s is None:
                picked.started_s = now
            cost = _chunk_cost(picked, lines, overhead)
            free -= 1
            heapq.heappush(events, (now + cost, 0, sequence, picked.index, lines))
            # the event's sequence number identifies the running chunk
            sequence += 1

    def make_ready(job: _Job, now: float) -> None:
        job.ready_s = now
        job.last_progress = now
        rerank(job, planning=True)

    while events:
        now, kind, event_seq, index, lines = heapq.heappop(events)
        running_ranks.pop(event_seq, None)
        while config.policy == "mlfq" and next_aging <= now:
            for job in jobs:
                if job.has_ready_chunk() and job.running == 0:
                    change = apply_aging(
                        level=job.level,
                        base_level=job.base_level,
                        waited_s=next_aging - job.last_progress,
                        settings=settings,
                    )
                    if change is not None:
                        set_level(job, change.level, change.reason, next_aging)
            next_aging += config.aging_check_s
        job = jobs[index]
        if kind == 1:
            arrived.add(index)
            live = [
                by_id[d]
                for d in job.request.depends_on
                if d in by_id and jobs[by_id[d]].finished_s is None
            ]
            job.last_progress = now
            if live:
                job.waiting_on = len(live)
                for dependency in live:
                    jobs[dependency].dependents.append(index)
                    if config.policy == "mlfq" and jobs[dependency].level > job.level:
                        set_level(jobs[dependency], job.level, "inheritance", now)
            else:
                make_ready(job, now)
        else:
            free += 1
            gpu = _chunk_cost(job, lines, overhead)
            gpu_total += gpu
            job.running -= 1
            job.done_chunks += 1
            job.done_lines += lines
            job.done_gpu += gpu
            job.level_gpu += gpu
            job.last_progress = now
            if config.policy == "mlfq":
                estimator = estimator.observe(
                    chunk_lines=lines, job_lines=job.total_lines, gpu_seconds=gpu
                )
                inherited = any(
                    jobs[d].finished_s is None and jobs[d].level <= job.level
                    for d in job.dependents
                )
                change = apply_feedback(
                    level=job.level, used_at_level_s=job.level_gpu, settings=settings
                )
                if change is not None and not inherited:
                    set_level(job, change.level, change.reason, now)
                rerank(job)
            if job.done_chunks == len(job.chunks):
                job.finished_s = now
                for dependent_index in job.dependents:
                    dependent = jobs[dependent_index]
                    dependent.waiting_on -= 1
                    if dependent.waiting_on == 0:
                        make_ready(dependent, now)
        fill(now)
    outcomes = [
        RequestOutcome(
            request_id=job.request.id,
            level=intake_level[job.index],
            arrival_s=job.request.arrival_s,
            ready_s=job.ready_s if job.ready_s is not None else job.request.arrival_s,
            started_s=job.started_s,
            finished_s=job.finished_s,
        )
        for job in jobs
    ]
    if collect is not None:
        collect.extend(outcomes)
    return summarize(
        outcomes, policy=config.policy, requests=len(jobs), gpu_s=gpu_total, workers=config.workers
    )


def clairvoyant(
    trace: Trace, level_of: Callable[[TraceRequest], Level | None], *, workers: int = 8
) -> dict[str, Any]:
    """Preemptive shortest-remaining-time on `workers` servers, reading service_s, no overhead."""
    requests = [r for r in trace.requests if level_of(r) is not None]
    levels = {r.id: level_of(r) for r in requests}
    remaining = {r.id: r.service_s for r in requests}
    arrival = {r.id: r.arrival_s for r in requests}
    pending_deps = {r.id: {d for d in r.depends_on if d in remaining} for r in requests}
    dependents: dict[str, list[str]] = {}
    for r in requests:
        for d in pending_deps[r.id]:
            dependents.setdefault(d, []).append(r.id)
    ready_at: dict[str, float] = {}
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    arrivals = sorted(requests, key=lambda r: r.arrival_s)
    position = 0
    active: set[str] = set()
    now = 0.0
    while position < len(arrivals) or active:
        while position < len(arrivals) and arrivals[position].arrival_s <= now + 1e-12:
            rid = arrivals[position].id
            position += 1
            if not {d for d in pending_deps[rid] if d not in finished}:
                ready_at[rid] = arrivals[position - 1].arrival_s
                active.add(rid)
        running = sorted(active, key=lambda rid: (remaining[rid], arrival[rid]))[:workers]
        next_arrival = arrivals[position].arrival_s if position < len(arrivals) else math.inf
        if not running:
            now = next_arrival
            continue
        step = min(min(remaining[rid] for rid in running), next_arrival - now)
        for rid in running:
            started.setdefault(rid, now)
            remaining[rid] -= step
        now += step
        for rid in running:
            if remaining[rid] <= 1e-9:
                active.discard(rid)
                finished[rid] = now
                for dependent in dependents.get(rid, []):
                    if dependent in ready_at or dependent not in {
                        a.id for a in arrivals[:position]
                    }:
                        continue
                    if all(d in finished for d in pending_deps[dependent]):
                        ready_at[dependent] = now
                        active.add(dependent)
    outcomes = [
        RequestOutcome(
            request_id=r.id,
            level=levels[r.id] or Level.P1,
            arrival_s=r.arrival_s,
            ready_s=ready_at.get(r.id, r.arrival_s),
            started_s=started.get(r.id),
            finished_s=finished.get(r.id),
        )
        for r in requests
    ]
    return summarize(
        outcomes,
        policy="clairvoyant",
        requests=len(requests),
        gpu_s=sum(r.service_s for r in requests),
        workers=workers,
    )


def check_acceptance(fifo: dict[str, Any], mlfq: dict[str, Any], service_sum: float) -> list[str]:
    """The issue's bars; returns the ones broken (empty: all met)."""
    broken: list[str] = []
    levels = mlfq["levels"]
    checks = [
        (
            "mean wait <= 25% fifo",
            mlfq["all"]["wait"]["mean"] <= 0.25 * fifo["all"]["wait"]["mean"],
        ),
        (
            "mean turnaround <= 60% fifo",
            mlfq["all"]["turnaround"]["mean"] <= 0.60 * fifo["all"]["turnaround"]["mean"],
        ),
        ("P0 max wait <= 10", levels["P0"]["wait"]["max"] <= 10.0),
        ("P1 p95 wait <= 60", levels["P1"]["wait"]["p95"] <= 60.0),
        ("P2 p95 wait <= 300", levels["P2"]["wait"]["p95"] <= 300.0),
        ("max wait <= 3600", mlfq["all"]["wait"]["max"] <= 3600.0),
        ("completed", mlfq["completed"] == mlfq["requests"]),
        ("gpu <= 1.10 service", mlfq["gpu_s"] <= 1.10 * service_sum),
    ]
    for name, ok in checks:
        if not ok:
            broken.append(name)
    return broken


def _row(name: str, result: dict[str, Any], service_sum: float) -> str:
    levels, wait = result["levels"], result["all"]["wait"]
    turnaround = result["all"]["turnaround"]["mean"]
    return (
        f"{name:<24} wait mean {wait['mean']:7.1f} p95 {wait['p95']:7.1f}"
        f" max {wait['max']:7.1f} | turn {turnaround:7.1f}"
        f" | P0 max {levels['P0']['wait']['max']:5.1f} P1 p95 {levels['P1']['wait']['p95']:6.1f}"
        f" P2 p95 {levels['P2']['wait']['p95']:6.1f} P3 max {levels['P3']['wait']['max']:7.1f}"
        f" | gpu {result['gpu_s'] / service_sum:5.3f}"
        f" done {result['completed']}/{result['requests']}"
    )


def variants(extended: bool = False) -> list[tuple[str, Trace]]:
    """The public trace (when present) and variants: other seeds, sizes, tails and peaks."""
    from bot.sim.trace import TraceShape

    traces: list[tuple[str, Trace]] = []
    if PUBLIC_TRACE.is_file():
        traces.append(("public", load_trace(PUBLIC_TRACE)))
    traces.append(("gen-seed7", generate_trace(seed=7)))
    traces.append(
        (
            "gen-1400-long",
            generate_trace(
                TraceShape(requests=1400, duration_s=15000, peak_at_s=5000, peak_width_s=1200),
                seed=11,
            ),
        )
    )
    traces.append(
        (
            "gen-heavy-tail",
            generate_trace(
                TraceShape(large_share=0.06, large_tail=0.7, large_max_files=220), seed=23
            ),
        )
    )
    traces.append(
        ("gen-sharp-peak", generate_trace(TraceShape(peak_share=0.55, peak_width_s=600), seed=5))
    )
    if not extended:
        return traces
    small = TraceShape(requests=600, duration_s=6480, peak_at_s=2160, peak_width_s=528)
    large = TraceShape(requests=1500, duration_s=16200, peak_at_s=5400, peak_width_s=1320)
    sharp_heavy = TraceShape(
        peak_share=0.55, peak_width_s=600, large_share=0.06, large_tail=0.7, large_max_files=220
    )
    traces += [
        ("gen-600", generate_trace(small, seed=3)),
        ("gen-1500", generate_trace(large, seed=41)),
        ("gen-hotfixes", generate_trace(TraceShape(hotfix_per_1000=60), seed=31)),
        ("gen-sharp-heavy", generate_trace(sharp_heavy, seed=9)),
        (
            "gen-sharp-1200",
            generate_trace(TraceShape(requests=1200, peak_share=0.55, peak_width_s=600), seed=13),
        ),
        ("gen-sharp-600", generate_trace(TraceShape(peak_share=0.55, peak_width_s=600), seed=19)),
    ]
    traces += [(f"gen-seed{seed}", generate_trace(seed=seed)) for seed in (2, 3, 4, 5, 6)]
    return traces


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", type=int, default=ModelConfig.line_budget)
    parser.add_argument("--first", type=int, default=DEFAULT_FIRST_BUDGET, help="0: none")
    parser.add_argument("--weights", default="8,4,2,1")
    parser.add_argument("--quantum", default=None)
    parser.add_argument("--reserved", type=int, default=MlfqSettings().reserved_slots)
    parser.add_argument("--short", type=float, default=MlfqSettings().short_work_s)
    parser.add_argument("--no-update-rank", action="store_true")
    parser.add_argument("--no-new-first", action="store_true")
    parser.add_argument("--no-fresh-tier", action="store_true")
    parser.add_argument("--whole-job-rank", action="store_true", help="first chunks by job")
    parser.add_argument("--only", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--extended", action="store_true", help="more variants")
    args = parser.parse_args(argv)
    level_of = policy_levels()
    p0, p1, p2, p3 = (int(w) for w in args.weights.split(","))
    mlfq_settings = replace(
        MlfqSettings(),
        weights=(p0, p1, p2, p3),
        reserved_slots=args.reserved,
        short_work_s=args.short,
    )
    if args.quantum:
        first, second, third = (float(q) for q in args.quantum.split(","))
        mlfq_settings = replace(mlfq_settings, quantum_s=(first, second, third))
    for name, trace in variants(args.extended):
        if args.only and name not in args.only.split(","):
            continue
        service_sum = sum(r.service_s for r in trace.requests if level_of(r) is not None)
        base = ModelConfig(
            line_budget=args.budget,
            first_budget=args.first or None,
            mlfq=mlfq_settings,
            update_rank=not args.no_update_rank,
            new_work_first=not args.no_new_first,
            fresh_tier=not args.no_fresh_tier,
            fresh_by_first_chunk=not args.whole_job_rank,
        )
        fifo = simulate(trace, replace(base, policy="fifo"), level_of)
        priority = simulate(trace, replace(base, policy="priority"), level_of)
        mlfq = simulate(trace, base, level_of)
        bound = clairvoyant(trace, level_of)
        if args.json:
            print(
                json.dumps(
                    {
                        "trace": name,
                        "fifo": fifo,
                        "priority": priority,
                        "mlfq": mlfq,
                        "clairvoyant": bound,
                    }
                )
            )
            continue
        print(f"== {name}: {len(trace.requests)} requests, service {service_sum:.0f} s")
        for label, result in (
            ("fifo", fifo),
            ("priority", priority),
            ("mlfq", mlfq),
            ("clairvoyant", bound),
        ):
            print(_row(label, result, service_sum))
        broken = check_acceptance(fifo, mlfq, service_sum)
        print("   acceptance:", "all met" if not broken else "BROKEN: " + ", ".join(broken))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
