"""Clocks: every decision takes `now` from one of these, never from the wall directly."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Protocol

EPOCH = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)  # a Monday morning: the start of virtual time


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """Wall-clock time in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class VirtualClock:
    """Time that moves only when told to (simulation and tests)."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self._now = start
        self.start = start
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float = 0.0, **delta: float) -> datetime:
        """Move forward by `seconds` and/or timedelta keywords (`minutes=5`)."""
        step = timedelta(seconds=seconds, **delta)
        if step < timedelta(0):
            raise ValueError("virtual time only moves forward")
        self._now += step
        return self._now

    async def sleep(self, seconds: float) -> None:
        """A sleep that moves virtual time instead of waiting, and is remembered."""
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)  # other tasks run meanwhile, as during a real wait

    def set(self, when: datetime) -> datetime:
        if when < self._now:
            raise ValueError("virtual time only moves forward")
        self._now = when
        return self._now

    def elapsed(self) -> float:
        return (self._now - self.start).total_seconds()
