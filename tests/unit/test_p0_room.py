"""Room for a P0 call on a batching engine: the learned pace curve, the companions it allows,
the calls taken back, and the engines of the replay's cost model learning both by themselves."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.config import WindowSettings
from bot.llm.batching import PROFILES, BatchedEngine, BatchingProfile, Finished
from bot.sched.engines import Engine, choose_engine, free_places
from bot.sched.p0_room import (
    NEAR_END_SHARE,
    REFERENCE_MAX,
    PacePoint,
    SharingCall,
    add_point,
    bucket_of,
    calls_to_take_back,
    near_end,
    p0_companions,
    solo_pace,
    tokens_left,
)


def curve_of(points: dict[float, float]) -> dict[int, PacePoint]:
    curve: dict[int, PacePoint] = {}
    for concurrency, latency in points.items():
        curve = add_point(curve, concurrency=concurrency, latency_per_token_s=latency)
    return curve


def test_buckets_are_powers_of_two() -> None:
    assert [bucket_of(n) for n in (0.2, 1.0, 1.01, 2.0, 2.5, 4.0, 4.1, 8.0, 9.0, 64.0)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        6,
    ]


def test_points_fold_into_their_bucket_and_nonsense_is_ignored() -> None:
    curve = add_point({}, concurrency=3.0, latency_per_token_s=0.1)
    curve = add_point(curve, concurrency=4.0, latency_per_token_s=0.2)
    assert list(curve) == [2]
    assert curve[2].calls == 2
    assert curve[2].latency_per_token_s == pytest.approx(0.1 + 0.3 * 0.1)
    assert curve[2].concurrency == pytest.approx(3.0 + 0.3 * 1.0)
    for concurrency, latency in ((0.0, 0.1), (2.0, 0.0), (2.0, math.inf), (-1.0, 0.1)):
        assert add_point(curve, concurrency=concurrency, latency_per_token_s=latency) == curve


def test_the_cpu_servers_measured_curve_leaves_a_p0_three_companions() -> None:
    # The raw sweep of the CPU vLLM (bench/results/engine.md): mean latency of a 160-token
    # answer at concurrency 1, 2, 4, 8, 16.
    curve = curve_of(
        {1: 19.09 / 160, 2: 17.89 / 160, 4: 24.46 / 160, 8: 45.75 / 160, 16: 115 / 160}
    )
    assert solo_pace(curve) == pytest.approx(19.09 / 160)
    # Between 4 (1.28x the pace alone) and 8 (2.4x) the line passes 1.5x at 4.8 calls: the P0
    # and three more.
    assert p0_companions(curve, max_slowdown=1.5, ceiling=48) == 3
    assert p0_companions(curve, max_slowdown=2.0, ceiling=48) == 5
    assert p0_companions(curve, max_slowdown=2.5, ceiling=48) == 7
    assert p0_companions(curve, max_slowdown=2.5, ceiling=6) == 6


def test_the_pace_alone_is_followed_down_the_slope_of_the_lowest_buckets() -> None:
    # Seen only at 4 and 8 calls on a line 0.02 + 0.01 n: alone is 0.03.
    curve = curve_of({4: 0.06, 8: 0.10})
    assert solo_pace(curve) == pytest.approx(0.03)
    # 1.5x alone (0.045) is reached at 2.5 calls: one companion.
    assert p0_companions(curve, max_slowdown=1.5, ceiling=48) == 1
    # A perfectly shared engine cannot make a call look faster than its pace divided by n.
    assert solo_pace(curve_of({4: 0.04, 8: 0.2})) == pytest.approx(0.01)
    # Flat or falling: the lowest bucket's pace.
    assert solo_pace(curve_of({3: 0.05, 16: 0.04})) == pytest.approx(0.05)


def test_an_engine_that_does_not_slow_with_the_batch_keeps_its_whole_window() -> None:
    curve = curve_of({1: 0.013, 4: 0.014, 16: 0.015, 32: 0.018})
    assert p0_companions(curve, max_slowdown=1.5, ceiling=40) == 40
    # Seen only at two calls, the pace alone may be half of it: no company until a second
    # bucket gives the slope.
    assert solo_pace(curve_of({2: 0.02})) == pytest.approx(0.01)
    assert p0_companions(curve_of({2: 0.02}), max_slowdown=1.5, ceiling=40) == 0
    assert p0_companions(curve_of({2: 0.02, 4: 0.02}), max_slowdown=1.5, ceiling=40) == 40


def test_without_a_low_concurrency_point_the_fallback_holds() -> None:
    assert p0_companions({}, max_slowdown=1.5, ceiling=48) == 0
    assert p0_companions({}, max_slowdown=1.5, ceiling=48, fallback=2) == 2
    only_busy = curve_of({16: 0.7, 23: 0.9})
    assert solo_pace(only_busy) is None
    assert p0_companions(only_busy, max_slowdown=1.5, ceiling=48, fallback=1) == 1
    # A point at REFERENCE_MAX still leads to the pace alone.
    assert solo_pace(curve_of({REFERENCE_MAX: 0.15})) == pytest.approx(0.15 / REFERENCE_MAX)


curves = st.dictionaries(st.floats(0.5, 64.0), st.floats(0.001, 10.0), min_size=0, max_size=8).map(
    curve_of
)


@given(curve=curves, slowdown=st.floats(1.0, 4.0), ceiling=st.integers(1, 64))
def test_companions_stay_within_the_window_and_grow_with_patience(
    curve: dict[int, PacePoint], slowdown: float, ceiling: int
) -> None:
    companions = p0_companions(curve, max_slowdown=slowdown, ceiling=ceiling)
    assert 0 <= companions <= ceiling
    assert p0_companions(curve, max_slowdown=slowdown * 1.5, ceiling=ceiling) >= companions


@given(curve=curves, slowdown=st.floats(1.0, 4.0))
def test_every_bucket_within_the_p0s_company_is_within_its_slowdown(
    curve: dict[int, PacePoint], slowdown: float
) -> None:
    solo = solo_pace(curve)
    companions = p0_companions(curve, max_slowdown=slowdown, ceiling=1000)
    if solo is None:
        assert companions == 0
        return
    allowed = solo * slowdown
    for point in curve.values():
        if point.concurrency <= companions + 1:
            assert point.latency_per_token_s <= allowed * (1 + 1e-9)
    if companions < 1000:
        # Something measured beyond the company is too slow.
        assert any(p.latency_per_token_s > allowed for p in curve.values())


def test_the_newest_calls_give_way_and_only_the_excess() -> None:
    ours = [SharingCall(1, 30.0), SharingCall(2, 2.0), SharingCall(3, 12.0), SharingCall(4, 2.0)]
    # Seven on the engine, one P0, three may stay: three go, the least advanced first.
    assert calls_to_take_back(running=7, p0_running=1, companions=3, ours=ours) == (4, 2, 3)
    assert calls_to_take_back(running=7, p0_running=0, companions=0, ours=ours) == ()
    assert calls_to_take_back(running=4, p0_running=1, companions=3, ours=ours) == ()
    # Another process holds the rest: this one gives what it has.
    assert calls_to_take_back(running=20, p0_running=1, companions=0, ours=ours[:2]) == (2, 1)


@given(
    running=st.integers(0, 80),
    p0=st.integers(0, 5),
    companions=st.integers(0, 48),
    elapsed=st.lists(st.floats(0, 600), max_size=60),
)
def test_take_back_counts_exactly_the_excess_of_what_is_ours(
    running: int, p0: int, companions: int, elapsed: list[float]
) -> None:
    ours = [SharingCall(index, value) for index, value in enumerate(elapsed)]
    victims = calls_to_take_back(running=running, p0_running=p0, companions=companions, ours=ours)
    expected = min(len(ours), max(0, running - p0 - companions)) if p0 > 0 else 0
    assert len(victims) == expected == len(set(victims))
    kept = [call.elapsed_s for call in ours if call.chunk_id not in victims]
    taken = [call.elapsed_s for call in ours if call.chunk_id in victims]
    assert not kept or not taken or max(taken) <= min(kept)


def test_places_beside_a_running_p0_are_its_companions_only() -> None:
    windows = WindowSettings(floor=1, ceiling=16, initial=12, p0_companions=2)
    engine = Engine.create("e", windows)
    assert free_places(engine, running=8) == 4
    # A P0 runs there: the window's places shrink to the P0 and two companions.
    assert free_places(engine, running=8, p0_running=1) == 0
    assert free_places(engine, running=2, p0_running=1) == 1
    # Another P0 chunk is still admitted above the window.
    assert free_places(engine, running=13, p0_places=1, p0_running=1) == 0
    assert free_places(engine, running=12, p0_places=1, p0_running=1) == 1
    other = Engine.create("f", windows)
    chosen = choose_engine([engine, other], running={"e": 2, "f": 10}, p0_running={"e": 1})
    assert chosen is other


def run_with_a_p0(profile: BatchingProfile, windows: WindowSettings) -> tuple[float, int]:
    """A backlog through one modelled engine; halfway, a P0 call of the same length arrives.

    Returns the P0's latency over its latency alone, and the companions the engine allowed.
    """
    model = BatchedEngine(profile)
    engine = Engine.create("model", windows)
    solo_s, calls = 8.0, 160
    marks = {}
    started: dict[str, float] = {}
    queue = [f"r{index}" for index in range(calls)]
    now = 0.0
    finished = 0
    p0_started: float | None = None
    p0_latency: float | None = None
    companions = -1
    p0_in = False
    while p0_latency is None:
        if finished >= calls // 2 and p0_started is None:
            companions = engine.p0_companions
            # Newest first make room, then the P0 joins.
            newest_first = sorted(started, key=lambda k: -started[k])
            for key in newest_first[: max(0, engine.in_flight - companions)]:
                early, _ = model.cancel(key, now_s=now)
                assert not early  # time stands still between events
                engine.abandon(marks.pop(key), now)
                del started[key]
                queue.insert(0, key)
            marks["p0"] = engine.start(now)
            model.admit("p0", solo_s=solo_s, lines=120, now_s=now)
            p0_started = now
            p0_in = True
        limit = engine.window if not p0_in else companions + 1
        while engine.in_flight < limit and queue:
            key = queue.pop(0)
            marks[key] = engine.start(now)
            started[key] = now
            model.admit(key, solo_s=solo_s, lines=120, now_s=now)
        next_event = model.next_event_s()
        assert next_event is not None
        now = next_event
        for done in model.advance(now):
            engine.finish(marks.pop(done.key), now, completion_tokens=done.completion_tokens)
            if done.key == "p0":
                p0_latency = now - p0_started if p0_started is not None else None
            else:
                started.pop(str(done.key), None)
                finished += 1
        if engine.due(now):
            engine.adapt(now)
    alone = BatchedEngine(profile)
    alone.admit("p0", solo_s=solo_s, lines=120, now_s=0.0)
    ended: list[Finished] = []
    while not ended:
        at = alone.next_event_s()
        assert at is not None
        ended = alone.advance(at)
    return p0_latency / ended[0].latency_s, companions


@pytest.mark.parametrize("profile", ["gpu-7b", "cpu-smollm2"])
def test_a_p0_on_a_loaded_modelled_engine_keeps_within_twice_its_pace_alone(profile: str) -> None:
    windows = WindowSettings(floor=1, ceiling=48, initial=4)
    slowdown, companions = run_with_a_p0(PROFILES[profile], windows)
    # The pace the P0 was promised, give or take the prefills of calls admitted beside it.
    assert slowdown <= windows.p0_slowdown * 1.1
    if profile == "gpu-7b":
        assert companions >= 4  # a GPU keeps part of its batch
    else:
        assert companions <= 2  # two CPU cores past their knee keep almost none


@settings(max_examples=15, deadline=None)
@given(base=st.floats(0.005, 0.05), knee=st.integers(2, 60))
def test_a_p0_keeps_its_pace_on_any_batching_curve(base: float, knee: int) -> None:
    model = BatchingProfile(
        name="any",
        step_base_s=base,
        step_per_sequence_s=base / knee,
        prefill_tokens_per_s=200 / base,
        fixed_prompt_tokens=700,
        prompt_tokens_per_line=12.0,
        source="generated",
    )
    windows = WindowSettings(floor=1, ceiling=48, initial=4)
    slowdown, _ = run_with_a_p0(model, windows)
    assert slowdown <= windows.p0_slowdown * 1.1


def test_streaming_calls_with_most_left_give_way_never_one_near_its_end() -> None:
    ours = [
        SharingCall(1, 30.0, tokens_done=10, tokens_expected=400),  # 390 left, oldest
        SharingCall(2, 2.0, tokens_done=0, tokens_expected=100),  # 100 left, newest
        SharingCall(3, 12.0, tokens_done=390, tokens_expected=400),  # near its end
        SharingCall(4, 5.0, tokens_done=50, tokens_expected=300),  # 250 left
    ]
    assert calls_to_take_back(running=6, p0_running=1, companions=3, ours=ours) == (1, 4)
    # Room for all but the P0: still never the call about to finish.
    assert calls_to_take_back(running=6, p0_running=1, companions=0, ours=ours) == (1, 4, 2)
    # Without an expected length of their own, calls are measured against the engine's usual.
    plain = [SharingCall(5, 1.0, tokens_done=20), SharingCall(6, 9.0, tokens_done=190)]
    assert calls_to_take_back(
        running=3, p0_running=1, companions=0, ours=plain, typical_tokens=200
    ) == (5,)
    # With no usual length known, progress cannot rank them: newest first, as without it.
    assert calls_to_take_back(running=3, p0_running=1, companions=0, ours=plain) == (5, 6)


progress_calls = st.lists(
    st.tuples(st.floats(0, 600), st.integers(0, 2000), st.integers(1, 2000)),
    max_size=40,
)


@given(
    running=st.integers(0, 80),
    p0=st.integers(0, 5),
    companions=st.integers(0, 48),
    calls=progress_calls,
)
def test_take_back_by_progress_spares_calls_near_their_end_and_takes_most_left(
    running: int, p0: int, companions: int, calls: list[tuple[float, int, int]]
) -> None:
    ours = [
        SharingCall(index, elapsed, tokens_done=min(done, expected), tokens_expected=expected)
        for index, (elapsed, done, expected) in enumerate(calls)
    ]
    victims = calls_to_take_back(running=running, p0_running=p0, companions=companions, ours=ours)
    assert len(victims) == len(set(victims))
    takeable = [call for call in ours if not near_end(call, typical_tokens=None)]
    excess = max(0, running - p0 - companions) if p0 > 0 else 0
    assert len(victims) == min(excess, len(takeable))
    by_id = {call.chunk_id: call for call in ours}
    for chunk_id in victims:
        call = by_id[chunk_id]
        assert call.tokens_expected is not None and call.tokens_done is not None
        assert call.tokens_expected - call.tokens_done > NEAR_END_SHARE * call.tokens_expected

    def left(call: SharingCall) -> float:
        value = tokens_left(call, typical_tokens=None)
        assert value is not None
        return value

    kept = [left(call) for call in takeable if call.chunk_id not in victims]
    taken = [left(by_id[chunk_id]) for chunk_id in victims]
    assert not kept or not taken or min(taken) >= max(kept)
