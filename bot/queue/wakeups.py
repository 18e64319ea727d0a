"""Wake-ups sent after a write commits, in a transaction of their own, coalesced.

PostgreSQL serializes every committing transaction that NOTIFYs behind one lock, held through
that commit's WAL flush (PreCommit_Notify). A NOTIFY inside a write therefore makes each such
write wait for the flush of the one before it: in the queue profile, 84% of the enqueue's
samples waited on that lock (bench/results/queue_profile.md). A transaction that only NOTIFYs
writes nothing else, so it commits without waiting for a flush, and the write before it joins
the other commits' group flush.

No listener reads a payload: a wake-up only says "look again". So wake-ups asked for while a
send is in flight are coalesced into the next send (every channel asked for, in one
statement); each channel asked for goes out in a send that begins after the ask. A wake-up
lost to a crash between the commit and the send, or to a failing database, is covered by every
listener's poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from bot.errors import StoreError

log = logging.getLogger(__name__)


class Wakeups:
    """Coalesced NOTIFYs: `wake(*channels)` asks for a NOTIFY of each, sent after the call by a
    background task without holding up the caller (a failed send is logged, never raised)."""

    def __init__(self, send: Callable[[tuple[str, ...]], Awaitable[None]]) -> None:
        self._send = send
        self._asked: set[str] = set()
        self._sender: asyncio.Task[None] | None = None
        self._sent: Counter[str] = Counter()

    def wake(self, *channels: str) -> None:
        """Wake `channels`' listeners: by the next send that begins after this call. The
        caller does not wait for it: a writer's turn would then take a round trip more on a
        loop that is busy with the other writers."""
        if not channels:
            return
        self._asked.update(channels)
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send_while_asked())

    def sends(self, channel: str) -> int:
        """How many NOTIFYs went out on `channel` (wake-ups asked for minus those coalesced)."""
        return self._sent[channel]

    async def drain(self) -> None:
        """Wait for the send in flight (before the connection it uses is closed)."""
        while self._sender is not None:
            await asyncio.gather(self._sender, return_exceptions=True)

    async def _send_while_asked(self) -> None:
        try:
            while self._asked:
                channels, self._asked = tuple(sorted(self._asked)), set()
                try:
                    await self._send(channels)
                    self._sent.update(channels)
                except StoreError as exc:
                    log.warning(
                        "wake-up on %s not sent (listeners will poll): %s",
                        ", ".join(channels),
                        exc,
                    )
        finally:
            self._sender = None
