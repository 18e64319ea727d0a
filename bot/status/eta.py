"""When a queued review starts and ends: a dry run of the scheduler over expected call lengths.

Pure: plain data in, plain data out. The queue as it stands (running calls with the time they
have left, queued calls with their ranks and expected lengths from the service estimator) is
played forward on the engines' slots, every free slot filled by the scheduler's own choice
(`bot.sched.mlfq.choose_slot`: P0 first, weighted shares, the short-work reserve), each level's
calls taken in the queue's order (rank, then job); a new P0 review with no free slot takes one
back as the dispatcher does (`choose_preemption`), so a hotfix is not promised the end of a
long call it would not wait for. A review waiting for others (stacked pull requests) queues its
calls only once they end, as the queue releases it. A fluid model (work divided by slots) was the
first idea; it misjudges the shallow queues this scheduler keeps, where a review's calls start
at once on free slots. Work that has not arrived yet is played too when `arrivals` is given: the
recent stream of each level (one typical review every so many seconds) keeps arriving while the
queue drains, so a P2's wait grows with the P1 work a burst will still bring, as it really does.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from bot.model import LEVELS, Level
from bot.review.chunking import DEFAULT_FIRST_BUDGET, DEFAULT_LINE_BUDGET
from bot.sched.mlfq import (
    CONTINUATION_RANK_OFFSET,
    MlfqSettings,
    RunningCall,
    choose_preemption,
    choose_slot,
    is_new_work,
)


@dataclass(frozen=True, slots=True)
class QueuedCall:
    """One queued call of a job: its queue rank and expected length in seconds."""

    rank: float
    seconds: float


@dataclass(frozen=True, slots=True)
class JobLoad:
    """One live job as the dry run sees it."""

    job_id: int
    level: Level
    started: bool  # its first call has started
    queued: tuple[QueuedCall, ...] = ()
    running_s: tuple[float, ...] = ()  # expected seconds left of each of its running calls
    # Live jobs it waits for (stacked pull requests): its calls queue only once they end.
    waits_for: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Capacity:
    """The engines: how many calls run at once, how fast, the scheduler's knobs, and how the
    planner cuts reviews into calls."""

    slots: int
    mlfq: MlfqSettings = field(default_factory=MlfqSettings)
    speed: float = 1.0  # expected seconds of work one slot does per second
    # How the planner cuts a review (its served budgets): a review not planned yet, and the
    # stream still to come, are played cut the same way.
    line_budget: int = DEFAULT_LINE_BUDGET
    first_budget: int | None = DEFAULT_FIRST_BUDGET

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("slots must be at least 1")
        if self.speed <= 0:
            raise ValueError("speed must be positive")
        if self.line_budget < 1 or (self.first_budget is not None and self.first_budget < 1):
            raise ValueError("chunk budgets must be at least one line")


@dataclass(frozen=True, slots=True)
class Arrivals:
    """Work expected to arrive while the queue drains: per level, one review every
    `every_s[level]` seconds, each made of `calls[level]`."""

    every_s: Mapping[Level, float]
    calls: Mapping[Level, tuple[QueuedCall, ...]]
    horizon_s: float = 4 * 3600.0  # nothing is assumed to arrive later than this
    max_reviews: int = 3000  # nor more than this many reviews in all


@dataclass(frozen=True, slots=True)
class Estimate:
    """Where one job stands: its place among jobs not started, and when it starts and ends."""

    job_id: int
    level: Level
    place: int | None  # 1 = next to start; None once its first call started
    start_in_s: float
    finish_in_s: float

    @property
    def ahead(self) -> int:
        """Jobs not started yet that are expected to start before this one."""
        return 0 if self.place is None else self.place - 1


@dataclass(slots=True)
class _Counts:
    running: list[int]
    ready: list[int]
    ready_new_work: list[int]
    ready_short_work: list[int]
    running_long_work: int = 0


@dataclass(slots=True)
class _Progress:
    start: float | None = None
    finish: float = 0.0


_Queues = dict[Level, list[tuple[float, int, float]]]  # per level, a heap of (rank, job, seconds)


class _Call(NamedTuple):
    """A running call of the dry run; a heap of them pops the one that ends first."""

    end: float
    order: int  # when it started, among the dry run's calls (unique: ties end here)
    job_id: int
    level: Level
    long_call: bool
    rank: float  # inf for a call running before the dry run began (its rank is not known)
    seconds: float  # the whole call's work
    start: float  # -inf for a call running before the dry run began


_Running = list[_Call]


def estimate_queue(
    jobs: Sequence[JobLoad], capacity: Capacity, arrivals: Arrivals | None = None
) -> dict[int, Estimate]:
    """Place, expected start and expected end (seconds from now) of every job given; with
    `arrivals`, while the work expected to arrive meanwhile competes for the slots."""
    settings = capacity.mlfq
    short_s = settings.short_work_s
    queues: _Queues = {}
    counts = _Counts([0] * 4, [0] * 4, [0] * 4, [0] * 4)
    progress = {job.job_id: _Progress(start=0.0 if job.started else None) for job in jobs}
    running: _Running = []
    order = itertools.count()
    held = _Held(jobs)
    for level in LEVELS:
        calls = sorted(
            (call.rank, job.job_id, max(0.0, call.seconds))
            for job in jobs
            if job.level == level and not held.holds(job.job_id)
            for call in job.queued
        )
        queues[level] = calls  # sorted: a heap already
        counts.ready[level] = len(calls)
        counts.ready_new_work[level] = sum(1 for rank, _, _ in calls if is_new_work(rank))
        counts.ready_short_work[level] = sum(1 for rank, _, _ in calls if rank <= short_s)
    held.release_ended(queues, counts, short_s)
    for job in jobs:
        for left in job.running_s:
            end = max(0.0, left) / capacity.speed
            long_call = left > short_s
            running.append(
                _Call(end, next(order), job.job_id, job.level, long_call, math.inf, left, -math.inf)
            )
            counts.running[job.level] += 1
            counts.running_long_work += int(long_call)
            progress[job.job_id].finish = max(progress[job.job_id].finish, end)
    heapq.heapify(running)
    real_left = sum(len(job.queued) + len(job.running_s) for job in jobs)
    stream = _Stream(arrivals)
    now = 0.0
    while real_left > 0:
        _fill(queues, counts, running, progress, capacity, now, order)
        if _take_back_for_p0(queues, counts, running, capacity, now):
            continue
        next_done = running[0].end if running else float("inf")
        arriving = stream.next_at()
        if arriving is not None and arriving[0] < next_done:
            now, level = arriving
            stream.arrive(level, queues, counts, progress, short_s)
            continue
        if not running:
            if any(queues.values()):
                # Nothing the scheduler would start and nothing running: start the most urgent
                # call anyway (the live dispatcher polls again; a dry run must not stall).
                level = next(level for level in LEVELS if queues[level])
                _start(level, queues, counts, running, progress, capacity, now, order)
                continue
            if held.release_all(queues, counts, short_s):
                continue  # what they wait for has no call left to run: they queue now
            break
        done = heapq.heappop(running)
        now, job_id, level, long_call = done.end, done.job_id, done.level, done.long_call
        counts.running[level] -= 1
        counts.running_long_work -= int(long_call)
        if job_id >= 0:
            real_left -= 1
            held.call_ended(job_id)
            held.release_ended(queues, counts, short_s)
    return _estimates(jobs, progress)


class _Held:
    """Jobs waiting for other live jobs: their queued calls join the queues once those end."""

    def __init__(self, jobs: Sequence[JobLoad]) -> None:
        live = {job.job_id for job in jobs}
        self.calls_left = {job.job_id: len(job.queued) + len(job.running_s) for job in jobs}
        self.ended = {job_id for job_id, left in self.calls_left.items() if left <= 0}
        self.waiting: dict[int, tuple[set[int], JobLoad]] = {}
        for job in jobs:
            waits_for = set(job.waits_for) & live - {job.job_id}
            if waits_for:
                self.waiting[job.job_id] = (waits_for, job)

    def holds(self, job_id: int) -> bool:
        return job_id in self.waiting

    def call_ended(self, job_id: int) -> None:
        self.calls_left[job_id] -= 1
        if self.calls_left[job_id] <= 0:
            self.ended.add(job_id)

    def release_ended(self, queues: _Queues, counts: _Counts, short_s: float) -> None:
        """Queue the calls of every held job whose dependencies have no call left."""
        # Runs after every call the dry run ends: nothing to do unless a job is held.
        while ready := [
            job_id for job_id, (waits_for, _) in self.waiting.items() if waits_for <= self.ended
        ]:
            for job_id in ready:
                _, job = self.waiting.pop(job_id)
                _enqueue(job.level, job.job_id, job.queued, queues, counts, short_s)

    def release_all(self, queues: _Queues, counts: _Counts, short_s: float) -> bool:
        """Queue every held job's calls (nothing it waits for can end); whether any were held."""
        held, self.waiting = self.waiting, {}
        for _, job in held.values():
            _enqueue(job.level, job.job_id, job.queued, queues, counts, short_s)
        return bool(held)


def _enqueue(
    level: Level,
    job_id: int,
    calls: Sequence[QueuedCall],
    queues: _Queues,
    counts: _Counts,
    short_s: float,
) -> None:
    for call in calls:
        heapq.heappush(queues[level], (call.rank, job_id, max(0.0, call.seconds)))
        counts.ready[level] += 1
        counts.ready_new_work[level] += int(is_new_work(call.rank))
        counts.ready_short_work[level] += int(call.rank <= short_s)


class _Stream:
    """The arrivals a dry run plays: each level's next review, at its own pace."""

    def __init__(self, arrivals: Arrivals | None) -> None:
        self.arrivals = arrivals
        self.next: dict[Level, float] = {}
        if arrivals is not None:
            self.next = {
                level: every
                for level, every in arrivals.every_s.items()
                if every > 0 and arrivals.calls.get(level)
            }
        self.count = 0
        self.ids = itertools.count(-1, -1)  # arrivals are not jobs of the queue: negative ids

    def next_at(self) -> tuple[float, Level] | None:
        if not self.next or self.arrivals is None or self.count >= self.arrivals.max_reviews:
            return None
        level = min(self.next, key=lambda key: (self.next[key], key))
        at = self.next[level]
        return None if at > self.arrivals.horizon_s else (at, level)

    def arrive(
        self,
        level: Level,
        queues: _Queues,
        counts: _Counts,
        progress: dict[int, _Progress],
        short_s: float,
    ) -> None:
        assert self.arrivals is not None
        self.next[level] += self.arrivals.every_s[level]
        self.count += 1
        job_id = next(self.ids)
        progress[job_id] = _Progress()
        _enqueue(level, job_id, self.arrivals.calls[level], queues, counts, short_s)


def _fill(
    queues: _Queues,
    counts: _Counts,
    running: _Running,
    progress: dict[int, _Progress],
    capacity: Capacity,
    now: float,
    order: itertools.count[int],
) -> None:
    """Start calls on free slots the way the dispatcher would."""
    while capacity.slots - len(running) > 0:
        choice = choose_slot(
            running=counts.running,
            ready=counts.ready,
            ready_new_work=counts.ready_new_work,
            ready_short_work=counts.ready_short_work,
            running_long_work=counts.running_long_work,
            free_slots=capacity.slots - len(running),
            total_slots=capacity.slots,
            settings=capacity.mlfq,
        )
        if choice is None:
            return
        level = next(
            (
                level
                for level in choice.levels
                if queues[level]
                and (choice.max_rank is None or queues[level][0][0] <= choice.max_rank)
            ),
            None,
        )
        if level is None:
            return
        _start(level, queues, counts, running, progress, capacity, now, order)


def _start(
    level: Level,
    queues: _Queues,
    counts: _Counts,
    running: _Running,
    progress: dict[int, _Progress],
    capacity: Capacity,
    now: float,
    order: itertools.count[int],
) -> None:
    rank, job_id, seconds = heapq.heappop(queues[level])
    short_s = capacity.mlfq.short_work_s
    counts.ready[level] -= 1
    if is_new_work(rank):
        counts.ready_new_work[level] -= 1
    long_call = rank > short_s
    if not long_call:
        counts.ready_short_work[level] -= 1
    counts.running[level] += 1
    counts.running_long_work += int(long_call)
    end = now + seconds / capacity.speed
    heapq.heappush(running, _Call(end, next(order), job_id, level, long_call, rank, seconds, now))
    mine = progress[job_id]
    if mine.start is None:
        mine.start = now
    mine.finish = max(mine.finish, end)


_LONG_AGO_S = 1e9


def _take_back_for_p0(
    queues: _Queues, counts: _Counts, running: _Running, capacity: Capacity, now: float
) -> bool:
    """Take back slots for new P0 reviews that have none, as the dispatcher does
    (`bot.sched.mlfq.choose_preemption`): the taken-back call goes back to its queue and is
    done again from the start. Whether anything was taken back."""
    waiting = counts.ready_new_work[Level.P0]
    free = capacity.slots - len(running)
    if waiting <= free or not capacity.mlfq.preempt:
        return False
    calls: list[RunningCall] = []
    for call in running:
        # A call running before the dry run began is taken as the oldest (taken back last).
        elapsed = _LONG_AGO_S if math.isinf(call.start) else (now - call.start) * capacity.speed
        calls.append(
            RunningCall(
                chunk_id=call.order,
                level=call.level,
                elapsed_s=elapsed,
                expected_s=elapsed + (call.end - now) * capacity.speed,
            )
        )
    # Waited 0 s: the dry run plays a call expected to end within the grace as ending then.
    choice = choose_preemption(
        waiting=waiting, free_slots=free, running=calls, waited_s=0.0, settings=capacity.mlfq
    )
    if not choice.victims:
        return False
    victims = set(choice.victims)
    for call in [call for call in running if call.order in victims]:
        running.remove(call)
        counts.running[call.level] -= 1
        counts.running_long_work -= int(call.long_call)
        rank = call.rank
        if math.isinf(rank):  # running before the dry run began: its rank is not known
            rank = CONTINUATION_RANK_OFFSET + call.seconds
        heapq.heappush(queues[call.level], (rank, call.job_id, call.seconds))
        counts.ready[call.level] += 1
        counts.ready_new_work[call.level] += int(is_new_work(rank))
        counts.ready_short_work[call.level] += int(rank <= capacity.mlfq.short_work_s)
    heapq.heapify(running)
    return True


def _estimates(jobs: Sequence[JobLoad], progress: dict[int, _Progress]) -> dict[int, Estimate]:
    waiting = sorted(
        (job for job in jobs if not job.started),
        key=lambda job: (progress[job.job_id].start or 0.0, int(job.level), job.job_id),
    )
    places = {job.job_id: index + 1 for index, job in enumerate(waiting)}
    return {
        job.job_id: Estimate(
            job_id=job.job_id,
            level=job.level,
            place=places.get(job.job_id),
            start_in_s=progress[job.job_id].start or 0.0,
            finish_in_s=progress[job.job_id].finish,
        )
        for job in jobs
    }


__all__ = ["Arrivals", "Capacity", "Estimate", "JobLoad", "QueuedCall", "estimate_queue"]
