"""A queue consumer run as its own OS process by the concurrency test.

Usage: python -m tests.support.drain_worker DATABASE_URL OWNER
Prints the ids of the chunks it finished, one per line.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

from bot.model import LEVELS
from bot.queue.store import QueueSettings, QueueStore


async def drain(url: str, owner: str, *, announce: bool = False) -> list[int]:
    store = QueueStore.from_url(url, settings=QueueSettings(notify=False), pool_size=1)
    finished: list[int] = []
    try:
        if announce:
            await store.ping()
            sys.stdout.write("ready\n")
            sys.stdout.flush()
        while True:
            now = datetime.now(UTC)
            leased = await store.fetch_chunk(levels=LEVELS, owner=owner, now=now, lease_s=600)
            if leased is None:
                return finished
            await store.finish_chunk(
                leased.chunk.id, owner=owner, now=now, gpu_seconds=0.01, result={"by": owner}
            )
            finished.append(leased.chunk.id)
    finally:
        await store.close()


if __name__ == "__main__":
    ids = asyncio.run(drain(sys.argv[1], sys.argv[2], announce=True))
    sys.stdout.write("".join(f"{i}\n" for i in ids))
