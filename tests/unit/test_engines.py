"""Engine bookkeeping: shared engine time, places, engine choice, and windows that find the
throughput of a batching engine (the replay's cost model) by themselves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.config import WindowSettings
from bot.llm.batching import PROFILES, BatchedEngine, BatchingProfile
from bot.llm.vllm_metrics import EngineLoad
from bot.sched.engines import Engine, choose_engine, free_places, total_places

WINDOWS = WindowSettings(floor=1, ceiling=48, initial=4)


def test_calls_in_flight_share_the_engine_time() -> None:
    engine = Engine.create("http://gpu0:8000", WINDOWS)
    first = engine.start(0.0)
    second = engine.start(10.0)
    # 0-10 s alone, 10-30 s shared by two: 10 + 20/2.
    assert engine.finish(first, 30.0, completion_tokens=100) == pytest.approx(20.0)
    # 10-30 s shared, 30-40 s alone: 20/2 + 10.
    assert engine.finish(second, 40.0, completion_tokens=50) == pytest.approx(20.0)
    assert engine.busy_s == pytest.approx(40.0)
    assert engine.completion_tokens == 150 and engine.in_flight == 0
    assert engine.utilization() == pytest.approx(1.0)


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0.1, 100)), min_size=1, max_size=30))
def test_the_shares_add_up_to_the_busy_time(calls: list[tuple[float, float]]) -> None:
    engine = Engine.create("e", WINDOWS)
    events = []
    for index, (start, length) in enumerate(calls):
        events.append((start, 0, index))
        events.append((start + length, 1, index))
    marks, shares = {}, []
    for at, kind, index in sorted(events):
        if kind == 0:
            marks[index] = engine.start(at)
        else:
            shares.append(engine.finish(marks.pop(index), at))
    assert sum(shares) == pytest.approx(engine.busy_s)
    assert engine.busy_s <= sum(length for _, length in calls) + 1e-6


def test_places_count_what_runs_in_every_process_and_leave_room_for_p0() -> None:
    engine = Engine.create("e", WindowSettings(floor=1, ceiling=8, initial=4))
    engine.start(0.0)
    assert free_places(engine) == 3
    # Another dispatcher process runs two more on the same server (counted in the database).
    assert free_places(engine, running=3) == 1
    assert free_places(engine, running=4) == 0
    assert free_places(engine, running=4, p0_places=1) == 1


def test_chunks_go_to_the_engine_with_the_most_room() -> None:
    small = Engine.create("a", WindowSettings(floor=1, ceiling=8, initial=2))
    large = Engine.create("b", WindowSettings(floor=1, ceiling=8, initial=8))
    assert choose_engine([small, large]) is large
    for _ in range(6):
        large.start(0.0)
    # a: 2 of 2 free (100%), b: 2 of 8 free (25%).
    assert choose_engine([small, large]) is small
    assert choose_engine([small, large], running={"a": 2, "b": 8}) is None
    assert choose_engine([small, large], running={"a": 2, "b": 8}, p0_places=1) is not None
    assert total_places([small, large]) == 10


def test_refusals_are_judged_at_once_and_halve_the_window() -> None:
    engine = Engine.create("e", WindowSettings(floor=1, ceiling=48, initial=16))
    mark = engine.start(0.0)
    assert not engine.due(0.5)
    engine.fail(mark, 0.5, overloaded=True)
    assert engine.due(0.5)
    decision = engine.adapt(0.5)
    assert (decision.reason, engine.window) == ("overload", 8)
    assert engine.history == [(0.0, 16), (0.5, 8)]


def test_queued_requests_inside_the_server_shrink_the_window() -> None:
    engine = Engine.create("e", WindowSettings(floor=1, ceiling=48, initial=16))
    for second in range(10):
        mark = engine.start(float(second))
        engine.finish(mark, second + 0.9, completion_tokens=100)
    decision = engine.adapt(10.0, EngineLoad(requests_waiting=5.0))
    assert (decision.reason, engine.window) == ("server_queue", 15)


def run_backlog(
    profile: BatchingProfile, windows: WindowSettings, *, calls: int, solo_s: float
) -> tuple[float, Engine]:
    """Feed a backlog to one modelled engine through its window; tokens/s once settled.

    Measured from the completion of a third of the calls to the start of the last one, so
    neither the start nor the draining tail (fewer calls left than places) counts.
    """
    model = BatchedEngine(profile)
    engine = Engine.create("model", windows)
    marks = {}
    started = finished = 0
    now = 0.0
    tokens = 0
    measure_from: float | None = None
    measure_to: float | None = None
    while finished < calls:
        while engine.in_flight < engine.window and started < calls:
            marks[started] = engine.start(now)
            # Calls of different lengths, as reviews are (0.5 to 1.5 times `solo_s`).
            length = solo_s * (0.5 + (started * 7919 % 13) / 12)
            model.admit(started, solo_s=length, lines=120, now_s=now)
            started += 1
            if started == calls:
                measure_to = now
        next_event = model.next_event_s()
        assert next_event is not None
        now = next_event
        for done in model.advance(now):
            engine.finish(marks.pop(done.key), now, completion_tokens=done.completion_tokens)
            finished += 1
            if finished == calls // 3:
                measure_from = now
            elif measure_from is not None and measure_to is None:
                tokens += done.completion_tokens
        if engine.due(now):
            engine.adapt(now)
    assert measure_from is not None and measure_to is not None and measure_to > measure_from
    return tokens / (measure_to - measure_from), engine


@pytest.mark.parametrize("profile", ["gpu-7b", "cpu-smollm2"])
def test_an_adaptive_window_finds_the_best_fixed_windows_throughput(profile: str) -> None:
    model = PROFILES[profile]
    best = max(
        run_backlog(model, WindowSettings(floor=w, ceiling=w, initial=w), calls=400, solo_s=8.0)[0]
        for w in (1, 2, 4, 8, 16, 32, 48)
    )
    window_one = run_backlog(
        model, WindowSettings(floor=1, ceiling=1, initial=1), calls=400, solo_s=8.0
    )[0]
    adaptive, engine = run_backlog(model, WINDOWS, calls=400, solo_s=8.0)
    assert adaptive >= 0.8 * best
    assert adaptive >= 2.0 * window_one
    assert len(engine.history) > 1  # it did move


# Prefill 60-400 times as fast per token as one sequence decodes, as on real servers: a
# call's prompt then takes a small part of its time.
@settings(max_examples=15, deadline=None)
@given(
    base=st.floats(0.005, 0.05),
    knee=st.integers(2, 60),
    prefill_speed=st.floats(60.0, 400.0),
)
def test_adaptive_windows_hold_most_of_the_best_throughput_on_any_curve(
    base: float, knee: int, prefill_speed: float
) -> None:
    model = BatchingProfile(
        name="any",
        step_base_s=base,
        step_per_sequence_s=base / knee,
        prefill_tokens_per_s=prefill_speed / base,
        fixed_prompt_tokens=600,
        prompt_tokens_per_line=16.0,
        source="generated",
    )
    best = max(
        run_backlog(model, WindowSettings(floor=w, ceiling=w, initial=w), calls=240, solo_s=8.0)[0]
        for w in (1, 4, 16, 48)
    )
    adaptive, _ = run_backlog(model, WINDOWS, calls=240, solo_s=8.0)
    assert adaptive >= 0.75 * best
