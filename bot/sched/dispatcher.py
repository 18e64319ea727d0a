"""The dispatcher: fills worker slots with chunks the MLFQ picks, and keeps the queue moving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from bot.clock import Clock
from bot.config import SchedulerSettings
from bot.errors import LeaseLost, LLMError, LLMRequestRejected, StoreError
from bot.llm.base import LLMBackend
from bot.model import LEVELS, Job, JobState, Level
from bot.obs.metrics import Metrics
from bot.outage import OutageWatch
from bot.queue.store import ChunkOutcome, Leased, QueueStore
from bot.sched.engine_pool import EnginePool
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
    rank_chunks,
)
from bot.sched.presence import Presence, backend_engines, keep_present

log = logging.getLogger(__name__)


def install_signal_handlers(dispatcher: Dispatcher) -> None:
    """SIGTERM and SIGINT make the dispatcher stop taking work and hand back what it holds."""
    import signal

    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, dispatcher.stop)


class CallUsage(Protocol):
    """Tokens and time one chunk's LLM calls took."""

    @property
    def latency_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def gpu_seconds(self) -> float: ...


class ReviewedChunk(Protocol):
    """What reviewing one chunk hands back to be stored (bot.review.engine.ChunkReview)."""

    @property
    def gpu_seconds(self) -> float: ...
    @property
    def usage(self) -> CallUsage: ...
    def to_result(self) -> Mapping[str, Any]: ...


class PlannedJob(Protocol):
    """What planning did to one job, as far as ranking its chunks goes (bot.review.planner)."""

    @property
    def job_id(self) -> int: ...
    @property
    def result(self) -> str: ...
    @property
    def chunk_lines(self) -> tuple[int, ...]: ...
    @property
    def ranks(self) -> tuple[float, ...]: ...


# Reviews one leased chunk (prompt, LLM call, parse) on the named engine, if any: the review
# side, injected by the pipeline.
ChunkReviewer = Callable[[Job | None, Leased, str | None], Awaitable[ReviewedChunk]]
JobCompleted = Callable[[int, datetime], Awaitable[None]]
# Told of a running chunk the dispatcher took back for P0 work (the replay drops its completion).
ChunkPreempted = Callable[[Leased, datetime], Awaitable[None]]
# Plans pending jobs (bot.review.planner through the pipeline: the diff fetched and chunked,
# forge errors retried or ending the job); gets the current estimator for the ranks, returns
# what it did to each job (a planned job's chunk sizes and ranks among it).
PlanJobs = Callable[[datetime, ServiceEstimator], Awaitable[Sequence[PlannedJob]]]


@dataclass(frozen=True, slots=True)
class DispatcherSettings:
    """How one dispatcher process runs."""

    policy: SchedulingPolicy = "mlfq"
    slots: int = 8
    owner: str = "dispatcher"
    lease_s: float = 300.0
    heartbeat_s: float = 30.0
    poll_s: float = 5.0
    maintenance_s: float = 60.0  # aging and lease reclaim period
    outage_backoff_s: float = 1.0  # first pause after the database is lost
    mlfq: MlfqSettings = field(default_factory=MlfqSettings)

    @classmethod
    def from_scheduler(
        cls,
        settings: SchedulerSettings,
        *,
        owner: str,
        policy: SchedulingPolicy = "mlfq",
        outage_backoff_s: float = 1.0,
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
            mlfq=MlfqSettings.from_scheduler_settings(settings),
        )


@dataclass(slots=True)
class _JobFacts:
    """What the dispatcher knows of a job it planned or ran (for ranks and the estimator)."""

    total_lines: int
    chunk_lines: tuple[int, ...]
    # Progress seen by this process, for re-ranking the job's unstarted continuations.
    next_seq: int = 0
    done_lines: int = 0
    done_chunks: int = 0
    done_gpu_s: float = 0.0
    ranks: tuple[float, ...] = ()  # rank_chunks ranks from chunk `ranks_from` on
    ranks_from: int = 0
    stored_rank: float | None = None  # what the queued continuations carry now


@dataclass(slots=True)
class _Load:
    running: dict[Level, int]
    ready: dict[Level, int]
    fresh: dict[Level, int]
    short_ready: dict[Level, int]
    running_long: int


class Dispatcher:
    """N worker slots over one queue store; decisions come from bot.sched.mlfq."""

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
        self.held: dict[int, Leased] = {}
        self.jobs: dict[int, _JobFacts] = {}
        self.level_changes = 0
        self.on_preempt = on_preempt
        self.preemptions = 0
        # When to look at the queue again although nothing happened: a P0 review waits for a
        # call expected to end within the preemption grace, and must not wait longer.
        self.recheck_at: datetime | None = None
        self._p0_waiting_since: datetime | None = None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        # Live mode: the LLM call of each running chunk, so preemption can cancel it.
        self._live = False
        self._calls: dict[int, asyncio.Task[ReviewedChunk]] = {}
        self._preempted: set[int] = set()
        self._next_maintenance = 0.0
        self._started: set[int] = set()  # live mode: chunks whose task was started

    # --- pure-ish steps (the replay drives these under a virtual clock) ---------------------

    @property
    def free_slots(self) -> int:
        if self.engines is not None:
            return self.engines.free
        return max(0, self.settings.slots - len(self.held))

    @property
    def total_slots(self) -> int:
        return self.engines.capacity if self.engines is not None else self.settings.slots

    def ranks_for(self, chunk_lines: Sequence[int]) -> tuple[float, ...]:
        """Ranks for a new job's chunks from the current estimator."""
        return rank_chunks(chunk_lines, estimator=self.estimator)

    async def plan_unplanned_jobs(self, now: datetime) -> int:
        """Plan jobs whose diff is not chunked yet; returns how many jobs planning handled.

        The chunk sizes and ranks of what was planned stay in the per-job record, so the
        job's continuations are re-ranked as its chunks start and finish.
        """
        outcomes = await self.plan_jobs(now, self.estimator)
        if self.settings.policy == "mlfq":
            for outcome in outcomes:
                if outcome.result == "planned" and outcome.chunk_lines:
                    self.jobs[outcome.job_id] = _JobFacts(
                        total_lines=sum(outcome.chunk_lines),
                        chunk_lines=outcome.chunk_lines,
                        ranks=outcome.ranks,
                        stored_rank=outcome.ranks[1] if len(outcome.ranks) > 1 else None,
                    )
        return len(outcomes)

    async def _read_load(self, now: datetime) -> _Load:
        load = await self.store.level_load(
            now=now,
            fresh_below=CONTINUATION_RANK_OFFSET,
            short_rank=self.settings.mlfq.short_work_s,
        )
        return _Load(
            running=dict(load.running),
            ready=dict(load.ready),
            fresh=dict(load.fresh),
            short_ready=dict(load.short_ready),
            running_long=load.running_long,
        )

    def _choose(self, load: _Load, free: int) -> SlotChoice | None:
        if self.settings.policy != "mlfq":
            return SlotChoice(levels=LEVELS, reason=self.settings.policy)
        return choose_slot(
            running=load.running,
            ready=load.ready,
            fresh=load.fresh,
            short_ready=load.short_ready,
            running_long=load.running_long,
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
            await self.engines.refresh(self.store.engine_load)
        if self.free_slots == 0 and not preempting:
            return leased
        load = await self._read_load(now) if self.settings.policy == "mlfq" else None
        leased = await self._lease(load, now)
        if load is not None and preempting:
            taken = await self.preempt(load, now)
            if taken:
                leased += await self._lease(load, now)
                await self.preempt(load, now)  # reset the wait, or a recheck if P0 still waits
        return leased

    async def _lease(self, load: _Load | None, now: datetime) -> list[Leased]:
        leased: list[Leased] = []
        retried = False
        while True:
            engine = None
            if self.engines is not None:
                engine = self.engines.pick(p0=False)
                if engine is None and load is not None and load.fresh.get(Level.P0, 0) > 0:
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
            leased.append(got)
            if self.engines is not None and engine is not None:
                self.engines.take(engine, got.chunk.id, now)
            if load is not None:
                self._account(load, got)
                await self._rerank_after_lease(got, now)
        return leased

    async def preempt(self, load: _Load, now: datetime) -> list[Leased]:
        """Take back running lower-level chunks for new P0 reviews that have no free slot.

        The chunk's call is cancelled (live) or dropped (replay, through `on_preempt`), and the
        chunk goes back to the queue with its level and rank, no attempt counted.
        """
        waiting = load.fresh.get(Level.P0, 0)
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
            victim = self.held.get(chunk_id)
            if victim is None or not self._cancel_call(chunk_id):
                continue
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
                reason=choice.reason,
                gpu_seconds=used_s,
            )
            self.preemptions += 1
            log.info(
                "preempted chunk %s of job %s (%s) for P0 work: %s",
                chunk_id,
                chunk.job_id,
                chunk.level,
                choice.reason,
                extra={"action": "preempt", "job_id": chunk.job_id},
            )
            if self.on_preempt is not None:
                await self.on_preempt(victim, now)
            rank = float(victim.extra.get("rank", 0.0))
            load.running[chunk.level] = max(0, load.running.get(chunk.level, 0) - 1)
            load.ready[chunk.level] = load.ready.get(chunk.level, 0) + 1
            if rank < CONTINUATION_RANK_OFFSET:
                load.fresh[chunk.level] = load.fresh.get(chunk.level, 0) + 1
            if rank <= self.settings.mlfq.short_work_s:
                load.short_ready[chunk.level] = load.short_ready.get(chunk.level, 0) + 1
            else:
                load.running_long = max(0, load.running_long - 1)
            taken.append(victim)
        return taken

    def _running_calls(self, now: datetime) -> list[RunningCall]:
        calls: list[RunningCall] = []
        for chunk_id, held in self.held.items():
            if self._live and chunk_id not in self._calls:
                continue  # not in its LLM call (starting or storing its result)
            chunk = held.chunk
            facts = self.jobs.get(chunk.job_id)
            started = chunk.started_at or now
            calls.append(
                RunningCall(
                    chunk_id=chunk_id,
                    level=chunk.level,
                    elapsed_s=max(0.0, (now - started).total_seconds()),
                    expected_s=expected_chunk_s(
                        chunk_lines=chunk.lines,
                        job_lines=facts.total_lines if facts is not None else chunk.lines,
                        estimator=self.estimator,
                    ),
                )
            )
        return calls

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

    async def _rerank_after_lease(self, leased: Leased, now: datetime) -> None:
        facts = await self.job_facts(leased.chunk.job_id)
        if facts is None or not facts.chunk_lines:
            return
        facts.next_seq = max(facts.next_seq, leased.chunk.seq + 1)
        await self._store_rank(leased.chunk.job_id, facts, now)

    async def _store_rank(self, job_id: int, facts: _JobFacts, now: datetime) -> None:
        """Give the job's unstarted continuations the rank of its next chunk (see queue_ranks)."""
        index = facts.next_seq - facts.ranks_from
        if facts.next_seq < 1 or not 0 <= index < len(facts.ranks):
            return
        rank = facts.ranks[index]
        if rank == facts.stored_rank:
            return
        facts.stored_rank = rank
        await self.store.rerank_continuations(job_id, rank=rank, now=now)

    def _account(self, load: _Load, leased: Leased) -> None:
        level = leased.chunk.level
        rank = float(leased.extra.get("rank", 0.0))
        load.running[level] = load.running.get(level, 0) + 1
        load.ready[level] = max(0, load.ready.get(level, 0) - 1)
        if rank < CONTINUATION_RANK_OFFSET:
            load.fresh[level] = max(0, load.fresh.get(level, 0) - 1)
        if rank <= self.settings.mlfq.short_work_s:
            load.short_ready[level] = max(0, load.short_ready.get(level, 0) - 1)
        else:
            load.running_long += 1

    async def job_facts(self, job_id: int) -> _JobFacts | None:
        """Size facts of a job (cached; read from the store for jobs another process planned)."""
        facts = self.jobs.get(job_id)
        if facts is None:
            chunk_lines = await self.store.chunk_lines(job_id)
            if not chunk_lines:
                return None
            # Ranked afresh: the chunk now leased or finished tells where the job stands.
            ranks = rank_chunks(chunk_lines, estimator=self.estimator)
            facts = _JobFacts(total_lines=sum(chunk_lines), chunk_lines=chunk_lines, ranks=ranks)
            self.jobs[job_id] = facts
        return facts

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
        self.held.pop(chunk.id, None)
        try:
            outcome = await self.store.finish_chunk(
                chunk.id,
                owner=self.settings.owner,
                now=now,
                gpu_seconds=gpu_seconds,
                result=result,
            )
        except LeaseLost:
            log.warning(
                "lost the lease of chunk %s",
                chunk.id,
                extra={"action": "lease_lost", "job_id": chunk.job_id},
            )
            return None
        if self.settings.policy == "mlfq":
            facts = await self.job_facts(chunk.job_id)
            if facts is not None and facts.total_lines > 0:
                self.estimator = self.estimator.observe(
                    chunk_lines=chunk.lines,
                    job_lines=facts.total_lines,
                    gpu_seconds=gpu_seconds,
                )
            await self._feedback(outcome, now)
            if facts is not None and not outcome.job_complete:
                await self._rerank_after_finish(chunk.job_id, facts, chunk.lines, gpu_seconds, now)
        if outcome.job_complete:
            await self._job_done(outcome.job_id, now)
        return outcome

    async def _rerank_after_finish(
        self, job_id: int, facts: _JobFacts, lines: int, gpu_seconds: float, now: datetime
    ) -> None:
        """The job's own rate is known better now: re-rank what it has left."""
        facts.done_lines += lines
        facts.done_chunks += 1
        facts.done_gpu_s += gpu_seconds
        if not facts.chunk_lines or facts.next_seq >= len(facts.chunk_lines):
            return
        facts.ranks = rank_chunks(
            facts.chunk_lines,
            estimator=self.estimator,
            done_lines=facts.done_lines,
            done_chunks=facts.done_chunks,
            done_gpu_s=facts.done_gpu_s,
            first_seq=facts.next_seq,
        )
        facts.ranks_from = facts.next_seq
        await self._store_rank(job_id, facts, now)

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
            )
        except LeaseLost:
            return None
        if outcome.job_dead and self.metrics is not None:
            self.metrics.count_dead()
        return outcome

    async def _job_done(self, job_id: int, now: datetime) -> None:
        self.jobs.pop(job_id, None)
        if self.on_job_complete is not None:
            await self.on_job_complete(job_id, now)
        else:
            await self.store.finish_job(job_id, now=now, state=JobState.DONE)

    async def maintain(self, now: datetime) -> None:
        """Periodic work: aging (mlfq) and reclaiming leases of dead workers."""
        if self.settings.policy == "mlfq":
            raised = await self.store.apply_aging(
                now=now, interval_s=self.settings.mlfq.aging_interval_s
            )
            self.level_changes += raised
        reclaimed = await self.store.reclaim_expired(now=now)
        if reclaimed and self.metrics is not None:
            self.metrics.count_reclaims(reclaimed)

    async def release_all(self, now: datetime) -> int:
        """Give back every chunk this process holds (shutdown)."""
        released = 0
        for chunk_id in list(self.held):
            if await self.store.release_chunk(chunk_id, owner=self.settings.owner, now=now):
                released += 1
            self.held.pop(chunk_id, None)
            if self.engines is not None:
                self.engines.abandoned(chunk_id, now)
        return released

    # --- live mode --------------------------------------------------------------------------

    def wake(self) -> None:
        """Ask the loop to look at the queue now (NOTIFY arrived, a slot freed)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop taking work; running chunks finish or are released (see run)."""
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def _run_chunk(self, leased: Leased) -> None:
        """Live mode: run one chunk; whatever goes wrong, its slot is freed and the error kept."""
        chunk = leased.chunk
        try:
            await self._review_and_store(leased)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Not an outcome the review engine knows (a bug, a backend raising something of its
            # own, the database going away): the attempt counts, with its error on the chunk.
            log.exception(
                "chunk %s of job %s failed unexpectedly",
                chunk.id,
                chunk.job_id,
                extra={"action": "chunk_crashed", "job_id": chunk.job_id},
            )
            await self._record_crash(leased, exc)
        finally:
            self._started.discard(chunk.id)
            self._wake.set()

    async def _record_crash(self, leased: Leased, error: Exception) -> None:
        """Free the slot and count the attempt; if the store is away too, the lease expires."""
        chunk = leased.chunk
        self.held.pop(chunk.id, None)
        if self.engines is not None:
            self.engines.abandoned(chunk.id, self.clock.now())
        try:
            outcome = await self.store.fail_chunk(
                chunk.id,
                owner=self.settings.owner,
                now=self.clock.now(),
                error=f"{type(error).__name__}: {error}",
                retryable=True,
            )
        except LeaseLost:
            return  # finished or taken over before the failure: nothing to count
        except StoreError as exc:
            log.warning(
                "chunk %s: failure not recorded, its lease will expire: %s",
                chunk.id,
                exc,
                extra={"action": "chunk_failure_unrecorded", "job_id": chunk.job_id},
            )
            return
        if outcome.job_dead and self.metrics is not None:
            self.metrics.count_dead()

    async def _review_and_store(self, leased: Leased) -> None:
        """Review one chunk through the review engine and store what it found."""
        job = await self.store.get_job(leased.chunk.job_id)
        if self.metrics is not None and job is not None and leased.first_start:
            started = leased.chunk.started_at or self.clock.now()
            ready = job.ready_at or job.enqueued_at
            self.metrics.observe_wait(job.base_level, (started - ready).total_seconds())
        call = asyncio.ensure_future(self.review(job, leased))
        self._calls[leased.chunk.id] = call
        try:
            review = await call
        except LLMRequestRejected as exc:
            if self.engines is not None:
                await self.engines.failed(leased.chunk.id, self.clock.now(), overloaded=False)
            # This model cannot review this part (e.g. a prompt over its context length);
            # the rest of the review goes on and its summary names the part and why.
            log.warning(
                "chunk %s refused by the model server: %s",
                leased.chunk.id,
                exc,
                extra={"action": "chunk_refused", "job_id": leased.chunk.job_id},
            )
            await self.finish_chunk(
                leased,
                gpu_seconds=0.0,
                result={"status": "failed", "error": f"the model server refused it: {exc}"},
                now=self.clock.now(),
            )
            return
        except LLMError as exc:
            if self.engines is not None:
                await self.engines.failed(
                    leased.chunk.id, self.clock.now(), overloaded=exc.overloaded
                )
            await self.fail(leased, exc, self.clock.now())
            return
        except asyncio.CancelledError:
            if self.engines is not None:
                self.engines.abandoned(leased.chunk.id, self.clock.now())
            current = asyncio.current_task()
            preempted = leased.chunk.id in self._preempted
            if preempted and (current is None or not current.cancelling()):
                return  # preempted: the chunk is queued again and its slot serves P0
            raise
        finally:
            self._calls.pop(leased.chunk.id, None)
            self._preempted.discard(leased.chunk.id)
        gpu_seconds = review.gpu_seconds
        if self.engines is not None:
            # Under batching a call's latency is not its cost: charge its share of the engine.
            usage = review.usage
            shared = await self.engines.finished(
                leased.chunk.id,
                self.clock.now(),
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
            )
            # A backend that measured wall time says GPU seconds = latency: under batching the
            # call gets its share instead. One that charges a cost model has said its cost.
            if shared is not None and usage.gpu_seconds == usage.latency_s:
                gpu_seconds = shared
        if self.metrics is not None:
            usage = review.usage
            self.metrics.observe_chunk(self.settings.owner, gpu_seconds)
            self.metrics.observe_llm(usage.latency_s, usage.prompt_tokens, usage.completion_tokens)
        await self.finish_chunk(
            leased,
            gpu_seconds=gpu_seconds,
            result=review.to_result(),
            now=self.clock.now(),
        )

    async def review(self, job: Job | None, leased: Leased) -> ReviewedChunk:
        """Review one chunk through the injected reviewer, on the engine its lease names."""
        engine = self.engines.engine_of(leased.chunk.id) if self.engines is not None else None
        return await self.reviewer(job, leased, engine)

    def presence(self) -> Presence:
        """This dispatcher's row in `dispatchers`: its slots, running chunks and engines."""
        return Presence(
            self.store.engine,
            name=self.settings.owner,
            slots=self.total_slots,
            engines=lambda: backend_engines(self.backend, self.engines),
            running=lambda: len(self.held),
        )

    async def _heartbeat_loop(self, outage: OutageWatch) -> None:
        """Renew this process's leases and take back other processes' expired ones, every
        heartbeat: a dead dispatcher's chunks run again within about one lease."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self.heartbeat(self.clock.now())
            except StoreError as exc:
                # The leases run out if this goes on; others then take the chunks over.
                outage.lost(exc)

    async def heartbeat(self, now: datetime) -> int:
        """Renew held leases, then reclaim expired ones; returns how many were reclaimed."""
        if self.held:
            await self.store.heartbeat(
                list(self.held), owner=self.settings.owner, now=now, lease_s=self.settings.lease_s
            )
        reclaimed = await self.store.reclaim_expired(now=now)
        if reclaimed and self.metrics is not None:
            self.metrics.count_reclaims(reclaimed)
        return reclaimed

    async def _listen(self, database_url: str | None, *, quiet: bool = False) -> Any:
        """LISTEN on the queue channel through a dedicated asyncpg connection, if possible."""
        if database_url is None:
            return None
        import asyncpg

        from bot.db import plain_url
        from bot.queue.store import QUEUE_CHANNEL

        try:
            connection = await asyncpg.connect(plain_url(database_url), timeout=10)
            await connection.add_listener(QUEUE_CHANNEL, self._notified)
            # A server restart closes this connection: wake the loop so it listens again.
            connection.add_termination_listener(self._notified)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if not quiet:
                log.warning(
                    "LISTEN unavailable, polling every %ss: %s",
                    self.settings.poll_s,
                    exc,
                    extra={"action": "listen_failed"},
                )
            return None
        return connection

    def _notified(self, *_: object) -> None:
        self._wake.set()

    async def _step(self, loop: asyncio.AbstractEventLoop) -> None:
        """One pass of the loop: maintenance when due, planning, filling free slots."""
        if loop.time() >= self._next_maintenance:
            await self.maintain(self.clock.now())
            self._next_maintenance = loop.time() + self.settings.maintenance_s
        await self.plan_unplanned_jobs(self.clock.now())
        # Read the clock again: work submitted while we planned must not appear to
        # start before it arrived.
        try:
            await self.fill_slots(self.clock.now())
        finally:
            # Even when a later statement of the pass failed, what was leased runs: a leased
            # chunk without a task would keep its slot (and, heartbeat after heartbeat, its
            # lease) for ever.
            self._start_leased()

    def _start_leased(self) -> None:
        for chunk_id, leased in list(self.held.items()):
            if chunk_id in self._started:
                continue
            self._started.add(chunk_id)
            task = asyncio.create_task(self._run_chunk(leased))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds`, or less when stop() is called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    async def run(self, *, database_url: str | None = None, shutdown_grace_s: float = 30.0) -> None:
        """Serve until stop(): wake on NOTIFY (or the poll), fill slots, run chunks.

        A database outage never ends the loop: it backs off (with jitter), says so once, and
        carries on when the database is back; the LISTEN connection is opened again then.
        """
        listener = await self._listen(database_url)
        self._live = True
        outage = OutageWatch(
            f"dispatcher {self.settings.owner}", base_s=self.settings.outage_backoff_s
        )
        heartbeat = asyncio.create_task(self._heartbeat_loop(outage))
        present = asyncio.create_task(
            keep_present(self.presence(), clock=self.clock, interval_s=self.settings.heartbeat_s)
        )
        self._next_maintenance = 0.0
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    await self._step(loop)
                except StoreError as exc:
                    await self._pause(outage.lost(exc))
                    continue
                outage.recovered()
                if database_url is not None and (listener is None or listener.is_closed()):
                    # The server restarted (or was away at start): NOTIFY wakes us again.
                    listener = await self._listen(database_url, quiet=listener is None)
                timeout = self.settings.poll_s
                if self.recheck_at is not None:
                    until_recheck = (self.recheck_at - self.clock.now()).total_seconds()
                    timeout = min(timeout, max(0.0, until_recheck))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=timeout)
            if self._tasks:
                _, pending = await asyncio.wait(set(self._tasks), timeout=shutdown_grace_s)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            try:
                await self.release_all(self.clock.now())
            except StoreError as exc:
                log.warning(
                    "chunks not handed back (their leases expire instead): %s",
                    exc,
                    extra={"action": "release_failed"},
                )
        finally:
            heartbeat.cancel()
            present.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            with contextlib.suppress(asyncio.CancelledError):
                await present
            if listener is not None and not listener.is_closed():
                await listener.close()


def settings_for(policy: SchedulingPolicy, base: DispatcherSettings) -> DispatcherSettings:
    """The same dispatcher settings under another scheduling policy."""
    if policy not in SCHEDULING_POLICIES:
        raise ValueError(f"unknown policy {policy!r}: expected one of {SCHEDULING_POLICIES}")
    return replace(base, policy=policy)


def level_counts(values: Mapping[Level, int]) -> str:
    """`P0=1 P1=3 ...` for logs."""
    return " ".join(f"{level}={values.get(level, 0)}" for level in LEVELS)


__all__ = [
    "SCHEDULING_POLICIES",
    "ChunkReviewer",
    "Dispatcher",
    "DispatcherSettings",
    "PlannedJob",
    "ReviewedChunk",
    "SchedulingPolicy",
    "install_signal_handlers",
    "level_counts",
    "settings_for",
]
