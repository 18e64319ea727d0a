"""One process lifecycle: every long-running loop is a cleanup_ctx-style async context.

A context is an async generator function of the `Process`, as aiohttp's `cleanup_ctx` takes
one of the application: before its one `yield` it starts its part (a loop, a server, a
connection), after it it stops that part and waits for it. `running` starts contexts in order
and stops them in reverse order, also when one of them fails to start, so no task outlives
the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any

from bot.errors import StartError

log = logging.getLogger(__name__)


class Process:
    """What the contexts of one process share: the `stopping` event and the loops to watch."""

    def __init__(self, stopping: asyncio.Event | None = None) -> None:
        # Set first on the way out (a signal, the end of the caller's block): whatever takes
        # work stops taking it at once, before any context is stopped.
        self.stopping = stopping if stopping is not None else asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []

    def stop(self) -> None:
        """Ask the process to stop (what SIGTERM does)."""
        self.stopping.set()

    def start_loop(self, loop: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        """Run `loop` as a task `wait` watches: a loop that ends, by failing or not, ends it."""
        task = asyncio.create_task(loop, name=name)
        self._loops.append(task)
        return task

    async def wait(self) -> None:
        """Until `stop()` or until a loop ends; raises the failure of a loop that failed."""
        stopped = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait([stopped, *self._loops], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        for task in self._loops:
            failure = task.exception() if task.done() and not task.cancelled() else None
            if failure is not None:
                raise failure


Context = Callable[[Process], AsyncIterator[None]]


async def finish_loop(task: asyncio.Task[None], *, within_s: float | None = None) -> None:
    """Wait for a loop told to stop to end (cancelled after `within_s`, if given); its failure
    is logged, not raised: `Process.wait` has raised it already, and the other contexts must
    still stop."""
    done, _ = await asyncio.wait([task], timeout=within_s)
    if not done:
        task.cancel()
        await asyncio.wait([task])
    failure = None if task.cancelled() else task.exception()
    if failure is not None:
        log.error(
            "background task %s failed: %r",
            task.get_name(),
            failure,
            extra={"action": "serve_error"},
        )


def cancelled_at_stop(name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> Context:
    """A context for a loop that runs until it is cancelled (a heartbeat): `loop()` starts
    before the `yield`; after it, the loop is cancelled and waited for."""

    async def context(process: Process) -> AsyncIterator[None]:
        task = process.start_loop(loop(), name=name)
        yield
        task.cancel()
        await finish_loop(task)

    context.__name__ = name
    return context


def closing(name: str, close: Callable[[], Awaitable[None]]) -> Context:
    """A context that starts nothing and calls `close` when it stops (a pool, a client)."""

    async def context(process: Process) -> AsyncIterator[None]:
        yield
        await close()

    context.__name__ = name
    return context


@contextlib.asynccontextmanager
async def running(
    contexts: Sequence[Context], *, stopping: asyncio.Event | None = None
) -> AsyncIterator[Process]:
    """Start `contexts` in order; on the way out set `stopping`, then stop them in reverse.

    Raises StartError (naming the context, from its error) when one fails to start, after
    stopping those started before it.
    """
    process = Process(stopping)
    async with contextlib.AsyncExitStack() as started:
        try:
            for context in contexts:
                name = getattr(context, "__name__", repr(context))
                generator = context(process)
                try:
                    await anext(generator)
                except StopAsyncIteration:
                    raise StartError(name, RuntimeError("it ended before its yield")) from None
                except Exception as exc:
                    raise StartError(name, exc) from exc
                started.push_async_callback(_stop, name, generator)
            yield process
        finally:
            process.stop()


async def _stop(name: str, generator: AsyncIterator[None]) -> None:
    """Run a context's code after its `yield`, as aiohttp's cleanup_ctx does."""
    try:
        await anext(generator)
    except StopAsyncIteration:
        return
    raise RuntimeError(f"{name} has more than one yield")


__all__ = ["Context", "Process", "cancelled_at_stop", "closing", "finish_loop", "running"]
