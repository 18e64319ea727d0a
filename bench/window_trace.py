"""The engine window's trace on modelled engines whose tokens/s peaks at a known window.

    .venv/bin/python -m bench.window_trace

An engine's decode step of n sequences takes t0 + k*n + c*n**2 (the c term: a server short of
cores or bandwidth, like the CPU server that peaks at 8), so tokens/s n / step peaks at
sqrt(t0 / c). Each judged interval runs 30 s at the window with 2% of noise on tokens/s (seeded);
past a given number of sequences the engine queues the rest (requests_waiting); the window
is the served controller (bot.sched.window.adapt_window). Deterministic: one run is
the figure. Writes bench/results/window_trace.md.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
from collections.abc import Sequence
from pathlib import Path

from bot.config import WindowSettings
from bot.llm.vllm_metrics import EngineLoad
from bot.sched.window import WindowObservation, adapt_window, initial_window

RESULTS = Path(__file__).resolve().parent / "results"
T0 = 0.02


def observe(
    best: int, window: int, rng: random.Random, room: int | None = None
) -> WindowObservation:
    # Past `room` sequences the engine runs no more at once and queues the rest (vLLM with a
    # KV cache that holds a few long prompts), saying so in requests_waiting.
    running = window if room is None else min(window, room)
    step_s = T0 + 0.25 * T0 / best * running + T0 / best**2 * running * running
    tokens = round(running / step_s * 30.0 * (1 + rng.uniform(-0.02, 0.02)))
    return WindowObservation(
        elapsed_s=30.0,
        completed=max(1, tokens // 300),
        tokens=tokens,
        latency_s=step_s * window / running * tokens,
        engine=EngineLoad(requests_waiting=float(window - running)),
    )


def trace(
    best: int, reviews: int, settings: WindowSettings, room: int | None = None
) -> list[tuple[int, str]]:
    """(window, reason) per judged interval while `reviews` one-chunk reviews drain."""
    rng = random.Random(best)
    state = initial_window(settings)
    steps: list[tuple[int, str]] = [(state.window, "initial")]
    left = reviews
    while (left := left - max(settings.min_completions, state.window)) >= 0:
        decision = adapt_window(state, observe(best, state.window, rng, room), settings)
        state = decision.state
        steps.append((state.window, decision.reason))
    return steps


Sweep = dict[int, float]  # completion tokens/s at so many calls at once

# A CPU server's raw sweep, flat from 4 to 8 (`make bench-engine` at b99e18c, a slower server
# than today's bench/results/engine.md): completion tokens/s at 1, 2, 4, 8 and 16 at once.
CPU_SWEEP: Sweep = {1: 5.3, 2: 7.6, 4: 8.4, 8: 8.5, 16: 5.9}
# Another machine's CPU server, peaked at 4 (`make bench-engine`, stop 45's first run): 8 at
# once makes 0.69x of 4's tokens/s, so every interval spent at 8 costs a third of its work.
PEAKED_SWEEP: Sweep = {1: 17.3, 2: 24.1, 4: 32.3, 8: 22.2, 16: 17.2}


def sweep_tokens_per_s(sweep: Sweep, window: int) -> float:
    """The sweep's tokens/s at `window`, linear between its points, flat past the last."""
    points = sorted(sweep)
    window = min(window, points[-1])
    for low, high in itertools.pairwise(points):
        if low <= window <= high:
            share = (window - low) / (high - low)
            return sweep[low] + share * (sweep[high] - sweep[low])
    return sweep[points[0]]


def noisy_drain(
    sweep: Sweep,
    noise: float,
    seed: int,
    settings: WindowSettings,
    chunks: int = 41,
    room: int | None = 7,
) -> float:
    """A drain of `chunks` on an engine shaped like `sweep`, each interval's tokens/s and
    latency off by up to `noise` (a few long prompts among four completions), requests
    queued inside the engine past `room`: its tokens/s over the sweep's best."""
    rng = random.Random(seed)
    state = initial_window(settings)
    left, tokens_sum, seconds = chunks, 0, 0.0
    while left > 0:
        window = state.window
        completed = min(left, max(settings.min_completions, window))
        left -= completed
        tokens_per_s = sweep_tokens_per_s(sweep, window) * (1 + rng.uniform(-noise, noise))
        tokens = completed * 70
        elapsed = tokens / tokens_per_s
        tokens_sum, seconds = tokens_sum + tokens, seconds + elapsed
        latency = window / tokens_per_s * (1 + rng.uniform(-noise, noise)) * tokens
        observation = WindowObservation(
            elapsed_s=elapsed,
            completed=completed,
            tokens=tokens,
            latency_s=latency,
            full=left > 0,
            engine=EngineLoad(
                requests_waiting=float(max(0, window - room)) if room is not None else 0.0,
                kv_cache_usage=0.5,
            ),
        )
        state = adapt_window(state, observation, settings).state
    return tokens_sum / seconds / max(sweep.values())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    settings = WindowSettings(floor=1, ceiling=64, initial=4)
    lines = [
        "# Window trace on modelled engines",
        "",
        "`.venv/bin/python -m bench.window_trace` (virtual, deterministic). A drain of 40",
        "one-chunk reviews; an interval is judged after max(4, window) completions.",
        "",
        "| best window | engine runs at once | windows, interval by interval (reason) |",
        "|---:|---:|---|",
    ]
    # The last row is shaped like the CPU server of `make bench-engine`: best at 4, and
    # requests queued inside vLLM past 7.
    for best, room in ((4, None), (8, None), (13, None), (24, None), (48, None), (4, 7)):
        steps = trace(best, 40, settings, room)
        shown = "all" if room is None else str(room)
        lines.append(f"| {best} | {shown} | " + " → ".join(f"{w} ({r})" for w, r in steps) + " |")
    lines += [
        "",
        "On engines shaped like a CPU server's raw sweep, a drain of 41 chunks whose intervals",
        "are each off by up to the noise shown (tokens/s and latency, independently), 400",
        "seeds: the drain's tokens/s over the sweep's best. Flat: `make bench-engine` at",
        "b99e18c, 5.3, 7.6, 8.4, 8.5 and 5.9 tokens/s at 1, 2, 4, 8 and 16, requests queued",
        "past 7. Peaked: stop 45's first run on another machine, 17.3, 24.1, 32.3, 22.2 and",
        "17.2 tokens/s, nothing queued inside the server.",
        "",
        "| sweep | noise | median | P10 | P90 |",
        "|---|---:|---:|---:|---:|",
    ]
    cpu_settings = WindowSettings(floor=1, ceiling=48, initial=4)
    for name, sweep, room in (("flat", CPU_SWEEP, 7), ("peaked", PEAKED_SWEEP, None)):
        for noise in (0.05, 0.15, 0.25):
            ratios = sorted(
                noisy_drain(sweep, noise, seed, cpu_settings, room=room) for seed in range(400)
            )
            lines.append(
                f"| {name} | {noise:.0%} | {statistics.median(ratios):.3f} | {ratios[40]:.3f} "
                f"| {ratios[359]:.3f} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (RESULTS / "window_trace.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
