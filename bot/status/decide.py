"""Whether a job's status on the forge is worth writing again, and how a finished job ends.

Pure. A status is written when the job first appears, whenever its state changes, and
otherwise only when its level changed, its ETA moved by more than a quarter of the whole wait
it promised, its progress by more than a quarter, or its place grew by more than a quarter,
and at most once a minute: a busy queue never turns into a storm of writes, and an ETA that
holds needs no update at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from bot.config import DEFAULTS
from bot.model import SEVERITIES, JobState, Level

StatusState = Literal["queued", "in_progress", "completed"]
Conclusion = Literal["success", "neutral", "cancelled", "skipped"]
DEFAULT_NEUTRAL_AT: str = DEFAULTS.status.neutral_at


@dataclass(frozen=True, slots=True)
class StatusReport:
    """What the status of one job says now."""

    state: StatusState
    level: Level
    place: int | None = None  # 1-based, while queued
    finish_at: datetime | None = None  # the ETA of the posted review
    parts_done: int = 0
    parts_total: int = 0
    conclusion: Conclusion | None = None  # when completed


@dataclass(frozen=True, slots=True)
class PublishRules:
    """How much change is worth a write, and how often a job may be written."""

    min_interval_s: float = 60.0
    tolerance: float = 0.25  # a quarter
    eta_floor_s: float = 15.0  # ETA moves smaller than this never count
    # Writes that only bring news (a moved ETA, place, progress or level; not a first status
    # nor a state change) per forge in any hour. GitHub allows 500 content-creating requests
    # an hour; a morning whose engines run slower than estimated would otherwise spend them
    # on ETAs while reviews wait to be posted.
    updates_per_hour: int = DEFAULTS.status.updates_per_hour


NEWS_FREE = frozenset({"first", "state", "republish"})  # reasons that are never rationed


def updates_left(recent: Sequence[datetime], *, now: datetime, per_hour: int) -> int:
    """How many news-only writes the last hour's (`recent`) leave for now."""
    hour_ago = now - timedelta(hours=1)
    return max(0, per_hour - sum(1 for at in recent if at > hour_ago))


def publish_reason(
    previous: StatusReport | None,
    published_at: datetime | None,
    current: StatusReport,
    *,
    now: datetime,
    rules: PublishRules = PublishRules(),
    waiting_since: datetime | None = None,
) -> str | None:
    """Why `current` should be written now (for logs), or None to leave the forge as it is.

    `waiting_since` is when the job was queued: an ETA move is weighed against the whole wait
    the last status promised, from then to its finish, not against what was left of it.
    """
    if previous is None or published_at is None:
        return "first"
    if previous.state == "completed":
        return None  # a completed check is final
    if current.state != previous.state:
        return "state"
    if (now - published_at).total_seconds() < rules.min_interval_s:
        return None
    if current.level != previous.level:
        return "level"
    # A place that shrinks as the queue drains is the progress the ETA promised, not news;
    # one that grows (work jumped ahead) is.
    if (
        current.place is not None
        and previous.place is not None
        and current.place - previous.place > rules.tolerance * previous.place
    ):
        return "place"
    if current.finish_at is not None and previous.finish_at is not None:
        # An ETA that slips because the engines run slower than estimated stays about as far
        # ahead after every write; against what was left of the wait it would be rewritten
        # every minute all morning. Against the whole wait, each rewrite needs a larger move
        # than the last, so a slipping ETA is rewritten a few times, not hundreds.
        since = published_at if waiting_since is None else min(waiting_since, published_at)
        promised_s = max(0.0, (previous.finish_at - since).total_seconds())
        moved_s = abs((current.finish_at - previous.finish_at).total_seconds())
        if moved_s > max(rules.tolerance * promised_s, rules.eta_floor_s):
            return "eta"
    if (
        current.parts_total > 0
        and current.parts_done - previous.parts_done > rules.tolerance * current.parts_total
    ):
        return "progress"
    return None


def parse_severity(text: str) -> str:
    """A severity name of the output contract; raises ValueError naming the choices."""
    cleaned = text.strip().lower()
    if cleaned not in SEVERITIES:
        raise ValueError(f"not a severity: {text!r} (expected one of {', '.join(SEVERITIES)})")
    return cleaned


def findings_at_or_above(counts: Mapping[str, int], severity: str) -> int:
    """How many findings are at `severity` or more severe."""
    threshold = SEVERITIES.index(severity)
    return sum(int(counts.get(name, 0)) for name in SEVERITIES[: threshold + 1])


def conclude(
    state: JobState, *, counts: Mapping[str, int] | None, neutral_at: str
) -> Conclusion | None:
    """The conclusion of an ended job (None while it runs).

    A posted review is `success` unless a finding is at or above `neutral_at`, then `neutral`:
    the bot informs, it never blocks a merge. A newer push makes a review `skipped`; a
    cancelled one is `cancelled`; a review that failed is `neutral` (its text says why).
    """
    if state == JobState.DONE:
        return "neutral" if findings_at_or_above(counts or {}, neutral_at) else "success"
    if state == JobState.SUPERSEDED:
        return "skipped"
    if state == JobState.CANCELLED:
        return "cancelled"
    if state in (JobState.FAILED, JobState.DEAD):
        return "neutral"
    return None


def state_of(job_state: JobState, *, started: bool) -> StatusState:
    """The check run state of a job state."""
    if job_state in (JobState.WAITING, JobState.QUEUED):
        return "in_progress" if started else "queued"
    if job_state == JobState.RUNNING:
        return "in_progress"
    return "completed"


__all__ = [
    "DEFAULT_NEUTRAL_AT",
    "NEWS_FREE",
    "Conclusion",
    "PublishRules",
    "StatusReport",
    "StatusState",
    "conclude",
    "findings_at_or_above",
    "parse_severity",
    "publish_reason",
    "state_of",
    "updates_left",
]
