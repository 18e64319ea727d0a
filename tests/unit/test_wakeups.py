"""Wake-ups after a commit: sent in the background, coalesced into the next send, each ask
covered by a send that began after it, a failed send logged and never raised."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from bot.errors import StoreUnavailable
from bot.queue.wakeups import Wakeups


class GatedSend:
    """A send whose every NOTIFY waits for the test to open its own gate."""

    def __init__(self, *, open_gates: bool = False) -> None:
        self.began: list[tuple[str, ...]] = []
        self.gates: list[asyncio.Event] = []
        self.open_gates = open_gates
        self.failures = 0

    async def __call__(self, channels: tuple[str, ...]) -> None:
        gate = asyncio.Event()
        if self.open_gates:
            gate.set()
        self.began.append(channels)
        self.gates.append(gate)
        await gate.wait()
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("database restarting")


async def settle(condition: Callable[[], bool]) -> None:
    """Let the loop run the tasks ready to run until `condition` holds (no timers involved)."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_wake_ups_asked_for_during_a_send_share_the_next_one() -> None:
    send = GatedSend()
    wakeups = Wakeups(send)
    wakeups.wake("queue")
    await settle(lambda: len(send.began) == 1)
    for _ in range(4):
        wakeups.wake("queue")
    wakeups.wake("status", "queue")
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(send.began) == 1  # the asks made during the send wait for the next one
    send.gates[0].set()
    await settle(lambda: len(send.began) == 2)
    send.gates[1].set()
    await wakeups.drain()
    assert send.began == [("queue",), ("queue", "status")]
    assert (wakeups.sends("queue"), wakeups.sends("status")) == (2, 1)


async def test_an_ask_alone_is_sent_at_once_and_drain_waits_for_it() -> None:
    send = GatedSend(open_gates=True)
    wakeups = Wakeups(send)
    for _ in range(3):
        wakeups.wake("queue")
        await wakeups.drain()
    wakeups.wake()  # no channel, nothing to send
    await wakeups.drain()
    assert send.began == [("queue",)] * 3
    assert wakeups.sends("queue") == 3


async def test_the_asker_never_waits_for_the_send() -> None:
    send = GatedSend()  # every send blocks until its gate opens
    wakeups = Wakeups(send)
    wakeups.wake("queue")  # returns at once: nothing to await
    await settle(lambda: len(send.began) == 1)
    assert wakeups.sends("queue") == 0
    send.gates[0].set()
    await wakeups.drain()
    assert wakeups.sends("queue") == 1


async def test_a_failed_send_is_logged_not_raised_and_the_next_wake_sends_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    send = GatedSend(open_gates=True)
    send.failures = 1
    wakeups = Wakeups(send)
    with caplog.at_level(logging.WARNING, logger="bot.queue.wakeups"):
        wakeups.wake("queue")
        await wakeups.drain()
    assert "wake-up on queue not sent" in caplog.text
    assert wakeups.sends("queue") == 0
    wakeups.wake("queue")
    await wakeups.drain()
    assert wakeups.sends("queue") == 1
    assert send.began == [("queue",), ("queue",)]
