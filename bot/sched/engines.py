"""Engines: one LLM server (or the in-process engine) each, running a window of chunks.

An engine keeps what its window needs: how many chunks run on it, what the current interval
showed (completions, tokens, latency, refusals, whether the window was full), and the engine
time each call was given. Under batching a call's latency is not its cost: `n` calls in flight
share the engine, so each is charged `dt / n` of every stretch `dt` (processor sharing); the
charges of all calls add up to the time the engine was busy. Pure bookkeeping: every method
takes the time as plain seconds from the caller's clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bot.config import WindowSettings
from bot.llm.vllm_metrics import EngineLoad
from bot.sched.p0_room import PacePoint, add_point, p0_companions
from bot.sched.window import (
    WindowDecision,
    WindowObservation,
    WindowReason,
    WindowState,
    adapt_window,
    initial_window,
    ready_to_judge,
)

# An interval counts as full when the window was full for at least this share of it.
FULL_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class CallMark:
    """Where a call started on its engine (to charge its share when it ends)."""

    engine: str
    started_s: float
    shared_s: float  # the engine's shared-time clock at the start


@dataclass(slots=True)
class Engine:
    """One engine's window, load and counters."""

    name: str
    settings: WindowSettings
    state: WindowState
    now_s: float = 0.0
    in_flight: int = 0
    busy_s: float = 0.0
    # Shared-time clock: advances dt / in_flight, so a call's share is its difference.
    shared_s: float = 0.0
    last_reason: WindowReason | None = None
    # The interval being observed.
    interval_start_s: float = 0.0
    interval_completed: int = 0
    interval_tokens: int = 0
    interval_latency_s: float = 0.0
    interval_overloads: int = 0
    interval_full_s: float = 0.0
    # The fewest requests vLLM said it held queued at any read of its /metrics in the interval
    # (None: not read). vLLM queues each new request until its next step admits it, so one read
    # often finds a request or two waiting on an engine with room to spare; a queue seen at
    # every read is the engine's own limit.
    interval_waiting: float | None = None
    # Totals (for /metrics and the reports).
    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0  # of the answered calls, for the mean wait for a place
    prefix_cache_hit_rate: float | None = None
    history: list[tuple[float, int]] = field(default_factory=list)  # (time, window) changes
    decisions: Counter[WindowReason] = field(default_factory=Counter)  # judged intervals, by why
    # Pace per answer token by concurrency, from answered calls (see bot.sched.p0_room).
    pace: dict[int, PacePoint] = field(default_factory=dict)

    @classmethod
    def create(cls, name: str, settings: WindowSettings, *, now_s: float = 0.0) -> Engine:
        state = initial_window(settings)
        return cls(
            name=name,
            settings=settings,
            state=state,
            now_s=now_s,
            interval_start_s=now_s,
            history=[(now_s, state.window)],
        )

    @property
    def window(self) -> int:
        return self.state.window

    def tick(self, now_s: float) -> None:
        """Account the time since the last event at the load it had."""
        elapsed = now_s - self.now_s
        if elapsed <= 0:
            return
        if self.in_flight > 0:
            self.busy_s += elapsed
            self.shared_s += elapsed / self.in_flight
            if self.in_flight >= self.window:
                self.interval_full_s += elapsed
        self.now_s = now_s

    def start(self, now_s: float) -> CallMark:
        """A call begins on this engine."""
        self.tick(now_s)
        self.in_flight += 1
        return CallMark(engine=self.name, started_s=now_s, shared_s=self.shared_s)

    def finish(
        self,
        mark: CallMark,
        now_s: float,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> float:
        """A call ended with an answer; returns its share of engine seconds."""
        share = self._end(mark, now_s)
        self.completed += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.interval_completed += 1
        self.interval_tokens += completion_tokens
        latency = now_s - mark.started_s
        self.interval_latency_s += latency
        self.latency_s += latency
        if share > 0 and completion_tokens > 0:
            # Mean concurrency over the call's life: its latency over its share.
            self.pace = add_point(
                self.pace,
                concurrency=latency / share,
                latency_per_token_s=latency / completion_tokens,
            )
        return share

    @property
    def p0_companions(self) -> int:
        """Calls that may run beside a P0 call here: configured, else learned."""
        if self.settings.p0_companions is not None:
            return self.settings.p0_companions
        return p0_companions(
            self.pace, max_slowdown=self.settings.p0_slowdown, ceiling=self.settings.ceiling
        )

    def fail(self, mark: CallMark, now_s: float, *, overloaded: bool) -> float:
        """A call ended without an answer; `overloaded` for 429/503/timeouts."""
        share = self._end(mark, now_s)
        self.failed += 1
        self.interval_overloads += int(overloaded)
        return share

    def abandon(self, mark: CallMark, now_s: float) -> float:
        """A call was taken back (preemption, shutdown): no outcome to learn from."""
        return self._end(mark, now_s)

    def _end(self, mark: CallMark, now_s: float) -> float:
        self.tick(now_s)
        self.in_flight = max(0, self.in_flight - 1)
        return max(0.0, self.shared_s - mark.shared_s)

    def observation(self, now_s: float, load: EngineLoad | None = None) -> WindowObservation:
        """The interval so far, as the window judges it."""
        self.tick(now_s)
        elapsed = now_s - self.interval_start_s
        return WindowObservation(
            elapsed_s=elapsed,
            completed=self.interval_completed,
            tokens=self.interval_tokens,
            latency_s=self.interval_latency_s,
            overloads=self.interval_overloads,
            full=elapsed > 0 and self.interval_full_s >= FULL_SHARE * elapsed,
            engine=load,
        )

    def saw_queue(self, waiting: float | None) -> None:
        """Fold one read of the engine's queue into the interval's least."""
        if waiting is None:
            return
        self.interval_waiting = (
            waiting if self.interval_waiting is None else min(self.interval_waiting, waiting)
        )

    def due(self, now_s: float) -> bool:
        """Whether the interval holds enough to judge (or trouble to react to at once)."""
        if self.interval_overloads > 0:
            return True
        return ready_to_judge(
            completed=self.interval_completed,
            elapsed_s=now_s - self.interval_start_s,
            window=self.window,
            settings=self.settings,
        )

    def adapt(self, now_s: float, load: EngineLoad | None = None) -> WindowDecision:
        """Judge the interval, move the window, start the next interval."""
        decision = adapt_window(self.state, self.observation(now_s, load), self.settings)
        if decision.window != self.state.window:
            self.history.append((now_s, decision.window))
        self.state = decision.state
        self.last_reason = decision.reason
        self.decisions[decision.reason] += 1
        self.interval_start_s = now_s
        self.interval_completed = self.interval_tokens = self.interval_overloads = 0
        self.interval_latency_s = self.interval_full_s = 0.0
        self.interval_waiting = None
        return decision

    @property
    def mean_call_s(self) -> float | None:
        """Mean latency of the answered calls; None before the first."""
        return self.latency_s / self.completed if self.completed else None

    def utilization(self, since_s: float = 0.0) -> float:
        """Share of wall time since `since_s` with at least one call in flight."""
        span = self.now_s - since_s
        return min(1.0, self.busy_s / span) if span > 0 else 0.0


def free_places(
    engine: Engine, *, running: int | None = None, p0_places: int = 0, p0_running: int = 0
) -> int:
    """Places left in the engine's window, counting `running` (all processes) when known.

    `p0_places` are the places above the window a P0 chunk may take: the window's ceiling
    stays under the server's --max-num-seqs by that much, so the engine admits it at once.
    While `p0_running` P0 calls run here, only their companions' places count (see
    bot.sched.p0_room); more P0 chunks are still admitted.
    """
    busy = engine.in_flight if running is None else max(running, engine.in_flight)
    places = engine.window + p0_places - busy
    if p0_running > 0 and p0_places == 0:
        places = min(places, p0_running + engine.p0_companions - busy)
    return max(0, places)


def choose_engine(
    engines: Sequence[Engine],
    *,
    running: Mapping[str, int] | None = None,
    p0_places: int = 0,
    p0_running: Mapping[str, int] | None = None,
) -> Engine | None:
    """The engine with the most free places, relative to its window; None when all are full.

    Relative room spreads chunks so that engines with small windows (slower or loaded
    servers) get fewer; then more places first; remaining ties go to the first engine in the
    order given (rotate it for round robin).
    """
    best: Engine | None = None
    best_key = (0.0, 0)
    for engine in engines:
        count = None if running is None else running.get(engine.name, 0)
        p0_count = 0 if p0_running is None else p0_running.get(engine.name, 0)
        places = free_places(engine, running=count, p0_places=p0_places, p0_running=p0_count)
        if places <= 0:
            continue
        key = (places / (engine.window + p0_places), places)
        if best is None or key > best_key:
            best, best_key = engine, key
    return best


def total_places(engines: Sequence[Engine]) -> int:
    """Chunks all windows hold together (the dispatcher's slots)."""
    return sum(engine.window for engine in engines)


__all__ = [
    "CallMark",
    "Engine",
    "choose_engine",
    "free_places",
    "total_places",
]
