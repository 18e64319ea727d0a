"""Multilevel feedback queue decisions: which level a free slot serves, level changes, ranks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from bot.config import DEFAULTS, SchedulerSettings, valid_shares
from bot.model import LEVELS, Level
from bot.sched.backlog import DEFAULT_BACKLOG_FACTOR, is_backlogged

# fifo: one queue, one call per review; priority: levels, no time slicing; mlfq: this module.
SchedulingPolicy = Literal["fifo", "priority", "mlfq"]
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = ("fifo", "priority", "mlfq")
# Level counts indexed by level number (P0..P3); a Mapping[Level, int] is accepted too.
LevelCounts = Sequence[int] | Mapping[Level, int]


@dataclass(frozen=True, slots=True)
class MlfqSettings:
    """Knobs of the level choice, feedback, aging and the short-work reserve."""

    weights: tuple[int, int, int, int] = DEFAULTS.scheduler.weights
    # The shares while more chunks are ready than `backlog_factor` per slot (bot/config.py
    # says why P1's share rises then).
    backlog_weights: tuple[int, int, int, int] = DEFAULTS.scheduler.backlog_weights
    backlog_factor: float = DEFAULT_BACKLOG_FACTOR
    # GPU seconds a job may use at P0, P1, P2 before it drops one level (P3 is the floor).
    quantum_s: tuple[float, float, float] = DEFAULTS.scheduler.quantum_s
    aging_interval_s: float = DEFAULTS.scheduler.aging_interval_s
    # Slots kept for P0 and for jobs expected to finish within `short_work_s` while others are
    # busy, and lent to other work while none of that is ready: short work then waits for a
    # long call only when it came while the reserve was lent; a hotfix takes a slot back.
    reserved_slots: int = 1
    short_work_s: float = 20.0
    # Preemption for P0: when a new P0 review has no free slot and no running call is expected
    # to end within `preempt_grace_s`, the most recently started lower-level call gives way.
    preempt: bool = True
    preempt_grace_s: float = 5.0

    def __post_init__(self) -> None:
        for name, weights in (("weights", self.weights), ("backlog_weights", self.backlog_weights)):
            if not valid_shares(weights):
                raise ValueError(
                    f"{name} must be four numbers, P0's positive and none negative, got {weights}"
                )
        if len(self.quantum_s) != 3 or any(quantum <= 0 for quantum in self.quantum_s):
            raise ValueError(f"quantum_s must be three positive numbers, got {self.quantum_s}")
        if self.aging_interval_s <= 0:
            raise ValueError("aging_interval_s must be positive")
        if self.reserved_slots < 0:
            raise ValueError("reserved_slots must not be negative")
        if self.preempt_grace_s < 0:
            raise ValueError("preempt_grace_s must not be negative")

    @classmethod
    def from_scheduler_settings(
        cls, settings: SchedulerSettings, **changes: object
    ) -> MlfqSettings:
        """Take weights, quanta and aging from the bot's SchedulerSettings."""
        base = cls(
            weights=settings.weights,
            backlog_weights=settings.backlog_weights,
            quantum_s=settings.quantum_s,
            aging_interval_s=settings.aging_interval_s,
        )
        return replace(base, **changes)  # type: ignore[arg-type]

    def backlogged(self, ready: LevelCounts, total_slots: int) -> bool:
        """Whether these ready chunks queue beyond `total_slots` slots: the one test behind
        the backlog's shares and the backlog's larger chunks."""
        return is_backlogged(ready, total_slots, self.backlog_factor)

    def weights_for(self, ready: LevelCounts, total_slots: int) -> tuple[int, int, int, int]:
        """The shares that apply with these ready chunks on `total_slots` slots."""
        return self.backlog_weights if self.backlogged(ready, total_slots) else self.weights

    def quantum_for(self, level: Level) -> float:
        """GPU seconds allowed at a level before feedback; P3 has no limit."""
        return math.inf if level == Level.P3 else self.quantum_s[int(level)]


@dataclass(frozen=True, slots=True)
class LevelChange:
    """A decided level change and the reason that goes into the job history."""

    level: Level
    reason: str


@dataclass(frozen=True, slots=True)
class SlotChoice:
    """What the next free slot serves: levels in order of preference, and a size cap if any."""

    levels: tuple[Level, ...]
    max_rank: float | None = None  # only jobs expected to need at most this many GPU seconds
    reason: str = ""

    @property
    def level(self) -> Level:
        return self.levels[0]


def _counts(values: LevelCounts) -> tuple[int, int, int, int]:
    if isinstance(values, Mapping):
        return (
            int(values.get(Level.P0, 0)),
            int(values.get(Level.P1, 0)),
            int(values.get(Level.P2, 0)),
            int(values.get(Level.P3, 0)),
        )
    if len(values) != 4:
        raise ValueError(f"expected four level counts, got {len(values)}")
    return (int(values[0]), int(values[1]), int(values[2]), int(values[3]))


def order_levels(
    *, running: LevelCounts, ready: LevelCounts, weights: Sequence[float]
) -> tuple[Level, ...]:
    """Levels with ready work, most deserving first: P0, then the smallest running/weight share,
    then the levels of weight 0, which take a slot only when no other level has work for it."""
    running_counts = _counts(running)
    ready_counts = _counts(ready)
    candidates = [level for level in LEVELS if ready_counts[level] > 0]

    def key(level: Level) -> tuple[int, float, int]:
        if level == Level.P0:
            return (0, 0.0, 0)
        if weights[level] <= 0:
            return (2, float(running_counts[level]), int(level))
        return (1, running_counts[level] / weights[level], int(level))

    return tuple(sorted(candidates, key=key))


def choose_slot(
    *,
    running: LevelCounts,
    ready: LevelCounts,
    free_slots: int,
    total_slots: int,
    settings: MlfqSettings,
    ready_new_work: LevelCounts | None = None,
    ready_short_work: LevelCounts | None = None,
    running_long_work: int | None = None,
) -> SlotChoice | None:
    """Which levels the next free slot serves (None: leave it idle).

    Work-conserving over the levels with ready work; P0 never waits for a share. Shares are
    first divided among the levels with new work (first chunks of jobs that have not started:
    a job's wait ends when its first call starts), then among all levels with ready work; a
    level of weight 0 comes after all of them, new work or not (the backlog's P2). The
    last `reserved_slots` free slots take only P0 or short work while other slots are busy,
    and are lent to other work while none is ready.
    """
    if free_slots <= 0:
        return None
    weights = settings.weights_for(ready, total_slots)
    levels = order_levels(running=running, ready=ready, weights=weights)
    if not levels:
        return None
    if levels[0] == Level.P0:
        return SlotChoice(levels=levels, reason="P0 ready")
    reserve = min(settings.reserved_slots, total_slots - 1)
    long_running = sum(_counts(running)) if running_long_work is None else running_long_work
    if reserve > 0 and long_running >= total_slots - reserve:
        if ready_short_work is None:
            return SlotChoice(levels=levels, max_rank=settings.short_work_s, reason="reserved")
        short_levels = order_levels(running=running, ready=ready_short_work, weights=weights)
        if not short_levels:
            # Lent, not kept idle: a P0 that comes takes a slot back from lower-level work
            # (the dispatcher's preemption), and short work that comes finds the next free
            # slot reserved again. Kept idle, it wasted a slot through every long backlog.
            return SlotChoice(levels=levels, reason="reserve lent: no short work ready")
        return SlotChoice(
            levels=short_levels, max_rank=settings.short_work_s, reason="reserved for short work"
        )
    if ready_new_work is not None:
        new_work_levels = tuple(
            level
            for level in order_levels(running=running, ready=ready_new_work, weights=weights)
            if level == Level.P0 or weights[level] > 0
        )
        if new_work_levels:
            rest = tuple(level for level in levels if level not in new_work_levels)
            return SlotChoice(levels=new_work_levels + rest, reason="weighted share of new work")
    return SlotChoice(levels=levels, reason="weighted share")


def apply_feedback(
    *, level: Level, used_at_level_s: float, settings: MlfqSettings
) -> LevelChange | None:
    """Drop a job one level once it has used its level's quantum of GPU seconds (not below P3)."""
    if level >= Level.P3:
        return None
    quantum = settings.quantum_for(level)
    if used_at_level_s < quantum:
        return None
    lower = Level(level + 1)
    return LevelChange(
        lower,
        f"feedback: used {used_at_level_s:.0f} GPU s at {level} (quantum {quantum:.0f} s)",
    )


@dataclass(frozen=True, slots=True)
class ServiceEstimator:
    """GPU seconds of a review from its changed lines, learned from finished chunks.

    A weighted least-squares line `work = base + per_line * lines` (work: GPU seconds beyond
    the per-call overhead) over observed jobs, starting from a weak prior. Pure: `observe`
    returns a new estimator.
    """

    overhead_s: float = 3.0
    weight: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_xy: float = 0.0

    @classmethod
    def with_prior(
        cls,
        *,
        base_s: float = 10.0,
        per_line_s: float = 0.1,
        weight: float = 4.0,
        overhead_s: float = 3.0,
    ) -> ServiceEstimator:
        """An estimator that believes `base_s + per_line_s * lines` until it sees data."""
        estimator = cls(overhead_s=overhead_s)
        for lines in (20.0, 1000.0):
            estimator = estimator._add(lines, base_s + per_line_s * lines, weight / 2)
        return estimator

    def _add(self, x: float, y: float, weight: float) -> ServiceEstimator:
        return replace(
            self,
            weight=self.weight + weight,
            sum_x=self.sum_x + weight * x,
            sum_y=self.sum_y + weight * y,
            sum_xx=self.sum_xx + weight * x * x,
            sum_xy=self.sum_xy + weight * x * y,
        )

    def observe(self, *, chunk_lines: int, job_lines: int, gpu_seconds: float) -> ServiceEstimator:
        """Learn from one finished chunk covering `chunk_lines` of a `job_lines` review."""
        if chunk_lines <= 0 or job_lines <= 0:
            return self
        work = max(0.0, gpu_seconds - self.overhead_s) * job_lines / chunk_lines
        return self._add(float(job_lines), work, chunk_lines / job_lines)

    def coefficients(self) -> tuple[float, float]:
        """(base_s, per_line_s) of the fitted line, both kept non-negative."""
        if self.weight <= 0:
            return (10.0, 0.1)
        mean_x = self.sum_x / self.weight
        mean_y = self.sum_y / self.weight
        variance = self.sum_xx / self.weight - mean_x * mean_x
        if variance <= 1e-9:
            return (0.0, max(0.0, mean_y / mean_x) if mean_x > 0 else 0.1)
        per_line = (self.sum_xy / self.weight - mean_x * mean_y) / variance
        per_line = max(1e-4, per_line)
        base = max(0.0, mean_y - per_line * mean_x)
        return (base, per_line)

    def expected_work(self, lines: int) -> float:
        """Expected GPU seconds beyond overhead of reviewing `lines` changed lines in one call."""
        base, per_line = self.coefficients()
        return base + per_line * max(0, lines)

    def expected_service(self, lines: int) -> float:
        """Expected GPU seconds of one call over the whole change."""
        return self.overhead_s + self.expected_work(lines)


def expected_remaining_s(
    *,
    total_lines: int,
    remaining_lines: int,
    remaining_chunks: int,
    done_lines: int,
    done_chunks: int,
    done_gpu_s: float,
    estimator: ServiceEstimator,
    expected_work_s: float | None = None,
) -> float:
    """Expected GPU seconds a job still needs; its own finished chunks beat the estimate of
    its work (`expected_work_s`, the learned one, else the estimator's line)."""
    if remaining_chunks <= 0:
        return 0.0
    total = max(1, total_lines)
    if done_chunks > 0 and done_lines > 0:
        work = max(0.0, done_gpu_s - done_chunks * estimator.overhead_s) * total / done_lines
    elif expected_work_s is not None:
        work = expected_work_s
    else:
        work = estimator.expected_work(total)
    return remaining_chunks * estimator.overhead_s + work * remaining_lines / total


def rank_job(
    *,
    total_lines: int,
    remaining_lines: int,
    remaining_chunks: int,
    done_lines: int = 0,
    done_chunks: int = 0,
    done_gpu_s: float = 0.0,
    estimator: ServiceEstimator,
    expected_work_s: float | None = None,
) -> float:
    """Sort key within a level (smaller runs first): expected remaining GPU seconds."""
    return round(
        expected_remaining_s(
            total_lines=total_lines,
            remaining_lines=remaining_lines,
            remaining_chunks=remaining_chunks,
            done_lines=done_lines,
            done_chunks=done_chunks,
            done_gpu_s=done_gpu_s,
            estimator=estimator,
            expected_work_s=expected_work_s,
        ),
        3,
    )


# Continuation chunks rank behind every first chunk of their level: a job's wait ends when its
# first call starts, so new work goes first and the rest of a long review fills in behind it.
CONTINUATION_RANK_OFFSET = 1_000_000.0


class Rank(NamedTuple):
    """Where a chunk waits within its level, smaller first: new work (a job's first chunk)
    before its continuations, then by expected GPU seconds. The queue stores it as one number
    (`packed`), so one index serves the dequeue's order."""

    continuation: bool
    seconds: float

    @property
    def packed(self) -> float:
        """The stored rank: continuations sit CONTINUATION_RANK_OFFSET behind new work."""
        return self.seconds + (CONTINUATION_RANK_OFFSET if self.continuation else 0.0)

    @classmethod
    def unpack(cls, stored: float) -> Rank:
        """The rank a stored number stands for."""
        if stored >= CONTINUATION_RANK_OFFSET:
            return cls(continuation=True, seconds=stored - CONTINUATION_RANK_OFFSET)
        return cls(continuation=False, seconds=stored)


def is_new_work(stored_rank: float) -> bool:
    """Whether a stored rank is a job's first chunk (the job's wait ends when it starts)."""
    return not Rank.unpack(stored_rank).continuation


def rank_chunks(
    chunk_lines: Sequence[int],
    *,
    estimator: ServiceEstimator,
    done_lines: int = 0,
    done_chunks: int = 0,
    done_gpu_s: float = 0.0,
    first_seq: int = 0,
    new_work_first: bool = True,
    fresh_by_first_chunk: bool = False,
    expected_work_s: float | None = None,
) -> tuple[float, ...]:
    """Ranks for a job's chunks from `first_seq` on (smaller runs first).

    A continuation's rank is the job's expected remaining GPU seconds from that chunk on, pushed
    behind new work by CONTINUATION_RANK_OFFSET when `new_work_first`. A first chunk ranks by
    the whole job's expected work, shortest review first, which is what minimizes turnaround
    (push to posted review); `fresh_by_first_chunk` ranks it by its own small cost instead,
    which starts large reviews sooner (time to first chunk) and finishes everything later
    (morning burst: mean turnaround 92.3 s against 90.1 s). `expected_work_s` is the whole
    job's expected work beyond the calls' overhead (bot.sched.cost), when known.
    """
    total = sum(chunk_lines)
    ranks: list[float] = []
    for seq in range(first_seq, len(chunk_lines)):
        remaining = rank_job(
            total_lines=total,
            remaining_lines=sum(chunk_lines[seq:]),
            remaining_chunks=len(chunk_lines) - seq,
            done_lines=done_lines,
            done_chunks=done_chunks,
            done_gpu_s=done_gpu_s,
            estimator=estimator,
            expected_work_s=expected_work_s,
        )
        if seq == 0 and fresh_by_first_chunk:
            remaining = rank_job(
                total_lines=total,
                remaining_lines=chunk_lines[0],
                remaining_chunks=1,
                estimator=estimator,
                expected_work_s=expected_work_s,
            )
        ranks.append(Rank(continuation=new_work_first and seq > 0, seconds=remaining).packed)
    return tuple(ranks)


def queue_ranks(ranks: Sequence[float]) -> tuple[float, ...]:
    """Ranks to store for a job's chunks, from `rank_chunks` ranks starting at its next chunk.

    The queue leases a level's chunks by (rank, id), and a job is done only when its last chunk
    is: every unstarted continuation carries the rank of the next one, so one job's chunks go
    in order and the job with the least work left goes first (per-chunk ranks would start every
    long review's tail first and finish them all late).
    """
    if len(ranks) <= 1:
        return tuple(ranks)
    return (ranks[0],) + (ranks[1],) * (len(ranks) - 1)


def expected_chunk_s(
    *,
    chunk_lines: int,
    job_lines: int,
    estimator: ServiceEstimator,
    expected_work_s: float | None = None,
) -> float:
    """Expected GPU seconds of one chunk covering `chunk_lines` of a `job_lines` review (whose
    work beyond overhead is `expected_work_s` when known, else the estimator's line)."""
    total = max(1, job_lines, chunk_lines)
    work = estimator.expected_work(total) if expected_work_s is None else expected_work_s
    return estimator.overhead_s + work * max(0, chunk_lines) / total


@dataclass(frozen=True, slots=True)
class RunningCall:
    """A chunk running on a slot, as preemption sees it."""

    chunk_id: int
    level: Level
    elapsed_s: float  # since its call started
    expected_s: float  # expected length of the whole call


@dataclass(frozen=True, slots=True)
class PreemptionChoice:
    """Calls to take back (chunk ids), and when to look again if waiting for one to end."""

    victims: tuple[int, ...] = ()
    recheck_in_s: float | None = None
    reason: str = ""


def choose_preemption(
    *,
    waiting: int,
    free_slots: int,
    running: Sequence[RunningCall],
    waited_s: float,
    settings: MlfqSettings,
) -> PreemptionChoice:
    """Which running calls give their slot to new P0 reviews that have none.

    `waiting` counts P0 reviews not started yet, `waited_s` how long the oldest has waited for
    a slot. Within the grace a call expected to end in time is waited for instead; after it,
    or when none is, the most recently started non-P0 calls (the least work lost) give way.
    P0 calls are never taken back.
    """
    need = waiting - max(0, free_slots)
    if not settings.preempt or need <= 0:
        return PreemptionChoice()
    left_s = settings.preempt_grace_s - max(0.0, waited_s)
    ending: set[int] = set()
    if left_s > 0:
        ending = {call.chunk_id for call in running if call.expected_s - call.elapsed_s <= left_s}
        need -= len(ending)
    recheck = left_s if left_s > 0 and ending else None
    if need <= 0:
        return PreemptionChoice(recheck_in_s=recheck, reason="a call ends within the grace")
    candidates = sorted(
        (call for call in running if call.level != Level.P0 and call.chunk_id not in ending),
        key=lambda call: (call.elapsed_s, -int(call.level), call.chunk_id),
    )
    victims = tuple(call.chunk_id for call in candidates[:need])
    reason = (
        f"preempted for a P0 review that waited {max(0.0, waited_s):.1f} s with no free slot"
        if victims
        else ""
    )
    return PreemptionChoice(victims=victims, recheck_in_s=recheck, reason=reason)
