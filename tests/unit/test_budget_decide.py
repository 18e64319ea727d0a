"""The write budget's decisions, as plain functions: order, reserves, coalescing, the windows."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from bot.budget.decide import (
    BudgetLimits,
    Claim,
    Drop,
    Spend,
    Superseded,
    Wait,
    WriteValue,
    coalesce,
    counted_from,
    decide_spend,
    next_slot,
    reserve_for,
    room_left,
    schedule,
)
from bot.budget.model import PlannedWrite, play_budget
from bot.clock import EPOCH

GITHUB = BudgetLimits(per_minute=80, per_hour=500, min_interval_s=1.0)
NOW = EPOCH + timedelta(hours=2)


def claim(
    id: int, value: WriteValue, level: int = 1, *, ago_s: float = 0.0, target: str | None = None
) -> Claim:
    return Claim(id, value, level, NOW - timedelta(seconds=ago_s), target=target)


def spent_before(count: int, *, every_s: float, last_ago_s: float = 0.0) -> list[datetime]:
    """`count` writes `every_s` apart, the last one `last_ago_s` before NOW."""
    return [NOW - timedelta(seconds=last_ago_s + index * every_s) for index in range(count)]


def within_windows(times: list[float], limits: BudgetLimits) -> bool:
    """No window of the limits holds more writes than allowed, and the spacing holds."""
    ordered = sorted(times)
    if limits.min_interval_s and any(
        b - a < limits.min_interval_s - 1e-9 for a, b in itertools.pairwise(ordered)
    ):
        return False
    for seconds, limit in limits.windows():
        for index, start in enumerate(ordered):
            inside = sum(1 for other in ordered[index:] if other - start < seconds)
            if inside > limit:
                return False
    return True


@given(
    st.lists(st.floats(min_value=-4000, max_value=0), max_size=120),
    st.integers(min_value=1, max_value=120),
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=0, max_value=60),
    st.sampled_from([0.0, 0.5, 1.0]),
)
def test_a_schedule_never_overfills_a_window(
    history: list[float], count: int, per_minute: int, per_hour: int, interval: float
) -> None:
    """Whatever was spent before, the writes scheduled after it keep every window's limit."""
    limits = BudgetLimits(per_minute=per_minute, per_hour=per_hour, min_interval_s=interval)
    # The history itself is a valid one: what a budget would have let out.
    past = schedule([], min(len(history), 40), after=-4000.0, limits=limits)
    planned = schedule(past, count, after=0.0, limits=limits)
    assert all(moment >= 0.0 for moment in planned)
    assert planned == sorted(planned)
    assert within_windows([*past, *planned], limits)


@given(st.integers(min_value=0, max_value=79))
def test_room_is_spent_at_once_and_the_next_slot_is_when_the_oldest_ages_out(used: int) -> None:
    limits = BudgetLimits(per_minute=80, per_hour=0, min_interval_s=0.0, margin_s=0.0)
    spent = [float(-59 + index * 0.5) for index in range(used)]
    assert next_slot(spent, after=0.0, limits=limits) == 0.0
    full = [float(-59 + index * 0.5) for index in range(80)]
    assert next_slot(full, after=0.0, limits=limits) == 1.0  # -59 + 60


def test_value_order_decides_who_spends_the_last_slot() -> None:
    """One slot left in the minute: of the claims waiting, the review gets it; a summary edit
    waits behind a first status, which waits behind a check run's completion."""
    limits = BudgetLimits(
        per_minute=10, per_hour=0, min_interval_s=0.0, value_reserve=(0.0,), level_reserve=(0.0,)
    )
    spent = spent_before(9, every_s=1.0, last_ago_s=1.0)
    review = claim(1, WriteValue.REVIEW, ago_s=0.0)
    edit = claim(2, WriteValue.SUMMARY_EDIT, ago_s=30.0)  # older, worth less
    completed = claim(3, WriteValue.CHECK_COMPLETED, ago_s=20.0)
    first = claim(4, WriteValue.FIRST_STATUS, ago_s=25.0)
    waiting = [review, edit, completed, first]
    assert decide_spend(review, waiting, spent, now=NOW, limits=limits) == Spend()
    for loser in (edit, completed, first):
        assert isinstance(decide_spend(loser, waiting, spent, now=NOW, limits=limits), Wait)
    # In line: the completion's slot comes before the first status's, that before the edit's.
    waits = {
        item.value: decide_spend(item, waiting, spent, now=NOW, limits=limits)
        for item in (completed, first, edit)
    }
    order = sorted(waits, key=lambda value: waits[value].seconds)  # type: ignore[union-attr]
    assert order == [WriteValue.CHECK_COMPLETED, WriteValue.FIRST_STATUS, WriteValue.SUMMARY_EDIT]


def test_a_p0_review_goes_before_a_p2_review_and_has_room_the_p2_may_not_use() -> None:
    """The hour is nearly spent: a P2's review waits for the hour to turn, a P0's goes now."""
    spent = spent_before(455, every_s=7.0, last_ago_s=5.0)  # 45 left of 500
    p2 = claim(1, WriteValue.REVIEW, level=2, ago_s=60.0)
    p0 = claim(2, WriteValue.REVIEW, level=0)
    assert decide_spend(p0, [p0], spent, now=NOW, limits=GITHUB) == Spend()
    verdict = decide_spend(p2, [p2], spent, now=NOW, limits=GITHUB)
    assert isinstance(verdict, Wait) and verdict.seconds > 60
    # Waiting together, the P0 is first even though the P2 asked first.
    assert decide_spend(p0, [p2, p0], spent, now=NOW, limits=GITHUB) == Spend()


@given(
    st.sampled_from(list(WriteValue)),
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=0, max_value=500),
    st.integers(min_value=0, max_value=20),
)
def test_only_news_is_ever_dropped(value: WriteValue, level: int, used: int, ahead: int) -> None:
    """However full the budget and long the line, a review, summary or final state waits; news
    is dropped once spending it would eat into what more valuable writes are kept."""
    spent = spent_before(used, every_s=3600.0 / max(used, 1) * 0.99, last_ago_s=1.0)
    me = claim(999, value, level)
    others = [claim(index, WriteValue.REVIEW, 0, ago_s=5.0) for index in range(ahead)]
    verdict = decide_spend(me, [*others, me], spent, now=NOW, limits=GITHUB)
    if value != WriteValue.NEWS:
        assert isinstance(verdict, Spend | Wait)
    else:
        left = room_left(
            [(moment - NOW).total_seconds() for moment in sorted(spent)], now=0.0, limits=GITHUB
        )
        keeps = [reserve_for(me, limit, GITHUB) for _, limit in GITHUB.windows()]
        pressed = any(
            left[name] - ahead <= keep
            for name, keep in zip(GITHUB.window_names(), keeps, strict=True)
        )
        assert isinstance(verdict, Drop) == pressed


def test_news_goes_out_when_the_budget_is_idle_and_is_dropped_under_pressure() -> None:
    news = claim(1, WriteValue.NEWS)
    assert decide_spend(news, [news], [], now=NOW, limits=GITHUB) == Spend()
    busy = spent_before(250, every_s=14.0, last_ago_s=2.0)  # 250 of 500 left this hour
    assert isinstance(decide_spend(news, [news], busy, now=NOW, limits=GITHUB), Drop)
    first = claim(2, WriteValue.FIRST_STATUS)
    assert decide_spend(first, [first], busy, now=NOW, limits=GITHUB) == Spend()


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["status:1", "status:2", None]),
            st.integers(min_value=0, max_value=100),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_coalescing_keeps_only_the_newest_write_of_each_target(
    asked: list[tuple[str | None, int]],
) -> None:
    claims = [
        claim(index, WriteValue.FIRST_STATUS, ago_s=float(ago), target=target)
        for index, (target, ago) in enumerate(asked)
    ]
    kept = coalesce(claims)
    targets = [item.target for item in kept if item.target is not None]
    assert len(targets) == len(set(targets))
    assert {item.target for item in kept} == {item.target for item in claims}
    for item in kept:
        if item.target is None:
            continue
        newest = max(
            (other for other in claims if other.target == item.target),
            key=lambda other: (other.requested_at, other.id),
        )
        assert item == newest
        # Every older claim of the target is told it is superseded; the newest is not.
        for other in claims:
            verdict = decide_spend(other, claims, [], now=NOW, limits=GITHUB)
            if other.target == item.target and other != newest:
                assert verdict == Superseded(newest.id)
    assert [item.rank() for item in kept] == sorted(item.rank() for item in kept)


def test_queued_in_progress_completed_inside_the_window_is_one_write() -> None:
    """A status that waited while its job moved on: queued and in_progress are replaced by
    completed in line, which is the one write that goes out."""
    spent = spent_before(80, every_s=0.5, last_ago_s=0.5)  # the minute is full
    queued = claim(1, WriteValue.FIRST_STATUS, ago_s=40.0, target="status:7")
    started = claim(2, WriteValue.NEWS, ago_s=40.0, target="status:7")
    completed = claim(3, WriteValue.CHECK_COMPLETED, ago_s=40.0, target="status:7")
    waiting = [queued, started, completed]
    assert decide_spend(queued, waiting, spent, now=NOW, limits=GITHUB) == Superseded(3)
    assert decide_spend(started, waiting, spent, now=NOW, limits=GITHUB) == Superseded(3)
    assert isinstance(decide_spend(completed, waiting, spent, now=NOW, limits=GITHUB), Wait)
    later = NOW + timedelta(seconds=61)
    assert decide_spend(completed, [completed], spent, now=later, limits=GITHUB) == Spend()


def test_a_pause_the_forge_asked_for_holds_every_write() -> None:
    review = claim(1, WriteValue.REVIEW, level=0)
    until = NOW + timedelta(seconds=42)
    verdict = decide_spend(review, [review], [], now=NOW, limits=GITHUB, blocked_until=until)
    assert verdict == Wait(42.0)


def test_a_write_its_reserve_keeps_out_does_not_hold_up_one_allowed_to_spend() -> None:
    """The hour is nearly spent: a P2's review (ranked first: reviews before summaries) must
    leave the last tenth to urgent writes, so a P0's first summary behind it spends now."""
    spent = spent_before(455, every_s=7.0, last_ago_s=5.0)
    p2_review = claim(1, WriteValue.REVIEW, level=2, ago_s=30.0)
    p0_summary = claim(2, WriteValue.FIRST_SUMMARY, level=0)
    waiting = [p2_review, p0_summary]
    assert p2_review.rank() < p0_summary.rank()
    assert decide_spend(p0_summary, waiting, spent, now=NOW, limits=GITHUB) == Spend()
    assert isinstance(decide_spend(p2_review, waiting, spent, now=NOW, limits=GITHUB), Wait)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(WriteValue)),
            st.integers(min_value=0, max_value=3),
            st.floats(min_value=0, max_value=600),
        ),
        min_size=1,
        max_size=150,
    )
)
def test_the_played_budget_keeps_the_windows_and_drops_only_news(
    asked: list[tuple[WriteValue, int, float]],
) -> None:
    limits = BudgetLimits(per_minute=20, per_hour=60, min_interval_s=1.0)
    writes = [
        PlannedWrite(value, level, at, job_id=index)
        for index, (value, level, at) in enumerate(asked)
    ]
    played = play_budget(writes, limits)
    spent = [moment for moment in played if moment is not None]
    assert within_windows(spent, limits)
    for write, moment in zip(writes, played, strict=True):
        if write.value != WriteValue.NEWS:
            assert moment is not None and moment >= write.asked_s


def test_a_played_burst_posts_the_p0_review_first_and_coalesces_statuses() -> None:
    """200 reviews ask at once with their first status; a P0 asks last: its review is the
    first written, and a status replaced by its final state before it went out is one write."""
    limits = BudgetLimits(per_minute=80, per_hour=500, min_interval_s=1.0)
    writes = [PlannedWrite(WriteValue.REVIEW, 2, 0.0, job_id=index) for index in range(200)]
    writes.append(PlannedWrite(WriteValue.REVIEW, 0, 0.5, job_id=999))
    writes += [
        PlannedWrite(WriteValue.FIRST_STATUS, 2, 0.0, job_id=index, target=f"status:{index}")
        for index in range(200)
    ]
    writes += [
        PlannedWrite(WriteValue.CHECK_COMPLETED, 2, 30.0, job_id=index, target=f"status:{index}")
        for index in range(200)
    ]
    played = play_budget(writes, limits)
    p0 = played[200]
    assert p0 is not None and p0 < 2.0
    firsts = [moment for moment in played[201:401] if moment is not None]
    finals = [moment for moment in played[401:] if moment is not None]
    assert len(finals) == 200  # every final state goes out
    assert len(firsts) < 200  # the statuses that waited were coalesced into their final state
    assert within_windows([moment for moment in played if moment is not None], limits)


@given(
    st.lists(
        st.tuples(st.floats(min_value=0, max_value=30), st.floats(min_value=0, max_value=30)),
        min_size=1,
        max_size=40,
    )
)
def test_a_write_counted_from_its_answer_never_overfills_the_forges_minute(
    delays: list[tuple[float, float]],
) -> None:
    """Writes go one after another, each leaving as soon as the ledger allows, arriving at the
    forge up to 30 s after its decision and answered up to 30 s later: counted from the answer
    less the lead, the forge never sees more than its limit in a minute. Counted from the
    decision (the old ledger), one slow write let a fifth into GitHub's minute of 4."""
    limits = BudgetLimits(per_minute=4, per_hour=0, min_interval_s=1.0, margin_s=1.0)
    stamps: list[float] = []
    arrivals: list[float] = []
    moment = 0.0
    for to_forge, to_answer in delays:
        decided = next_slot(sorted(stamps), after=moment, limits=limits)
        arrived = decided + to_forge
        answered = arrived + to_answer
        at = counted_from(EPOCH + timedelta(seconds=answered), limits)
        stamps.append(max(decided, (at - EPOCH).total_seconds()))
        arrivals.append(arrived)
        moment = answered
    # What the forge checks: its windows over arrivals (it asks no spacing of them).
    assert within_windows(arrivals, replace(limits, min_interval_s=0.0))


def test_the_next_write_may_go_when_the_last_is_answered_not_an_interval_later() -> None:
    """GitHub's second between writes is counted from the answer less the same second: the
    pace of one write a second holds however long the forge takes to answer."""
    answered = NOW
    at = counted_from(answered, GITHUB)
    assert at == answered - timedelta(seconds=GITHUB.min_interval_s)
    seconds = (at - EPOCH).total_seconds()
    assert (
        next_slot([seconds], after=(answered - EPOCH).total_seconds(), limits=GITHUB)
        == (answered - EPOCH).total_seconds()
    )
