"""The dispatcher's steps: plan, choose a level, lease, preempt, finish, fail, age, reclaim."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from bot.clock import Clock
from bot.config import DEFAULTS, SchedulerSettings
from bot.errors import LeaseLost, LLMError
from bot.llm.base import CallProgress, LLMBackend, ProgressSource, ReportsProgress
from bot.model import LEVELS, JobState, Level
from bot.obs.metrics import Metrics
from bot.queue.store import ChunkOutcome, Leased, QueueStore
from bot.sched.cost import CostEstimate
from bot.sched.cost_book import CostBook
from bot.sched.engine_pool import EnginePool
from bot.sched.engines import Engine
from bot.sched.mlfq import (
    CONTINUATION_RANK_OFFSET,
    SCHEDULING_POLICIES,
    MlfqSettings,
    RunningCall,
    SchedulingPolicy,
    ServiceEstimator,
    SlotChoice,
    apply_feedback,
    choose_preemption,
    choose_slot,
    expected_chunk_s,
    is_new_work,
)
from bot.sched.p0_room import SharingCall
from bot.sched.ports import (
    ChunkPreempted,
    ChunkReviewer,
    JobCompleted,
    PlanJobs,
    ReviewedChunk,
)
from bot.sched.ranking import ContinuationRanks

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DispatcherSettings:
    """How one dispatcher process runs."""

    policy: SchedulingPolicy = "mlfq"
    slots: int = DEFAULTS.scheduler.workers
    owner: str = "dispatcher"
    lease_s: float = DEFAULTS.scheduler.lease_s
    heartbeat_s: float = DEFAULTS.scheduler.heartbeat_s
    poll_s: float = DEFAULTS.scheduler.poll_s
    maintenance_s: float = 60.0  # aging and lease reclaim period
    # First pause after the database is lost.
    outage_backoff_s: float = DEFAULTS.database.outage_backoff_s
    # After stop(), running calls get this long to finish before they are handed back.
    shutdown_grace_s: float = DEFAULTS.scheduler.shutdown_grace_s
    mlfq: MlfqSettings = field(default_factory=MlfqSettings)
    # mlfq: rank reviews by the cost learned per language, repository and pull request
    # (bot.sched.cost), learning from every review this dispatcher finishes; off, by the
    # line over changed lines alone (REVIEW_BOT_LEARNED_COSTS). Off by default: on the mornings
    # measured it lowers mean turnaround by 0-3% (bench/results/learned_estimate.md), and on
    # the sharp-peak test trace it misses the 0.40x-FIFO target by 0.3 s.
    learned_costs: bool = DEFAULTS.scheduler.learned_costs
    # mlfq: planning cuts larger chunks while work queues (`mlfq.backlogged`); False never
    # looks (REVIEW_BOT_BACKLOG_CHUNK_LINES=0).
    backlog_chunks: bool = True

    @classmethod
    def from_scheduler(
        cls,
        settings: SchedulerSettings,
        *,
        owner: str,
        policy: SchedulingPolicy = "mlfq",
        outage_backoff_s: float = DEFAULTS.database.outage_backoff_s,
    ) -> DispatcherSettings:
        """Settings from the bot's SchedulerSettings."""
        return cls(
            outage_backoff_s=outage_backoff_s,
            policy=policy,
            slots=settings.workers,
            owner=owner,
            lease_s=settings.lease_s,
            heartbeat_s=settings.heartbeat_s,
            poll_s=settings.poll_s,
            shutdown_grace_s=settings.shutdown_grace_s,
            mlfq=MlfqSettings.from_scheduler_settings(settings),
            learned_costs=settings.learned_costs,
            backlog_chunks=bool(settings.backlog_chunk_lines),
        )


@dataclass(slots=True)
class _QueueLoad:
    """Chunks per level as one pass sees them: read from the database (every process), then
    kept current as the pass leases and preempts."""

    running: dict[Level, int]
    ready: dict[Level, int]
    ready_new_work: dict[Level, int]  # first chunks of jobs not started yet
    ready_short_work: dict[Level, int]  # ready chunks ranked as short work
    running_long_work: int  # running chunks ranked above short work, all levels


class DispatcherCore:
    """N worker slots over one queue store; decisions come from bot.sched.mlfq.

    These are the steps: the live loop (bot.sched.dispatcher.Dispatcher) runs them as work
    arrives, the replay drives them under a virtual clock.
    """

    def __init__(
        self,
        store: QueueStore,
        backend: LLMBackend,
        *,
        plan_jobs: PlanJobs,
        reviewer: ChunkReviewer,
        settings: DispatcherSettings,
        clock: Clock,
        on_job_complete: JobCompleted | None = None,
        estimator: ServiceEstimator | None = None,
        metrics: Metrics | None = None,
        on_preempt: ChunkPreempted | None = None,
        engines: EnginePool | None = None,
    ) -> None:
        self.store = store
        # With engines, the slots are the engines' windows and each chunk names its engine;
        # without, `settings.slots` calls run on whatever the backend picks.
        self.engines = engines
        self.backend = backend
        self.settings = settings
        self.clock = clock
        self.reviewer = reviewer
        self.on_job_complete = on_job_complete
        self.plan_jobs = plan_jobs
        self.metrics = metrics
        self.estimator = estimator or ServiceEstimator.with_prior()
        # What reviews cost per group, shared with every dispatcher through the store.
        self.costs = CostBook(store)
        self._costs_loaded = False
        self.held: dict[int, Leased] = {}
        self.ranks = ContinuationRanks(store)
        self.level_changes = 0
        self.on_preempt = on_preempt
        self.preemptions = 0
        # When to look at the queue again although nothing happened: a P0 review waits for a
        # call expected to end within the preemption grace, and must not wait longer.
        self.recheck_at: datetime | None = None
        self._p0_waiting_since: datetime | None = None
        self._stopping = asyncio.Event()
        self._running_at_stop: set[int] = set()  # the chunks held when stop() was called
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        # Live mode: the LLM call of each running chunk, so preemption can cancel it.
        self._live = False
        self._calls: dict[int, asyncio.Task[ReviewedChunk]] = {}
        self._preempted: set[int] = set()
        self._next_maintenance = 0.0
        self._started: set[int] = set()  # live mode: chunks whose task was started
        # How far each running call's answer has come, where the backend can say (streaming);
        # the replay points it at its engine model instead.
        self.progress: ProgressSource | None = (
            backend.progress if isinstance(backend, ReportsProgress) else None
        )
        self.recomputed_tokens = 0  # answer tokens thrown away by taking calls back
        # Leased chunks waiting for a place on their review's engine (see bot.sched.affinity):
        # chunk id -> (since, the engine their lease names).
        self._parked: dict[int, tuple[datetime, str | None]] = {}

    # --- pure-ish steps (the replay drives these under a virtual clock) ---------------------

    @property
    def free_slots(self) -> int:
        if self.engines is not None:
            return self.engines.free
        return max(0, self.settings.slots - len(self.held))

    @property
    def total_slots(self) -> int:
        return self.engines.capacity if self.engines is not None else self.settings.slots

    async def plan_unplanned_jobs(self, now: datetime) -> int:
        """Plan jobs whose diff is not chunked yet; returns how many jobs planning handled.

        The chunk sizes and ranks of what was planned stay in the per-job record, so the
        job's continuations are re-ranked as its chunks start and finish.
        """

        async def backlogged() -> bool:
            return await self._backlogged(now)

        outcomes = await self.plan_jobs(now, await self.cost_estimate(now), backlogged)
        if self.settings.policy == "mlfq":
            for outcome in outcomes:
                self.ranks.remember(outcome)
        return len(outcomes)

    async def _backlogged(self, now: datetime) -> bool:
        """Whether ready work queues beyond the slots now (read from the database, so the
        chunks other dispatchers run count too; only when a job is there to plan)."""
        if self.settings.policy != "mlfq" or not self.settings.backlog_chunks:
            return False
        load = await self._read_load(now)
        return self.settings.mlfq.backlogged(load.ready, self.total_slots)

    @property
    def learns_costs(self) -> bool:
        return self.settings.policy == "mlfq" and self.settings.learned_costs

    async def cost_estimate(self, now: datetime) -> CostEstimate:
        """What planning ranks with: the line, and the learned costs (read once at first)."""
        if self.learns_costs and not self._costs_loaded:
            await self.costs.load(now)
            self._costs_loaded = True
        return CostEstimate(
            fallback=self.estimator, learned=self.costs.model, use_learned=self.learns_costs
        )

    async def _read_load(self, now: datetime) -> _QueueLoad:
        load = await self.store.level_load(
            now=now,
            new_work_below=CONTINUATION_RANK_OFFSET,
            short_work_rank=self.settings.mlfq.short_work_s,
        )
        return _QueueLoad(
            running=dict(load.running),
            ready=dict(load.ready),
            ready_new_work=dict(load.ready_new_work),
            ready_short_work=dict(load.ready_short_work),
            running_long_work=load.running_long_work,
        )

    def _choose(self, load: _QueueLoad, free: int) -> SlotChoice | None:
        if self.settings.policy != "mlfq":
            return SlotChoice(levels=LEVELS, reason=self.settings.policy)
        return choose_slot(
            running=load.running,
            ready=load.ready,
            ready_new_work=load.ready_new_work,
            ready_short_work=load.ready_short_work,
            running_long_work=load.running_long_work,
            free_slots=free,
            total_slots=self.total_slots,
            settings=self.settings.mlfq,
        )

    async def fill_slots(self, now: datetime) -> list[Leased]:
        """Lease a chunk for each free slot the scheduler wants filled; returns them.

        Under mlfq a new P0 review that finds no free slot takes one back from a running
        lower-level chunk (see `preempt`), then gets it here.
        """
        leased: list[Leased] = []
        if self._stopping.is_set():
            return leased
        preempting = self.settings.policy == "mlfq" and self.settings.mlfq.preempt
        if self.engines is not None:
            await self.engines.refresh(self.store.engine_running)
            leased += await self._unpark(now)
        if self.free_slots == 0 and not preempting:
            self._recheck_parked(now, reset=True)
            return leased
        load = await self._read_load(now) if self.settings.policy == "mlfq" else None
        leased += await self._lease(load, now)
        if load is not None and preempting:
            taken = await self.preempt(load, now)
            if taken:
                leased += await self._lease(load, now)
                await self.preempt(load, now)  # reset the wait, or a recheck if P0 still waits
            await self.make_p0_room(load, now)
        self._recheck_parked(now, reset=not preempting)
        return leased

    async def _settle_engine(self, got: Leased, picked: Engine, now: datetime) -> Engine | None:
        """The engine a leased chunk runs on: its review's home while that has room, else the
        windows' pick or, while that is cheaper than a prefill there, a wait for home (None:
        the chunk is parked, leased but not started)."""
        assert self.engines is not None
        chunk = got.chunk
        leased_on = picked.name
        placement = self.engines.place(chunk.job_id, picked, waited_s=0.0)
        target = None if placement.engine is None else self.engines.by_name(placement.engine)
        if target is None:
            home = self.engines.by_name(self.engines.homes.home_of(chunk.job_id) or "")
            parked_there = sum(
                1
                for chunk_id in self._parked
                if (held := self.held.get(chunk_id)) is not None
                and self.engines.homes.home_of(held.chunk.job_id) == (home and home.name)
            )
            # A P0 never waits, and at most a window's worth of chunks waits for one engine.
            if chunk.level == Level.P0 or home is None or parked_there >= home.window:
                target = picked
            else:
                # Parked: leased, but on no engine until it starts, or every process's windows
                # would count it against the engine it was leased for, which it never runs on.
                await self._move_engine(chunk.id, leased_on, None)
                self._parked[chunk.id] = (now, None)
                return None
        await self._move_engine(chunk.id, leased_on, target.name)
        self.engines.homes.settle(chunk.job_id, target.name)
        return target

    async def _move_engine(self, chunk_id: int, leased_on: str | None, engine: str | None) -> None:
        if leased_on == engine:
            return
        # The windows of every process count what runs on each engine from this column.
        await self.store.move_chunk_engine(chunk_id, owner=self.settings.owner, engine=engine)

    async def _unpark(self, now: datetime) -> list[Leased]:
        """Start parked chunks whose home has a place now, or that waited long enough to
        spill (see bot.sched.affinity); returns those started."""
        assert self.engines is not None
        started: list[Leased] = []
        for chunk_id, (since, leased_on) in sorted(self._parked.items(), key=lambda i: i[1][0]):
            held = self.held.get(chunk_id)
            if held is None:
                del self._parked[chunk_id]
                continue
            waited_s = (now - since).total_seconds()
            picked = self.engines.pick(p0=False)
            placement = self.engines.place(held.chunk.job_id, picked, waited_s=waited_s)
            target = None if placement.engine is None else self.engines.by_name(placement.engine)
            if target is None:
                continue
            del self._parked[chunk_id]
            await self._move_engine(chunk_id, leased_on, target.name)
            self.engines.take(target, chunk_id, now, p0=held.chunk.level == Level.P0)
            self.engines.homes.settle(held.chunk.job_id, target.name)
            log.debug(
                "chunk %s starts on %s after waiting %.2f s (%s)",
                chunk_id,
                target.name,
                waited_s,
                placement.reason,
                extra={"action": "chunk_placed", "job_id": held.chunk.job_id},
            )
            started.append(held)
        return started

    def _recheck_parked(self, now: datetime, *, reset: bool) -> None:
        """Look again when the first parked chunk may spill (a place freeing wakes us too)."""
        if reset:
            self.recheck_at = None
        if self.engines is None or not self._parked:
            return
        dues = [
            since + timedelta(seconds=engine.settings.affinity_prefill_s)
            for chunk_id, (since, _) in self._parked.items()
            if (held := self.held.get(chunk_id)) is not None
            and (
                engine := self.engines.by_name(self.engines.homes.home_of(held.chunk.job_id) or "")
            )
            is not None
        ]
        future = [due for due in dues if due > now]
        if future:
            due = min(future)
            self.recheck_at = due if self.recheck_at is None else min(self.recheck_at, due)

    async def _lease(self, load: _QueueLoad | None, now: datetime) -> list[Leased]:
        leased: list[Leased] = []
        retried = False
        while True:
            engine = None
            if self.engines is not None:
                engine = self.engines.pick(p0=False)
                if engine is None and load is not None and load.ready_new_work.get(Level.P0, 0) > 0:
                    # Every window is full: a new P0 review takes a place above one, which
                    # the server admits at once (the ceiling stays under --max-num-seqs).
                    engine = self.engines.pick(p0=True)
                    choice: SlotChoice | None = SlotChoice(levels=(Level.P0,), reason="p0 place")
                elif engine is None:
                    break
                elif load is None:
                    choice = SlotChoice(levels=LEVELS)
                else:
                    choice = self._choose(load, max(1, self.free_slots))
                if engine is None:
                    break
            elif self.free_slots <= 0:
                break
            elif load is None:
                choice = SlotChoice(levels=LEVELS)
            else:
                choice = self._choose(load, self.free_slots)
            if choice is None:
                break
            got = await self.store.fetch_chunk(
                levels=choice.levels,
                owner=self.settings.owner,
                now=now,
                lease_s=self.settings.lease_s,
                max_rank=choice.max_rank,
                engine=None if engine is None else engine.name,
            )
            if got is None:
                if load is None or retried:
                    break
                # Another process took what the counts promised: look again, once.
                load = await self._read_load(now)
                retried = True
                continue
            self.held[got.chunk.id] = got
            if self.engines is not None and engine is not None:
                placed = await self._settle_engine(got, engine, now)
                if placed is not None:
                    self.engines.take(placed, got.chunk.id, now, p0=got.chunk.level == Level.P0)
                    leased.append(got)
            else:
                leased.append(got)
            if load is not None:
                self._account(load, got)
                await self.ranks.after_lease(got, now, self.estimator)
        return leased

    async def preempt(self, load: _QueueLoad, now: datetime) -> list[Leased]:
        """Take back running lower-level chunks for new P0 reviews that have no free slot.

        The chunk's call is cancelled (live) or dropped (replay, through `on_preempt`), and the
        chunk goes back to the queue with its level and rank, no attempt counted.
        """
        waiting = load.ready_new_work.get(Level.P0, 0)
        if waiting <= 0 or self._stopping.is_set():
            self._p0_waiting_since = None
            self.recheck_at = None
            return []
        if self._p0_waiting_since is None:
            self._p0_waiting_since = now
        waited_s = (now - self._p0_waiting_since).total_seconds()
        choice = choose_preemption(
            waiting=waiting,
            free_slots=self.free_slots,
            running=self._running_calls(now),
            waited_s=waited_s,
            settings=self.settings.mlfq,
        )
        self.recheck_at = (
            None if choice.recheck_in_s is None else now + timedelta(seconds=choice.recheck_in_s)
        )
        taken: list[Leased] = []
        for chunk_id in choice.victims:
            victim = await self._take_back(chunk_id, choice.reason, load, now)
            if victim is not None:
                taken.append(victim)
        return taken

    async def make_p0_room(self, load: _QueueLoad, now: datetime) -> list[Leased]:
        """Take back this process's lower-level calls beyond a running P0 call's companions.

        Admission above a window starts a P0 chunk at once, but on an engine past its knee
        the batch it joins sets its pace; see bot.sched.p0_room for how many may stay.
        """
        if self.engines is None or not any(self.engines.p0_running.values()):
            return []
        ours: dict[str, list[SharingCall]] = {}
        for chunk_id, held, elapsed in self._in_calls(now):
            engine = self.engines.engine_of(chunk_id)
            if engine is not None and held.chunk.level != Level.P0:
                progress = self._progress_of(chunk_id)
                ours.setdefault(engine, []).append(
                    SharingCall(
                        chunk_id,
                        elapsed,
                        tokens_done=None if progress is None else progress.completion_tokens,
                        tokens_expected=None if progress is None else progress.expected_tokens,
                    )
                )
        taken: list[Leased] = []
        for chunk_id in self.engines.to_take_back(ours):
            victim = await self._take_back(chunk_id, "room for a P0 call on its engine", load, now)
            if victim is not None:
                taken.append(victim)
        return taken

    async def _take_back(
        self, chunk_id: int, reason: str, load: _QueueLoad, now: datetime
    ) -> Leased | None:
        """Cancel a running chunk's call and queue the chunk again, no attempt counted."""
        victim = self.held.get(chunk_id)
        if victim is None:
            return None
        # Read before the call is cancelled: a cancelled call forgets its progress.
        progress = self._progress_of(chunk_id)
        if not self._cancel_call(chunk_id):
            return None
        lost_tokens = 0 if progress is None else progress.completion_tokens
        self.recomputed_tokens += lost_tokens
        if self.metrics is not None and lost_tokens:
            self.metrics.count_recomputed_tokens(lost_tokens)
        del self.held[chunk_id]
        chunk = victim.chunk
        used_s = (now - chunk.started_at).total_seconds() if chunk.started_at else 0.0
        if self.engines is not None:
            shared = self.engines.abandoned(chunk_id, now)
            used_s = used_s if shared is None else shared
        await self.store.release_chunk(
            chunk_id,
            owner=self.settings.owner,
            now=now,
            reason=reason,
            gpu_seconds=used_s,
            attempt=chunk.lease_attempt,
        )
        self.preemptions += 1
        log.info(
            "preempted chunk %s of job %s (%s) for P0 work: %s; %s answer tokens to recompute",
            chunk_id,
            chunk.job_id,
            chunk.level,
            reason,
            lost_tokens if progress is not None else "unknown",
            extra={
                "action": "preempt",
                "job_id": chunk.job_id,
                "recomputed_tokens": lost_tokens if progress is not None else None,
            },
        )
        if self.on_preempt is not None:
            await self.on_preempt(victim, now)
        rank = float(victim.extra.get("rank", 0.0))
        load.running[chunk.level] = max(0, load.running.get(chunk.level, 0) - 1)
        load.ready[chunk.level] = load.ready.get(chunk.level, 0) + 1
        if is_new_work(rank):
            load.ready_new_work[chunk.level] = load.ready_new_work.get(chunk.level, 0) + 1
        if rank <= self.settings.mlfq.short_work_s:
            load.ready_short_work[chunk.level] = load.ready_short_work.get(chunk.level, 0) + 1
        else:
            load.running_long_work = max(0, load.running_long_work - 1)
        return victim

    def _in_calls(self, now: datetime) -> list[tuple[int, Leased, float]]:
        """This process's chunks in their LLM call, with the seconds since each started."""
        calls: list[tuple[int, Leased, float]] = []
        for chunk_id, held in self.held.items():
            if chunk_id in self._parked:
                continue  # waiting for its engine: no call yet
            if self._live and chunk_id not in self._calls:
                continue  # not in its LLM call (starting or storing its result)
            started = held.chunk.started_at or now
            calls.append((chunk_id, held, max(0.0, (now - started).total_seconds())))
        return calls

    def _running_calls(self, now: datetime) -> list[RunningCall]:
        calls: list[RunningCall] = []
        for chunk_id, held, elapsed in self._in_calls(now):
            chunk = held.chunk
            facts = self.ranks.known(chunk.job_id)
            calls.append(
                RunningCall(
                    chunk_id=chunk_id,
                    level=chunk.level,
                    elapsed_s=elapsed,
                    expected_s=expected_chunk_s(
                        chunk_lines=chunk.lines,
                        job_lines=facts.total_lines if facts is not None else chunk.lines,
                        estimator=self.estimator,
                        expected_work_s=facts.expected_work_s if facts is not None else None,
                    ),
                )
            )
        return calls

    def _progress_of(self, chunk_id: int) -> CallProgress | None:
        return None if self.progress is None else self.progress(chunk_id)

    def _cancel_call(self, chunk_id: int) -> bool:
        """Live mode: cancel the chunk's LLM call (the HTTP request is aborted) if still on."""
        if not self._live:
            return True
        call = self._calls.get(chunk_id)
        if call is None or call.done():
            return False
        self._preempted.add(chunk_id)
        call.cancel()
        return True

    def _account(self, load: _QueueLoad, leased: Leased) -> None:
        level = leased.chunk.level
        rank = float(leased.extra.get("rank", 0.0))
        load.running[level] = load.running.get(level, 0) + 1
        load.ready[level] = max(0, load.ready.get(level, 0) - 1)
        if is_new_work(rank):
            load.ready_new_work[level] = max(0, load.ready_new_work.get(level, 0) - 1)
        if rank <= self.settings.mlfq.short_work_s:
            load.ready_short_work[level] = max(0, load.ready_short_work.get(level, 0) - 1)
        else:
            load.running_long_work += 1

    async def finish_chunk(
        self,
        leased: Leased,
        *,
        gpu_seconds: float,
        result: Mapping[str, Any],
        now: datetime,
    ) -> ChunkOutcome | None:
        """Store a finished chunk, learn from it, apply feedback; None when the lease was lost."""
        chunk = leased.chunk
        try:
            outcome = await self.store.finish_chunk(
                chunk.id,
                owner=self.settings.owner,
                now=now,
                gpu_seconds=gpu_seconds,
                result=result,
                attempt=chunk.lease_attempt,
            )
        except LeaseLost:
            self.held.pop(chunk.id, None)
            log.warning(
                "chunk %s (attempt %s): lease lost, dropping result",
                chunk.id,
                chunk.lease_attempt,
                extra={"action": "lease_lost", "job_id": chunk.job_id, "chunk_id": chunk.id},
            )
            return None
        # Held until stored: a stop that cancels the store hands the chunk back.
        self.held.pop(chunk.id, None)
        if self.settings.policy == "mlfq":
            facts = await self.ranks.facts_of(chunk.job_id, self.estimator)
            if facts is not None and facts.total_lines > 0:
                self.estimator = self.estimator.observe(
                    chunk_lines=chunk.lines,
                    job_lines=facts.total_lines,
                    gpu_seconds=gpu_seconds,
                )
            await self._feedback(outcome, now)
            if facts is not None and not outcome.job_complete:
                await self.ranks.after_finish(
                    chunk.job_id, facts, chunk.lines, gpu_seconds, now, self.estimator
                )
        if outcome.job_complete:
            await self._job_done(outcome.job_id, now)
        return outcome

    async def _feedback(self, outcome: ChunkOutcome, now: datetime) -> None:
        if outcome.job_complete or outcome.level is None or outcome.base_level is None:
            return
        # A job above its own level runs there for a reason (inheritance or aging): it keeps it.
        if outcome.level < outcome.base_level:
            return
        change = apply_feedback(
            level=outcome.level,
            used_at_level_s=outcome.level_gpu_seconds,
            settings=self.settings.mlfq,
        )
        if change is None:
            return
        changed = await self.store.set_level(
            outcome.job_id, change.level, now=now, reason=change.reason, actor="scheduler"
        )
        if changed:
            self.level_changes += 1

    async def fail(self, leased: Leased, error: LLMError, now: datetime) -> ChunkOutcome | None:
        """Count a failed call: the store retries it later or ends the job dead."""
        self.held.pop(leased.chunk.id, None)
        try:
            outcome = await self.store.fail_chunk(
                leased.chunk.id,
                owner=self.settings.owner,
                now=now,
                error=str(error),
                retryable=error.retryable,
                attempt=leased.chunk.lease_attempt,
            )
        except LeaseLost:
            log.warning(
                "chunk %s (attempt %s): lease lost, dropping its failure",
                leased.chunk.id,
                leased.chunk.lease_attempt,
                extra={"action": "lease_lost", "job_id": leased.chunk.job_id},
            )
            return None
        if outcome.job_dead and self.metrics is not None:
            self.metrics.count_dead()
        return outcome

    async def _job_done(self, job_id: int, now: datetime) -> None:
        facts = self.ranks.known(job_id)
        self.ranks.forget(job_id)
        if self.settings.policy == "mlfq" and (self.learns_costs or facts is not None):
            await self.costs.learn(
                job_id,
                now,
                self.estimator,
                predicted_work_s=facts.expected_work_s if facts is not None else None,
                learn=self.learns_costs,
            )
        if self.on_job_complete is not None:
            await self.on_job_complete(job_id, now)
        else:
            await self.store.finish_job(job_id, now=now, state=JobState.DONE)

    async def maintain(self, now: datetime) -> None:
        """Periodic work: aging (mlfq), reclaiming leases of dead workers, and reading what
        other dispatchers learnt of review costs."""
        if self.settings.policy == "mlfq":
            raised = await self.store.apply_aging(
                now=now, interval_s=self.settings.mlfq.aging_interval_s
            )
            self.level_changes += raised
        if self.learns_costs:
            await self.costs.forget_old(now)
            await self.costs.load(now)
            self._costs_loaded = True
        reclaimed = await self.store.reclaim_expired(now=now)
        if reclaimed and self.metrics is not None:
            self.metrics.count_reclaims(reclaimed)

    async def release_all(self, now: datetime, *, reason: str | None = None) -> int:
        """Give back every chunk this process holds (shutdown), no attempt counted; with a
        `reason`, each release goes into its job's history."""
        released = 0
        for chunk_id, leased in list(self.held.items()):
            if await self.store.release_chunk(
                chunk_id,
                owner=self.settings.owner,
                now=now,
                attempt=leased.chunk.lease_attempt,
                reason=reason,
            ):
                released += 1
            self.held.pop(chunk_id, None)
            self._parked.pop(chunk_id, None)
            if self.engines is not None:
                self.engines.abandoned(chunk_id, now)
        return released


def settings_for(policy: SchedulingPolicy, base: DispatcherSettings) -> DispatcherSettings:
    """The same dispatcher settings under another scheduling policy."""
    if policy not in SCHEDULING_POLICIES:
        raise ValueError(f"unknown policy {policy!r}: expected one of {SCHEDULING_POLICIES}")
    return replace(base, policy=policy)


def level_counts(values: Mapping[Level, int]) -> str:
    """`P0=1 P1=3 ...` for logs."""
    return " ".join(f"{level}={values.get(level, 0)}" for level in LEVELS)
