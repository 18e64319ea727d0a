"""The status core: the ETA dry run, the should-publish decision, conclusions and the words."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.budget.decide import BudgetLimits
from bot.clock import EPOCH
from bot.config import load_settings
from bot.errors import ConfigError
from bot.model import JobState, Level
from bot.sched.mlfq import CONTINUATION_RANK_OFFSET, MlfqSettings, ServiceEstimator
from bot.status.calibrate import EtaLearner, EtaSample, learn_calibration
from bot.status.decide import (
    PublishRules,
    StatusReport,
    conclude,
    findings_at_or_above,
    parse_severity,
    publish_reason,
    state_of,
    updates_left,
)
from bot.status.eta import Arrivals, Capacity, JobLoad, QueuedCall, estimate_queue
from bot.status.load import LiveCalls, arrivals_of, job_load, unplanned_sizes
from bot.status.render import StatusFacts, about, ordinal, render_status
from bot.status.standing import EtaModel, model_from_json, model_to_json

NOW = EPOCH
NO_RESERVE = MlfqSettings(reserved_slots=0)


def single(job_id: int, level: Level, seconds: float, *, rank: float | None = None) -> JobLoad:
    return JobLoad(
        job_id,
        level,
        started=False,
        queued=(QueuedCall(rank if rank is not None else seconds, seconds),),
    )


# -- the dry run -------------------------------------------------------------------------------


def test_an_empty_queue_starts_now_and_ends_after_the_job_own_calls() -> None:
    job = JobLoad(
        1,
        Level.P1,
        started=False,
        queued=(
            QueuedCall(5.0, 5.0),
            QueuedCall(CONTINUATION_RANK_OFFSET + 20, 10.0),
            QueuedCall(CONTINUATION_RANK_OFFSET + 20, 10.0),
        ),
    )
    estimate = estimate_queue([job], Capacity(slots=8, mlfq=NO_RESERVE))[1]
    assert estimate.place == 1 and estimate.ahead == 0
    assert estimate.start_in_s == 0.0
    # Three free slots: all three calls run at once, the review ends with the longest.
    assert estimate.finish_in_s == pytest.approx(10.0)


def test_one_slot_serves_a_level_in_rank_order() -> None:
    jobs = [single(1, Level.P1, 30.0), single(2, Level.P1, 10.0), single(3, Level.P1, 20.0)]
    estimates = estimate_queue(jobs, Capacity(slots=1, mlfq=NO_RESERVE))
    assert [estimates[i].place for i in (2, 3, 1)] == [1, 2, 3]
    assert estimates[2].finish_in_s == pytest.approx(10.0)
    assert estimates[3].start_in_s == pytest.approx(10.0)
    assert estimates[3].finish_in_s == pytest.approx(30.0)
    assert estimates[1].finish_in_s == pytest.approx(60.0)


def test_work_still_arriving_above_a_job_delays_it_and_below_does_not() -> None:
    """One slot, a P2 review of 30 s alone; P1 reviews of 8 s arrive every 10 s (the recent
    stream). Played on, they take the slot whenever one is ready: the P2 ends later."""
    job = single(1, Level.P2, 30.0)
    alone = estimate_queue([job], Capacity(slots=1, mlfq=NO_RESERVE))[1]
    assert alone.finish_in_s == pytest.approx(30.0)
    stream = Arrivals({Level.P1: 10.0}, {Level.P1: (QueuedCall(8.0, 8.0),)}, horizon_s=900.0)
    busy = estimate_queue([job], Capacity(slots=1, mlfq=NO_RESERVE), stream)[1]
    # The P2 call starts at once (nothing else is there yet) and runs 30 s; the P1s wait.
    assert busy.start_in_s == 0.0 and busy.finish_in_s == pytest.approx(30.0)
    behind = [single(1, Level.P2, 30.0), single(2, Level.P2, 30.0)]
    later = estimate_queue(behind, Capacity(slots=1, mlfq=NO_RESERVE), stream)
    quiet = estimate_queue(behind, Capacity(slots=1, mlfq=NO_RESERVE))
    # The second P2 waits for the P1 work still arriving: far more than the 24 s of the three
    # that came while the first ran, since more keep coming while those run.
    assert quiet[2].finish_in_s == pytest.approx(60.0)
    assert later[2].finish_in_s > 60.0 + 24.0
    # Nothing is assumed to arrive past the horizon: P1s at 10 and 20 s only, run 30-46 s.
    short = Arrivals(stream.every_s, stream.calls, horizon_s=25.0)
    assert estimate_queue(behind, Capacity(slots=1, mlfq=NO_RESERVE), short)[2].finish_in_s == (
        pytest.approx(76.0)
    )
    # A stream below the job's level does not hold it back, while P2 has a share...
    low = Arrivals({Level.P3: 10.0}, {Level.P3: (QueuedCall(8.0, 8.0),)}, horizon_s=900.0)
    shares = replace(NO_RESERVE, backlog_weights=(8, 16, 2, 1))
    assert estimate_queue(behind, Capacity(slots=1, mlfq=shares), low)[2].finish_in_s == (
        pytest.approx(60.0)
    )
    # ...but at the backlog's weight 0 (two chunks queued on one slot), P2 waits for it too.
    waits = estimate_queue(behind, Capacity(slots=1, mlfq=NO_RESERVE), low)[2]
    assert waits.finish_in_s > 60.0 + 8.0


def test_the_stream_is_read_from_the_recent_window_and_played_as_long_again() -> None:
    estimator = ServiceEstimator.with_prior()
    recent = [(Level.P1, 40)] * 30 + [(Level.P2, 900)] * 2 + [(Level.P0, None)] * 3
    stream = arrivals_of(recent, window_s=900.0, estimator=estimator)
    assert stream is not None
    assert stream.every_s == {Level.P1: 30.0, Level.P0: 300.0}  # P2: too few to count
    assert stream.horizon_s == 900.0
    assert [call.seconds for call in stream.calls[Level.P1]] == [pytest.approx(17.0)]
    assert arrivals_of([(Level.P1, 40)] * 2, estimator=estimator) is None


def test_a_review_not_planned_yet_is_cut_as_the_planner_cuts() -> None:
    assert unplanned_sizes(300, line_budget=400, first_budget=100) == [300]
    assert unplanned_sizes(900, line_budget=400, first_budget=100) == [100, 400, 400]
    # A served model with a small context: chunks of 108 lines, the first of 100.
    assert unplanned_sizes(300, line_budget=108, first_budget=100) == [100, 100, 100]
    assert unplanned_sizes(300, line_budget=108, first_budget=None) == [100, 100, 100]
    assert unplanned_sizes(250, line_budget=100, first_budget=100) == [84, 84, 84]
    calls = LiveCalls(job_id=7, level=Level.P1, started=False, planned=False, total_lines=0,
                      request_lines=300)  # fmt: skip
    estimator = ServiceEstimator.with_prior()
    default = job_load(calls, estimator=estimator, now=NOW)
    small = job_load(calls, estimator=estimator, now=NOW, line_budget=108)
    assert len(default.queued) == 1 and len(small.queued) == 3
    # Three calls pay the overhead three times: the small-context review is expected longer.
    assert sum(c.seconds for c in small.queued) == pytest.approx(
        sum(c.seconds for c in default.queued) + 2 * estimator.overhead_s
    )
    stream = arrivals_of([(Level.P1, 300)] * 3, estimator=estimator, line_budget=108)
    assert stream is not None and len(stream.calls[Level.P1]) == 3


def test_the_eta_learns_a_factor_per_level_from_its_misses() -> None:
    samples = [EtaSample(Level.P1, 10.0, 10.0)] * 30 + [EtaSample(Level.P2, 10.0, 20.0)] * 30
    calibration = learn_calibration(samples)
    # Pooled median 1.5, shrunk towards 1 by ten reviews' weight: 1.43; each level shrunk
    # towards that by the same weight.
    assert calibration.factor(Level.P0) == pytest.approx((60 * 1.5 + 10) / 70)
    assert calibration.factor(Level.P2) == pytest.approx((30 * 2 + 10 * (100 / 70)) / 40)
    assert calibration.factor(Level.P1) == pytest.approx((30 * 1 + 10 * (100 / 70)) / 40)
    assert learn_calibration([]).factor(Level.P1) == 1.0
    extreme = learn_calibration([EtaSample(Level.P3, 1.0, 500.0)] * 500)
    assert extreme.factor(Level.P3) == 4.0  # bounded


def test_the_learner_keeps_the_dry_runs_promise_not_the_scaled_one() -> None:
    learner = EtaLearner()
    for job_id in range(40):
        learner.promise(job_id, Level.P2, given_at=NOW, finish_in_s=10.0)
        learner.promise(job_id, Level.P2, given_at=NOW, finish_in_s=99.0)  # later: ignored
        learner.finished(job_id, NOW + timedelta(seconds=20))
    learner.promise(99, Level.P2, given_at=NOW, finish_in_s=10.0)
    learner.forget(99)  # cancelled: nothing learnt
    learner.finished(99, NOW + timedelta(seconds=1000))
    overall = (40 * 2.0 + 10 * 1.0) / 50  # every sample says 2: pooled, shrunk towards 1
    assert learner.calibration.factor(Level.P2) == pytest.approx((40 * 2.0 + 10 * overall) / 50)


def test_sixteen_equal_jobs_on_eight_slots_end_in_two_waves() -> None:
    jobs = [single(i, Level.P1, 10.0) for i in range(16)]
    estimates = estimate_queue(jobs, Capacity(slots=8, mlfq=NO_RESERVE))
    finishes = sorted(estimate.finish_in_s for estimate in estimates.values())
    assert finishes == [pytest.approx(10.0)] * 8 + [pytest.approx(20.0)] * 8


def test_running_calls_hold_their_slots_until_they_end() -> None:
    busy = JobLoad(1, Level.P2, started=True, running_s=(40.0,))
    waiting = single(2, Level.P1, 5.0)
    estimates = estimate_queue([busy, waiting], Capacity(slots=1, mlfq=NO_RESERVE))
    assert estimates[1].place is None and estimates[1].finish_in_s == pytest.approx(40.0)
    assert estimates[2].start_in_s == pytest.approx(40.0)
    assert estimates[2].finish_in_s == pytest.approx(45.0)


def test_p0_goes_before_every_other_level() -> None:
    jobs = [single(i, Level.P1, 10.0) for i in range(4)] + [single(9, Level.P0, 50.0, rank=50.0)]
    estimates = estimate_queue(jobs, Capacity(slots=1, mlfq=NO_RESERVE))
    assert estimates[9].place == 1 and estimates[9].start_in_s == 0.0
    assert estimates[0].start_in_s == pytest.approx(50.0)


def test_levels_share_the_slots_by_weight() -> None:
    # Four slots, a deep P1 and a deep P2 queue: the scheduler gives P1 about twice P2's slots.
    jobs = [single(i, Level.P1, 10.0) for i in range(40)]
    jobs += [single(100 + i, Level.P2, 10.0) for i in range(40)]
    shares = replace(NO_RESERVE, backlog_weights=(8, 16, 2, 1))
    estimates = estimate_queue(jobs, Capacity(slots=3, mlfq=shares))
    p1_done = max(estimates[i].finish_in_s for i in range(40))
    p2_done_by_then = sum(1 for i in range(40) if estimates[100 + i].finish_in_s <= p1_done)
    assert 15 <= p2_done_by_then <= 25  # 40 P1 jobs at 2 slots: P2 ran 1 slot meanwhile
    # At the backlog's default shares P2's weight is 0: it waits until P1 has no work left.
    waiting = estimate_queue(jobs, Capacity(slots=3, mlfq=NO_RESERVE))
    p1_done = max(waiting[i].finish_in_s for i in range(40))
    assert min(waiting[100 + i].start_in_s for i in range(40)) >= p1_done - 10.0


def test_a_longer_queue_ahead_means_a_later_eta() -> None:
    mine = single(1, Level.P2, 10.0, rank=10.0)
    short = [single(10 + i, Level.P1, 10.0) for i in range(3)]
    long = [single(10 + i, Level.P1, 10.0) for i in range(30)]
    one_slot = Capacity(slots=1, mlfq=NO_RESERVE)
    assert estimate_queue([mine, *short], one_slot)[1].finish_in_s == pytest.approx(40.0)
    assert estimate_queue([mine, *long], one_slot)[1].finish_in_s == pytest.approx(310.0)
    # Two slots: a weighted share gives P2 one of them at once, however long P1's queue...
    shares = replace(NO_RESERVE, backlog_weights=(8, 16, 2, 1))
    two_slots = Capacity(slots=2, mlfq=shares)
    assert estimate_queue([mine, *long], two_slots)[1].finish_in_s == pytest.approx(10.0)
    # ...and the backlog's weight 0 keeps it waiting while work queues: it starts once no
    # more than two chunks per slot are ready (three P1s left), at 130 s.
    waiting = Capacity(slots=2, mlfq=NO_RESERVE)
    assert estimate_queue([mine, *long], waiting)[1].finish_in_s == pytest.approx(140.0)


def test_the_reserved_slot_serves_short_work_first_then_is_lent() -> None:
    # Two slots, one reserved: a long call holds one; the other takes short work first, and
    # long work once no short work is left.
    long_running = JobLoad(1, Level.P1, started=True, running_s=(100.0,))
    long_queued = single(2, Level.P1, 60.0, rank=60.0)
    short_queued = single(3, Level.P2, 5.0, rank=5.0)
    estimates = estimate_queue(
        [long_running, long_queued, short_queued], Capacity(slots=2, mlfq=MlfqSettings())
    )
    assert estimates[3].start_in_s == 0.0
    assert estimates[2].start_in_s == pytest.approx(5.0)


def test_a_new_p0_takes_a_slot_back_unless_a_call_ends_within_the_grace() -> None:
    # One slot held by a P1 call; the dispatcher takes it back for a new P0 review (the call
    # is done again later), unless it is expected to end within the grace (5 s).
    p0 = single(9, Level.P0, 10.0)
    long_left = JobLoad(1, Level.P1, started=True, running_s=(100.0,))
    estimates = estimate_queue([long_left, p0], Capacity(slots=1, mlfq=NO_RESERVE))
    assert estimates[9].start_in_s == 0.0 and estimates[9].finish_in_s == pytest.approx(10.0)
    assert estimates[1].finish_in_s == pytest.approx(110.0)
    ending = JobLoad(1, Level.P1, started=True, running_s=(3.0,))
    estimates = estimate_queue([ending, p0], Capacity(slots=1, mlfq=NO_RESERVE))
    assert estimates[9].start_in_s == pytest.approx(3.0)
    no_preemption = MlfqSettings(reserved_slots=0, preempt=False)
    estimates = estimate_queue([long_left, p0], Capacity(slots=1, mlfq=no_preemption))
    assert estimates[9].start_in_s == pytest.approx(100.0)


def test_p0_calls_are_never_taken_back() -> None:
    running_p0 = JobLoad(1, Level.P0, started=True, running_s=(100.0,))
    estimates = estimate_queue([running_p0, single(9, Level.P0, 10.0)], Capacity(slots=1))
    assert estimates[9].start_in_s == pytest.approx(100.0)


def test_a_review_waiting_for_another_starts_once_that_one_ends() -> None:
    """A hotfix stacked on a review still running 40 s starts then, not at once, however many
    slots are free (the queue releases it only when that review ends)."""
    eight = Capacity(slots=8, mlfq=NO_RESERVE)
    base = JobLoad(1, Level.P0, started=True, running_s=(40.0,))
    hotfix = JobLoad(2, Level.P0, started=False, queued=(QueuedCall(10.0, 10.0),), waits_for=(1,))
    estimates = estimate_queue([base, hotfix], eight)
    assert estimates[2].start_in_s == pytest.approx(40.0)
    assert estimates[2].finish_in_s == pytest.approx(50.0)
    # A chain waits for the whole chain; a job no longer live holds nothing.
    on_top = JobLoad(3, Level.P1, started=False, queued=(QueuedCall(5.0, 5.0),), waits_for=(2,))
    assert estimate_queue([base, hotfix, on_top], eight)[3].start_in_s == pytest.approx(50.0)
    gone = replace(hotfix, waits_for=(99,))
    assert estimate_queue([base, gone], eight)[2].start_in_s == 0.0
    # Its calls are not played while it waits: a review behind it on one slot is not held up.
    one = Capacity(slots=1, mlfq=NO_RESERVE)
    queued_base = single(1, Level.P2, 40.0)
    other = single(4, Level.P1, 20.0)
    estimates = estimate_queue([queued_base, hotfix, other], one)
    assert estimates[4].finish_in_s == pytest.approx(20.0)
    assert estimates[2].start_in_s == pytest.approx(60.0)


def test_jobs_that_wait_for_each_other_still_get_an_estimate() -> None:
    first = JobLoad(1, Level.P1, started=False, queued=(QueuedCall(5.0, 5.0),), waits_for=(2,))
    second = JobLoad(2, Level.P1, started=False, queued=(QueuedCall(5.0, 5.0),), waits_for=(1,))
    estimates = estimate_queue([first, second], Capacity(slots=2, mlfq=NO_RESERVE))
    assert [estimate.finish_in_s for estimate in estimates.values()] == [pytest.approx(5.0)] * 2


def test_a_faster_engine_shortens_the_eta() -> None:
    jobs = [single(i, Level.P1, 10.0) for i in range(10)]
    slow = estimate_queue(jobs, Capacity(slots=2, mlfq=NO_RESERVE))
    fast = estimate_queue(jobs, Capacity(slots=2, mlfq=NO_RESERVE, speed=2.0))
    assert fast[9].finish_in_s == pytest.approx(slow[9].finish_in_s / 2)


def test_capacity_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="slots"):
        Capacity(slots=0)
    with pytest.raises(ValueError, match="speed"):
        Capacity(slots=1, speed=0.0)


jobs_strategy = st.lists(
    st.tuples(
        st.sampled_from(list(Level)),
        st.booleans(),
        st.lists(st.floats(min_value=0.5, max_value=300.0), min_size=0, max_size=4),
        st.lists(st.floats(min_value=0.0, max_value=200.0), min_size=0, max_size=2),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(jobs_strategy, st.integers(min_value=1, max_value=9))
def test_every_job_gets_a_consistent_estimate(raw: list, slots: int) -> None:
    jobs = []
    for index, (level, started, calls, running) in enumerate(raw):
        queued = tuple(
            QueuedCall(seconds if seq == 0 else CONTINUATION_RANK_OFFSET + sum(calls), seconds)
            for seq, seconds in enumerate(calls)
        )
        jobs.append(
            JobLoad(index, level, started=started or bool(running), queued=queued,
                    running_s=tuple(running) if started else ())
        )  # fmt: skip
    estimates = estimate_queue(jobs, Capacity(slots=slots))
    total_work = sum(sum(c.seconds for c in job.queued) + sum(job.running_s) for job in jobs)
    places = sorted(e.place for e in estimates.values() if e.place is not None)
    assert places == list(range(1, len(places) + 1))
    for job in jobs:
        estimate = estimates[job.job_id]
        assert 0.0 <= estimate.start_in_s <= estimate.finish_in_s + 1e-9
        assert (
            estimate.finish_in_s
            >= estimate.start_in_s + max((c.seconds for c in job.queued), default=0.0) - 1e-6
        )
        assert estimate.finish_in_s <= total_work + 1e-6  # never later than one slot doing it all
        assert estimate.finish_in_s >= max(job.running_s, default=0.0) - 1e-9
        if job.started:
            assert estimate.place is None and estimate.start_in_s == 0.0


# -- should a status be written? ---------------------------------------------------------------


def queued(place: int, eta_s: float, level: Level = Level.P1) -> StatusReport:
    return StatusReport("queued", level, place=place, finish_at=NOW + timedelta(seconds=eta_s))


def test_the_first_report_is_always_written() -> None:
    assert publish_reason(None, None, queued(12, 40), now=NOW) == "first"


def test_a_state_change_is_written_at_once() -> None:
    running = StatusReport("in_progress", Level.P1, parts_done=0, parts_total=3)
    assert publish_reason(queued(1, 40), NOW, running, now=NOW + timedelta(seconds=1)) == "state"


def test_a_shrinking_place_is_progress_not_news() -> None:
    later = NOW + timedelta(minutes=5)
    assert publish_reason(queued(12, 400), NOW, queued(3, 400), now=later) is None


def test_small_moves_are_not_written() -> None:
    assert (
        publish_reason(queued(12, 400), NOW, queued(10, 420), now=NOW + timedelta(minutes=5))
        is None
    )


@pytest.mark.parametrize(
    ("current", "reason"),
    [
        (queued(16, 400), "place"),  # 12 -> 16: work jumped ahead
        (queued(12, 520), "eta"),  # 400 s promised, moved by 120 s
        (queued(12, 400, Level.P2), "level"),
    ],
)
def test_moves_over_a_quarter_are_written_after_a_minute(
    current: StatusReport, reason: str
) -> None:
    previous = queued(12, 400)
    assert publish_reason(previous, NOW, current, now=NOW + timedelta(seconds=59)) is None
    assert publish_reason(previous, NOW, current, now=NOW + timedelta(seconds=60)) == reason


def slipping_eta_writes(waiting_since: datetime | None, *, hours: float = 4.0) -> list[float]:
    """Seconds after enqueue at which an ETA that stays ten minutes ahead is rewritten, with
    a pass every 20 s (the engines run far slower than the estimate and nothing moves)."""
    previous, published_at = queued(12, 600), NOW
    written = []
    for step in range(1, int(hours * 180) + 1):
        at = NOW + timedelta(seconds=20 * step)
        current = StatusReport("queued", Level.P1, place=12, finish_at=at + timedelta(minutes=10))
        if publish_reason(previous, published_at, current, now=at, waiting_since=waiting_since):
            written.append((at - NOW).total_seconds())
            previous, published_at = current, at
    return written


def test_an_eta_that_keeps_slipping_is_rewritten_ever_more_rarely() -> None:
    written = slipping_eta_writes(waiting_since=NOW)
    # Each rewrite needs a move of a quarter of the whole wait promised so far: the gaps grow
    # by about a quarter each time (160 s, 200 s, ... 50 min), 14 rewrites in four hours.
    gaps = [b - a for a, b in itertools.pairwise([0.0, *written])]
    assert all(later >= earlier for earlier, later in itertools.pairwise(gaps))
    assert gaps[-1] > 10 * gaps[0]
    assert 10 <= len(written) <= 16
    # Weighed against what was left of the wait it was rewritten every 160 s, 90 times.
    assert len(slipping_eta_writes(waiting_since=None)) >= 80


def test_news_writes_are_rationed_per_hour() -> None:
    recent = [NOW - timedelta(minutes=m) for m in (1, 10, 59, 61, 120)]
    assert updates_left(recent, now=NOW, per_hour=5) == 2
    assert updates_left(recent, now=NOW, per_hour=3) == 0
    assert updates_left(recent, now=NOW, per_hour=0) == 0
    assert updates_left([], now=NOW, per_hour=120) == 120


def test_eta_moves_below_the_floor_are_ignored() -> None:
    previous = queued(1, 20)
    assert publish_reason(previous, NOW, queued(1, 34), now=NOW + timedelta(minutes=2)) is None


def test_progress_over_a_quarter_is_written() -> None:
    before = StatusReport("in_progress", Level.P2, parts_done=1, parts_total=8)
    small = StatusReport("in_progress", Level.P2, parts_done=2, parts_total=8)
    large = StatusReport("in_progress", Level.P2, parts_done=4, parts_total=8)
    at = NOW + timedelta(minutes=2)
    assert publish_reason(before, NOW, small, now=at) is None
    assert publish_reason(before, NOW, large, now=at) == "progress"


def test_a_completed_status_is_final() -> None:
    done = StatusReport("completed", Level.P1, conclusion="success")
    again = StatusReport("completed", Level.P1, conclusion="neutral")
    assert publish_reason(done, NOW, again, now=NOW + timedelta(hours=1)) is None


def test_the_rules_are_configurable() -> None:
    rules = PublishRules(min_interval_s=10.0, tolerance=0.5)
    at = NOW + timedelta(seconds=11)
    assert publish_reason(queued(12, 400), NOW, queued(16, 400), now=at, rules=rules) is None
    assert publish_reason(queued(12, 400), NOW, queued(19, 400), now=at, rules=rules) == "place"


# -- conclusions and states ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "counts", "neutral_at", "expected"),
    [
        (JobState.DONE, {}, "major", "success"),
        (JobState.DONE, {"minor": 3, "info": 1}, "major", "success"),
        (JobState.DONE, {"minor": 3, "major": 1}, "major", "neutral"),
        (JobState.DONE, {"minor": 1}, "minor", "neutral"),
        (JobState.DONE, {"critical": 1}, "critical", "neutral"),
        (JobState.DONE, {"major": 2}, "critical", "success"),
        (JobState.SUPERSEDED, None, "major", "skipped"),
        (JobState.CANCELLED, None, "major", "cancelled"),
        (JobState.FAILED, None, "major", "neutral"),
        (JobState.DEAD, None, "major", "neutral"),
        (JobState.RUNNING, None, "major", None),
    ],
)
def test_conclusions(
    state: JobState, counts: dict[str, int] | None, neutral_at: str, expected: str | None
) -> None:
    assert conclude(state, counts=counts, neutral_at=neutral_at) == expected


def test_severities() -> None:
    assert parse_severity(" Major ") == "major"
    with pytest.raises(ValueError, match="critical, major, minor, info"):
        parse_severity("blocker")
    assert findings_at_or_above({"critical": 1, "major": 2, "minor": 5}, "major") == 3


def test_states() -> None:
    assert state_of(JobState.QUEUED, started=False) == "queued"
    assert state_of(JobState.WAITING, started=False) == "queued"
    assert state_of(JobState.RUNNING, started=True) == "in_progress"
    for ended in (JobState.DONE, JobState.FAILED, JobState.SUPERSEDED, JobState.CANCELLED):
        assert state_of(ended, started=True) == "completed"


# -- words ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "text"),
    [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th"),
     (21, "21st"), (102, "102nd"), (111, "111th")],
)  # fmt: skip
def test_ordinals(number: int, text: str) -> None:
    assert ordinal(number) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "5 s"), (38, "40 s"), (59, "60 s"), (61, "1 min"), (150, "2 min"), (3600, "1 h"),
     (3900, "1 h 5 min")],
)  # fmt: skip
def test_about(seconds: float, text: str) -> None:
    assert about(seconds) == text


def test_the_queued_status_reads_level_place_eta_and_why() -> None:
    report = queued(12, 38)
    facts = StatusFacts(reasons=("ordinary pull request",), start_at=NOW + timedelta(seconds=9),
                        slots=8, weights=(8, 4, 2, 1))  # fmt: skip
    text = render_status(report, facts, now=NOW)
    assert text.title == "P1 · 12th in line · review in about 40 s"
    assert (
        text.description
        == "P1 · 12th in line · review in about 40 s · why P1: ordinary pull request"
    )
    assert "**Why P1:** ordinary pull request." in text.summary
    assert "Expected start:** in about 10 s" in text.summary
    assert "8 worker slots, shared by level weights 8:4:2:1," in text.summary
    queued_up = render_status(report, replace(facts, backlog_weights=(8, 16, 2, 1)), now=NOW)
    assert "level weights 8:4:2:1 (8:16:2:1 while work queues)," in queued_up.summary
    waits = render_status(report, replace(facts, backlog_weights=(8, 16, 0, 1)), now=NOW)
    assert (
        "level weights 8:4:2:1 (8:16:0:1 while work queues; a level at 0 waits until the others "
        "have no work)," in waits.summary
    )


def test_a_stacked_review_says_what_it_waits_for_instead_of_its_place() -> None:
    facts = StatusFacts(reasons=("hotfix branch",), waits_for=("acme/api#3",))
    text = render_status(queued(1, 95), facts, now=NOW)
    assert text.title == "P1 · waits for acme/api#3 · review in about 2 min"
    assert "**Waits for:** the review of acme/api#3, which this pull request is stacked on" in (
        text.summary
    )


def test_descriptions_fit_the_forges_limit() -> None:
    facts = StatusFacts(reasons=("x" * 500,))
    assert len(render_status(queued(3, 10), facts, now=NOW).description) <= 140


def test_in_progress_shows_parts_done() -> None:
    report = StatusReport("in_progress", Level.P2, finish_at=NOW + timedelta(minutes=3),
                          parts_done=2, parts_total=5)  # fmt: skip
    text = render_status(report, StatusFacts(), now=NOW)
    assert text.title == "P2 · 2 of 5 parts done · review in about 3 min"


def test_completed_names_findings_and_links_the_review() -> None:
    report = StatusReport("completed", Level.P1, conclusion="neutral")
    facts = StatusFacts(counts={"major": 1, "minor": 2}, review_url="https://example.test/r/1",
                        review_summary="Reviewed 3 files.")  # fmt: skip
    text = render_status(report, facts, now=NOW)
    assert text.title == "Reviewed: 3 findings (1 major, 2 minor)"
    assert "1 at major or above" in text.summary
    assert "[The review](https://example.test/r/1)" in text.summary
    clean = render_status(StatusReport("completed", Level.P1, conclusion="success"),
                          StatusFacts(counts={}), now=NOW)  # fmt: skip
    assert clean.title == "Reviewed: no findings"


def test_skipped_cancelled_and_failed_say_so() -> None:
    skipped = StatusReport("completed", Level.P1, conclusion="skipped")
    assert render_status(skipped, StatusFacts(), now=NOW).title.startswith("Not reviewed")
    cancelled = StatusReport("completed", Level.P1, conclusion="cancelled")
    assert render_status(cancelled, StatusFacts(), now=NOW).title == "Review cancelled"
    failed = StatusReport("completed", Level.P1, conclusion="neutral")
    text = render_status(failed, StatusFacts(error="planning failed: 502"), now=NOW)
    assert text.title == "Review failed: planning failed: 502"


def test_the_hourly_budget_comes_from_the_environment() -> None:
    assert load_settings({}).status.updates_per_hour == 120
    assert load_settings({"REVIEW_BOT_STATUS_UPDATES_PER_HOUR": "0"}).status.updates_per_hour == 0
    with pytest.raises(ConfigError, match="REVIEW_BOT_STATUS_UPDATES_PER_HOUR must be 0 or more"):
        load_settings({"REVIEW_BOT_STATUS_UPDATES_PER_HOUR": "-1"})


def test_the_publishers_model_survives_its_trip_through_the_database_row() -> None:
    estimator = ServiceEstimator.with_prior().observe(chunk_lines=40, job_lines=80, gpu_seconds=9)
    model = EtaModel(
        Capacity(
            slots=6,
            mlfq=MlfqSettings(
                weights=(9, 3, 2, 1), backlog_weights=(9, 12, 2, 1), reserved_slots=2
            ),
            speed=1.5,
            line_budget=108,
            first_budget=None,
        ),
        estimator,
        learn_calibration([EtaSample(Level.P2, 10.0, 30.0)] * 20),
    )
    assert model_from_json(json.loads(json.dumps(model_to_json(model)))) == model
    tight = replace(model, budget={"github": BudgetLimits(per_minute=4, per_hour=40)})
    back = model_from_json(json.loads(json.dumps(model_to_json(tight))))
    assert back.budget["github"] == BudgetLimits(per_minute=4, per_hour=40)
    # A model kept before the ETA knew the budgets reads back with the default limits.
    older = {key: value for key, value in model_to_json(model).items() if key != "budget"}
    assert model_from_json(older) == model
    with pytest.raises(KeyError):
        model_from_json({"slots": 2})
