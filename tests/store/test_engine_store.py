"""Chunks name their engine in the database: per-engine load for every process, and the report."""

from __future__ import annotations

import sqlalchemy as sa

from bot.clock import VirtualClock
from bot.model import LEVELS, Level
from bot.obs.reports import ReportOptions, build_report
from bot.queue.store import QueueStore
from tests.support.factories import decide, make_request, plans


async def _enqueue(store: QueueStore, clock: VirtualClock, number: int, *lines: int) -> int:
    result = await store.submit_request(
        make_request(number=number, head_sha=f"{number:040d}"), decide(Level.P1), now=clock.now()
    )
    assert result.job_id is not None
    await store.plan_job(result.job_id, plans(*lines), now=clock.now())
    return result.job_id


async def test_leases_name_their_engine_and_the_load_is_counted_per_engine(
    store: QueueStore, clock: VirtualClock
) -> None:
    await _enqueue(store, clock, 1, 10, 10, 10)
    await _enqueue(store, clock, 2, 10)
    assert await store.engine_load() == {}
    leases = []
    for owner, engine in (("a", "http://gpu0"), ("b", "http://gpu0"), ("a", "http://gpu1")):
        leased = await store.fetch_chunk(
            levels=LEVELS, owner=owner, now=clock.now(), lease_s=60, engine=engine
        )
        assert leased is not None and leased.extra["engine"] == engine
        leases.append((owner, leased))
    # A lease without an engine (a process that runs no windows) is not any engine's load.
    plain = await store.fetch_chunk(levels=LEVELS, owner="c", now=clock.now(), lease_s=60)
    assert plain is not None and plain.extra["engine"] is None
    # Two processes (owners a and b) share gpu0: both chunks count against its window.
    assert await store.engine_load() == {"http://gpu0": 2, "http://gpu1": 1}
    owner, first = leases[0]
    clock.advance(4)
    await store.finish_chunk(
        first.chunk.id,
        owner=owner,
        now=clock.now(),
        gpu_seconds=1.5,
        result={"status": "ok", "usage": {"prompt_tokens": 900, "completion_tokens": 120}},
    )
    assert await store.engine_load() == {"http://gpu0": 1, "http://gpu1": 1}
    async with store.engine.connect() as conn:
        rows = (await conn.execute(sa.text("SELECT * FROM report_engines"))).mappings().all()
    assert len(rows) == 1
    row = rows[0]
    assert row["engine"] == "http://gpu0" and row["chunks"] == 1
    assert (row["prompt_tokens"], row["completion_tokens"]) == (900, 120)
    assert float(row["gpu_s"]) == 1.5 and float(row["latency_s"]) == 4.0
    assert float(row["tokens_per_gpu_s"]) == 80.0
    report = await build_report(store.reports, "engines", ReportOptions())
    assert [(r["engine"], r["chunks"], r["completion_tokens"]) for r in report.rows] == [
        ("http://gpu0", 1, 120)
    ]
    assert "share of the batch" in report.notes[0]


async def test_the_dashboard_draws_each_engines_utilization(
    store: QueueStore, clock: VirtualClock
) -> None:
    from bot.obs.dashboard import read_dashboard, render_dashboard

    await _enqueue(store, clock, 1, 10, 10, 10)
    for engine, gpu_seconds in (
        ("http://gpu0", 600.0),
        ("http://gpu0", 300.0),
        ("http://gpu1", 360.0),
    ):
        leased = await store.fetch_chunk(
            levels=LEVELS, owner="d", now=clock.now(), lease_s=600, engine=engine
        )
        assert leased is not None
        await store.finish_chunk(
            leased.chunk.id,
            owner="d",
            now=clock.now(),
            gpu_seconds=gpu_seconds,
            result={"status": "ok", "usage": {"completion_tokens": 100}},
        )
    clock.advance(3600)
    view = await read_dashboard(store.monitoring, now=clock.now(), hours=1.0, thresholds={})
    assert [(work.engine, work.chunks) for work in view.engines] == [
        ("http://gpu0", 2),
        ("http://gpu1", 1),
    ]
    page = render_dashboard(view)
    # 900 of 3,600 s busy, and 360 of 3,600 s.
    assert 'data-engine="http://gpu0" data-value="0.250"' in page
    assert 'data-engine="http://gpu1" data-value="0.100"' in page
    assert '<table id="engines">' in page
