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
import random
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
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (RESULTS / "window_trace.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
