"""Databases filled by a real replay, for the report, metrics and dashboard tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from bot import devdb
from bot.sim.replay import replay_trace
from bot.sim.trace import Trace, TraceShape, generate_trace

SMALL_SHAPE = TraceShape(
    requests=80,
    duration_s=1200.0,
    peak_at_s=400.0,
    peak_width_s=150.0,
    hotfix_per_1000=60,
    depends_per_1000=40,
    workers=2,
)


def small_trace(seed: int = 7, requests: int = 80) -> Trace:
    """A short morning with a burst: enough load on two workers that jobs really wait."""
    return generate_trace(replace(SMALL_SHAPE, requests=requests), seed=seed, scenario="obs")


@asynccontextmanager
async def replayed_database(
    pg_server: str,
    template: str,
    *,
    policy: str = "mlfq",
    trace: Trace | None = None,
    workers: int = 2,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A database copied from the migrated template, filled by replaying `trace`."""
    name = devdb.unique_database_name("rbt_obs")
    url = await devdb.create_database(pg_server, name, template=template)
    try:
        summary = await replay_trace(
            trace or small_trace(),
            policy=policy,  # type: ignore[arg-type]
            database_url=url,
            workers=workers,
        )
        yield url, summary
    finally:
        await devdb.drop_database(pg_server, name)
