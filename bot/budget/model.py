"""The write budget played forward in time, for the replay: when each write would go out.

Each write asks at a time; at every moment the claims waiting are looked at in spend order,
and each spends as soon as it fits (the same `next_slot`, reserves, news rule and coalescing
the ledger applies), so `bot simulate --forge-budget` reports what one installation's
budget would do to the posting of a whole morning.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.budget.decide import (
    BudgetLimits,
    Claim,
    WriteValue,
    keeps_of,
    news_pressed,
    next_slot,
)
from bot.clock import EPOCH


@dataclass(frozen=True, slots=True)
class PlannedWrite:
    """One write the replay's review would make: what it is worth, its level, when it asks."""

    value: WriteValue
    level: int
    asked_s: float
    job_id: int
    target: str | None = None


def _claim(index: int, write: PlannedWrite) -> Claim:
    asked = EPOCH + timedelta(seconds=write.asked_s)
    return Claim(index, write.value, write.level, asked, target=write.target)


def play_budget(writes: Sequence[PlannedWrite], limits: BudgetLimits) -> list[float | None]:
    """When each write goes out (seconds), or None when it is dropped (news) or coalesced
    into a newer write of its target."""
    result: list[float | None] = [None] * len(writes)
    arrivals = sorted(range(len(writes)), key=lambda index: writes[index].asked_s)
    horizon = limits.horizon_s
    spent: list[float] = []  # in time order
    pending: dict[int, Claim] = {}
    by_target: dict[str, int] = {}
    cursor = 0
    now = writes[arrivals[0]].asked_s if arrivals else 0.0
    while cursor < len(arrivals) or pending:
        while cursor < len(arrivals) and writes[arrivals[cursor]].asked_s <= now:
            index = arrivals[cursor]
            cursor += 1
            target = writes[index].target
            if target is not None and target in by_target:
                pending.pop(by_target[target], None)  # coalesced into this newer one
            if target is not None:
                by_target[target] = index
            pending[index] = _claim(index, writes[index])
        # The line at `now`, relative to it: what was spent in the windows, then each claim in
        # spend order planned at its slot. A claim whose reserves are no smaller than those of
        # one already planned later cannot go earlier: it is not looked at.
        times = [moment - now for moment in spent[bisect.bisect_right(spent, now - horizon) :]]
        blocked: list[tuple[int, ...]] = []
        wake: float | None = None
        for index, claim in sorted(pending.items(), key=lambda item: item[1].rank()):
            keep = tuple(keeps_of(claim, limits))
            if any(all(mine >= theirs for mine, theirs in zip(keep, other, strict=True))
                   for other in blocked):  # fmt: skip
                continue
            if claim.value == WriteValue.NEWS and news_pressed(claim, times, 0, limits):
                del pending[index]
                continue
            slot = next_slot(times, after=0.0, limits=limits, keep=keep)
            bisect.insort(times, slot)
            if slot <= 0.0:
                result[index] = now
                spent.append(now)
                del pending[index]
                if claim.target is not None and by_target.get(claim.target) == index:
                    del by_target[claim.target]
                continue
            blocked.append(keep)
            wake = slot if wake is None else min(wake, slot)
        upcoming = writes[arrivals[cursor]].asked_s - now if cursor < len(arrivals) else None
        steps = [step for step in (upcoming, wake) if step is not None]
        if steps:
            now += max(min(steps), 1e-6)
        elif pending:
            now += 1.0
    return result


def posting_waits(
    finishes: Sequence[tuple[int, int, float]], spent: Sequence[float], limits: BudgetLimits
) -> dict[int, float]:
    """How long each review waits for the budget to post it once its last chunk is done.

    `finishes` are (job id, level, seconds from now to its last chunk's end), `spent` the
    writes already counted in the windows (seconds from now, at most 0). The reviews ask in
    the order they finish, each at its level's reserve, each slot taken from the next.
    """
    times = sorted(spent)
    waits: dict[int, float] = {}
    for job_id, level, finish_s in sorted(finishes, key=lambda item: (item[2], item[1])):
        asked = max(0.0, finish_s)
        claim = Claim(job_id, WriteValue.REVIEW, level, EPOCH)
        slot = next_slot(times, after=asked, limits=limits, keep=keeps_of(claim, limits))
        bisect.insort(times, slot)
        waits[job_id] = slot - asked
    return waits


def spent_at(seconds: float | None) -> datetime | None:
    """A played write's time as a moment of the replay's clock."""
    return None if seconds is None else EPOCH + timedelta(seconds=seconds)


__all__ = ["PlannedWrite", "play_budget", "posting_waits", "spent_at"]
