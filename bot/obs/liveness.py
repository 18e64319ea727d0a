"""Which dispatchers and engines are alive, from the heartbeats in the `dispatchers` table.

A dispatcher is alive while it has beaten within `stale_after_s` (three heartbeats) and has not
said it stopped. An engine is alive when some live dispatcher has it in rotation; dispatchers
that share engines count each engine once. The decisions are pure; `read_liveness` is the read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bot.config import DEFAULTS
from bot.queue.monitoring import MonitoringRecords

STALE_HEARTBEATS = 3
# Dispatchers that died this long ago still show on the dashboard, then drop off.
RECENT_S = 3600.0


def stale_after(heartbeat_s: float) -> float:
    """How long without a beat before a dispatcher counts as dead."""
    return STALE_HEARTBEATS * heartbeat_s


# The staleness of an unconfigured bot's dispatchers (REVIEW_BOT_HEARTBEAT_S at its default).
DEFAULT_STALE_S = stale_after(DEFAULTS.scheduler.heartbeat_s)


@dataclass(frozen=True, slots=True)
class DispatcherBeat:
    """One dispatcher's last heartbeat."""

    name: str
    last_seen: datetime
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    host: str = ""
    pid: int = 0
    slots: int = 0
    running: int = 0
    engines: Mapping[str, bool] | None = None  # engine name -> in rotation
    # engine name -> share of prompt tokens its vLLM served from the prefix cache (where known)
    prefix_cache_hit_rate: Mapping[str, float] | None = None

    def alive(self, *, now: datetime, stale_after_s: float) -> bool:
        return self.stopped_at is None and now - self.last_seen <= timedelta(seconds=stale_after_s)


@dataclass(frozen=True, slots=True)
class Liveness:
    """How many dispatchers and engines are alive, and the recent dispatchers behind that."""

    dispatchers: int
    engines: int
    engines_known: int
    beats: tuple[DispatcherBeat, ...] = ()
    # engine name -> prefix-cache hit rate, from the freshest live dispatcher that knows it
    prefix_cache_hit_rate: Mapping[str, float] | None = None

    def to_dict(self) -> dict[str, int]:
        return {
            "dispatchers_alive": self.dispatchers,
            "engines_alive": self.engines,
            "engines_known": self.engines_known,
        }


def summarize_liveness(
    beats: Iterable[DispatcherBeat], *, now: datetime, stale_after_s: float
) -> Liveness:
    """Count live dispatchers and the distinct engines they have in rotation."""
    recent = tuple(beats)
    alive = [beat for beat in recent if beat.alive(now=now, stale_after_s=stale_after_s)]
    known: set[str] = set()
    in_rotation: set[str] = set()
    hit_rates: dict[str, float] = {}
    for beat in sorted(alive, key=lambda beat: beat.last_seen):
        hit_rates.update(beat.prefix_cache_hit_rate or {})
    for beat in alive:
        for name, healthy in (beat.engines or {}).items():
            known.add(name)
            if healthy:
                in_rotation.add(name)
    return Liveness(
        dispatchers=len(alive),
        engines=len(in_rotation),
        engines_known=len(known),
        beats=recent,
        prefix_cache_hit_rate=hit_rates,
    )


def no_dispatcher_message(
    liveness: Liveness,
    *,
    waiting_jobs: int,
    oldest_wait_s: float,
    grace_s: float,
    watched_s: float | None = None,
    stale_after_s: float = 0.0,
) -> str | None:
    """The alert when ready work has waited past `grace_s` and no dispatcher is alive.

    `watched_s`: how long this process has watched. Until it has watched one stale window
    (`stale_after_s`, three heartbeats) a dispatcher starting beside it may not have beaten yet,
    so its absence says nothing.
    """
    if watched_s is not None and watched_s < stale_after_s:
        return None
    if liveness.dispatchers > 0 or waiting_jobs == 0 or oldest_wait_s <= grace_s:
        return None
    return (
        f"no dispatcher is alive and {waiting_jobs} review(s) wait (the oldest for "
        f"{oldest_wait_s:.0f} s): start `bot serve --role dispatcher` or check why it stopped"
    )


def beat_from_row(row: Mapping[str, Any]) -> DispatcherBeat:
    """A `dispatchers` row as a DispatcherBeat."""
    engines = row.get("engines") or []
    return DispatcherBeat(
        name=str(row["name"]),
        last_seen=row["last_seen"],
        started_at=row.get("started_at"),
        stopped_at=row.get("stopped_at"),
        host=str(row.get("host") or ""),
        pid=int(row.get("pid") or 0),
        slots=int(row.get("slots") or 0),
        running=int(row.get("running") or 0),
        engines={
            str(item["name"]): bool(item.get("alive"))
            for item in engines
            if isinstance(item, Mapping) and "name" in item
        },
        prefix_cache_hit_rate={
            str(item["name"]): float(item["prefix_cache_hit_rate"])
            for item in engines
            if isinstance(item, Mapping)
            and "name" in item
            and isinstance(item.get("prefix_cache_hit_rate"), int | float)
        },
    )


async def read_liveness(
    monitoring: MonitoringRecords, *, now: datetime, stale_after_s: float
) -> Liveness:
    """Read recent heartbeats and count what is alive; raises StoreUnavailable/StoreError."""
    since = now - timedelta(seconds=max(RECENT_S, stale_after_s))
    rows = await monitoring.dispatchers(since=since)
    beats: Sequence[DispatcherBeat] = [beat_from_row(dict(row._mapping)) for row in rows]
    return summarize_liveness(beats, now=now, stale_after_s=stale_after_s)
