"""How honest the ETA is: the ETA given when a review is first shown, against its real finish.

`bot simulate` feeds it during a replay; the summary gives, per level, the median and P90 of
the absolute error in seconds and of the error relative to the review's actual turnaround.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bot.model import LEVELS, JobState, Level
from bot.queue.status import StatusRecords
from bot.sched.mlfq import ServiceEstimator
from bot.stats import percentile
from bot.status.calibrate import Calibration, EtaLearner
from bot.status.eta import Capacity
from bot.status.standing import EtaModel, standings


@dataclass(frozen=True, slots=True)
class Promise:
    """The ETA a review got when it was first shown."""

    level: Level
    given_at: datetime
    finish_at: datetime


def eta_errors(
    promises: Mapping[int, Promise], finished: Mapping[int, datetime]
) -> dict[str, dict[str, float]]:
    """Per level and overall: n, median/P90 absolute error (s), median/P90 error / turnaround."""
    rows: dict[str, list[tuple[float, float]]] = {"all": []}
    for job_id, promise in promises.items():
        done = finished.get(job_id)
        if done is None:
            continue
        error = abs((done - promise.finish_at).total_seconds())
        turnaround = max(1.0, (done - promise.given_at).total_seconds())
        rows.setdefault(str(promise.level), []).append((error, error / turnaround))
        rows["all"].append((error, error / turnaround))
    summary: dict[str, dict[str, float]] = {}
    for name in ["all", *(str(level) for level in LEVELS)]:
        values = rows.get(name, [])
        absolute = [error for error, _ in values]
        relative = [share for _, share in values]
        summary[name] = {
            "n": len(values),
            "median_error_s": round(percentile(absolute, 0.5), 2),
            "p90_error_s": round(percentile(absolute, 0.9), 2),
            "median_relative": round(percentile(relative, 0.5), 4),
            "p90_relative": round(percentile(relative, 0.9), 4),
        }
    return summary


class EtaRecorder:
    """Remembers each review's first ETA (from the live queue, learning from its misses as
    the status publisher does) and its real finish."""

    def __init__(
        self,
        records: StatusRecords,
        *,
        capacity: Capacity,
        estimator: Callable[[], ServiceEstimator],
        learn: bool = True,
    ) -> None:
        self.records = records
        self.capacity = capacity
        self.estimator = estimator
        self.learner = EtaLearner() if learn else None
        self.promises: dict[int, Promise] = {}
        self.finished: dict[int, datetime] = {}

    async def observe(self, now: datetime) -> int:
        """Give every review not seen before its ETA, as the status would show it; how many.

        The same `standings` the status publisher and `/review status` read, with no write
        budget: the replay plays the budget after the run, so a promise is judged against the
        review's last chunk."""
        await self._learn()
        rows = await self.records.live_jobs()
        if not any(int(row.id) not in self.promises for row in rows):
            return 0
        calibration = self.learner.calibration if self.learner is not None else Calibration()
        model = EtaModel(self.capacity, self.estimator(), calibration, budget={})
        standing = await standings(self.records, model, now=now, rows=rows)
        new = 0
        for row in rows:
            job_id = int(row.id)
            if job_id in self.promises:
                continue
            if self.learner is not None:
                # The learner learns from the dry run's own promise, as the publisher's does.
                self.learner.promise(
                    job_id,
                    Level(row.level),
                    given_at=now,
                    finish_in_s=standing.raw[job_id].finish_in_s,
                )
            shown = standing.estimates[job_id]
            self.promises[job_id] = Promise(
                Level(row.level), now, now + timedelta(seconds=shown.finish_in_s)
            )
            new += 1
        return new

    async def _learn(self) -> None:
        """Feed the learner the reviews that ended since the last look."""
        if self.learner is None:
            return
        waiting = [job_id for job_id in self.promises if self.learner.promised(job_id)]
        if not waiting:
            return
        ended = await self.records.ended_among(waiting)
        for row in ended:
            if JobState(row.state) == JobState.DONE and row.finished_at is not None:
                self.learner.finished(int(row.id), row.finished_at)
            else:
                self.learner.forget(int(row.id))

    def finish(self, job_id: int, at: datetime) -> None:
        """The review of `job_id` was finished (posted) at `at`."""
        self.finished[job_id] = at

    def summary(self) -> dict[str, Any]:
        return eta_errors(self.promises, self.finished)


def render_eta_errors(summary: Mapping[str, Mapping[str, float]]) -> str:
    """The ETA accuracy table of `bot simulate`."""
    lines = [
        "ETA at enqueue vs actual finish:",
        f"{'':6} {'n':>5} {'median err':>11} {'P90 err':>9} {'median/turn':>12} {'P90/turn':>9}",
    ]
    for name, row in summary.items():
        if not row["n"]:
            continue
        lines.append(
            f"{name:6} {int(row['n']):>5} {row['median_error_s']:>9.1f} s"
            f" {row['p90_error_s']:>7.1f} s"
            f" {row['median_relative']:>12.1%} {row['p90_relative']:>9.1%}"
        )
    return "\n".join(lines)


__all__ = ["EtaRecorder", "Promise", "eta_errors", "render_eta_errors"]
