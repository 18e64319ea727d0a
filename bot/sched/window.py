"""How many chunks an engine runs at once: a window adapted from what the engine shows.

vLLM earns its throughput by batching many sequences, so an engine is fed a window of chunks,
not one. The window climbs while completed tokens/s climbs and backs off when the engine shows
it is past its knee: latency per token rising with no throughput to show for it, refusals
(429/503) or timeouts, and, where vLLM's `/metrics` is read, requests queued inside the engine,
a full KV cache or preemptions. Pure: observations in, the next window out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from bot.config import WindowSettings
from bot.llm.vllm_metrics import EngineLoad

WindowReason = Literal[
    "overload",
    "preemptions",
    "server_queue",
    "kv_cache_full",
    "no_data",
    "not_full",
    "baseline",
    "throughput_up",
    "latency_up",
    "probe",
    "hold",
    "no_gain",
    "throughput_down",
    "knee",
]


# Judged intervals in a row at one window, each slower than the comparison point, that shrink it.
SLOW_INTERVALS_TO_SHRINK = 2


@dataclass(frozen=True, slots=True)
class WindowObservation:
    """One engine over one interval: what completed, how long it took, what went wrong."""

    elapsed_s: float
    completed: int  # chunks that finished
    tokens: int  # completion tokens of those chunks
    latency_s: float  # summed latency of those chunks
    overloads: int = 0  # answers 429/503 and timeouts
    # Every place of the window was taken for most of the interval: throughput then says
    # something about the window, not about how much work there was.
    full: bool = True
    engine: EngineLoad | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def latency_per_token_s(self) -> float:
        return self.latency_s / self.tokens if self.tokens > 0 else math.inf


@dataclass(frozen=True, slots=True)
class WindowState:
    """An engine's window and the interval the next one is compared against."""

    window: int
    # The last judged interval: its tokens/s, latency per token and the window it ran with.
    tokens_per_s: float | None = None
    latency_per_token_s: float | None = None
    measured_window: int | None = None
    # Slow start: the window doubles until the first sign of the knee, then moves by steps of
    # `growth` of itself.
    slow_start: bool = True
    holds: int = 0  # judged intervals in a row that moved nothing (a probe follows)
    # Intervals in a row slower than the comparison point at the same window (see adapt_window).
    slow_intervals: int = 0
    probe_up: bool = False  # the last probe went up (the next one goes down)


@dataclass(frozen=True, slots=True)
class WindowDecision:
    """The next state and why it was chosen (for logs and /metrics)."""

    state: WindowState
    reason: WindowReason

    @property
    def window(self) -> int:
        return self.state.window


def initial_window(settings: WindowSettings) -> WindowState:
    """Where an engine starts (a fixed window has nothing to learn)."""
    return WindowState(window=settings.initial, slow_start=not settings.fixed)


def ready_to_judge(
    *, completed: int, elapsed_s: float, window: int, settings: WindowSettings
) -> bool:
    """Whether an interval holds enough to be judged (see WindowSettings.min_completions)."""
    # A full turnover of the window at least: tokens arrive in lumps as calls end, and a
    # shorter interval measures the lumps, not the engine.
    needed = max(settings.min_completions, window)
    return completed >= needed and elapsed_s >= settings.min_interval_s


def _clamp(window: int, settings: WindowSettings) -> int:
    return max(settings.floor, min(settings.ceiling, window))


def growth_step(state: WindowState, settings: WindowSettings) -> int:
    """How far one move goes: the whole window in slow start, else a share of it (>= 1).

    Steps proportional to the window keep each probe's expected gain above the noise
    tolerance; steps of one at a large window would each gain too little to see and creep
    past the knee.
    """
    if state.slow_start:
        return max(1, state.window)
    return max(1, math.ceil(state.window * settings.growth))


def _decide(
    state: WindowState, window: int, reason: WindowReason, settings: WindowSettings
) -> WindowDecision:
    clamped = _clamp(window, settings)
    holds = state.holds + 1 if clamped == state.window else 0
    return WindowDecision(replace(state, window=clamped, holds=holds), reason)


def _back_off(
    state: WindowState, window: int, reason: WindowReason, settings: WindowSettings
) -> WindowDecision:
    before = state.measured_window
    if before is not None and before < state.window and state.tokens_per_s is not None:
        # Trouble right after a grow: the grow brought it. Go back to the window before it,
        # which ran without trouble, and keep its interval as the comparison point; starting
        # a fresh baseline there would grow again without a comparison (4 -> 8 -> 7 -> 6 ->
        # 8 -> 10 on the CPU server, whose best is 4).
        to = _clamp(min(window, before), settings)
        if to == before:
            return WindowDecision(
                replace(state, window=to, slow_start=False, holds=0), reason=reason
            )
    # The last interval was measured at another operating point: compare afresh from here.
    return WindowDecision(
        WindowState(window=_clamp(window, settings), slow_start=False), reason=reason
    )


def adapt_window(
    state: WindowState, observation: WindowObservation, settings: WindowSettings
) -> WindowDecision:
    """The next window after one judged interval; never outside [floor, ceiling].

    In order: refusals or timeouts cut it by `overload_factor`; vLLM preemptions or requests
    queued inside the engine take one off; any of these right after a grow goes back to the
    window before it. An interval with nothing completed, or with places left empty for want
    of work, teaches nothing. Otherwise the interval is compared with the last one (a first
    interval outside slow start is a baseline that holds): after a grow, enough more tokens/s
    (see `min_elasticity`) grows again and less goes back; slow start stops at the first
    doubling whose gain is under `slow_start_elasticity` and steps on from that window; after
    a shrink, tokens/s lost beyond the same measure and the tolerance goes back up; at the
    same window, tokens/s up by the tolerance grows it and latency per token up without it,
    two judged intervals in a row, shrinks it. A KV cache at its high mark never lets the
    window grow; after `probe_after` quiet intervals in a row it probes a step up or down.
    """
    # A state from before a settings change may lie outside the bounds: start from inside.
    window = _clamp(state.window, settings)
    state = replace(state, window=window)
    engine = observation.engine or EngineLoad()
    if observation.overloads > 0:
        return _back_off(state, math.floor(window * settings.overload_factor), "overload", settings)
    if engine.new_preemptions is not None and engine.new_preemptions > 0:
        return _back_off(state, window - 1, "preemptions", settings)
    if engine.requests_waiting is not None and engine.requests_waiting >= 1:
        return _back_off(state, window - 1, "server_queue", settings)
    if observation.completed <= 0 or observation.tokens <= 0 or observation.elapsed_s <= 0:
        return WindowDecision(replace(state, window=_clamp(window, settings)), "no_data")
    if not observation.full:
        return WindowDecision(replace(state, window=_clamp(window, settings)), "not_full")
    kv_full = engine.kv_cache_usage is not None and engine.kv_cache_usage >= settings.kv_cache_high
    throughput = observation.tokens_per_s
    latency = observation.latency_per_token_s
    measured = replace(
        state,
        tokens_per_s=throughput,
        latency_per_token_s=latency,
        measured_window=window,
        slow_intervals=0,
    )
    step = growth_step(state, settings)
    grow_to = window if kv_full else window + step
    if grow_to >= settings.ceiling:
        # Nothing left to double into: later moves are steps.
        measured = replace(measured, slow_start=False)
    grow_reason: WindowReason = "kv_cache_full" if kv_full else "throughput_up"
    previous = state.measured_window
    if state.tokens_per_s is None or state.latency_per_token_s is None or previous is None:
        # Slow start doubles from its first interval (the next one is compared with it); a
        # baseline after a back-off holds, so that every later move is judged.
        to = grow_to if state.slow_start else window
        return _decide(measured, to, "kv_cache_full" if kv_full else "baseline", settings)
    ratio = throughput / state.tokens_per_s if state.tokens_per_s > 0 else math.inf
    slower = latency > state.latency_per_token_s * (1 + settings.tolerance)
    if window > previous:
        # Elasticity: the share of the window's growth that came back as tokens/s.
        grown = window / previous
        if state.slow_start and ratio < grown**settings.slow_start_elasticity:
            if ratio >= grown**settings.min_elasticity:
                # The doubling paid, but less than a still-elastic engine gives: the next one
                # would land past the knee (4 -> 8 -> 16 on a server whose best is 8). Go on
                # by steps from here, judged by `min_elasticity`.
                stepped = replace(measured, slow_start=False)
                to = window if kv_full else window + growth_step(stepped, settings)
                return _decide(stepped, to, "knee", settings)
        elif ratio >= grown**settings.min_elasticity:
            return _decide(measured, grow_to, grow_reason, settings)
        # Too little throughput for the extra places: they add latency and take the room a
        # P0 chunk would need. Go all the way back (after a doubling too: halfway would lie
        # past a knee that peaks), or probes would creep up by halves.
        reason: WindowReason = "latency_up" if slower else "no_gain"
        return _decide(replace(measured, slow_start=False), previous, reason, settings)
    if window < previous:
        # A smaller window that keeps the tokens/s (by the same elasticity, within the noise
        # tolerance) is the better one: it leaves a P0 room and shortens every call. Without
        # the tolerance, one interval of four completions a few percent short sent the CPU
        # server's window from its best (4) back up to 8.
        kept = (window / previous) ** settings.min_elasticity / (1 + settings.tolerance)
        if ratio >= kept or kv_full:
            return _decide(measured, window, "hold", settings)
        return _decide(measured, previous, "throughput_down", settings)
    if ratio >= 1 + settings.tolerance:
        return _decide(measured, grow_to, grow_reason, settings)
    if slower:
        if state.slow_intervals + 1 < SLOW_INTERVALS_TO_SHRINK:
            # One slow interval at an unchanged window is as often the work as the engine (a
            # few long prompts in four completions): hold, still compared with the interval
            # before it. A shrink it set off would be kept by the noise tolerance, and such
            # shrinks, one after another, walked the CPU server's window from 4 to 2 at 0.9x
            # its tokens/s.
            waiting = replace(state, slow_intervals=state.slow_intervals + 1)
            return _decide(waiting, window, "hold", settings)
        shrink_to = window - max(1, math.ceil(window * settings.growth))
        return _decide(replace(measured, slow_start=False), shrink_to, "latency_up", settings)
    if state.holds + 1 >= settings.probe_after:
        # Probes alternate up and down, so noise that lets a useless grow pass now and then
        # is met by shrinks that keep the tokens/s: the window does not drift either way.
        down = state.probe_up or kv_full or window >= settings.ceiling
        probe_step = max(1, math.ceil(window * settings.growth))
        probe_to = window - probe_step if down else window + probe_step
        return _decide(replace(measured, probe_up=not down), probe_to, "probe", settings)
    return _decide(measured, window, "hold", settings)


__all__ = [
    "WindowDecision",
    "WindowObservation",
    "WindowReason",
    "WindowState",
    "adapt_window",
    "growth_step",
    "initial_window",
    "ready_to_judge",
]
