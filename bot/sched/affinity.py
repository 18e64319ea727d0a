"""Prefix affinity: which engine a review's next chunk runs on, so its shared prompt is reused.

A review's chunks share the front of their prompts (the system prompt, then the pull
request's title and description: bot.review.prompts puts them first), which vLLM keeps in
its prefix cache after the first chunk: on that engine, the review's home, the next chunk
skips prefilling it. So a chunk goes home while the home's window has room. When it is full
the chunk may wait there for a place, or spill to an engine with room and prefill the shared
prompt again: it spills only when the wait is expected to cost more than that prefill.
Pure: names, counts and seconds in, a decision out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# Reviews whose home engine is remembered at once; the oldest are forgotten first.
MAX_HOMES = 4096

PlacementReason = Literal["home", "new review", "spill", "wait"]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a chunk runs (`engine`), or None: wait for a place on its home."""

    engine: str | None
    reason: PlacementReason


def expected_wait_s(*, mean_call_s: float | None, in_flight: int) -> float | None:
    """Seconds until a place frees on a full engine: `in_flight` calls of `mean_call_s`
    each, at random points of their lives, end one every `mean_call_s / in_flight` on
    average. None when the engine has not answered a call yet."""
    if mean_call_s is None or mean_call_s <= 0:
        return None
    return mean_call_s / max(1, in_flight)


def place_chunk(
    *,
    home: str | None,
    picked: str | None,
    free: Mapping[str, int],
    wait_s: float | None,
    waited_s: float,
    prefill_s: float,
) -> Placement:
    """Where the chunk of a review at home on `home` runs.

    `picked` is the engine the windows alone would choose (None: all are full), `free` the
    places each engine has, `wait_s` the expected wait for a place at home (None: unknown),
    `waited_s` how long the chunk has waited already, `prefill_s` what prefilling the
    review's shared prompt again elsewhere costs. Home while it has room; else spill to
    `picked` when the wait (what is left of it, or what was already spent) costs more than
    the prefill, or is unknown; else wait.
    """
    if home is None or home not in free:
        return Placement(picked, "new review")
    if free[home] > 0:
        return Placement(home, "home")
    if picked is None or picked == home:
        return Placement(None, "wait")
    if wait_s is None or waited_s >= prefill_s or waited_s + wait_s > prefill_s:
        return Placement(picked, "spill")
    return Placement(None, "wait")


@dataclass(slots=True)
class ReviewHomes:
    """The engine each review's first chunk ran on (its prefix is cached there)."""

    max_reviews: int = MAX_HOMES
    homes: OrderedDict[int, str] = field(default_factory=OrderedDict)

    def home_of(self, job_id: int) -> str | None:
        return self.homes.get(job_id)

    def settle(self, job_id: int, engine: str) -> None:
        """The review ran a chunk on `engine`: its home, unless it has one already."""
        if job_id in self.homes:
            self.homes.move_to_end(job_id)
            return
        self.homes[job_id] = engine
        while len(self.homes) > self.max_reviews:
            self.homes.popitem(last=False)

    def forget(self, job_id: int) -> None:
        self.homes.pop(job_id, None)


__all__ = [
    "MAX_HOMES",
    "Placement",
    "PlacementReason",
    "ReviewHomes",
    "expected_wait_s",
    "place_chunk",
]
