"""The status publisher: on every job state change, and every few seconds for news, decide which
statuses moved enough and write them.

Thin I/O around the pure parts (load, eta, decide, render). A trigger on review_jobs NOTIFYs
each state change (a pass follows at once) and records each ended job's owed final status in
status_outbox, so a review that starts and ends between two passes still gets its status.
Writes go one at a time through the forge clients, whose pacing of content-creating calls they
share with reviews; a failed write is logged and tried again on a later pass, and never holds
up a review.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from bot.budget.decide import BudgetLimits, WriteValue
from bot.budget.intent import WriteHeld, WriteIntent, writing
from bot.budget.ledger import DEFAULT_LIMITS
from bot.clock import Clock
from bot.config import DEFAULTS
from bot.errors import ForgeError, LeaseLost, StoreError
from bot.forges.base import ForgePermissionDenied, guarded_writes
from bot.forges.statuses import (
    StatusUpdate,
    StatusWritten,
    gitlab_allows,
    gitlab_state_of,
)
from bot.model import JobState, Level
from bot.queue.connector import Listener
from bot.queue.status import StatusRecords
from bot.sched.mlfq import ServiceEstimator
from bot.status.calibrate import EtaLearner
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
from bot.status.eta import Capacity
from bot.status.render import StatusFacts, render_status
from bot.status.standing import EtaModel, save_model, standings

log = logging.getLogger(__name__)

PUBLISHER_LEASE = "status_publisher"  # one publisher at a time across processes
MUTE_AFTER_REFUSAL = timedelta(hours=1)
MODEL_REFRESH = timedelta(seconds=30)


class StatusWriter(Protocol):
    """What the publisher needs from a forge client."""

    async def publish_status(self, update: StatusUpdate) -> StatusWritten: ...


@dataclass(frozen=True, slots=True)
class StatusSettings:
    """Whether statuses are written, how often the queue is looked at, and when to speak."""

    enabled: bool = DEFAULTS.status.enabled
    neutral_at: str = DEFAULT_NEUTRAL_AT
    interval_s: float = DEFAULTS.status.interval_s
    # State changes arrive in bursts (a thousand reviews a morning): passes they wake are at
    # least this far apart, so one pass answers many of them.
    min_gap_s: float = 0.5
    rules: PublishRules = field(default_factory=PublishRules)
    ended_batch: int = 200
    # The publisher's lease: renewed every pass, taken over when its holder stops passing.
    lease_s: float = 30.0
    owner: str = field(default_factory=lambda: f"status-{os.getpid()}-{uuid.uuid4().hex[:8]}")


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
    owed: bool = False  # from the outbox: settled once written


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


def change_name(row: Any) -> str:
    """How people name a live job's pull or merge request: acme/api#12, group/project!12."""
    return f"{row.repo}{'!' if row.forge == 'gitlab' else '#'}{int(row.number)}"


class StatusPublisher:
    """Writes each review's check run or commit status when it is worth writing."""

    def __init__(
        self,
        records: StatusRecords,
        forges: Mapping[str, StatusWriter],
        *,
        clock: Clock,
        capacity: Capacity,
        estimator: Callable[[], ServiceEstimator],
        settings: StatusSettings | None = None,
        budget: Mapping[str, BudgetLimits] | None = None,
    ) -> None:
        self.records = records
        self.budget = dict(budget) if budget is not None else dict(DEFAULT_LIMITS)
        self.forges = forges
        self.clock = clock
        self.capacity = capacity
        self.estimator = estimator
        self.settings = settings or StatusSettings()
        self.muted: dict[tuple[str, str], datetime] = {}
        self.writes = 0
        self.held: set[str] = set()  # forges whose write budget had no room this pass
        # When each forge's news-only writes of the last hour went out (in memory: a restart
        # grants a fresh hour, which is at most one hour's budget twice).
        self.news_written: dict[str, deque[datetime]] = {}
        # What the ETA learnt of its misses (in memory: a new leader starts from the dry run).
        self.learner = EtaLearner()
        self._kept: tuple[EtaModel, datetime] | None = None  # the model last kept, and when
        self.attempt = 0  # the attempt at the publisher's lease this pass runs as

    def model(self) -> EtaModel:
        """What this publisher estimates with now."""
        return EtaModel(self.capacity, self.estimator(), self.learner.calibration, self.budget)

    async def _keep_model(self, model: EtaModel, now: datetime) -> None:
        """Keep the model for /review status and the dashboard: when it changed, and at least
        every MODEL_REFRESH (its updated_at then tells how fresh it is)."""
        if (
            self._kept is not None
            and self._kept[0] == model
            and now - self._kept[1] < MODEL_REFRESH
        ):
            return
        await save_model(self.records, model, now=now)
        self._kept = (model, now)

    async def _owed_rows(self) -> list[Any]:
        return await self.records.owed(limit=self.settings.ended_batch)

    async def _settle(self, row: Any) -> None:
        await self.records.settle_owed(job_id=int(row.id), republish=bool(row.republish))

    async def _gitlab_heads(self, due: Sequence[_Due]) -> dict[tuple[str, str], str]:
        """GitLab's state on each head that a due write targets."""
        shas = sorted({item.row.head_sha for item in due if item.row.forge == "gitlab"})
        if not shas:
            return {}
        rows = await self.records.head_states(forge="gitlab", shas=shas)
        return {
            (row.repo, row.head_sha): gitlab_state_of(row.state, row.conclusion) for row in rows
        }

    async def _lead(self, now: datetime) -> int | None:
        """Take or renew the publisher's lease; the attempt held, or None (another leads)."""
        return await self.records.lead(
            name=PUBLISHER_LEASE,
            owner=self.settings.owner,
            now=now,
            until=now + timedelta(seconds=self.settings.lease_s),
        )

    async def _may_write(self, row: Any, report: StatusReport) -> bool:
        """Whether this pass's attempt still leads, and the job can still take the status."""
        return await self.records.may_write(
            name=PUBLISHER_LEASE,
            owner=self.settings.owner,
            attempt=self.attempt,
            job_id=int(row.id),
            final=report.state == "completed",
        )

    async def publish_once(self, now: datetime) -> PassResult:
        """Look at the queue once and write what moved enough; returns what it did."""
        result = PassResult()
        attempt = await self._lead(now)
        if attempt is None:
            return result
        self.attempt = attempt
        due = await self._due(now, result)
        heads = await self._gitlab_heads(due)
        self.held = set()
        for item in sorted(due, key=_priority):
            if item.row.forge in self.held or (
                item.reason not in NEWS_FREE and not self._news_allowed(item.row.forge, now)
            ):
                # The forge's write budget had no room this pass, or the news ration is spent.
                result.deferred += 1
                continue
            if item.row.forge == "gitlab":
                head = (item.row.repo, item.row.head_sha)
                wanted = gitlab_state_of(item.report.state, item.report.conclusion)
                if not gitlab_allows(heads.get(head), wanted):
                    # Another job's status holds the head (GitLab keeps one per name):
                    # this one waits until that one has finished.
                    result.deferred += 1
                    continue
                if await self._write(item, now, result):
                    heads[head] = wanted
                continue
            await self._write(item, now, result)
        return result

    def _news_allowed(self, forge: str, now: datetime) -> bool:
        recent = self.news_written.setdefault(forge, deque())
        while recent and recent[0] <= now - timedelta(hours=1):
            recent.popleft()
        return updates_left(recent, now=now, per_hour=self.settings.rules.updates_per_hour) > 0

    async def _due(self, now: datetime, result: PassResult) -> list[_Due]:
        model = self.model()
        await self._keep_model(model, now)
        standing = await standings(self.records, model, now=now)
        for row in standing.rows:
            job_id = int(row.id)
            self.learner.promise(
                job_id, Level(row.level), given_at=now, finish_in_s=standing.raw[job_id].finish_in_s
            )
        names = {int(row.id): change_name(row) for row in standing.rows}
        rows = [row for row in standing.rows if row.forge in self.forges]
        result.live = len(rows)
        due: list[_Due] = []
        for row in rows:
            if self._is_muted(row, now):
                continue
            estimate = standing.estimates[int(row.id)]
            state = state_of(JobState(row.state), started=bool(row.started))
            report = StatusReport(
                state=state,
                level=Level(row.level),
                place=estimate.place if state == "queued" else None,
                finish_at=now + timedelta(seconds=estimate.finish_in_s),
                parts_done=int(row.chunks_done or 0),
                parts_total=int(row.chunks_total or 0),
            )
            waits_for = tuple(names[i] for i in row.waits_for or () if int(i) in names)
            facts = self._facts(
                row,
                start_at=now + timedelta(seconds=estimate.start_in_s),
                waits_for=waits_for,
            )
            self._consider(due, row, report, facts, now)
        for row in await self._owed_rows():
            if JobState(row.state) == JobState.DONE and row.finished_at is not None:
                self.learner.finished(int(row.id), row.finished_at)
            else:
                self.learner.forget(int(row.id))
            if row.forge not in self.forges:
                await self._settle(row)  # no client for it: nobody can write it
                continue
            if self._is_muted(row, now):
                continue
            report, facts = self._final(row)
            if row.republish:
                due.append(_Due(row, report, "republish", facts, owed=True))
                continue
            before = len(due)
            self._consider(due, row, report, facts, now)
            if len(due) == before:
                await self._settle(row)  # already written as it ends
            else:
                due[-1] = _Due(row, report, due[-1].reason, facts, owed=True)
        return due

    def _final(self, row: Any) -> tuple[StatusReport, StatusFacts]:
        """An ended job's last status: its conclusion from every finding still open on its head
        (a review posts only what is new; its status speaks for the head)."""
        review = row.review or {}
        done = JobState(row.state) == JobState.DONE
        counts = review.get("counts") if done else None
        open_counts = review.get("open_counts", counts) if done else None
        conclusion = conclude(
            JobState(row.state), counts=open_counts, neutral_at=self.settings.neutral_at
        )
        report = StatusReport(
            state="completed",
            level=Level(row.level),
            parts_done=int(row.chunks_done or 0),
            parts_total=int(row.chunks_total or 0),
            conclusion=conclusion,
        )
        new = sum(int(value) for value in counts.values()) if counts is not None else None
        facts = self._facts(
            row,
            review_url=review.get("url"),
            counts=open_counts,
            new_findings=new if "open_counts" in review else None,
            review_summary=review.get("summary"),
            error=row.last_error,
        )
        return report, facts

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
            backlog_weights=self.capacity.mlfq.backlog_weights,
            **known,
        )

    def _is_muted(self, row: Any, now: datetime) -> bool:
        until = self.muted.get((row.forge, row.repo))
        return until is not None and now < until

    async def _write(self, item: _Due, now: datetime, result: PassResult) -> bool:
        """Write one status; whether the forge took it."""
        row, report = item.row, item.report
        writer = self.forges[row.forge]
        context = {"job_id": int(row.id), "forge": row.forge, "repo": row.repo}
        update = self._update(row, report, item.facts, now)
        if item.reason == "republish":
            # GitHub asks for a new check run on a Re-run; the old one stays as it was.
            update = replace(update, check_run_id=None)
        if not await self._may_write(row, report):
            log.warning(
                "status of job %s (publisher attempt %s): lease lost or job ended, dropping result",
                row.id,
                self.attempt,
                extra={"action": "lease_lost", **context},
            )
            return False
        try:
            # Asked again right before the request goes out (after the forge's pacing).
            with (
                writing(self._intent(item)),
                guarded_writes(lambda: self._may_write(row, report)),
            ):
                written = await writer.publish_status(update)
        except LeaseLost:
            log.warning(
                "status of job %s (publisher attempt %s): lease lost or job ended, dropping result",
                row.id,
                self.attempt,
                extra={"action": "lease_lost", **context},
            )
            return False
        except WriteHeld as exc:
            # The write budget had no room soon enough: the next pass writes the state then
            # (a newer write of this status replaces this one in line).
            result.deferred += 1
            self.held.add(row.forge)
            log.info(
                "status of job %s held: %s", row.id, exc, extra={"action": "status_held", **context}
            )
            return False
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
            return False
        self.writes += 1
        result.written += 1
        result.reasons[item.reason] += 1
        if item.reason not in NEWS_FREE:
            self.news_written.setdefault(row.forge, deque()).append(now)
        recorded = await self._record(row, report, written, now)
        if item.owed and recorded:
            # Only the leader settles what it owes: a write that went out just before its lease
            # was taken over leaves the debt to the new leader, which writes it once more.
            await self._settle(row)
        log.info(
            "status of job %s: %s (%s)",
            row.id,
            report.state,
            item.reason,
            extra={"action": "status_written", **context},
        )
        return True

    def _intent(self, item: _Due) -> WriteIntent:
        """The write as the budget sees it: its worth, level, job and target; it waits about
        a pass at most (then the next pass writes the newest state)."""
        value = write_value(item.report.state, item.reason)
        # A pass's worth, and never less than a few of GitHub's one-second spacings; a final
        # state, which a person waits for, up to a minute.
        floor = 60.0 if value == WriteValue.CHECK_COMPLETED else 5.0
        return WriteIntent(
            level=int(item.report.level),
            job_id=int(item.row.id),
            value=value,
            target=f"status:{item.row.forge}:{int(item.row.id)}",
            max_wait_s=max(self.settings.interval_s, floor),
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
    ) -> bool:
        """Remember a write; whether it was recorded (not when this attempt no longer leads)."""
        try:
            recorded = await self.records.record_report(
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
                    "lease_name": PUBLISHER_LEASE,
                    "lease_owner": self.settings.owner,
                    "lease_attempt": self.attempt,
                },
            )
        except StoreError as exc:
            # The write happened; the next pass may write it once more, which is harmless.
            log.warning(
                "status of job %s written but not recorded: %s",
                row.id,
                exc,
                extra={"action": "status_record_failed", "job_id": int(row.id)},
            )
            return False
        if not recorded:
            log.warning(
                "status of job %s (publisher attempt %s) written as the lease was taken over:"
                " not recorded, the new leader writes it over",
                row.id,
                self.attempt,
                extra={"action": "lease_lost", "job_id": int(row.id)},
            )
            await self._note_stale_write(row, report, written, now)
            return False
        return True

    async def _note_stale_write(
        self, row: Any, report: StatusReport, written: StatusWritten, now: datetime
    ) -> None:
        """The forge took a write the new leader does not know of (it may show a job that has
        ended as running again): tell the leader, who writes the job's state over it."""
        try:
            await self.records.note_stale_write(
                job_id=int(row.id),
                state=report.state,
                conclusion=report.conclusion,
                external_id=written.external_id,
                now=now,
            )
        except StoreError as exc:
            log.warning(
                "status of job %s: a stale write could not be noted: %s",
                row.id,
                exc,
                extra={"action": "status_record_failed", "job_id": int(row.id)},
            )

    async def run(self, stop: asyncio.Event, *, database_url: str | None = None) -> None:
        """Pass after pass until `stop`: at once when a job changes state (LISTEN on the
        trigger's channel, given `database_url`), else every `interval_s` for news. A failing
        pass is logged and the next one tries again."""
        wake = asyncio.Event()
        listener = await self._listen(database_url, wake)
        try:
            while not stop.is_set():
                wake.clear()
                started = asyncio.get_running_loop().time()
                try:
                    await self.publish_once(self.clock.now())
                except (StoreError, OSError) as exc:
                    log.warning(
                        "status pass failed: %s", exc, extra={"action": "status_pass_failed"}
                    )
                if listener is None or listener.is_closed():
                    listener = await self._listen(database_url, wake, quiet=listener is not None)
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
                try:
                    await asyncio.wait(
                        waits, timeout=self.settings.interval_s, return_when="FIRST_COMPLETED"
                    )
                finally:
                    for waiting in waits:
                        waiting.cancel()
                gap = self.settings.min_gap_s - (asyncio.get_running_loop().time() - started)
                if gap > 0 and not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=gap)
        finally:
            if listener is not None and not listener.is_closed():
                with contextlib.suppress(Exception):
                    await listener.close()

    async def _listen(
        self, database_url: str | None, wake: asyncio.Event, *, quiet: bool = False
    ) -> Listener | None:
        """LISTEN for job state changes, given `database_url`."""
        if database_url is None:
            return None
        try:
            return await self.records.listen(wake.set)
        except StoreError as exc:
            if not quiet:
                log.warning(
                    "LISTEN unavailable, statuses every %ss: %s",
                    self.settings.interval_s,
                    exc,
                    extra={"action": "status_listen_failed"},
                )
            return None


def write_value(state: str, reason: str) -> WriteValue:
    """What a status write is worth: the final state, the first status, or news."""
    if state == "completed":
        return WriteValue.CHECK_COMPLETED
    if reason == "first":
        return WriteValue.FIRST_STATUS
    return WriteValue.NEWS


def _priority(item: _Due) -> tuple[int, int, int]:
    """The write budget's order: final states, then first statuses, then the other state
    changes and news; the most urgent levels first within each."""
    value = write_value(item.report.state, item.reason)
    return (int(value), int(item.report.level), int(item.row.id))


__all__ = [
    "PassResult",
    "StatusPublisher",
    "StatusSettings",
    "StatusWriter",
    "previous_report",
    "write_value",
]
