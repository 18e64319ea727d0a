"""MLFQ decisions: level choice, feedback, ranks and the estimator (aging and inheritance are
the store's: tests/system/test_store.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.config import SchedulerSettings
from bot.model import Level
from bot.sched.mlfq import (
    CONTINUATION_RANK_OFFSET,
    MlfqSettings,
    Rank,
    RunningCall,
    ServiceEstimator,
    apply_feedback,
    choose_preemption,
    choose_slot,
    expected_chunk_s,
    is_new_work,
    order_levels,
    queue_ranks,
    rank_chunks,
    rank_job,
)

SETTINGS = MlfqSettings(reserved_slots=0)
counts = st.lists(st.integers(min_value=0, max_value=20), min_size=4, max_size=4)


def test_p0_never_waits_for_a_share() -> None:
    choice = choose_slot(
        running=[0, 8, 0, 0], ready=[1, 50, 5, 5], free_slots=1, total_slots=9, settings=SETTINGS
    )
    assert choice is not None and choice.level == Level.P0


def test_weights_share_slots_among_levels_with_ready_work() -> None:
    # P1 runs 4 (4/4 = 1.0), P2 runs 1 (1/2 = 0.5): P2 is further below its share.
    levels = order_levels(running=[0, 4, 1, 0], ready=[0, 9, 9, 0], weights=(8, 4, 2, 1))
    assert levels == (Level.P2, Level.P1)


def test_p1s_share_rises_while_work_queues() -> None:
    settings = MlfqSettings(weights=(8, 6, 2, 1), backlog_weights=(8, 16, 2, 1), reserved_slots=0)
    # 12 slots, P1 runs 8 and P2 runs 2: 8/6 > 2/2, so P2 is below its share while the queue
    # keeps up; 8/16 < 2/2 while more than two chunks per slot are ready.
    keeping_up = choose_slot(running=[0, 8, 2, 0], ready=[0, 10, 10, 0], free_slots=1,
                             total_slots=12, settings=settings)  # fmt: skip
    queued = choose_slot(running=[0, 8, 2, 0], ready=[0, 15, 10, 0], free_slots=1,
                         total_slots=12, settings=settings)  # fmt: skip
    assert keeping_up is not None and keeping_up.level == Level.P2
    assert queued is not None and queued.level == Level.P1
    assert settings.weights_for([0, 12, 12, 0], 12) == (8, 6, 2, 1)
    assert settings.weights_for([0, 13, 12, 0], 12) == (8, 16, 2, 1)


def test_one_set_of_shares_when_the_backlog_weights_equal_the_weights() -> None:
    settings = MlfqSettings(weights=(8, 6, 2, 1), backlog_weights=(8, 6, 2, 1), reserved_slots=0)
    queued = choose_slot(running=[0, 8, 2, 0], ready=[0, 15, 10, 0], free_slots=1,
                         total_slots=12, settings=settings)  # fmt: skip
    assert queued is not None and queued.level == Level.P2


def test_a_level_of_weight_0_takes_a_slot_only_when_no_other_level_has_work() -> None:
    settings = MlfqSettings(weights=(8, 6, 2, 1), backlog_weights=(8, 16, 0, 1), reserved_slots=0)
    # Work queues (24 ready on 8 slots). P2 runs nothing and has new work, P1 has only
    # continuations ready: P1 is served first all the same, and P3 keeps its slot.
    queued = choose_slot(running=[0, 6, 0, 0], ready=[0, 12, 12, 0], ready_new_work=[0, 0, 12, 0],
                         free_slots=1, total_slots=8, settings=settings)  # fmt: skip
    assert queued is not None and queued.levels == (Level.P1, Level.P2)
    bots = choose_slot(running=[0, 6, 0, 0], ready=[0, 12, 12, 1], ready_new_work=[0, 0, 12, 1],
                       free_slots=1, total_slots=8, settings=settings)  # fmt: skip
    assert bots is not None and bots.levels == (Level.P3, Level.P1, Level.P2)
    # Work-conserving: with nothing else ready, P2 takes the slot.
    alone = choose_slot(running=[0, 0, 1, 0], ready=[0, 0, 30, 0], ready_new_work=[0, 0, 30, 0],
                        free_slots=1, total_slots=8, settings=settings)  # fmt: skip
    assert alone is not None and alone.level == Level.P2
    # While the queue keeps up, P2's share of 2 holds as before.
    keeping_up = choose_slot(running=[0, 6, 0, 0], ready=[0, 3, 3, 0], ready_new_work=[0, 0, 3, 0],
                             free_slots=1, total_slots=8, settings=settings)  # fmt: skip
    assert keeping_up is not None and keeping_up.level == Level.P2


def test_p0_needs_a_positive_weight_and_no_weight_is_negative() -> None:
    assert MlfqSettings(backlog_weights=(8, 16, 0, 0)).backlog_weights == (8, 16, 0, 0)
    with pytest.raises(ValueError, match="P0's positive"):
        MlfqSettings(weights=(0, 6, 2, 1))
    with pytest.raises(ValueError, match="none negative"):
        MlfqSettings(backlog_weights=(8, 16, -1, 1))


def test_an_empty_level_gives_its_share_away() -> None:
    choice = choose_slot(
        running=[0, 7, 0, 0], ready=[0, 3, 0, 0], free_slots=1, total_slots=8, settings=SETTINGS
    )
    assert choice is not None and choice.levels == (Level.P1,)


def test_no_ready_work_leaves_the_slot_idle() -> None:
    assert (
        choose_slot(
            running=[0, 3, 0, 0], ready=[0] * 4, free_slots=5, total_slots=8, settings=SETTINGS
        )
        is None
    )
    assert (
        choose_slot(
            running=[0] * 4, ready=[0, 1, 0, 0], free_slots=0, total_slots=8, settings=SETTINGS
        )
        is None
    )


def test_fresh_work_is_shared_first() -> None:
    choice = choose_slot(
        running=[0, 0, 0, 0],
        ready=[0, 2, 9, 0],
        ready_new_work=[0, 2, 0, 0],
        free_slots=8,
        total_slots=8,
        settings=SETTINGS,
    )
    assert choice is not None and choice.levels == (Level.P1, Level.P2)


def test_the_reserved_slot_prefers_short_work_and_is_lent_when_there_is_none() -> None:
    settings = MlfqSettings(reserved_slots=1, short_work_s=20.0)
    kwargs = {"ready": [0, 5, 5, 0], "free_slots": 1, "total_slots": 8, "settings": settings}
    lent = choose_slot(
        running=[0, 5, 2, 0], running_long_work=7, ready_short_work=[0, 0, 0, 0], **kwargs
    )
    assert lent is not None and lent.max_rank is None and lent.reason.startswith("reserve lent")
    short = choose_slot(
        running=[0, 5, 2, 0], running_long_work=7, ready_short_work=[0, 0, 2, 0], **kwargs
    )
    assert short is not None and short.levels == (Level.P2,) and short.max_rank == 20.0
    spare = choose_slot(
        running=[0, 5, 1, 0], running_long_work=6, ready_short_work=[0, 0, 0, 0], **kwargs
    )
    assert spare is not None and spare.max_rank is None
    urgent = choose_slot(
        running=[0, 5, 2, 0],
        running_long_work=7,
        ready_short_work=[0] * 4,
        **{**kwargs, "ready": [1, 5, 5, 0]},
    )
    assert urgent is not None and urgent.level == Level.P0


@given(counts, counts, st.integers(1, 8))
def test_choice_is_work_conserving(running: list[int], ready: list[int], free: int) -> None:
    choice = choose_slot(
        running=running, ready=ready, free_slots=free, total_slots=8, settings=SETTINGS
    )
    if any(ready):
        assert choice is not None
        assert set(choice.levels) == {Level(i) for i, n in enumerate(ready) if n > 0}
        if ready[0]:
            assert choice.level == Level.P0
    else:
        assert choice is None


def test_feedback_drops_one_level_after_the_quantum() -> None:
    settings = MlfqSettings(quantum_s=(120.0, 90.0, 240.0))
    assert apply_feedback(level=Level.P1, used_at_level_s=89.9, settings=settings) is None
    change = apply_feedback(level=Level.P1, used_at_level_s=90.0, settings=settings)
    assert change is not None and change.level == Level.P2 and "quantum 90" in change.reason
    assert apply_feedback(level=Level.P3, used_at_level_s=1e9, settings=settings) is None


def test_settings_validate_and_come_from_the_bot_settings() -> None:
    with pytest.raises(ValueError, match="weights"):
        MlfqSettings(weights=(0, 1, 1, 1))
    with pytest.raises(ValueError, match="backlog_weights"):
        MlfqSettings(backlog_weights=(1, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quantum"):
        MlfqSettings(quantum_s=(1.0, 2.0))  # type: ignore[arg-type]
    settings = MlfqSettings.from_scheduler_settings(
        SchedulerSettings(
            weights=(9, 3, 2, 1), backlog_weights=(9, 12, 2, 1), aging_interval_s=60.0
        ),
        reserved_slots=2,
    )
    assert settings.weights == (9, 3, 2, 1) and settings.aging_interval_s == 60.0
    assert settings.backlog_weights == (9, 12, 2, 1)
    assert settings.reserved_slots == 2


def test_estimator_learns_the_cost_line_from_chunks() -> None:
    estimator = ServiceEstimator.with_prior(base_s=10.0, per_line_s=0.1, weight=1.0)
    # truth: work = 20 + 0.05 * lines
    for lines in (40, 100, 300, 800, 2000) * 20:
        chunk = min(lines, 400)
        work = (20 + 0.05 * lines) * chunk / lines
        estimator = estimator.observe(chunk_lines=chunk, job_lines=lines, gpu_seconds=3.0 + work)
    base, per_line = estimator.coefficients()
    assert base == pytest.approx(20.0, rel=0.05)
    assert per_line == pytest.approx(0.05, rel=0.05)
    assert estimator.expected_service(100) == pytest.approx(3 + 20 + 5, rel=0.05)


def test_estimator_ignores_empty_observations() -> None:
    estimator = ServiceEstimator.with_prior()
    assert estimator.observe(chunk_lines=0, job_lines=10, gpu_seconds=5.0) == estimator


def test_rank_uses_the_jobs_own_rate_once_known() -> None:
    estimator = ServiceEstimator.with_prior(base_s=0.0, per_line_s=0.1)
    unknown = rank_job(
        total_lines=1000, remaining_lines=500, remaining_chunks=2, estimator=estimator
    )
    known = rank_job(
        total_lines=1000,
        remaining_lines=500,
        remaining_chunks=2,
        done_lines=500,
        done_chunks=2,
        done_gpu_s=2 * 3.0 + 500 * 1.0,  # this job costs 1 s per line
        estimator=estimator,
    )
    assert known > unknown * 5


def test_first_chunks_rank_before_continuations_and_short_before_long() -> None:
    estimator = ServiceEstimator.with_prior()
    small = rank_chunks([50], estimator=estimator)
    large = rank_chunks([400, 400, 400], estimator=estimator)
    assert small[0] < large[0] < CONTINUATION_RANK_OFFSET
    assert all(rank >= CONTINUATION_RANK_OFFSET for rank in large[1:])
    assert large[1] > large[2]
    assert (
        rank_chunks([400, 400], estimator=estimator, new_work_first=False)[1]
        < CONTINUATION_RANK_OFFSET
    )


def test_a_large_reviews_first_chunk_ranks_by_the_whole_review() -> None:
    """Shortest review first is what minimizes turnaround: a large review's small first chunk
    does not jump a mid-sized review, unless asked to (time to first chunk)."""
    estimator = ServiceEstimator.with_prior()
    large = rank_chunks([100, 400, 400], estimator=estimator)
    mid = rank_chunks([300], estimator=estimator)
    assert mid[0] < large[0] < CONTINUATION_RANK_OFFSET
    by_first_chunk = rank_chunks([100, 400, 400], estimator=estimator, fresh_by_first_chunk=True)
    assert by_first_chunk[0] < mid[0]


def test_queued_continuations_carry_the_rank_of_the_jobs_next_chunk() -> None:
    estimator = ServiceEstimator.with_prior()
    ranks = rank_chunks([100, 400, 400, 200], estimator=estimator)
    stored = queue_ranks(ranks)
    assert stored[0] == ranks[0]
    # the queue leases by (rank, id): equal ranks keep one job's chunks in order, and the job
    # ranks by all the work it has left, not by its shortest tail
    assert stored[1:] == (ranks[1],) * 3
    assert ranks[3] < ranks[1]
    assert queue_ranks(ranks[:1]) == ranks[:1]


def test_expected_chunk_length_is_a_share_of_the_jobs_expected_work() -> None:
    estimator = ServiceEstimator.with_prior(base_s=0.0, per_line_s=0.1)
    whole = expected_chunk_s(chunk_lines=800, job_lines=800, estimator=estimator)
    half = expected_chunk_s(chunk_lines=400, job_lines=800, estimator=estimator)
    assert whole == pytest.approx(3.0 + 80.0, rel=0.01)
    assert half == pytest.approx(3.0 + 40.0, rel=0.01)


def _call(chunk_id: int, level: Level, elapsed_s: float, expected_s: float = 60.0) -> RunningCall:
    return RunningCall(chunk_id=chunk_id, level=level, elapsed_s=elapsed_s, expected_s=expected_s)


PREEMPTING = MlfqSettings(preempt_grace_s=5.0)


def test_no_preemption_while_a_slot_is_free_or_nothing_waits() -> None:
    busy = [_call(1, Level.P1, 2.0), _call(2, Level.P2, 1.0)]
    for waiting, free in ((1, 1), (0, 0), (2, 3)):
        choice = choose_preemption(
            waiting=waiting, free_slots=free, running=busy, waited_s=0.0, settings=PREEMPTING
        )
        assert choice.victims == () and choice.recheck_in_s is None


def test_the_most_recently_started_lower_level_call_gives_way_never_a_p0_one() -> None:
    busy = [
        _call(1, Level.P1, 30.0),
        _call(2, Level.P0, 0.5),  # started last, but P0 work is never taken back
        _call(3, Level.P2, 4.0),
        _call(4, Level.P3, 12.0),
    ]
    one = choose_preemption(
        waiting=1, free_slots=0, running=busy, waited_s=0.0, settings=PREEMPTING
    )
    assert one.victims == (3,)
    assert "preempted" in one.reason
    two = choose_preemption(
        waiting=2, free_slots=0, running=busy, waited_s=0.0, settings=PREEMPTING
    )
    assert two.victims == (3, 4)
    only_p0 = choose_preemption(
        waiting=1,
        free_slots=0,
        running=[_call(2, Level.P0, 0.5)],
        waited_s=0.0,
        settings=PREEMPTING,
    )
    assert only_p0.victims == ()


def test_a_call_ending_within_the_grace_is_waited_for_then_no_longer() -> None:
    busy = [_call(1, Level.P1, 57.0, expected_s=60.0), _call(2, Level.P1, 1.0)]
    first = choose_preemption(
        waiting=1, free_slots=0, running=busy, waited_s=0.0, settings=PREEMPTING
    )
    assert first.victims == ()
    assert first.recheck_in_s == pytest.approx(5.0)
    # the call overran its estimate: once the grace is up the P0 review waits no longer
    later = [_call(1, Level.P1, 62.0, expected_s=60.0), _call(2, Level.P1, 6.0)]
    after = choose_preemption(
        waiting=1, free_slots=0, running=later, waited_s=5.0, settings=PREEMPTING
    )
    assert after.victims == (2,) and after.recheck_in_s is None
    # two P0 reviews waiting and one call ending soon: one waits for it, one preempts
    both = choose_preemption(
        waiting=2, free_slots=0, running=busy, waited_s=0.0, settings=PREEMPTING
    )
    assert both.victims == (2,) and both.recheck_in_s == pytest.approx(5.0)


def test_preemption_can_be_switched_off() -> None:
    off = MlfqSettings(preempt=False)
    choice = choose_preemption(
        waiting=3, free_slots=0, running=[_call(1, Level.P3, 1.0)], waited_s=60.0, settings=off
    )
    assert choice.victims == ()
    with pytest.raises(ValueError):
        MlfqSettings(preempt_grace_s=-1.0)


calls = st.lists(
    st.builds(
        RunningCall,
        chunk_id=st.integers(min_value=0, max_value=10_000),
        level=st.sampled_from(list(Level)),
        elapsed_s=st.floats(min_value=0, max_value=600),
        expected_s=st.floats(min_value=0, max_value=600),
    ),
    max_size=12,
    unique_by=lambda call: call.chunk_id,
)


@given(
    calls,
    st.integers(min_value=0, max_value=6),
    st.integers(min_value=0, max_value=3),
    st.floats(min_value=0, max_value=30),
)
def test_preemption_takes_no_more_than_needed_and_never_p0(
    running: list[RunningCall], waiting: int, free: int, waited: float
) -> None:
    choice = choose_preemption(
        waiting=waiting, free_slots=free, running=running, waited_s=waited, settings=PREEMPTING
    )
    by_id = {call.chunk_id: call for call in running}
    assert len(choice.victims) <= max(0, waiting - free)
    assert len(set(choice.victims)) == len(choice.victims)
    assert all(by_id[victim].level != Level.P0 for victim in choice.victims)
    taken = [by_id[victim].elapsed_s for victim in choice.victims]
    spared = [
        call.elapsed_s
        for call in running
        if call.level != Level.P0
        and call.chunk_id not in choice.victims
        and (waited >= 5.0 or call.expected_s - call.elapsed_s > 5.0 - waited)
    ]
    # the least work lost: no spared candidate started after a victim
    if taken and spared:
        assert max(taken) <= min(spared)


@given(st.booleans(), st.floats(min_value=0.0, max_value=100_000.0))
def test_a_rank_packs_and_unpacks_its_tier_and_seconds(continuation: bool, seconds: float) -> None:
    rank = Rank(continuation=continuation, seconds=seconds)
    # Packing adds the offset: what comes back is the seconds to the offset's float precision.
    assert Rank.unpack(rank.packed) == (continuation, pytest.approx(seconds, abs=1e-9))
    assert is_new_work(rank.packed) is not continuation


def test_every_continuation_sorts_behind_all_new_work() -> None:
    slowest_new = Rank(continuation=False, seconds=99_999.0).packed
    quickest_continuation = Rank(continuation=True, seconds=0.0).packed
    assert slowest_new < quickest_continuation
