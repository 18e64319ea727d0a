"""The replay's engines under the batching cost model (bot.llm.batching): where chunks run.

With `bot simulate --batching PROFILE`, each of the trace's workers is an engine that runs the
window of chunks the dispatcher gives it, and a chunk ends when the engine's batch has done
its work, not after a fixed time: the more chunks in flight, the longer each takes and the more
the engine makes in all. The simulated backend still says what a chunk costs alone (the trace's
cost model); the engine model turns that into time under the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.llm.base import CallProgress
from bot.llm.batching import BatchedEngine, BatchingProfile, Finished
from bot.queue.store import Leased
from bot.sched.ports import ReviewedChunk


@dataclass(frozen=True, slots=True)
class Completion:
    """A chunk whose call ended on its engine."""

    leased: Leased
    review: ReviewedChunk
    finished: Finished


class BatchedEngines:
    """One modelled engine per name; chunks admitted with what they cost alone."""

    def __init__(self, profile: BatchingProfile, names: Sequence[str]) -> None:
        self.profile = profile
        self.models = {name: BatchedEngine(profile) for name in names}
        self._running: dict[int, tuple[str, Leased, ReviewedChunk]] = {}

    @property
    def busy(self) -> bool:
        return bool(self._running)

    def admit(self, engine: str, leased: Leased, review: ReviewedChunk, now_s: float) -> None:
        """Start a leased chunk on `engine`; `review.gpu_seconds` is its cost alone."""
        chunk = leased.chunk
        self._running[chunk.id] = (engine, leased, review)
        self.models[engine].admit(
            chunk.id, solo_s=review.gpu_seconds, lines=chunk.lines, now_s=now_s
        )

    def progress(self, chunk_id: int) -> CallProgress | None:
        """How far a running chunk's answer has come on its engine (as a stream would say)."""
        entry = self._running.get(chunk_id)
        if entry is None:
            return None
        state = self.models[entry[0]].progress(chunk_id)
        if state is None:
            return None
        made, expected = state
        return CallProgress(completion_tokens=made, expected_tokens=expected)

    def next_event_s(self) -> float | None:
        """The earliest time an engine's batch changes (a prefill or a call ends)."""
        times = [t for model in self.models.values() if (t := model.next_event_s()) is not None]
        return min(times) if times else None

    def advance(self, now_s: float) -> list[Completion]:
        """Run every engine up to `now_s`; the chunks that finished, in order."""
        done: list[Completion] = []
        for model in self.models.values():
            for finished in model.advance(now_s):
                chunk_id = int(str(finished.key))
                _, leased, review = self._running.pop(chunk_id)
                done.append(Completion(leased=leased, review=review, finished=finished))
        done.sort(key=lambda completion: (completion.finished.at_s, completion.leased.chunk.id))
        return done

    def cancel(self, chunk_id: int, now_s: float) -> float:
        """Take a chunk off its engine (preemption); the engine seconds it had used."""
        entry = self._running.pop(chunk_id, None)
        if entry is None:
            return 0.0
        engine = entry[0]
        _, used = self.models[engine].cancel(chunk_id, now_s=now_s)
        return used or 0.0

    def busy_s(self) -> float:
        return sum(model.busy_s for model in self.models.values())

    def summary(self, makespan_s: float) -> dict[str, Any]:
        """Per engine: utilization over the makespan and decode tokens made."""
        span = makespan_s if makespan_s > 0 else math.inf
        engines = {
            name: {
                "utilization": round(model.busy_s / span, 4),
                "busy_s": round(model.busy_s, 3),
                "tokens": round(model.tokens),
            }
            for name, model in self.models.items()
        }
        total_busy = self.busy_s()
        return {
            "profile": self.profile.name,
            "source": self.profile.source,
            "engines": engines,
            "utilization": round(total_busy / (span * max(1, len(self.models))), 4),
            "tokens": round(sum(model.tokens for model in self.models.values())),
        }


__all__ = ["BatchedEngines", "Completion"]
