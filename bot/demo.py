"""`make demo`: the bot on embedded defaults, from an empty machine to printed results."""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from datetime import timedelta

from bot import devdb
from bot.clock import VirtualClock
from bot.config import Settings
from bot.db import upgrade_database
from bot.model import LEVELS, ChunkPlan, Level, PolicyDecision, ReviewRequest
from bot.queue.store import QueueStore


async def _queue_demo(url: str, *, jobs: int, consumers: int) -> None:
    await upgrade_database(url)
    store = QueueStore.from_url(url, pool_size=consumers + 1)
    clock = VirtualClock()
    try:
        for number in range(1, jobs + 1):
            level = Level(number % 4)
            request = ReviewRequest(
                forge="github",
                repo="acme/demo",
                number=number,
                title=f"change {number}",
                author="dev",
                author_is_bot=False,
                base_ref="main",
                head_ref=f"f/{number}",
                base_sha="0" * 40,
                head_sha=f"{number:040x}",
                event="pull_request",
                action="opened",
            )
            result = await store.submit_request(
                request, PolicyDecision(level=level, reasons=(f"demo {level}",)), now=clock.now()
            )
            assert result.job_id is not None
            plans = [ChunkPlan(files=({"path": f"f{i}.py"},), lines=20) for i in range(3)]
            await store.plan_job(result.job_id, plans, now=clock.now())
        print(f"enqueued {jobs} jobs x 3 chunks at levels P0..P3")
        taken: list[tuple[str, Level]] = []

        async def consume(owner: str) -> None:
            while True:
                leased = await store.fetch_chunk(
                    levels=LEVELS, owner=owner, now=clock.now(), lease_s=60
                )
                if leased is None:
                    return
                taken.append((owner, leased.chunk.level))
                outcome = await store.finish_chunk(
                    leased.chunk.id, owner=owner, now=clock.now(), gpu_seconds=1.0, result={}
                )
                if outcome.job_complete:
                    await store.finish_job(outcome.job_id, now=clock.now() + timedelta(seconds=1))

        await asyncio.gather(*(consume(f"consumer-{i}") for i in range(consumers)))
        print(f"{consumers} concurrent consumers took {len(taken)} chunks:")
        for owner, count in sorted(Counter(owner for owner, _ in taken).items()):
            print(f"  {owner}: {count}")
        first = [str(level) for _, level in taken[:12]]
        print("order of the first chunks taken (priority first):", " ".join(first))
        done = await store.list_jobs(limit=jobs)
        print("job states:", dict(Counter(job.state.value for job in done)))
    finally:
        await store.close()


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Provision an embedded database, migrate it and push a batch through the queue."""
    with devdb.provision_server() as server:

        async def run() -> None:
            async with devdb.scratch_database(server, "review_bot_demo") as url:
                await _queue_demo(url, jobs=40, consumers=4)

        asyncio.run(run())
    return 0
