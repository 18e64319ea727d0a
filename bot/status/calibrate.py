"""The ETA learns from its own misses: a factor per level from recent promises against actual
finishes. Pure.

The dry run (bot/status/eta.py) plays the queue as it stands. It cannot see work that arrives
later at a higher level (a P2's wait grows with the rest of a burst), and the service estimator
fits a mean while one review's service is skewed (a short hotfix is usually quicker than the
line says). Both are steady per level, so the fix is measured, not modelled: every ETA is the
dry run's, scaled by the median of actual / promised over the level's last reviews, shrunk
towards all levels' median (and that towards 1) while a level has few reviews. The promise
kept for learning is the dry run's own, never the scaled one: the factor must not chase itself.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from bot.model import LEVELS, Level

# Reviews per level a factor is learnt from (the newest), and how many reviews' weight the
# pooled factor (and 1, for it) keeps while data are few.
WINDOW = 100
PRIOR_WEIGHT = 10.0
FACTOR_BOUNDS = (0.25, 4.0)
MIN_PROMISE_S = 1.0  # shorter promises say nothing about a ratio


@dataclass(frozen=True, slots=True)
class EtaSample:
    """One review's dry-run promise (seconds from when it was given) and what it took."""

    level: Level
    promised_s: float
    actual_s: float


@dataclass(frozen=True, slots=True)
class Calibration:
    """The factor each level's ETA is scaled by (1 where nothing was learnt)."""

    factors: Mapping[Level, float] = field(default_factory=dict)

    def factor(self, level: Level) -> float:
        return self.factors.get(level, 1.0)


def _shrunk(ratios: list[float], towards: float) -> float:
    if not ratios:
        return towards
    count = len(ratios)
    return (count * statistics.median(ratios) + PRIOR_WEIGHT * towards) / (count + PRIOR_WEIGHT)


def learn_calibration(samples: Iterable[EtaSample], *, window: int = WINDOW) -> Calibration:
    """Each level's factor from `samples` (oldest first): its last `window` ratios' median,
    shrunk towards the pooled median, itself shrunk towards 1; bounded to FACTOR_BOUNDS."""
    by_level: dict[Level, deque[float]] = {level: deque(maxlen=window) for level in LEVELS}
    pooled: deque[float] = deque(maxlen=window * len(LEVELS))
    for sample in samples:
        if sample.promised_s < MIN_PROMISE_S or sample.actual_s <= 0:
            continue
        ratio = sample.actual_s / sample.promised_s
        by_level[sample.level].append(ratio)
        pooled.append(ratio)
    overall = _shrunk(list(pooled), 1.0)
    low, high = FACTOR_BOUNDS
    return Calibration(
        {
            level: min(high, max(low, _shrunk(list(ratios), overall)))
            for level, ratios in by_level.items()
        }
    )


@dataclass(frozen=True, slots=True)
class _Promise:
    level: Level
    given_at: datetime
    promised_s: float


class EtaLearner:
    """Remembers each review's first dry-run promise and, once it finished, learns from it."""

    def __init__(self, *, window: int = WINDOW) -> None:
        self.window = window
        self._promises: dict[int, _Promise] = {}
        self._samples: deque[EtaSample] = deque(maxlen=window * len(LEVELS) * 4)
        self._calibration = Calibration()

    @property
    def calibration(self) -> Calibration:
        return self._calibration

    def promised(self, job_id: int) -> bool:
        return job_id in self._promises

    def promise(self, job_id: int, level: Level, *, given_at: datetime, finish_in_s: float) -> None:
        """The dry run's first ETA for `job_id` (unscaled); later ones are ignored."""
        self._promises.setdefault(job_id, _Promise(level, given_at, finish_in_s))

    def finished(self, job_id: int, at: datetime) -> None:
        """`job_id`'s review was finished at `at`: learn from its promise, if one was kept."""
        promise = self._promises.pop(job_id, None)
        if promise is None:
            return
        actual_s = (at - promise.given_at).total_seconds()
        self._samples.append(EtaSample(promise.level, promise.promised_s, actual_s))
        self._calibration = learn_calibration(self._samples, window=self.window)

    def forget(self, job_id: int) -> None:
        """`job_id` ended without a review (cancelled, superseded): nothing to learn."""
        self._promises.pop(job_id, None)


__all__ = ["Calibration", "EtaLearner", "EtaSample", "learn_calibration"]
