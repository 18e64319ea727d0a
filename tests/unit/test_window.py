"""Engine windows: every rule on literal intervals, bounds and convergence as properties."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.config import WindowSettings, check_ceiling, load_settings
from bot.errors import ConfigError
from bot.llm.vllm_metrics import EngineLoad
from bot.sched.window import (
    WindowObservation,
    WindowState,
    adapt_window,
    growth_step,
    initial_window,
    ready_to_judge,
)

SETTINGS = WindowSettings(floor=1, ceiling=64, initial=4)


def interval(
    tokens_per_s: float,
    latency_per_token_s: float,
    *,
    elapsed_s: float = 10.0,
    completed: int = 10,
    **changes: object,
) -> WindowObservation:
    tokens = round(tokens_per_s * elapsed_s)
    observation = WindowObservation(
        elapsed_s=elapsed_s,
        completed=completed,
        tokens=tokens,
        latency_s=latency_per_token_s * tokens,
    )
    return replace(observation, **changes)  # type: ignore[arg-type]


def measured(window: int, tokens_per_s: float, latency: float, **changes: object) -> WindowState:
    state = WindowState(
        window=window,
        tokens_per_s=tokens_per_s,
        latency_per_token_s=latency,
        measured_window=window,
        slow_start=False,
    )
    return replace(state, **changes)  # type: ignore[arg-type]


# --- the rules, one by one -----------------------------------------------------------------


def test_the_first_interval_is_the_baseline_and_slow_start_doubles() -> None:
    decision = adapt_window(initial_window(SETTINGS), interval(80.0, 0.05), SETTINGS)
    assert decision.reason == "baseline"
    assert decision.window == 8
    assert decision.state.tokens_per_s == pytest.approx(80.0)
    assert decision.state.measured_window == 4


def test_throughput_that_grows_with_the_window_grows_it_again() -> None:
    state = replace(measured(8, 100.0, 0.08), window=16, slow_start=True)
    decision = adapt_window(state, interval(170.0, 0.09), SETTINGS)
    assert (decision.reason, decision.window) == ("throughput_up", 32)


def test_a_doubling_that_brings_too_little_goes_all_the_way_back() -> None:
    # 8 -> 16 places for 5% more tokens/s and 80% more latency per token: past the knee.
    state = replace(measured(8, 100.0, 0.08), window=16, slow_start=True)
    decision = adapt_window(state, interval(105.0, 0.144), SETTINGS)
    assert (decision.reason, decision.window) == ("latency_up", 8)
    assert decision.state.slow_start is False


def test_slow_start_stops_at_the_first_doubling_that_bends() -> None:
    # The CPU server: 4 -> 8 gave 1.25x tokens/s, an elasticity of 0.32: the doubling paid,
    # the next one (to 16) would have lost. Slow start ends: one step (a quarter) up from 8.
    state = replace(measured(4, 40.5, 0.1), window=8, slow_start=True)
    decision = adapt_window(state, interval(50.7, 0.16), SETTINGS)
    assert (decision.reason, decision.window) == ("knee", 10)
    assert decision.state.slow_start is False
    # Nearly linear (1.6x for 2x): still far from the knee, slow start goes on.
    decision = adapt_window(state, interval(64.8, 0.12), SETTINGS)
    assert (decision.reason, decision.window) == ("throughput_up", 16)
    assert decision.state.slow_start is True


def test_a_grow_of_one_that_brings_nothing_goes_back_to_the_last_window() -> None:
    state = replace(measured(8, 100.0, 0.08), window=9)
    decision = adapt_window(state, interval(100.5, 0.08), SETTINGS)
    assert (decision.reason, decision.window) == ("no_gain", 8)


def test_a_shrink_that_cost_throughput_goes_back_up() -> None:
    state = replace(measured(16, 120.0, 0.13), window=8)
    decision = adapt_window(state, interval(90.0, 0.09), SETTINGS)
    assert (decision.reason, decision.window) == ("throughput_down", 16)


def test_a_shrink_that_kept_the_throughput_holds() -> None:
    state = replace(measured(16, 120.0, 0.13), window=12)
    decision = adapt_window(state, interval(116.0, 0.10), SETTINGS)
    assert (decision.reason, decision.window) == ("hold", 12)


def test_latency_rising_without_throughput_at_the_same_window_twice_shrinks_it() -> None:
    first = adapt_window(measured(20, 100.0, 0.10), interval(101.0, 0.13), SETTINGS)
    # One slow interval may be the work, not the engine: held, still compared with the last
    # good one, whose figures it keeps.
    assert (first.reason, first.window) == ("hold", 20)
    assert (first.state.tokens_per_s, first.state.latency_per_token_s) == (100.0, 0.10)
    second = adapt_window(first.state, interval(100.0, 0.12), SETTINGS)
    assert (second.reason, second.window) == ("latency_up", 15)


def test_a_slow_interval_between_good_ones_moves_nothing() -> None:
    slow = adapt_window(measured(20, 100.0, 0.10), interval(101.0, 0.13), SETTINGS)
    good = adapt_window(slow.state, interval(100.0, 0.10), SETTINGS)
    again = adapt_window(good.state, interval(101.0, 0.13), SETTINGS)
    assert [d.window for d in (slow, good, again)] == [20, 20, 20]
    assert again.state.slow_intervals == 1


def test_more_throughput_at_the_same_window_grows_it() -> None:
    decision = adapt_window(measured(20, 100.0, 0.10), interval(115.0, 0.10), SETTINGS)
    assert (decision.reason, decision.window) == ("throughput_up", 25)


def test_quiet_intervals_hold_then_probe_one_step_up() -> None:
    state = measured(20, 100.0, 0.10)
    reasons = []
    for _ in range(SETTINGS.probe_after):
        decision = adapt_window(state, interval(100.0, 0.10), SETTINGS)
        reasons.append(decision.reason)
        state = decision.state
    assert reasons == ["hold"] * (SETTINGS.probe_after - 1) + ["probe"]
    assert state.window == 25 and state.holds == 0


def test_probes_go_up_and_down_in_turn() -> None:
    state = measured(20, 100.0, 0.10, holds=SETTINGS.probe_after - 1)
    up = adapt_window(state, interval(100.0, 0.10), SETTINGS)
    assert (up.reason, up.window) == ("probe", 25)
    # Nothing gained up there: back to 20, and the next probe goes down.
    back = adapt_window(up.state, interval(101.0, 0.125), SETTINGS)
    assert (back.reason, back.window) == ("latency_up", 20)
    state, reasons = back.state, []
    while state.window == 20:
        down = adapt_window(state, interval(100.0, 0.10), SETTINGS)
        state = down.state
        reasons.append(down.reason)
    assert reasons == ["hold"] * (SETTINGS.probe_after - 1) + ["probe"]
    assert down.window == 15
    # 15 places keep 97% of the tokens/s: the smaller window stays.
    kept = adapt_window(down.state, interval(97.0, 0.08), SETTINGS)
    assert (kept.reason, kept.window) == ("hold", 15)


def test_refusals_and_timeouts_cut_the_window() -> None:
    decision = adapt_window(measured(20, 100.0, 0.1), interval(150.0, 0.05, overloads=2), SETTINGS)
    assert (decision.reason, decision.window) == ("overload", 10)
    # The old comparison point was another regime: the next interval is a fresh baseline.
    assert decision.state.tokens_per_s is None and decision.state.slow_start is False


def test_vllm_preemptions_and_queued_requests_take_one_place_off() -> None:
    preempting = interval(150.0, 0.05, engine=EngineLoad(new_preemptions=3))
    queued = interval(150.0, 0.05, engine=EngineLoad(requests_waiting=2))
    assert adapt_window(measured(20, 100.0, 0.1), preempting, SETTINGS).window == 19
    assert adapt_window(measured(20, 100.0, 0.1), preempting, SETTINGS).reason == "preemptions"
    assert adapt_window(measured(20, 100.0, 0.1), queued, SETTINGS).reason == "server_queue"
    assert adapt_window(measured(20, 100.0, 0.1), queued, SETTINGS).window == 19


def test_trouble_right_after_a_grow_goes_back_to_the_window_before_it() -> None:
    # The CPU server: 4 -> 8 by slow start, and at 8 vLLM queues requests. The grow brought
    # it: back to 4, judged against 4's interval, not a fresh baseline that grows again.
    grown = replace(measured(4, 27.0, 0.15), window=8, slow_start=True)
    for trouble in (
        interval(25.0, 0.3, engine=EngineLoad(requests_waiting=2)),
        interval(25.0, 0.3, engine=EngineLoad(new_preemptions=1)),
        interval(25.0, 0.3, overloads=1),
    ):
        decision = adapt_window(grown, trouble, SETTINGS)
        assert decision.window == 4
        assert decision.state.measured_window == 4 and decision.state.tokens_per_s == 27.0
        assert decision.state.slow_start is False
        # The same tokens/s at 4 holds there.
        again = adapt_window(decision.state, interval(27.5, 0.15), SETTINGS)
        assert (again.reason, again.window) == ("hold", 4)
    # Refusals that cut below the window before the grow start afresh from the cut.
    deep = adapt_window(
        replace(measured(10, 50.0, 0.1), window=13), interval(40.0, 0.2, overloads=3), SETTINGS
    )
    assert deep.window == 6 and deep.state.tokens_per_s is None


def test_a_baseline_after_a_back_off_holds_until_compared() -> None:
    backed = adapt_window(measured(20, 100.0, 0.1), interval(150.0, 0.05, overloads=2), SETTINGS)
    assert backed.window == 10 and backed.state.tokens_per_s is None
    baseline = adapt_window(backed.state, interval(80.0, 0.1), SETTINGS)
    assert (baseline.reason, baseline.window) == ("baseline", 10)
    assert baseline.state.measured_window == 10


def test_a_shrink_within_the_noise_holds() -> None:
    # 8 -> 4 kept 85% of the tokens/s: (4/8) ** 0.15 = 0.90 asks for more, but one interval of
    # four completions moves by more than the tolerance; the smaller window stays.
    state = replace(measured(8, 25.0, 0.3), window=4)
    kept = adapt_window(state, interval(21.3, 0.16), SETTINGS)
    assert (kept.reason, kept.window) == ("hold", 4)
    lost = adapt_window(state, interval(19.0, 0.19), SETTINGS)
    assert (lost.reason, lost.window) == ("throughput_down", 8)


def test_a_full_kv_cache_stops_growth_but_not_shrinking() -> None:
    full = EngineLoad(kv_cache_usage=0.97, requests_waiting=0, new_preemptions=0)
    grew = adapt_window(measured(20, 100.0, 0.1), interval(150.0, 0.1, engine=full), SETTINGS)
    assert (grew.reason, grew.window) == ("kv_cache_full", 20)
    slow = interval(100.0, 0.2, engine=full)
    slower = adapt_window(
        adapt_window(measured(20, 100.0, 0.1), slow, SETTINGS).state, slow, SETTINGS
    )
    assert slower.window < 20


def test_an_interval_with_empty_places_or_nothing_done_teaches_nothing() -> None:
    state = measured(20, 100.0, 0.10)
    idle = adapt_window(state, interval(10.0, 0.5, full=False), SETTINGS)
    assert idle.reason == "not_full" and idle.state == state
    nothing = adapt_window(state, interval(0.0, 0.1, completed=0), SETTINGS)
    assert nothing.reason == "no_data" and nothing.state == state


def test_a_fixed_window_never_moves() -> None:
    fixed = WindowSettings(floor=1, ceiling=1, initial=1)
    state = initial_window(fixed)
    for observation in (interval(100.0, 0.1), interval(300.0, 0.1), interval(50.0, 1.0)):
        state = adapt_window(state, observation, fixed).state
        assert state.window == 1


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="floor <= initial <= ceiling"):
        WindowSettings(floor=4, initial=2, ceiling=8)
    with pytest.raises(ValueError, match="floor <= initial <= ceiling"):
        WindowSettings(floor=0, initial=1, ceiling=8)
    with pytest.raises(ValueError, match="tolerance"):
        WindowSettings(tolerance=0.0)


def test_window_bounds_come_from_the_environment() -> None:
    defaults = load_settings({})
    assert (defaults.window.floor, defaults.window.initial, defaults.window.ceiling) == (1, 4, 48)
    fixed = load_settings({"REVIEW_BOT_WINDOW_FLOOR": "1", "REVIEW_BOT_WINDOW_CEILING": "1"})
    assert fixed.window.fixed and fixed.window.initial == 1
    chosen = load_settings(
        {
            "REVIEW_BOT_WINDOW_FLOOR": "2",
            "REVIEW_BOT_WINDOW_INITIAL": "6",
            "REVIEW_BOT_WINDOW_CEILING": "30",
            "REVIEW_BOT_LLM_MAX_NUM_SEQS": "32",
        }
    )
    assert (chosen.window.floor, chosen.window.initial, chosen.window.ceiling) == (2, 6, 30)
    assert chosen.llm.max_num_seqs == 32
    with pytest.raises(ConfigError, match="REVIEW_BOT_WINDOW"):
        load_settings({"REVIEW_BOT_WINDOW_FLOOR": "8", "REVIEW_BOT_WINDOW_CEILING": "4"})
    with pytest.raises(ConfigError, match="--max-num-seqs 48"):
        load_settings({"REVIEW_BOT_LLM_MAX_NUM_SEQS": "48"})
    assert (defaults.window.p0_slowdown, defaults.window.p0_companions) == (1.5, None)
    room = load_settings({"REVIEW_BOT_P0_SLOWDOWN": "2", "REVIEW_BOT_P0_COMPANIONS": "3"})
    assert (room.window.p0_slowdown, room.window.p0_companions) == (2.0, 3)
    with pytest.raises(ConfigError, match="p0_slowdown must be at least 1"):
        load_settings({"REVIEW_BOT_P0_SLOWDOWN": "0.5"})
    with pytest.raises(ConfigError, match="REVIEW_BOT_P0_COMPANIONS must be an integer"):
        load_settings({"REVIEW_BOT_P0_COMPANIONS": "some"})
    assert load_settings({}).llm.max_tokens == 1024
    assert load_settings({"REVIEW_BOT_LLM_MAX_TOKENS": "160"}).llm.max_tokens == 160
    with pytest.raises(ConfigError, match="REVIEW_BOT_LLM_MAX_TOKENS"):
        load_settings({"REVIEW_BOT_LLM_MAX_TOKENS": "0"})


def test_the_ceiling_must_leave_a_place_for_p0_under_max_num_seqs() -> None:
    check_ceiling(WindowSettings(ceiling=63), max_num_seqs=64)
    with pytest.raises(ValueError, match="--max-num-seqs 64"):
        check_ceiling(WindowSettings(ceiling=64), max_num_seqs=64)


def test_an_interval_is_judged_after_enough_completions_and_time() -> None:
    # A full turnover of the window...
    assert not ready_to_judge(completed=7, elapsed_s=10.0, window=8, settings=SETTINGS)
    assert ready_to_judge(completed=8, elapsed_s=10.0, window=8, settings=SETTINGS)
    assert not ready_to_judge(completed=8, elapsed_s=1.0, window=8, settings=SETTINGS)
    # ...and never fewer than min_completions calls.
    assert not ready_to_judge(completed=3, elapsed_s=5.0, window=1, settings=SETTINGS)
    assert ready_to_judge(completed=4, elapsed_s=5.0, window=1, settings=SETTINGS)


def test_steps_are_a_share_of_the_window_outside_slow_start() -> None:
    assert growth_step(WindowState(window=8, slow_start=True), SETTINGS) == 8
    assert growth_step(WindowState(window=8, slow_start=False), SETTINGS) == 2
    assert growth_step(WindowState(window=2, slow_start=False), SETTINGS) == 1


# --- properties ----------------------------------------------------------------------------

window_settings = st.builds(
    lambda floor, span, initial_at, tolerance: WindowSettings(
        floor=floor,
        ceiling=floor + span,
        initial=floor + min(span, initial_at),
        tolerance=tolerance,
    ),
    st.integers(1, 8),
    st.integers(0, 96),
    st.integers(0, 96),
    st.floats(0.02, 0.5),
)
engine_loads = st.none() | st.builds(
    EngineLoad,
    requests_waiting=st.none() | st.floats(0, 50),
    kv_cache_usage=st.none() | st.floats(0, 1),
    new_preemptions=st.none() | st.floats(0, 5),
)
observations = st.builds(
    WindowObservation,
    elapsed_s=st.floats(0, 600),
    completed=st.integers(0, 200),
    tokens=st.integers(0, 100_000),
    latency_s=st.floats(0, 10_000),
    overloads=st.integers(0, 3),
    full=st.booleans(),
    engine=engine_loads,
)
states = st.builds(
    WindowState,
    window=st.integers(1, 120),
    tokens_per_s=st.none() | st.floats(0, 10_000),
    latency_per_token_s=st.none() | st.floats(0, 10),
    measured_window=st.none() | st.integers(1, 120),
    slow_start=st.booleans(),
    holds=st.integers(0, 10),
)


@given(states, observations, window_settings)
def test_the_window_stays_within_floor_and_ceiling(
    state: WindowState, observation: WindowObservation, config: WindowSettings
) -> None:
    decision = adapt_window(state, observation, config)
    assert config.floor <= decision.window <= config.ceiling


@given(states, observations, window_settings)
def test_trouble_never_grows_the_window(
    state: WindowState, observation: WindowObservation, config: WindowSettings
) -> None:
    engine = observation.engine or EngineLoad()
    decision = adapt_window(state, observation, config)
    clamped = max(config.floor, min(config.ceiling, state.window))
    if observation.overloads > 0:
        assert decision.window <= max(config.floor, math.floor(clamped * config.overload_factor))
    elif (engine.new_preemptions or 0) > 0 or (engine.requests_waiting or 0) >= 1:
        assert decision.window <= max(config.floor, clamped - 1)
    elif (engine.kv_cache_usage or 0) >= config.kv_cache_high:
        assert decision.window <= clamped


@given(states, observations, window_settings)
def test_an_interval_that_shows_nothing_changes_nothing(
    state: WindowState, observation: WindowObservation, config: WindowSettings
) -> None:
    engine = observation.engine or EngineLoad()
    troubled = (
        observation.overloads > 0
        or (engine.new_preemptions or 0) > 0
        or (engine.requests_waiting or 0) >= 1
    )
    empty = observation.completed <= 0 or observation.tokens <= 0 or observation.elapsed_s <= 0
    if troubled or not (empty or not observation.full):
        return
    decision = adapt_window(state, observation, config)
    assert decision.window == max(config.floor, min(config.ceiling, state.window))
    assert decision.state.tokens_per_s == state.tokens_per_s


class BatchingEngine:
    """A test engine: a step of n sequences takes t0 + k*n seconds and makes n tokens.

    Above `capacity` sequences the extra requests wait inside the engine (as vLLM does above
    --max-num-seqs) and say so in `requests_waiting`; noise is a relative jitter of tokens/s.
    """

    def __init__(
        self, t0: float, k: float, capacity: int, noise: float, seed: int, c: float = 0.0
    ) -> None:
        # `c` adds c*n**2 to a step: a server that runs short of cores or memory bandwidth
        # loses tokens/s past its best window (the CPU server peaks at 8).
        self.t0, self.k, self.c, self.capacity, self.noise = t0, k, c, capacity, noise
        self.rng = random.Random(seed)

    def step_s(self, running: int) -> float:
        return self.t0 + self.k * running + self.c * running * running

    def tokens_per_s(self, window: int) -> float:
        running = min(window, self.capacity)
        return running / self.step_s(running)

    def run(self, window: int, elapsed_s: float = 30.0) -> WindowObservation:
        running = min(window, self.capacity)
        step_s = self.step_s(running)
        jitter = 1 + self.rng.uniform(-self.noise, self.noise)
        tokens = round(running / step_s * elapsed_s * jitter)
        # Latency per token seen by a request includes its wait behind the engine's capacity.
        latency_per_token = step_s * window / running / jitter
        return WindowObservation(
            elapsed_s=elapsed_s,
            completed=max(1, tokens // 300),
            tokens=tokens,
            latency_s=latency_per_token * tokens,
            engine=EngineLoad(requests_waiting=float(window - running), kv_cache_usage=0.5),
        )


def drive(engine: BatchingEngine, config: WindowSettings, rounds: int) -> list[int]:
    state = initial_window(config)
    windows = []
    for _ in range(rounds):
        state = adapt_window(state, engine.run(state.window), config).state
        windows.append(state.window)
    return windows


@settings(max_examples=60, deadline=None)
@given(
    t0=st.floats(0.005, 0.05),
    knee=st.integers(2, 80),
    noise=st.floats(0.0, 0.04),
    seed=st.integers(0, 10_000),
)
def test_the_window_settles_near_the_best_throughput(
    t0: float, knee: int, noise: float, seed: int
) -> None:
    # The knee is where the step time has doubled from one sequence's: k = t0 / knee.
    config = WindowSettings(floor=1, ceiling=64, initial=4)
    engine = BatchingEngine(t0=t0, k=t0 / knee, capacity=1000, noise=noise, seed=seed)
    windows = drive(engine, config, rounds=80)
    best = max(engine.tokens_per_s(window) for window in range(1, 65))
    settled = windows[-30:]
    mean_throughput = sum(engine.tokens_per_s(window) for window in settled) / len(settled)
    assert mean_throughput >= 0.8 * best
    # ...and not by sitting at the ceiling when the knee is far below it (noise may carry a
    # probe up there now and then, but the window does not stay).
    if knee <= 8:
        assert sorted(settled)[len(settled) // 2] < config.ceiling
        if noise == 0:
            assert max(settled) < config.ceiling


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_the_window_stays_under_what_the_engine_runs_at_once(capacity: int, seed: int) -> None:
    # Linear scaling up to the capacity: only the engine's queue can say where it ends.
    config = WindowSettings(floor=1, ceiling=64, initial=4)
    engine = BatchingEngine(t0=0.02, k=0.00001, capacity=capacity, noise=0.02, seed=seed)
    windows = drive(engine, config, rounds=80)
    settled = windows[-30:]
    assert max(settled) <= capacity + max(1, math.ceil(capacity * config.growth))
    assert sum(settled) / len(settled) >= 0.6 * capacity


def test_refusals_above_a_limit_keep_the_window_below_it() -> None:
    config = WindowSettings(floor=1, ceiling=64, initial=4)
    state = initial_window(config)
    windows = []
    for _ in range(60):
        window = state.window
        refused = window > 12
        observation = interval(window * 10.0, 0.1, overloads=int(refused))
        state = adapt_window(state, observation, config).state
        windows.append(state.window)
    assert max(windows[-30:]) <= 12 + math.ceil(12 * config.growth)
    assert windows.count(64) == 0


def drain(engine: BatchingEngine, config: WindowSettings, reviews: int) -> list[int]:
    """The windows judged while `reviews` one-chunk reviews drain: an interval is judged once
    it holds max(min_completions, window) completions (ready_to_judge), so a drain of 40 gives
    the controller only a handful of intervals."""
    state = initial_window(config)
    windows = [state.window]
    left = reviews
    while left > 0:
        needed = max(config.min_completions, state.window)
        left -= needed
        if left < 0:
            break
        state = adapt_window(state, engine.run(state.window), config).state
        windows.append(state.window)
    return windows


PEAKED = {
    "best": st.integers(4, 32),
    "linear_share": st.floats(0.0, 0.5),
    "noise": st.floats(0.0, 0.04),
    "seed": st.integers(0, 10_000),
}


def peaked_engine(best: int, linear_share: float, noise: float, seed: int) -> BatchingEngine:
    # Tokens/s n / (t0 + k n + c n**2) peaks at n = sqrt(t0 / c), whatever k is.
    t0 = 0.02
    return BatchingEngine(
        t0=t0, k=linear_share * t0 / best, c=t0 / best**2, capacity=1000, noise=noise, seed=seed
    )


@settings(max_examples=80, deadline=None)
@given(**PEAKED)
def test_slow_start_does_not_overshoot_the_knee(
    best: int, linear_share: float, noise: float, seed: int
) -> None:
    config = WindowSettings(floor=1, ceiling=64, initial=4)
    engine = peaked_engine(best, linear_share, noise, seed)
    state = initial_window(config)
    windows: list[int] = []
    slow_start_reached = state.window
    for _ in range(60):
        state = adapt_window(state, engine.run(state.window), config).state
        windows.append(state.window)
        if state.slow_start:
            slow_start_reached = max(slow_start_reached, state.window)
    # Slow start ends within a third past the best window (a few percent of noise can let one
    # doubling through from under it), never a doubling past it; only the first doubling, from
    # the initial window with nothing to compare, may pass it. Later probes go a step up and
    # come back.
    knee_bound = max(2 * config.initial, best + math.ceil(best / 3))
    assert slow_start_reached <= knee_bound
    assert max(windows) <= knee_bound + max(1, math.ceil(knee_bound * config.growth))
    settled = windows[-30:]
    peak = max(engine.tokens_per_s(window) for window in range(1, 65))
    mean_throughput = sum(engine.tokens_per_s(window) for window in settled) / len(settled)
    assert mean_throughput >= 0.9 * peak


@settings(max_examples=80, deadline=None)
@given(**PEAKED)
def test_the_window_converges_within_a_drain_of_40_reviews(
    best: int, linear_share: float, noise: float, seed: int
) -> None:
    config = WindowSettings(floor=1, ceiling=64, initial=4)
    engine = peaked_engine(best, linear_share, noise, seed)
    windows = drain(engine, config, reviews=40)
    peak = max(engine.tokens_per_s(window) for window in range(1, 65))
    # Over the drain's second half the windows run the engine within 15% of its best, on
    # average (a drain of 40 holds only 5-8 judged intervals; a step under way may not have
    # been judged when it ends). The controller before the knee rule: 0.83 at worst.
    second_half = windows[len(windows) // 2 :]
    mean_throughput = sum(engine.tokens_per_s(w) for w in second_half) / len(second_half)
    assert mean_throughput >= 0.85 * peak


@settings(max_examples=200, deadline=None)
@given(room=st.integers(5, 7), noise=st.floats(0.0, 0.04), seed=st.integers(0, 10_000))
def test_an_engine_that_queues_past_its_knee_keeps_the_window_at_the_knee(
    room: int, noise: float, seed: int
) -> None:
    # The CPU server: tokens/s best at 4, and past `room` sequences vLLM queues requests
    # (its KV cache holds a few long prompts). After slow start's first doubling, a window
    # that runs into the queue comes straight back: never two judged intervals in a row past
    # the room (the old controller went 4 -> 8 -> 7 -> 9 -> 8 -> 7 with room for 7), never
    # more than one step past it, and the drain keeps 90% of the best tokens/s.
    config = WindowSettings(floor=1, ceiling=64, initial=4)
    engine = peaked_engine(4, 0.25, noise, seed)
    engine.capacity = room
    windows = drain(engine, config, reviews=40)[2:]
    assert max(windows) <= room + max(1, math.ceil(room * config.growth))
    assert not any(a > room and b > room for a, b in itertools.pairwise(windows))
    best = max(engine.tokens_per_s(window) for window in range(1, 65))
    assert sum(engine.tokens_per_s(w) for w in windows) / len(windows) >= 0.9 * best
