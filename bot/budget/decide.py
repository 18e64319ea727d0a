"""What a forge's write budget decides, as plain functions: which write spends next, when.

A budget is one forge identity's allowance of content-creating requests (a GitHub App
installation or token, a GitLab token): at most `per_minute` in any 60 s and `per_hour` in any
hour, at least `min_interval_s` apart. Writes waiting for it are claims; a claim spends when
the writes ranked before it (more valuable, then more urgent, then older) fit first. A claim
whose target a newer claim names is superseded (coalesced): only the newest state is written.
Each write leaves a share of each window to more valuable and more urgent ones, so what is
worth little never spends the room a later review needs; news (a moved ETA, progress) is
dropped rather than kept waiting when the budget runs low.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import IntEnum
from typing import Literal

from bot.config import DEFAULTS

MINUTE_S = 60.0
HOUR_S = 3600.0


class WriteValue(IntEnum):
    """What a write is worth to the people on the pull request, most first."""

    REVIEW = 0  # a review with new findings
    FIRST_SUMMARY = 1  # the first summary comment (and replies to a person's command)
    CHECK_COMPLETED = 2  # a check run / status's final state
    FIRST_STATUS = 3  # the first status of a head (queued, place, ETA)
    SUMMARY_EDIT = 4  # the living summary edited in place, reactions
    NEWS = 5  # a moved ETA, place or progress


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """One forge identity's write allowance; 0 turns a window's limit off."""

    # GitHub's, as the settings' defaults give them.
    per_minute: int = DEFAULTS.budget.github_writes_per_minute
    per_hour: int = DEFAULTS.budget.github_writes_per_hour
    min_interval_s: float = 1.0
    # Share of each window a write must leave to more valuable writes, by value: a write of
    # little worth never spends the room a review coming later needs. News is dropped, not
    # kept waiting, when spending it would eat into its share.
    value_reserve: tuple[float, ...] = (0.0, 0.05, 0.1, 0.4, 0.45, 0.5)
    # And to more urgent ones, by level: a hotfix never waits for the hour to turn.
    level_reserve: tuple[float, ...] = (0.0, 0.05, 0.1, 0.1)
    # Compressed time (tests, benchmarks): the minute and the hour are this many times as long.
    time_scale: float = 1.0
    # Margin past a window's edge before a slot counts as free again: the forge times a
    # write when it arrives, a little after the ledger did.
    margin_s: float = 1.0

    def windows(self) -> tuple[tuple[float, int], ...]:
        """The (seconds, limit) windows that apply."""
        return tuple(
            (seconds * self.time_scale, limit)
            for seconds, limit in ((MINUTE_S, self.per_minute), (HOUR_S, self.per_hour))
            if limit > 0
        )

    def window_names(self) -> tuple[str, ...]:
        """ "minute" and/or "hour", in the order of `windows`."""
        return tuple(
            name
            for name, limit in (("minute", self.per_minute), ("hour", self.per_hour))
            if limit > 0
        )

    @property
    def answer_lead_s(self) -> float:
        """How long before the forge's answer a write is counted from (see `counted_from`)."""
        return max(0.0, min(self.margin_s, self.min_interval_s))

    @property
    def horizon_s(self) -> float:
        """How far back spent writes still count."""
        return max((seconds for seconds, _ in self.windows()), default=0.0) + self.margin_s


@dataclass(frozen=True, slots=True)
class Claim:
    """A write waiting for the budget."""

    id: int
    value: WriteValue
    level: int
    requested_at: datetime
    target: str | None = None  # what the write sets (a job's status): a newer claim replaces it

    def rank(self) -> tuple[int, int, datetime, int]:
        """Spend order: most valuable, then most urgent level, then oldest."""
        return (int(self.value), int(self.level), self.requested_at, self.id)


@dataclass(frozen=True, slots=True)
class Spend:
    write_id: int = 0  # the ledger's id of the write, once recorded
    kind: Literal["spend"] = "spend"


@dataclass(frozen=True, slots=True)
class Wait:
    seconds: float
    kind: Literal["wait"] = "wait"


@dataclass(frozen=True, slots=True)
class Drop:
    reason: str
    kind: Literal["drop"] = "drop"


@dataclass(frozen=True, slots=True)
class Superseded:
    by: int
    kind: Literal["superseded"] = "superseded"


Verdict = Spend | Wait | Drop | Superseded


def coalesce(claims: Iterable[Claim]) -> list[Claim]:
    """The claims still worth writing: for each target only the newest, in spend order."""
    newest: dict[str, Claim] = {}
    untargeted: list[Claim] = []
    for claim in claims:
        if claim.target is None:
            untargeted.append(claim)
            continue
        known = newest.get(claim.target)
        if known is None or (claim.requested_at, claim.id) > (known.requested_at, known.id):
            newest[claim.target] = claim
    return sorted([*untargeted, *newest.values()], key=Claim.rank)


def superseded_by(me: Claim, waiting: Iterable[Claim]) -> Claim | None:
    """A newer claim naming the same target as `me`, if any."""
    if me.target is None:
        return None
    newer = [
        other
        for other in waiting
        if other.id != me.id
        and other.target == me.target
        and (other.requested_at, other.id) > (me.requested_at, me.id)
    ]
    return max(newer, key=lambda claim: (claim.requested_at, claim.id)) if newer else None


def reserve_for(claim: Claim, limit: int, limits: BudgetLimits) -> int:
    """Slots of a window of `limit` this claim must leave to more valuable or urgent writes."""
    values, levels = limits.value_reserve, limits.level_reserve
    share = values[min(int(claim.value), len(values) - 1)]
    share += levels[min(max(int(claim.level), 0), len(levels) - 1)]
    return min(limit - 1, math.ceil(limit * share)) if share > 0 else 0


def counted_from(answered_at: datetime, limits: BudgetLimits) -> datetime:
    """When a write the forge has answered counts from (for the windows and the interval), if
    later than its decision.

    The forge times a write when it arrives, somewhere between the decision and the answer; on
    a loaded machine that can be seconds after the decision, and a window counted from the
    decision alone once let two dispatchers put one write too many in GitHub's minute. Counted
    from the answer less `answer_lead_s` (at most `margin_s`, which every window adds past its
    edge), no window can end up short; the lead, as long as the minimum interval, keeps the
    next write free to go at the answer rather than an interval after it.
    """
    return answered_at - timedelta(seconds=limits.answer_lead_s)


def next_slot(
    spent: Sequence[float],
    *,
    after: float,
    limits: BudgetLimits,
    keep: Sequence[int] = (),
) -> float:
    """The earliest time at or after `after` (seconds) a write fits, leaving `keep[i]` slots
    of window i to others.

    `spent` is sorted and may hold writes planned later than `after` (a model of the line):
    a write fits when, in each window, fewer than `limit - keep` writes fall in the window
    ending at that time, and no write is closer than `min_interval_s`.
    """
    moment = after
    windows = limits.windows()
    keeps = tuple(keep) or (0,) * len(windows)
    interval = limits.min_interval_s
    tolerance = 1e-6  # float sums must not keep a slot moving by nothing
    while True:
        start_at = moment
        if interval > 0 and spent:
            index = bisect.bisect_right(spent, moment)
            if index > 0 and moment - spent[index - 1] < interval - tolerance:
                moment = spent[index - 1] + interval
            elif index < len(spent) and spent[index] - moment < interval - tolerance:
                moment = spent[index] + interval
        for (seconds, limit), kept in zip(windows, keeps, strict=True):
            allowed = max(1, limit - kept)
            start = bisect.bisect_right(spent, moment - seconds - limits.margin_s)
            end = bisect.bisect_right(spent, moment)
            if end - start >= allowed:
                moment = max(moment, spent[end - allowed] + seconds + limits.margin_s)
        if moment <= start_at + tolerance:
            return max(moment, start_at)


def schedule(
    spent: Sequence[float],
    count: int,
    *,
    after: float,
    limits: BudgetLimits,
    keep: Sequence[int] = (),
) -> list[float]:
    """When `count` more writes would go out, one after the other, from `after`."""
    times = list(spent)
    planned: list[float] = []
    moment = after
    for _ in range(count):
        moment = next_slot(times, after=moment, limits=limits, keep=keep)
        bisect.insort(times, moment)
        planned.append(moment)
    return planned


def room_left(spent: Sequence[float], *, now: float, limits: BudgetLimits) -> dict[str, int]:
    """Writes left in each window at `now` (what /metrics shows)."""
    left: dict[str, int] = {}
    for name, (seconds, limit) in zip(limits.window_names(), limits.windows(), strict=True):
        start = bisect.bisect_right(spent, now - seconds)
        end = bisect.bisect_right(spent, now)
        left[name] = max(0, limit - (end - start))
    return left


def keeps_of(claim: Claim, limits: BudgetLimits) -> list[int]:
    """The slots of each window `claim` leaves to others."""
    return [reserve_for(claim, limit, limits) for _, limit in limits.windows()]


def news_pressed(claim: Claim, spent: Sequence[float], ahead: int, limits: BudgetLimits) -> str:
    """Why news would be dropped now (`spent` sorted, relative to now = 0), or ""."""
    left = room_left(spent, now=0.0, limits=limits)
    for name, (_, limit), reserve in zip(
        limits.window_names(), limits.windows(), keeps_of(claim, limits), strict=True
    ):
        if left[name] - ahead <= reserve:
            return f"news held back: {left[name]} of {limit} writes left this {name}"
    return ""


def line_slot(
    me: Claim, ahead: Sequence[Claim], spent: Sequence[float], *, after: float, limits: BudgetLimits
) -> float:
    """When `me` fits, the claims ranked before it planned first, each with its own reserve
    (so a claim kept out by its reserve does not hold up one allowed to spend).

    A claim whose reserves are no smaller than those of one already planned later cannot go
    before it: it is not planned (the line stays a few dozen plans long however many wait).
    """
    times = list(spent)
    blocked: list[tuple[int, ...]] = []
    for claim in sorted(ahead, key=Claim.rank):
        keep = tuple(keeps_of(claim, limits))
        if any(all(mine >= theirs for mine, theirs in zip(keep, other, strict=True))
               for other in blocked):  # fmt: skip
            continue
        if claim.value == WriteValue.NEWS and news_pressed(claim, spent, 0, limits):
            continue  # it will be dropped, not spent
        slot = next_slot(times, after=after, limits=limits, keep=keep)
        bisect.insort(times, slot)
        if slot > after:
            blocked.append(keep)
    return next_slot(times, after=after, limits=limits, keep=keeps_of(me, limits))


def decide_spend(
    me: Claim,
    waiting: Sequence[Claim],
    spent: Sequence[datetime],
    *,
    now: datetime,
    limits: BudgetLimits,
    blocked_until: datetime | None = None,
) -> Verdict:
    """Whether `me` spends now, waits (how long), is dropped, or is superseded.

    `waiting` are the live claims of the same budget (with or without `me`); `spent` the
    writes of the last hour, any order.
    """
    newer = superseded_by(me, waiting)
    if newer is not None:
        return Superseded(newer.id)
    ahead = [claim for claim in coalesce(waiting) if claim.id != me.id and claim.rank() < me.rank()]
    times = sorted((moment - now).total_seconds() for moment in spent)
    after = 0.0
    if blocked_until is not None:
        after = max(after, (blocked_until - now).total_seconds())
    if me.value == WriteValue.NEWS:
        reason = news_pressed(me, times, len(ahead), limits)
        if reason:
            return Drop(reason)
    moment = line_slot(me, ahead, times, after=after, limits=limits)
    if moment <= 0.0:
        return Spend()
    return Wait(moment)


def wait_until(now: datetime, verdict: Wait) -> datetime:
    """The moment a waiting claim looks again."""
    return now + timedelta(seconds=verdict.seconds)


__all__ = [
    "HOUR_S",
    "MINUTE_S",
    "BudgetLimits",
    "Claim",
    "Drop",
    "Spend",
    "Superseded",
    "Verdict",
    "Wait",
    "WriteValue",
    "coalesce",
    "decide_spend",
    "keeps_of",
    "line_slot",
    "news_pressed",
    "next_slot",
    "reserve_for",
    "room_left",
    "schedule",
    "superseded_by",
    "wait_until",
]
