"""A dispatcher's heartbeat in the database, so the web role can tell whether any is alive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bot.clock import Clock
from bot.errors import StoreError
from bot.queue.monitoring import MonitoringRecords
from bot.sched.engine_pool import EnginePool

log = logging.getLogger(__name__)

# Rows of dispatchers gone this long are deleted by the next beat of any other.
FORGET_AFTER = timedelta(days=7)


def backend_engines(backend: object, pool: EnginePool | None = None) -> list[dict[str, Any]]:
    """The engines a backend feeds, whether each is in rotation, and each window's load.

    The OpenAI-compatible backend has one worker per server, each healthy or ejected; any
    other backend (in-process vLLM, simulated) is one engine that is there while it is. With
    an engine pool, each engine also carries its window, chunks in flight and utilization.
    """
    workers = getattr(backend, "workers", None)
    if isinstance(workers, list) and workers:
        engines = [
            {"name": str(getattr(worker, "base_url", index)), "alive": bool(worker.healthy)}
            for index, worker in enumerate(workers)
            if hasattr(worker, "healthy")
        ]
    elif pool is not None:
        engines = [{"name": engine.name, "alive": True} for engine in pool.engines]
    else:
        engines = [{"name": type(backend).__name__, "alive": True}]
    if pool is not None:
        for entry in engines:
            engine = pool.by_name(str(entry["name"]))
            if engine is not None:
                entry.update(
                    window=engine.window,
                    in_flight=engine.in_flight,
                    utilization=round(engine.utilization(engine.history[0][0]), 4),
                    prefix_cache_hit_rate=engine.prefix_cache_hit_rate,
                )
    return engines


@dataclass(slots=True)
class Presence:
    """Writes one dispatcher's row in `dispatchers`: a beat now and then, a goodbye at stop."""

    monitoring: MonitoringRecords
    name: str
    slots: int
    engines: Callable[[], list[dict[str, Any]]]
    running: Callable[[], int]
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    started_at: datetime | None = None

    async def beat(self, *, now: datetime) -> None:
        """Say this dispatcher is alive at `now`; raises StoreUnavailable/StoreError."""
        if self.started_at is None:
            self.started_at = now
        await self.monitoring.beat(
            name=self.name,
            host=self.host,
            pid=self.pid,
            started_at=self.started_at,
            now=now,
            slots=self.slots,
            running=self.running(),
            engines=self.engines(),
            forget_before=now - FORGET_AFTER,
        )

    async def leave(self, *, now: datetime) -> None:
        """Say this dispatcher stopped (so it does not read as crashed); raises StoreError."""
        await self.monitoring.leave(name=self.name, now=now)


async def keep_present(presence: Presence, *, clock: Clock, interval_s: float) -> None:
    """Beat every `interval_s` until cancelled, then say goodbye; an outage is logged, retried."""
    try:
        while True:
            try:
                await presence.beat(now=clock.now())
            except StoreError as exc:
                log.warning(
                    "dispatcher heartbeat not written: %s",
                    exc,
                    extra={"action": "presence_failed", "dispatcher": presence.name},
                )
            await asyncio.sleep(interval_s)
    finally:
        with contextlib.suppress(StoreError):
            await presence.leave(now=clock.now())
