"""The status publisher: every few seconds, decide which statuses moved enough and write them.

Thin I/O around the pure parts (load, eta, decide, render). Writes go one at a time through
the forge clients, whose pacing of content-creating calls they share with reviews; a failed
write is logged and tried again on a later pass, and never holds up a review.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.clock import Clock
from bot.errors import ForgeError
from bot.forges.base import ForgePermissionDenied
from bot.forges.statuses import StatusUpdate, StatusWritten
from bot.model import JobState, Level
from bot.sched.mlfq import ServiceEstimator
from bot.status import publisher_sql as sql
from bot.status.decide import (
    DEFAULT_NEUTRAL_AT,
    NEWS_FREE,
    PublishRules,
    StatusReport,
    conclude,
    publish_reason,
    state_of,
    updates_left,
)
from bot.status.eta import Capacity, Estimate, estimate_queue
from bot.status.load import LiveCalls, job_load
from bot.status.render import StatusFacts, render_status

log = logging.getLogger(__name__)

PUBLISHER_LOCK_KEY = 0x52425354  # one publisher at a time across processes
MUTE_AFTER_REFUSAL = timedelta(hours=1)


class StatusWriter(Protocol):
    """What the publisher needs from a forge client."""

    async def publish_status(self, update: StatusUpdate) -> StatusWritten: ...


@dataclass(frozen=True, slots=True)
class StatusSettings:
    """Whether statuses are written, how often the queue is looked at, and when to speak."""

    enabled: bool = True
    neutral_at: str = DEFAULT_NEUTRAL_AT
    interval_s: float = 5.0
    rules: PublishRules = field(default_factory=PublishRules)
    ended_batch: int = 200


@dataclass(slots=True)
class PassResult:
    """What one pass did."""

    live: int = 0
    written: int = 0
    failed: int = 0
    deferred: int = 0  # news held back by the hourly budget (see PublishRules.updates_per_hour)
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class _Due:
    row: Any
    report: StatusReport
    reason: str
    facts: StatusFacts


def previous_report(row: Any) -> tuple[StatusReport | None, datetime | None]:
    """The status last written for a job, from the status_* columns of a row."""
    if row.status_state is None:
        return None, None
    report = StatusReport(
        state=row.status_state,
        level=Level(row.status_level),
        place=row.status_place,
        finish_at=row.status_finish_at,
        parts_done=row.status_parts_done,
        parts_total=row.status_parts_total,
        conclusion=row.status_conclusion,
    )
    return report, row.status_published_at


def live_calls(row: Any) -> LiveCalls:
    """A live-jobs row as the ETA's loader takes it."""
    request_lines = None
    if row.additions is not None and row.deletions is not None:
        request_lines = int(row.additions) + int(row.deletions)
    return LiveCalls(
        job_id=int(row.id),
        level=Level(row.level),
        started=bool(row.started),
        planned=bool(row.planned),
        total_lines=int(row.total_lines or 0),
        request_lines=request_lines,
        queued_ranks=tuple(row.queued_ranks or ()),
        queued_lines=tuple(row.queued_lines or ()),
        running_lines=tuple(row.running_lines or ()),
        running_started=tuple(row.running_started or ()),
        done_lines=int(row.done_lines or 0),
        done_calls=int(row.done_calls or 0),
        done_gpu_s=float(row.done_gpu_s or 0.0),
    )


async def fetch_live_rows(engine: AsyncEngine) -> list[Any]:
    """Every live job with its calls and its last written status."""
    async with engine.connect() as conn:
        return list((await conn.execute(sql.SELECT_LIVE_JOBS)).all())


def estimate_rows(
    rows: Sequence[Any], *, capacity: Capacity, estimator: ServiceEstimator, now: datetime
) -> dict[int, Estimate]:
    """Place, start and end of every live job in `rows`."""
    loads = [job_load(live_calls(row), estimator=estimator, now=now) for row in rows]
    return estimate_queue(loads, capacity)


class StatusPublisher:
    """Writes each review's check run or commit status when it is worth writing."""

    def __init__(
        self,
        engine: AsyncEngine,
        forges: Mapping[str, StatusWriter],
        *,
        clock: Clock,
        capacity: Capacity,
        estimator: Callable[[], ServiceEstimator],
        settings: StatusSettings | None = None,
    ) -> None:
        self.engine = engine
        self.forges = forges
        self.clock = clock
        self.capacity = capacity
        self.estimator = estimator
        self.settings = settings or StatusSettings()
        self.muted: dict[tuple[str, str], datetime] = {}
        self.writes = 0
        # When each forge's news-only writes of the last hour went out (in memory: a restart
        # grants a fresh hour, which is at most one hour's budget twice).
        self.news_written: dict[str, deque[datetime]] = {}

    async def live_rows(self) -> list[Any]:
        """Every live job with its calls and its last written status."""
        return await fetch_live_rows(self.engine)

    async def _ended_rows(self) -> list[Any]:
        async with self.engine.connect() as conn:
            result = await conn.execute(sql.SELECT_ENDED_OPEN, {"limit": self.settings.ended_batch})
            return list(result.all())

    @contextlib.asynccontextmanager
    async def _leading(self) -> AsyncIterator[bool]:
        async with self.engine.connect() as conn:
            leading = bool(await conn.scalar(sql.TRY_LOCK, {"key": PUBLISHER_LOCK_KEY}))
            try:
                yield leading
            finally:
                if leading:
                    await conn.scalar(sql.UNLOCK, {"key": PUBLISHER_LOCK_KEY})
                await conn.commit()

    async def publish_once(self, now: datetime) -> PassResult:
        """Look at the queue once and write what moved enough; returns what it did."""
        result = PassResult()
        async with self._leading() as leading:
            if not leading:
                return result
            due = await self._due(now, result)
            for item in sorted(due, key=_priority):
                if item.reason not in NEWS_FREE and not self._news_allowed(item.row.forge, now):
                    result.deferred += 1
                    continue
                await self._write(item, now, result)
        return result

    def _news_allowed(self, forge: str, now: datetime) -> bool:
        recent = self.news_written.setdefault(forge, deque())
        while recent and recent[0] <= now - timedelta(hours=1):
            recent.popleft()
        return updates_left(recent, now=now, per_hour=self.settings.rules.updates_per_hour) > 0

    async def _due(self, now: datetime, result: PassResult) -> list[_Due]:
        rows = [row for row in await self.live_rows() if row.forge in self.forges]
        result.live = len(rows)
        estimates = estimate_rows(rows, capacity=self.capacity, estimator=self.estimator(), now=now)
        due: list[_Due] = []
        for row in rows:
            if self._is_muted(row, now):
                continue
            estimate = estimates[int(row.id)]
            state = state_of(JobState(row.state), started=bool(row.started))
            report = StatusReport(
                state=state,
                level=Level(row.level),
                place=estimate.place if state == "queued" else None,
                finish_at=now + timedelta(seconds=estimate.finish_in_s),
                parts_done=int(row.chunks_done or 0),
                parts_total=int(row.chunks_total or 0),
            )
            facts = self._facts(row, start_at=now + timedelta(seconds=estimate.start_in_s))
            self._consider(due, row, report, facts, now)
        for row in await self._ended_rows():
            if row.forge not in self.forges or self._is_muted(row, now):
                continue
            review = row.review or {}
            counts = review.get("counts") if JobState(row.state) == JobState.DONE else None
            conclusion = conclude(
                JobState(row.state), counts=counts, neutral_at=self.settings.neutral_at
            )
            report = StatusReport(
                state="completed",
                level=Level(row.level),
                parts_done=int(row.chunks_done or 0),
                parts_total=int(row.chunks_total or 0),
                conclusion=conclusion,
            )
            facts = self._facts(
                row,
                review_url=review.get("url"),
                counts=counts,
                review_summary=review.get("summary"),
                error=row.last_error,
            )
            self._consider(due, row, report, facts, now)
        return due

    def _consider(
        self, due: list[_Due], row: Any, report: StatusReport, facts: StatusFacts, now: datetime
    ) -> None:
        previous, published_at = previous_report(row)
        reason = publish_reason(
            previous,
            published_at,
            report,
            now=now,
            rules=self.settings.rules,
            waiting_since=row.enqueued_at,
        )
        if reason is None:
            return
        if row.forge == "gitlab" and reason not in ("first", "state"):
            return  # GitLab refuses to set a status to the state it has: states only
        due.append(_Due(row, report, reason, facts))

    def _facts(self, row: Any, **known: Any) -> StatusFacts:
        return StatusFacts(
            reasons=tuple(row.reasons or ()),
            neutral_at=self.settings.neutral_at,
            slots=self.capacity.slots,
            weights=self.capacity.mlfq.weights,
            **known,
        )

    def _is_muted(self, row: Any, now: datetime) -> bool:
        until = self.muted.get((row.forge, row.repo))
        return until is not None and now < until

    async def _write(self, item: _Due, now: datetime, result: PassResult) -> None:
        row, report = item.row, item.report
        writer = self.forges[row.forge]
        context = {"job_id": int(row.id), "forge": row.forge, "repo": row.repo}
        try:
            previous, _ = previous_report(row)
            if (
                row.forge == "gitlab"
                and previous is not None
                and previous.state == "queued"
                and report.state == "completed"
                and report.conclusion in ("success", "neutral")
            ):
                # GitLab's statuses go pending -> running -> success.
                running = StatusReport("in_progress", report.level, parts_done=report.parts_done,
                                       parts_total=report.parts_total)  # fmt: skip
                await writer.publish_status(self._update(row, running, item.facts, now))
                self.writes += 1
            written = await writer.publish_status(self._update(row, report, item.facts, now))
        except ForgeError as exc:
            result.failed += 1
            if isinstance(exc, ForgePermissionDenied):
                self.muted[(row.forge, row.repo)] = now + MUTE_AFTER_REFUSAL
            log.warning(
                "status of job %s not written: %s",
                row.id,
                exc,
                extra={"action": "status_failed", **context},
            )
            return
        self.writes += 1
        result.written += 1
        result.reasons[item.reason] += 1
        if item.reason not in NEWS_FREE:
            self.news_written.setdefault(row.forge, deque()).append(now)
        await self._record(row, report, written, now)
        log.info(
            "status of job %s: %s (%s)",
            row.id,
            report.state,
            item.reason,
            extra={"action": "status_written", **context},
        )

    def _update(
        self, row: Any, report: StatusReport, facts: StatusFacts, now: datetime
    ) -> StatusUpdate:
        words = render_status(report, facts, now=now)
        return StatusUpdate(
            repo=row.repo,
            head_sha=row.head_sha,
            job_id=int(row.id),
            state=report.state,
            title=words.title,
            summary=words.summary,
            description=words.description,
            conclusion=report.conclusion,
            details_url=facts.review_url or row.web_url,
            check_run_id=row.status_external_id,
            installation_id=row.installation_id,
            project_id=row.project_id,
        )

    async def _record(
        self, row: Any, report: StatusReport, written: StatusWritten, now: datetime
    ) -> None:
        try:
            async with self.engine.begin() as conn:
                await conn.execute(
                    sql.RECORD_REPORT,
                    {
                        "job_id": int(row.id),
                        "forge": row.forge,
                        "repo": row.repo,
                        "head_sha": row.head_sha,
                        "kind": written.kind,
                        "external_id": written.external_id,
                        "state": report.state,
                        "level": int(report.level),
                        "place": report.place,
                        "finish_at": report.finish_at,
                        "parts_done": report.parts_done,
                        "parts_total": report.parts_total,
                        "conclusion": report.conclusion,
                        "now": now,
                    },
                )
        except SQLAlchemyError as exc:
            # The write happened; the next pass may write it once more, which is harmless.
            log.warning(
                "status of job %s written but not recorded: %s",
                row.id,
                exc,
                extra={"action": "status_record_failed", "job_id": int(row.id)},
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Pass after pass until `stop`; a failing pass is logged and the next one tries again."""
        while not stop.is_set():
            try:
                await self.publish_once(self.clock.now())
            except (SQLAlchemyError, OSError) as exc:
                log.warning("status pass failed: %s", exc, extra={"action": "status_pass_failed"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.interval_s)


def _priority(item: _Due) -> tuple[int, int, int]:
    """State changes first (they tell the most), then the most urgent levels."""
    first = 0 if item.reason in ("state", "first") else 1
    return (first, int(item.report.level), int(item.row.id))


__all__ = [
    "PassResult",
    "StatusPublisher",
    "StatusSettings",
    "StatusWriter",
    "estimate_rows",
    "fetch_live_rows",
    "live_calls",
    "previous_report",
]
