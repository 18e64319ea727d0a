"""Wait alerts: a job still waiting past its level's threshold raises one alert, once.

The decision is pure (`decide_alerts`, `webhook_due`, `render_webhook_payload`); `AlertMonitor`
reads candidates from the database and records each alert in the `alerts` table, whose unique
job id keeps it once across every process; `setup_alerts` runs the monitor as a cleanup_ctx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import aiohttp
from aiohttp import web

from bot.clock import Clock, SystemClock
from bot.config import AlertSettings
from bot.errors import StoreError, StoreUnavailable
from bot.logsafe import escaped
from bot.model import Level
from bot.obs.liveness import DEFAULT_STALE_S, no_dispatcher_message, read_liveness
from bot.obs.metrics import Metrics, read_queue_snapshot
from bot.outage import OutageWatch
from bot.queue.monitoring import MonitoringRecords

log = logging.getLogger(__name__)

MAX_PENDING = 500
MAX_LINES_PER_POST = 20
NO_DISPATCHER = "no_dispatcher"  # kind of the service alert: work waits, nobody takes it


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """A ready job that has not started yet."""

    job_id: int
    level: Level
    ready_at: datetime
    forge: str = ""
    repo: str = ""
    number: int = 0


@dataclass(frozen=True, slots=True)
class Alert:
    """One job that waited past its level's threshold."""

    job_id: int
    level: Level
    waited_s: float
    threshold_s: float
    message: str


def render_alert_message(job: WaitingJob, *, waited_s: float, threshold_s: float) -> str:
    """One line naming the job, its level and how long it has waited."""
    # The repository name came from a webhook: escaped, it cannot forge lines or carry markup.
    where = f"{job.forge} {escaped(job.repo)}#{job.number}" if job.repo else f"job {job.job_id}"
    return (
        f"{job.level} review {where} (job {job.job_id}) has waited {waited_s:.0f} s "
        f"without starting (threshold {threshold_s:.0f} s)"
    )


def decide_alerts(
    waiting: Iterable[WaitingJob],
    *,
    now: datetime,
    thresholds: Mapping[Level, float],
    alerted: Collection[int] = (),
) -> list[Alert]:
    """Waiting jobs past their level's threshold with no alert yet; P3 (no threshold) never."""
    alerts: list[Alert] = []
    for job in waiting:
        threshold = thresholds.get(job.level)
        if threshold is None or job.job_id in alerted:
            continue
        waited = (now - job.ready_at).total_seconds()
        if waited > threshold:
            alerts.append(
                Alert(
                    job_id=job.job_id,
                    level=job.level,
                    waited_s=waited,
                    threshold_s=threshold,
                    message=render_alert_message(job, waited_s=waited, threshold_s=threshold),
                )
            )
    return alerts


def webhook_due(*, last_sent_at: datetime | None, now: datetime, min_interval_s: float) -> bool:
    """May another alert message go out now (at most one per `min_interval_s`)?"""
    return last_sent_at is None or (now - last_sent_at).total_seconds() >= min_interval_s


def render_webhook_payload(
    alerts: Sequence[Alert],
    *,
    notes: Sequence[str] = (),
    max_lines: int = MAX_LINES_PER_POST,
) -> dict[str, str]:
    """A Slack-compatible message: service notes first, then `alerts`, the worst wait first."""
    lines = [f"review-bot: {note}" for note in notes]
    if alerts:
        ordered = sorted(alerts, key=lambda alert: (int(alert.level), -alert.waited_s))
        lines.append(f"review-bot: {len(alerts)} review(s) waiting past their threshold")
        lines.extend(f"• {alert.message}" for alert in ordered[:max_lines])
        if len(ordered) > max_lines:
            lines.append(f"… and {len(ordered) - max_lines} more")
    return {"text": "\n".join(lines)}


@dataclass(slots=True)
class AlertMonitor:
    """Finds waiting jobs past their threshold, records and reports each one once."""

    monitoring: MonitoringRecords
    settings: AlertSettings
    metrics: Metrics | None = None
    session: aiohttp.ClientSession | None = None
    limit: int = 500
    pending: list[Alert] = field(default_factory=list)
    last_sent_at: datetime | None = None
    dispatcher_stale_s: float = DEFAULT_STALE_S
    notes: list[str] = field(default_factory=list)  # service alerts not posted yet
    watching_since: datetime | None = None  # the first liveness check of this process

    async def check(self, *, now: datetime) -> list[Alert]:
        """Raise the alerts due at `now`; returns those this process recorded."""
        if not self.settings.threshold_s:
            return []
        cutoff = now - timedelta(seconds=min(self.settings.threshold_s.values()))
        rows = await self.monitoring.alert_candidates(cutoff=cutoff, limit=self.limit)
        waiting = [
            WaitingJob(
                job_id=row.id,
                level=Level(row.level),
                ready_at=row.ready_at,
                forge=row.forge,
                repo=row.repo,
                number=row.number,
            )
            for row in rows
        ]
        due = sorted(
            decide_alerts(waiting, now=now, thresholds=self.settings.threshold_s),
            key=lambda alert: alert.job_id,  # one insert order everywhere: no deadlocks
        )
        if not due:
            return []
        recorded = await self.monitoring.record_alerts(
            [
                {
                    "job_id": alert.job_id,
                    "level": int(alert.level),
                    "waited_s": alert.waited_s,
                    "threshold_s": alert.threshold_s,
                    "fired_at": now,
                    "message": alert.message,
                }
                for alert in due
            ],
        )
        fired = [alert for alert in due if alert.job_id in recorded]
        for alert in fired:
            log.warning(
                "wait alert: %s",
                alert.message,
                extra={
                    "action": "wait_alert",
                    "job_id": alert.job_id,
                    "level": str(alert.level),
                    "waited_s": round(alert.waited_s, 3),
                    "threshold_s": alert.threshold_s,
                },
            )
            if self.metrics is not None:
                self.metrics.count_alert(alert.level)
        if self.settings.webhook_url:
            self.pending = (self.pending + fired)[-MAX_PENDING:]
        return fired

    async def check_dispatchers(self, *, now: datetime) -> str | None:
        """Alert once per outage when work waits and no dispatcher is alive (not before this
        process has watched for one stale window: a dispatcher started with it may not have
        beaten yet); close the alert when one is back. Returns the message recorded, if any."""
        queue = await read_queue_snapshot(self.monitoring, now=now)
        liveness = await read_liveness(
            self.monitoring, now=now, stale_after_s=self.dispatcher_stale_s
        )
        grace_s = min(self.settings.threshold_s.values(), default=60.0)
        if self.watching_since is None:
            self.watching_since = now
        message = no_dispatcher_message(
            liveness,
            waiting_jobs=sum(queue.waiting.values()),
            oldest_wait_s=max(queue.oldest_wait_s.values(), default=0.0),
            grace_s=grace_s,
            watched_s=(now - self.watching_since).total_seconds(),
            stale_after_s=self.dispatcher_stale_s,
        )
        if message is None:
            if liveness.dispatchers and await self.monitoring.resolve_operational_alert(
                kind=NO_DISPATCHER, now=now
            ):
                note = f"a dispatcher is alive again ({liveness.dispatchers} now)"
                log.info("%s", note, extra={"action": "no_dispatcher_resolved"})
                self._note(note)
            return None
        opened = await self.monitoring.open_operational_alert(
            kind=NO_DISPATCHER, now=now, message=message
        )
        if not opened:
            return None  # this outage was already reported, here or by another process
        log.warning(
            "service alert: %s",
            message,
            extra={"action": "no_dispatcher_alert", "dispatchers_alive": 0},
        )
        if self.metrics is not None:
            self.metrics.count_service_alert(NO_DISPATCHER)
        self._note(message)
        return message

    def _note(self, note: str) -> None:
        if self.settings.webhook_url:
            self.notes = [*self.notes, note][-MAX_PENDING:]

    async def flush(self, *, now: datetime) -> bool:
        """Post the pending alerts as one message if the rate limit allows; True if sent."""
        url = self.settings.webhook_url
        if not url or not (self.pending or self.notes) or self.session is None:
            return False
        if not webhook_due(
            last_sent_at=self.last_sent_at, now=now, min_interval_s=self.settings.min_interval_s
        ):
            return False
        batch = list(self.pending)
        notes = list(self.notes)
        self.last_sent_at = now  # a failed post also waits out the interval: no hammering
        try:
            async with self.session.post(
                url,
                json=render_webhook_payload(batch, notes=notes),
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response:
                if response.status >= 300:
                    raise aiohttp.ClientResponseError(
                        response.request_info, (), status=response.status
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "alert webhook failed (%d alerts kept for the next try): %s",
                len(batch),
                exc,
                extra={"action": "alert_post_failed"},
            )
            if self.metrics is not None:
                self.metrics.count_alert_post("failed")
            return False
        self.pending = self.pending[len(batch) :]
        self.notes = self.notes[len(notes) :]
        if self.metrics is not None:
            self.metrics.count_alert_post("sent")
        log.info("alert webhook: posted %d alerts", len(batch), extra={"action": "alert_post_sent"})
        return True

    async def run_once(self, *, now: datetime) -> list[Alert]:
        """One round: raise due alerts, then post what the rate limit allows."""
        fired = await self.check(now=now)
        await self.check_dispatchers(now=now)
        await self.flush(now=now)
        return fired


async def run_alert_loop(
    monitor: AlertMonitor, *, clock: Clock, interval_s: float, outage_backoff_s: float = 1.0
) -> None:
    """Check every `interval_s` until cancelled; through a database outage, back off (said once
    when it starts and once when it ends)."""
    outage = OutageWatch("alerts", base_s=outage_backoff_s)
    while True:
        wait_s = interval_s
        try:
            await monitor.run_once(now=clock.now())
        except StoreUnavailable as exc:
            wait_s = max(interval_s, outage.lost(exc))
        except StoreError as exc:
            log.warning("alert check failed: %s", exc, extra={"action": "alert_check_failed"})
        except Exception:
            # A bug in one round must not end alerting for the process's lifetime.
            log.exception("alert check crashed", extra={"action": "alert_check_crashed"})
        else:
            outage.recovered()
        await asyncio.sleep(wait_s)


ALERT_MONITOR_KEY = web.AppKey("alert_monitor", AlertMonitor)


def alert_context(
    *,
    monitoring: MonitoringRecords,
    settings: AlertSettings,
    clock: Clock,
    metrics: Metrics | None = None,
    interval_s: float = 2.0,
    dispatcher_stale_s: float = DEFAULT_STALE_S,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx that runs the alert loop for the app's lifetime."""

    async def alerts_running(app: web.Application) -> AsyncIterator[None]:
        session = aiohttp.ClientSession() if settings.webhook_url else None
        monitor = AlertMonitor(
            monitoring=monitoring,
            settings=settings,
            metrics=metrics,
            session=session,
            dispatcher_stale_s=dispatcher_stale_s,
        )
        app[ALERT_MONITOR_KEY] = monitor
        task = asyncio.create_task(
            run_alert_loop(monitor, clock=clock, interval_s=interval_s), name="alert-loop"
        )
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if session is not None:
                await session.close()

    return alerts_running


def setup_alerts(
    app: web.Application,
    *,
    monitoring: MonitoringRecords,
    settings: AlertSettings,
    clock: Clock | None = None,
    metrics: Metrics | None = None,
    interval_s: float = 2.0,
    dispatcher_stale_s: float = DEFAULT_STALE_S,
) -> None:
    """Run the alert loop while the app runs."""
    app.cleanup_ctx.append(
        alert_context(
            monitoring=monitoring,
            settings=settings,
            clock=clock or SystemClock(),
            metrics=metrics,
            interval_s=interval_s,
            dispatcher_stale_s=dispatcher_stale_s,
        )
    )


__all__ = [
    "ALERT_MONITOR_KEY",
    "Alert",
    "AlertMonitor",
    "WaitingJob",
    "alert_context",
    "decide_alerts",
    "render_webhook_payload",
    "run_alert_loop",
    "setup_alerts",
    "webhook_due",
]
