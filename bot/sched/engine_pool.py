"""The dispatcher's engines: which engine a leased chunk goes to, and what its end teaches.

Thin I/O around bot.sched.engines and bot.sched.window: what runs on each engine is read from
the database (every process's leases name their engine), a call's start and end are booked on
its engine, every call's end reads its vLLM /metrics (where a probe is given), and when an
engine's interval is due its window moves.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime

from bot.config import WindowSettings
from bot.llm.vllm_metrics import EngineMetrics, engine_load, prefix_cache_hit_rate
from bot.obs.metrics import Metrics
from bot.queue.records import EngineRunning
from bot.sched.affinity import Placement, ReviewHomes, expected_wait_s, place_chunk
from bot.sched.engines import CallMark, Engine, choose_engine, free_places, total_places
from bot.sched.p0_room import SharingCall, calls_to_take_back
from bot.sched.window import WindowDecision

log = logging.getLogger(__name__)

# Reads an engine's /metrics by its name (base URL); None when it says nothing.
EngineProbe = Callable[[str], Awaitable[EngineMetrics | None]]


class EnginePool:
    """Engines with windows, the calls running on them, and the per-engine load in the database."""

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        p0_places: int = 1,
        probe: EngineProbe | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        names = [engine.name for engine in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must differ, got {names}")
        self.engines = list(engines)
        self.p0_places = p0_places
        self.probe = probe
        self.metrics = metrics
        self.running: dict[str, int] = {}
        self.p0_running: dict[str, int] = {}
        self.marks: dict[int, CallMark] = {}
        self._p0_chunks: set[int] = set()
        self._scraped: dict[str, EngineMetrics] = {}
        # Each review's home engine, where its shared prompt is in the prefix cache.
        self.homes = ReviewHomes()
        self._busy_shown: dict[str, float] = {}

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        window: WindowSettings,
        *,
        now: datetime,
        p0_places: int = 1,
        probe: EngineProbe | None = None,
        metrics: Metrics | None = None,
    ) -> EnginePool:
        """One engine per name, each with the same window bounds."""
        engines = [Engine.create(name, window, now_s=now.timestamp()) for name in names]
        return cls(engines, p0_places=p0_places, probe=probe, metrics=metrics)

    def by_name(self, name: str) -> Engine | None:
        return next((engine for engine in self.engines if engine.name == name), None)

    @property
    def capacity(self) -> int:
        """Chunks the windows hold together (the scheduler's slots)."""
        return total_places(self.engines)

    @property
    def free(self) -> int:
        """Free places in all windows (P0's places above them not counted)."""
        return sum(
            free_places(
                engine,
                running=self.running.get(engine.name),
                p0_running=self.p0_running.get(engine.name, 0),
            )
            for engine in self.engines
        )

    async def refresh(
        self, engine_load_in_database: Callable[[], Awaitable[dict[str, EngineRunning]]]
    ) -> None:
        """Read what runs on each engine in every process."""
        counts = await engine_load_in_database()
        self.running = {name: count.running for name, count in counts.items()}
        self.p0_running = {name: count.p0 for name, count in counts.items()}

    def pick(self, *, p0: bool) -> Engine | None:
        """The engine for the next chunk; with `p0`, places above the windows count too."""
        # Rotate so ties spread over engines instead of always going to the first.
        if self.engines:
            self.engines.append(self.engines.pop(0))
        return choose_engine(
            self.engines,
            running=self.running,
            p0_places=self.p0_places if p0 else 0,
            p0_running=self.p0_running,
        )

    def place(self, job_id: int, picked: Engine | None, *, waited_s: float) -> Placement:
        """Where a chunk of review `job_id` runs: its home while it has room (see
        bot.sched.affinity), else `picked` (the windows' choice) or a wait for home."""
        home = self.by_name(self.homes.home_of(job_id) or "")
        free = {
            engine.name: free_places(
                engine,
                running=self.running.get(engine.name),
                p0_running=self.p0_running.get(engine.name, 0),
            )
            for engine in self.engines
        }
        wait_s = None
        if home is not None:
            busy = max(self.running.get(home.name, 0), home.in_flight)
            wait_s = expected_wait_s(mean_call_s=home.mean_call_s, in_flight=busy)
        return place_chunk(
            home=None if home is None else home.name,
            picked=None if picked is None else picked.name,
            free=free,
            wait_s=wait_s,
            waited_s=waited_s,
            prefill_s=home.settings.affinity_prefill_s if home is not None else 0.0,
        )

    def take(self, engine: Engine, chunk_id: int, now: datetime, *, p0: bool = False) -> None:
        """A chunk was leased to run on `engine` (`p0`: at level P0)."""
        self.marks[chunk_id] = engine.start(now.timestamp())
        self.running[engine.name] = self.running.get(engine.name, 0) + 1
        if p0:
            self._p0_chunks.add(chunk_id)
            self.p0_running[engine.name] = self.p0_running.get(engine.name, 0) + 1

    def to_take_back(self, ours: dict[str, list[SharingCall]]) -> list[int]:
        """This process's lower-level calls that give way to P0 calls on their engines.

        `ours` lists, per engine name, this process's running lower-level calls there.
        """
        victims: list[int] = []
        for engine in self.engines:
            p0_count = self.p0_running.get(engine.name, 0)
            if p0_count <= 0:
                continue
            victims += calls_to_take_back(
                running=max(self.running.get(engine.name, 0), engine.in_flight),
                p0_running=p0_count,
                companions=engine.p0_companions,
                ours=ours.get(engine.name, []),
                typical_tokens=engine.completion_tokens / engine.completed
                if engine.completed
                else None,
            )
        return victims

    def engine_of(self, chunk_id: int) -> str | None:
        mark = self.marks.get(chunk_id)
        return None if mark is None else mark.engine

    def _release(self, chunk_id: int) -> tuple[Engine, CallMark] | None:
        mark = self.marks.pop(chunk_id, None)
        if mark is None:
            return None
        engine = self.by_name(mark.engine)
        if engine is None:
            return None
        self.running[engine.name] = max(0, self.running.get(engine.name, 0) - 1)
        if chunk_id in self._p0_chunks:
            self._p0_chunks.discard(chunk_id)
            self.p0_running[engine.name] = max(0, self.p0_running.get(engine.name, 0) - 1)
        return engine, mark

    async def finished(
        self,
        chunk_id: int,
        now: datetime,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        overloads: int = 0,
    ) -> float | None:
        """A chunk's call answered; returns its share of engine seconds (None: not ours)."""
        released = self._release(chunk_id)
        if released is None:
            return None
        engine, mark = released
        share = engine.finish(
            mark,
            now.timestamp(),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )
        engine.interval_overloads += overloads
        await self._judge(engine, now)
        return share

    async def failed(self, chunk_id: int, now: datetime, *, overloaded: bool) -> float | None:
        """A chunk's call failed; refusals for load and timeouts shrink the window at once."""
        released = self._release(chunk_id)
        if released is None:
            return None
        engine, mark = released
        share = engine.fail(mark, now.timestamp(), overloaded=overloaded)
        await self._judge(engine, now)
        return share

    def abandoned(self, chunk_id: int, now: datetime) -> float | None:
        """A chunk's call was taken back (preemption, crash, shutdown): nothing to learn."""
        released = self._release(chunk_id)
        if released is None:
            return None
        engine, mark = released
        return engine.abandon(mark, now.timestamp())

    async def _judge(self, engine: Engine, now: datetime) -> WindowDecision | None:
        now_s = now.timestamp()
        # Every call's end reads the engine's queue, so that the interval is judged by the
        # queue it held throughout, not by one read that met a request on its way in.
        scraped = await self.probe(engine.name) if self.probe is not None else None
        if scraped is not None:
            engine.saw_queue(scraped.requests_waiting)
        if not engine.due(now_s):
            self._show(engine)
            return None
        load = None
        if scraped is not None:
            previous = self._scraped.get(engine.name)
            load = replace(engine_load(previous, scraped), requests_waiting=engine.interval_waiting)
            rate = prefix_cache_hit_rate(previous, scraped)
            if rate is not None:
                engine.prefix_cache_hit_rate = rate
            self._scraped[engine.name] = scraped
        before = engine.window
        observation = engine.observation(now_s, load)
        decision = engine.adapt(now_s, load)
        if decision.window != before:
            log.info(
                "engine %s window %s -> %s (%s; %.1f tokens/s)",
                engine.name,
                before,
                decision.window,
                decision.reason,
                observation.tokens_per_s,
                extra={
                    "action": "engine_window",
                    "engine": engine.name,
                    "window": decision.window,
                    "reason": decision.reason,
                },
            )
        self._show(engine, tokens_per_s=observation.tokens_per_s)
        return decision

    def _show(self, engine: Engine, *, tokens_per_s: float | None = None) -> None:
        if self.metrics is None:
            return
        shown = self._busy_shown.get(engine.name, 0.0)
        self._busy_shown[engine.name] = engine.busy_s
        self.metrics.show_engine(
            engine.name,
            window=engine.window,
            in_flight=engine.in_flight,
            tokens_per_s=tokens_per_s,
            prefix_cache_hit_rate=engine.prefix_cache_hit_rate,
            busy_s=engine.busy_s - shown,
            p0_companions=engine.p0_companions,
        )


__all__ = ["EnginePool", "EngineProbe"]
