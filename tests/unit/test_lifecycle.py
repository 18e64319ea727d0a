"""One process lifecycle: contexts start in order and stop in reverse, a part that does not
start stops the parts started before it, and a loop that fails ends the process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from bot.errors import StartError
from bot.lifecycle import Context, Process, cancelled_at_stop, finish_loop, running


def looping(name: str, said: list[str]) -> Context:
    """A context whose loop runs until its context stops it; it says what happens to it."""

    async def context(process: Process) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = process.start_loop(stop.wait(), name=name)  # type: ignore[arg-type]
        said.append(f"start {name}")
        yield
        said.append(f"stop {name} (stopping: {process.stopping.is_set()})")
        stop.set()
        await finish_loop(task)

    context.__name__ = name
    return context


def refusing(name: str) -> Context:
    async def context(process: Process) -> AsyncIterator[None]:
        raise OSError(98, "Address already in use")
        yield  # pragma: no cover

    context.__name__ = name
    return context


_BEFORE: set[asyncio.Task[object]] = set()


@pytest.fixture(autouse=True)
async def tasks_before() -> None:
    """The tasks already in the loop (a worker's loop runs every test of its session): a task
    another test left behind is that test's failure, not this one's."""
    _BEFORE.clear()
    _BEFORE.update(asyncio.all_tasks())


def other_tasks() -> set[asyncio.Task[object]]:
    """Tasks started since the test began, besides the test's own."""
    return asyncio.all_tasks() - {asyncio.current_task()} - _BEFORE  # type: ignore[operator]


async def test_contexts_start_in_order_and_stop_in_reverse_once_stopping_is_set() -> None:
    said: list[str] = []
    async with running([looping("first", said), looping("second", said)]) as process:
        assert said == ["start first", "start second"]
        assert not process.stopping.is_set()
    assert said == [
        "start first",
        "start second",
        "stop second (stopping: True)",
        "stop first (stopping: True)",
    ]
    assert other_tasks() == set()


async def test_a_context_that_does_not_start_stops_those_started_before_it() -> None:
    said: list[str] = []
    contexts = [looping("first", said), looping("second", said), refusing("third")]
    contexts.append(looping("fourth", said))
    with pytest.raises(StartError, match=r"^third did not start: OSError: .*in use") as raised:
        async with running(contexts):
            raise AssertionError("the process ran with a part that did not start")
    assert raised.value.part == "third"
    assert isinstance(raised.value.__cause__, OSError)
    assert said == [
        "start first",
        "start second",
        "stop second (stopping: True)",
        "stop first (stopping: True)",
    ]
    assert other_tasks() == set()  # no loop left running


async def test_a_failing_loop_ends_the_wait_with_its_failure_and_every_context_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said: list[str] = []

    async def failing(process: Process) -> AsyncIterator[None]:
        async def crash() -> None:
            raise ValueError("the loop broke")

        task = process.start_loop(crash(), name="crashing")
        yield
        said.append("stop failing")
        await finish_loop(task)

    with (
        caplog.at_level(logging.ERROR, logger="bot.lifecycle"),
        pytest.raises(ValueError, match="the loop broke"),
    ):
        async with running([looping("first", said), failing]) as process:
            await asyncio.wait_for(process.wait(), timeout=10)
    assert said == ["start first", "stop failing", "stop first (stopping: True)"]
    assert "background task crashing failed: ValueError('the loop broke')" in caplog.text
    assert other_tasks() == set()


async def test_the_wait_ends_when_the_process_is_asked_to_stop() -> None:
    stopping = asyncio.Event()
    said: list[str] = []
    async with running([looping("first", said)], stopping=stopping) as process:
        asyncio.get_running_loop().call_soon(stopping.set)  # what SIGTERM does in bot serve
        await asyncio.wait_for(process.wait(), timeout=10)
    assert said == ["start first", "stop first (stopping: True)"]


async def test_a_heartbeat_is_cancelled_at_stop_and_says_goodbye_before_the_next_stops() -> None:
    said: list[str] = []

    async def beat() -> None:
        try:
            await asyncio.Event().wait()  # beats until cancelled, as keep_present does
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # its goodbye, a write, is awaited
            said.append("goodbye")
            raise

    async with running([looping("first", said), cancelled_at_stop("heartbeat", beat)]):
        await asyncio.sleep(0)  # the heartbeat runs while the process does
    assert said == ["start first", "goodbye", "stop first (stopping: True)"]
    assert other_tasks() == set()
