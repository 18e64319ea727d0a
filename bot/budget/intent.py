"""What the write a forge call is about to make is for: set by the caller, read by the budget.

The forge clients' signatures stay forge-shaped; the poster and the status publisher say which
job (and level) their writes serve, and the publisher whether a write may wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from bot.budget.decide import WriteValue
from bot.errors import ForgeError

DEFAULT_LEVEL = 2  # a write no job names ranks as an ordinary review's


@dataclass(frozen=True, slots=True)
class WriteIntent:
    """The job a write serves, its level, what it sets, and whether it may wait."""

    level: int = DEFAULT_LEVEL
    job_id: int | None = None
    value: WriteValue | None = None  # None: the forge call's own kind decides
    target: str | None = None  # a newer write to the same target replaces this one
    # How long the write may wait for room; past it WriteDeferred is raised (None: no bound).
    max_wait_s: float | None = None


_CURRENT: ContextVar[WriteIntent | None] = ContextVar("review_bot_write_intent", default=None)


@contextmanager
def writing(intent: WriteIntent) -> Iterator[WriteIntent]:
    """Make `intent` the intent of the forge writes made inside the block."""
    token = _CURRENT.set(intent)
    try:
        yield intent
    finally:
        _CURRENT.reset(token)


def current_intent() -> WriteIntent | None:
    """The intent set by the innermost `writing` block, if any."""
    return _CURRENT.get()


class WriteHeld(ForgeError):
    """The budget did not let this write out; the caller decides when to try again."""

    @property
    def retryable(self) -> bool:
        return False


class WriteDropped(WriteHeld):
    """News the budget could not afford: dropped, a later state says more."""


class WriteSuperseded(WriteHeld):
    """A newer write to the same target was asked for: this one is coalesced into it."""


class WriteDeferred(WriteHeld):
    """No room soon enough for the caller; `retry_after` says when room comes."""


__all__ = [
    "DEFAULT_LEVEL",
    "WriteDeferred",
    "WriteDropped",
    "WriteHeld",
    "WriteIntent",
    "WriteSuperseded",
    "current_intent",
    "writing",
]
