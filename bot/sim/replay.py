"""`bot simulate`: replay a trace through the real policy, queue, chunker and dispatcher.

Virtual time: an event heap of arrivals and chunk completions; the simulated LLM backend charges
the trace cost model instantly and the completion is scheduled at now + its GPU seconds. With a
batching profile the workers are engines that each run a window of chunks at once
(bot.sim.batched), and a chunk ends when its engine's batch has done its work.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bot.budget.decide import BudgetLimits
from bot.clock import EPOCH, VirtualClock
from bot.components import planning_settings
from bot.config import DEFAULT_POLICY_DIR, SchedulerSettings, Settings, WindowSettings
from bot.engine_setup import configured_budget
from bot.errors import ReviewBotError
from bot.llm.base import LLMRequest
from bot.llm.batching import BatchingProfile, get_profile
from bot.llm.simulated import SimulatedBackend
from bot.model import Job, JobState, Level, PolicyDecision
from bot.pipeline import build_pipeline
from bot.policy import PolicyBook, evaluate, load_policy_book
from bot.queue.store import Leased, QueueSettings, QueueStore
from bot.review.chunk_review import default_request
from bot.review.planner import PlanningSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.sched.engine_pool import EnginePool
from bot.sched.mlfq import MlfqSettings, SchedulingPolicy, ServiceEstimator
from bot.sim.batched import BatchedEngines
from bot.sim.forge import memory_forges
from bot.sim.forge_budget import limits_for, through_budget
from bot.sim.metrics import RequestOutcome, summarize
from bot.sim.trace import Trace, TraceRequest, load_trace, to_review_request
from bot.stats import profile_verdict, service_profile
from bot.status.accuracy import EtaRecorder, render_eta_errors

log = logging.getLogger(__name__)

# Event kinds, in the order they are handled at one instant; a RECHECK looks at the queue
# again (a P0 review waiting for a call expected to end within the preemption grace).
COMPLETION, ARRIVAL, MAINTENANCE, RECHECK = 0, 1, 2, 3


@dataclass(slots=True)
class _Tracked:
    request: TraceRequest
    level: Level  # what the policy gave at intake
    job_id: int


def _at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def _seconds(when: datetime) -> float:
    return (when - EPOCH).total_seconds()


async def relax_durability(url: str, name: str) -> None:
    """Commit without waiting for the WAL flush: a throwaway replay database needs no crash
    safety, and every commit then costs a fraction of a millisecond instead of a disk flush."""
    import asyncpg

    from bot.db import plain_url

    connection = await asyncpg.connect(plain_url(url))
    try:
        await connection.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    finally:
        await connection.close()


@asynccontextmanager
async def fresh_database(database_url: str, *, keep: bool = False) -> AsyncIterator[str]:
    """A new, migrated database on the server of `database_url` (dropped unless `keep`)."""
    from bot import devdb
    from bot.db import upgrade_database

    name = devdb.unique_database_name("review_bot_sim")
    url = await devdb.create_database(database_url, name)
    try:
        await relax_durability(url, name)
        await upgrade_database(url)
        yield url
    finally:
        if not keep:
            await devdb.drop_database(database_url, name)


async def replay_trace(
    trace: Trace,
    *,
    policy: SchedulingPolicy,
    database_url: str,
    workers: int | None = None,
    planning: PlanningSettings | None = None,
    mlfq: MlfqSettings | None = None,
    policy_book: PolicyBook | None = None,
    collect: list[RequestOutcome] | None = None,
    record_eta: bool = False,
    batching: BatchingProfile | None = None,
    window: WindowSettings | None = None,
    forge_budget: BudgetLimits | None = None,
    estimator: ServiceEstimator | None = None,
    learned_costs: bool = False,
) -> dict[str, Any]:
    """Replay `trace` against the (already migrated) database; returns the summary object.

    The pipeline is `bot serve`'s (`build_pipeline`): the same planner, dispatcher and poster,
    with a virtual clock, the simulated backend and an in-memory forge. `collect`, when given,
    receives every request's outcome (for plots); `record_eta` adds the status ETA's accuracy
    (`eta`: the ETA given at enqueue against the actual finish). With `batching`, the trace's
    workers are engines with adaptive windows (`window`) under that cost model.
    """
    book = policy_book or load_policy_book(DEFAULT_POLICY_DIR)
    slots = workers or trace.header.workers
    clock = VirtualClock(EPOCH)
    store = QueueStore.from_url(database_url, settings=QueueSettings(notify=False), pool_size=2)
    backend = SimulatedBackend(overhead_s=trace.header.overhead_s)
    forges = memory_forges(clock)
    pool: EnginePool | None = None
    batched: BatchedEngines | None = None
    if batching is not None:
        names = [f"engine-{index}" for index in range(slots)]
        # The engine model has no prefix cache: a prefill costs the same on every engine, so
        # a review's chunk never waits for its home engine here (it still goes home when
        # there is room).
        settings = (window or WindowSettings()).model_copy(update={"affinity_prefill_s": 0.0})
        pool = EnginePool.build(names, settings, now=clock.now())
        batched = BatchedEngines(batching, names)
    tracked: dict[str, _Tracked] = {}
    by_job: dict[int, _Tracked] = {}

    async def build_request(job: Job | None, leased: Leased) -> LLMRequest:
        # The served request, plus the true cost the simulated backend charges (never the
        # scheduler: it sees only the changed lines).
        request = await default_request(job, leased)
        item = by_job[leased.chunk.job_id]
        metadata = {
            **request.metadata,
            "total_lines": item.request.total_lines,
            "service_s": item.request.service_s,
        }
        return replace(request, metadata=metadata)

    # Running chunks: chunk id -> (completion event sequence, start, charged GPU seconds).
    running: dict[int, tuple[int, float, float]] = {}
    dropped: set[int] = set()  # completion events of preempted chunks
    waste = {"gpu_s": 0.0, "preemptions": 0, "first_chunks": 0}

    async def chunk_preempted(leased: Leased, now: datetime) -> None:
        if batched is not None:
            waste["gpu_s"] += batched.cancel(leased.chunk.id, _seconds(now))
            waste["preemptions"] += 1
            waste["first_chunks"] += int(leased.chunk.seq == 0)
            return
        sequence_number, started_s, charged = running.pop(leased.chunk.id)
        dropped.add(sequence_number)
        used = max(0.0, _seconds(now) - started_s)
        # The backend charged the whole call up front: keep only what ran (wasted work).
        backend.gpu_seconds -= max(0.0, charged - used)
        waste["gpu_s"] += used
        waste["preemptions"] += 1
        waste["first_chunks"] += int(leased.chunk.seq == 0)

    pipeline = build_pipeline(
        store,
        forges=forges,
        # fifo is one queue: intake puts every review on one level, and planning keeps it there
        policies=None if policy == "fifo" else book,
        backend=backend,
        clock=clock,
        dispatcher=DispatcherSettings(
            policy=policy,
            slots=slots,
            owner="replay",
            lease_s=86400.0,
            mlfq=mlfq or MlfqSettings.from_scheduler_settings(SchedulerSettings()),
            learned_costs=learned_costs,
        ),
        planning=planning,
        build_request=build_request,
        on_preempt=chunk_preempted,
        engines=pool,
        estimator=estimator,
    )
    dispatcher = pipeline.dispatcher
    if batched is not None:
        # Calls run on the engine model, which knows how far each answer has come.
        dispatcher.progress = batched.progress
    # -- the status ETA's accuracy (bot.status): what a review is promised when first shown --
    eta: EtaRecorder | None = None
    if record_eta:
        eta = EtaRecorder(
            store.status,
            capacity=pipeline.eta_capacity(),
            estimator=lambda: dispatcher.estimator,
        )
    events: list[tuple[float, int, int, Any]] = []
    sequence = 0
    for request in trace.requests:
        events.append((request.arrival_s, ARRIVAL, sequence, request))
        sequence += 1
    heapq.heapify(events)
    maintenance_s = 60.0
    next_maintenance = maintenance_s
    submitted = 0
    recheck_due: set[float] = set()
    try:
        while events or (batched is not None and batched.busy):
            engine_event = batched.next_event_s() if batched is not None else None
            now_s = min(
                events[0][0] if events else float("inf"),
                float("inf") if engine_event is None else engine_event,
            )
            while policy == "mlfq" and next_maintenance <= now_s and by_job:
                clock.set(_at(next_maintenance))
                await dispatcher.maintain(clock.now())
                next_maintenance += maintenance_s
            if next_maintenance <= now_s:
                next_maintenance = (now_s // maintenance_s + 1) * maintenance_s
            clock.set(_at(now_s))
            now = clock.now()
            arrived = False
            if batched is not None and pool is not None:
                for completion in batched.advance(now_s):
                    leased = completion.leased
                    # Charged its share of the engine, as `bot serve` charges a batched call.
                    shared = await pool.finished(
                        leased.chunk.id,
                        now,
                        prompt_tokens=completion.review.usage.prompt_tokens,
                        completion_tokens=completion.finished.completion_tokens,
                    )
                    await dispatcher.finish_chunk(
                        leased,
                        gpu_seconds=completion.finished.engine_s if shared is None else shared,
                        result=completion.review.to_result(),
                        now=now,
                    )
            while events and events[0][0] <= now_s:
                _, kind, event_sequence, payload = heapq.heappop(events)
                if kind == RECHECK:
                    recheck_due.discard(payload)
                elif kind == ARRIVAL:
                    forges[payload.forge].add_request(payload)
                    item = await _submit(payload, store, book, policy, now, tracked)
                    if item is not None:
                        by_job[item.job_id] = item
                        submitted += 1
                        arrived = True
                elif event_sequence in dropped:
                    dropped.discard(event_sequence)
                else:
                    done, review = payload
                    running.pop(done.chunk.id, None)
                    await dispatcher.finish_chunk(
                        done, gpu_seconds=review.gpu_seconds, result=review.to_result(), now=now
                    )
            if arrived:
                while await dispatcher.plan_unplanned_jobs(now):
                    pass
                if eta is not None:
                    await eta.observe(now)
            for leased in await dispatcher.fill_slots(now):
                review = await dispatcher.review(None, leased)
                if batched is not None and pool is not None:
                    engine = pool.engine_of(leased.chunk.id)
                    assert engine is not None, "a leased chunk has an engine"
                    batched.admit(engine, leased, review, now_s)
                    continue
                heapq.heappush(
                    events,
                    (now_s + review.gpu_seconds, COMPLETION, sequence, (leased, review)),
                )
                running[leased.chunk.id] = (sequence, now_s, review.gpu_seconds)
                sequence += 1
            if dispatcher.recheck_at is not None:
                recheck_s = _seconds(dispatcher.recheck_at)
                if recheck_s > now_s and recheck_s not in recheck_due:
                    recheck_due.add(recheck_s)
                    heapq.heappush(events, (recheck_s, RECHECK, sequence, recheck_s))
                    sequence += 1
        outcomes = [await _outcome(store, item) for item in tracked.values()]
    finally:
        await store.close()
    posted = sum(len(forge.posted) for forge in forges.values())
    budget_stats: dict[str, Any] | None = None
    # The ETA is judged against the review's last chunk: the budget below is played after the
    # run, where `bot serve`'s statuses add its wait as it binds (bot.status.standing).
    finished_on_engines = outcomes
    if forge_budget is not None:
        # One installation's write budget decides when each review really shows on the PR.
        outcomes, budget_stats = through_budget(outcomes, forge_budget)
    if collect is not None:
        collect.extend(outcomes)
    # Batched, the GPU time spent is the engines' busy time (calls share it), not the sum
    # of what each call would have cost alone.
    gpu_s = batched.busy_s() if batched is not None else backend.gpu_seconds
    result = summarize(outcomes, policy=policy, requests=submitted, gpu_s=gpu_s, workers=slots)
    result["posted"] = posted
    if budget_stats is not None:
        result["forge_budget"] = budget_stats
    result["level_changes"] = dispatcher.level_changes
    result["preemptions"] = waste["preemptions"]
    result["preempted_first_chunks"] = waste["first_chunks"]
    result["wasted_gpu_s"] = round(waste["gpu_s"], 3)
    result["recomputed_tokens"] = dispatcher.recomputed_tokens
    if policy == "mlfq":
        error = dispatcher.costs.median_error()
        result["estimate"] = {
            "learned": dispatcher.learns_costs,
            "reviews": len(dispatcher.costs.errors),
            "mdape": None if error is None else round(error, 4),
        }
    if batched is not None and pool is not None:
        result["batching"] = batched.summary(float(result.get("makespan_s") or 0.0))
        result["batching"]["windows"] = {
            engine.name: {
                "final": engine.window,
                "max": max(window for _, window in engine.history),
                "changes": len(engine.history) - 1,
            }
            for engine in pool.engines
        }
    if eta is not None:
        for item, outcome in zip(tracked.values(), finished_on_engines, strict=True):
            if outcome.finished_s is not None:
                eta.finish(item.job_id, _at(outcome.finished_s))
        result["eta"] = eta.summary()
    return result


async def _outcome(store: QueueStore, item: _Tracked) -> RequestOutcome:
    """What the queue recorded of one request: ready, first call, review posted."""
    job = await store.get_job(item.job_id)
    if job is None:
        raise ReviewBotError(f"job {item.job_id} of trace request {item.request.id} is gone")
    ready = job.ready_at or job.enqueued_at
    posted = job.finished_at if job.state == JobState.DONE else None
    return RequestOutcome(
        request_id=item.request.id,
        level=item.level,
        arrival_s=item.request.arrival_s,
        ready_s=_seconds(ready),
        started_s=None if job.first_started_at is None else _seconds(job.first_started_at),
        finished_s=None if posted is None else _seconds(posted),
        service_s=item.request.service_s,
    )


async def _submit(
    request: TraceRequest,
    store: QueueStore,
    book: PolicyBook,
    policy: SchedulingPolicy,
    now: datetime,
    tracked: dict[str, _Tracked],
) -> _Tracked | None:
    """Normalize, evaluate and enqueue one trace request; None when intake would ignore it."""
    review_request = to_review_request(request)
    if review_request is None:
        return None
    decision = evaluate(book.policy_for(review_request.repo), review_request)
    if not decision.review:
        return None
    intake_level = decision.level
    if policy == "fifo":
        decision = PolicyDecision(level=Level.P1, reasons=("fifo replay: one queue",))
    result = await store.submit_request(
        review_request,
        decision,
        now=now,
        # no delivery id: a replay has no webhook redeliveries to dedupe, and it saves two
        # statements per request
        depends_on=[tracked[d].job_id for d in request.depends_on if d in tracked],
    )
    if result.job_id is None or not result.created:
        return None
    item = _Tracked(request=request, level=intake_level, job_id=result.job_id)
    tracked[request.id] = item
    return item


def run_simulation(
    trace: Trace | str | Path,
    policy: SchedulingPolicy,
    workers: int | None,
    database_url: str,
    *,
    keep: bool = False,
    planning: PlanningSettings | None = None,
    mlfq: MlfqSettings | None = None,
    record_eta: bool = False,
    batching: BatchingProfile | None = None,
    forge_budget: BudgetLimits | None = None,
    learned_costs: bool = False,
) -> dict[str, Any]:
    """Replay a trace on a fresh database on the server at `database_url`; the summary object."""
    loaded = trace if isinstance(trace, Trace) else load_trace(trace)
    return asyncio.run(
        simulate(
            loaded,
            policy=policy,
            workers=workers,
            database_url=database_url,
            keep=keep,
            planning=planning,
            mlfq=mlfq,
            record_eta=record_eta,
            batching=batching,
            forge_budget=forge_budget,
            learned_costs=learned_costs,
        )
    )


async def simulate(
    trace: Trace,
    *,
    policy: SchedulingPolicy,
    workers: int | None,
    database_url: str,
    keep: bool = False,
    planning: PlanningSettings | None = None,
    mlfq: MlfqSettings | None = None,
    collect: list[RequestOutcome] | None = None,
    record_eta: bool = False,
    batching: BatchingProfile | None = None,
    forge_budget: BudgetLimits | None = None,
    estimator: ServiceEstimator | None = None,
    learned_costs: bool = False,
) -> dict[str, Any]:
    """Async form of run_simulation (for callers already in an event loop)."""
    started = time.perf_counter()
    async with fresh_database(database_url, keep=keep) as url:
        result = await replay_trace(
            trace,
            policy=policy,
            database_url=url,
            workers=workers,
            planning=planning,
            mlfq=mlfq,
            collect=collect,
            record_eta=record_eta,
            batching=batching,
            forge_budget=forge_budget,
            estimator=estimator,
            learned_costs=learned_costs,
        )
    result["wall_s"] = round(time.perf_counter() - started, 3)
    return result


def render_text(result: dict[str, Any], profile: dict[str, float]) -> str:
    """Human-readable summary: turnaround per level first, then the service-time profile."""
    lines = [
        f"policy {result['policy']}: {result['completed']}/{result['requests']} reviews posted, "
        f"makespan {result['makespan_s']:.0f} s, GPU {result['gpu_s']:.0f} s "
        f"({result['gpu_over_service']:.3f} x one call per review), "
        f"utilization {result['utilization']:.1%}",
        "turnaround: push to review posted (s); slowdown: turnaround / service time",
        f"{'':6} {'n':>5} {'mean':>8} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}"
        f" {'slowdown':>9} {'first chunk':>12} {'breaches':>9}",
    ]
    rows = [("all", result["requests"], result["all"], None)]
    rows += [
        (name, level["n"], level, level["breaches"]) for name, level in result["levels"].items()
    ]
    for name, count, data, breaches in rows:
        turnaround = data["turnaround"]
        lines.append(
            f"{name:6} {count:>5} {turnaround['mean']:>8.1f} {turnaround['p50']:>8.1f}"
            f" {turnaround['p95']:>8.1f} {turnaround['p99']:>8.1f} {turnaround['max']:>8.1f}"
            f" {data['slowdown']['mean']:>9.2f} {data['time_to_first_chunk']['mean']:>12.1f}"
            f" {'' if breaches is None else breaches:>9}"
        )
    lines += [
        "(first chunk: mean time from ready to the first call; breaches: first calls later than"
        " the level's alert threshold)",
        f"service time: P50 {profile['p50']:.1f} s, P95 {profile['p95']:.1f} s, "
        f"P99 {profile['p99']:.1f} s, P99/P50 {profile['p99_over_p50']:.1f}, "
        f"stddev/mean {profile['stddev_over_mean']:.2f}",
        f"  rule: {profile_verdict(profile)}",
    ]
    if "wall_s" in result:
        lines.append(f"replayed in {result['wall_s']:.1f} s of wall time")
    return "\n".join(lines)


def render_batching(result: dict[str, Any], *, workers: int) -> str:
    """Exclusive slots against batched engines: turnaround per level, GPU time, utilization."""
    exclusive, batched = result["exclusive"], result["batched"]
    model = batched["batching"]
    lines = [
        f"{workers} exclusive slots (one call per GPU) against {workers} batched engines "
        f"({model['profile']}: {model['source']}), same trace, same scheduler",
        f"{'':6} {'n':>5} {'exclusive turnaround':>22} {'batched turnaround':>20}",
        f"{'':6} {'':>5} {'mean':>10} {'p95':>11} {'mean':>9} {'p95':>10}",
    ]
    rows = [("all", exclusive["requests"], exclusive["all"], batched["all"])]
    rows += [
        (name, level["n"], level, batched["levels"].get(name, level))
        for name, level in exclusive["levels"].items()
    ]
    for name, count, alone, shared in rows:
        lines.append(
            f"{name:6} {count:>5} {alone['turnaround']['mean']:>10.1f}"
            f" {alone['turnaround']['p95']:>11.1f} {shared['turnaround']['mean']:>9.1f}"
            f" {shared['turnaround']['p95']:>10.1f}"
        )
    windows = model["windows"]
    lines += [
        f"GPU s: exclusive {exclusive['gpu_s']:.0f}, batched {batched['gpu_s']:.0f} "
        "(engine busy time; calls in a batch share it)",
        f"utilization: exclusive {exclusive['utilization']:.1%}, batched engines "
        f"{model['utilization']:.1%} busy (per engine "
        + ", ".join(f"{engine['utilization']:.0%}" for engine in model["engines"].values())
        + ")",
        "windows reached: " + ", ".join(str(window["max"]) for window in windows.values()),
    ]
    return "\n".join(lines)


def trace_to_replay(path: str | None) -> Trace:
    """The trace at `path`, or without one the generated morning (said on stderr), so a plain
    clone simulates without a trace file; raises TraceError."""
    if path:
        return load_trace(path)
    from bot.sim.shapes import DEFAULT_SEED, DEFAULT_SHAPE, generated_trace

    trace = generated_trace(DEFAULT_SHAPE, seed=DEFAULT_SEED)
    print(
        f"bot simulate: no --trace given: replaying a generated {DEFAULT_SHAPE} "
        f"({len(trace.requests)} requests; the same as `bot trace generate --shape "
        f"{DEFAULT_SHAPE} --seed {DEFAULT_SEED}`)",
        file=sys.stderr,
    )
    return trace


def run_simulation_command(args: argparse.Namespace, settings: Settings) -> int:
    """The `bot simulate` command."""
    from bot import devdb

    trace = trace_to_replay(args.trace)
    policy: SchedulingPolicy = args.policy
    workers = args.workers or trace.header.workers
    budget_name = getattr(args, "forge_budget", None)
    budget = limits_for(budget_name) if budget_name and budget_name != "none" else None
    profile_name = getattr(args, "batching", None)
    batching = get_profile(profile_name) if profile_name else None
    # Planning as `bot serve` plans for a backend that is not a served model.
    budget_lines = configured_budget(settings)
    planning = planning_settings(
        settings,
        line_budget=budget_lines.line_budget,
        context_tokens=budget_lines.context_tokens,
        backlog_line_budget=budget_lines.backlog_line_budget,
    )

    def run(url: str, batched: BatchingProfile | None = None) -> dict[str, Any]:
        return run_simulation(
            trace,
            policy,
            workers,
            url,
            keep=bool(getattr(args, "keep", False)),
            record_eta=policy == "mlfq" and batched is None,
            batching=batched,
            forge_budget=budget,
            learned_costs=getattr(args, "estimate", "line") == "learned",
            # The scheduler's knobs as `bot serve` reads them (weights, quanta, aging).
            mlfq=MlfqSettings.from_scheduler_settings(settings.scheduler),
            planning=planning,
        )

    def runs(url: str) -> dict[str, Any]:
        if batching is None:
            return run(url)
        # The same trace on the same number of GPUs: exclusive slots, then batched engines.
        return {"exclusive": run(url), "batched": run(url, batching)}

    if settings.database.url:
        result = runs(settings.database.url)
    else:
        with devdb.provision_server() as server_url:
            result = runs(server_url)
    if batching is not None:
        print(json.dumps(result) if args.json else render_batching(result, workers=workers))
        return 0
    if args.json:
        wall = result.pop("wall_s", None)
        extras = ("level_changes", "preemptions", "preempted_first_chunks", "wasted_gpu_s")
        for extra in (*extras, "estimate"):
            result.pop(extra, None)
        print(json.dumps(result))
        if wall is not None:
            log.info("replayed in %.1f s", wall, extra={"action": "simulate"})
        return 0
    profile = service_profile([request.service_s for request in trace.requests])
    print(render_text(result, profile))
    if result.get("estimate", {}).get("mdape") is not None:
        estimate = result["estimate"]
        how = "learned" if estimate["learned"] else "the line over changed lines"
        print(
            f"estimate of a review's engine seconds ({how}): median error "
            f"{estimate['mdape']:.1%} over {estimate['reviews']} reviews"
        )
    if "eta" in result:
        print(render_eta_errors(result["eta"]))
        if "forge_budget" in result:
            print(
                "(ETA against each review's last chunk: the replay plays the write budget "
                "after the run, so its wait is not in these ETAs; bot serve's statuses add it "
                "as it binds)"
            )
    if "forge_budget" in result:
        print(render_forge_budget(result["forge_budget"], getattr(args, "forge_budget", "")))
    return 0


def render_forge_budget(stats: dict[str, Any], forge: str) -> str:
    """What one installation's write budget did to the posting (the turnaround above counts
    it)."""
    lines = [
        f"posted through one {forge} write budget ({stats['per_minute']} a minute, "
        f"{stats['per_hour'] or 'no'} an hour): {stats['writes']} writes, "
        f"{stats['writes_per_review']} per review, {stats['coalesced_or_dropped']} coalesced, "
        f"{stats['never_posted']} reviews never posted; last write at "
        f"{stats['last_write_s'] / 3600:.2f} h",
        "posting wait the budget added (s): "
        + ", ".join(
            f"{level} median {item['median_s']:.0f} p95 {item['p95_s']:.0f}"
            for level, item in stats["posting_delay"].items()
        ),
    ]
    return "\n".join(lines)


__all__ = [
    "render_batching",
    "render_text",
    "replay_trace",
    "run_simulation",
    "run_simulation_command",
    "simulate",
]
