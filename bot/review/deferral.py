"""What planning and posting do when the forge fails: try again later, or end the job failed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from bot.errors import ForgeError
from bot.forges.base import may_pass_later
from bot.model import Job, JobState
from bot.queue.records import Fence
from bot.queue.store import QueueStore
from bot.retry import exponential_delay

log = logging.getLogger(__name__)

Stage = Literal["planning", "posting"]
_ACTION_PREFIX = {"planning": "plan", "posting": "post"}
_ACTOR = {"planning": "planner", "posting": "poster"}


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """How often and how patiently one stage retries a failing forge."""

    max_attempts: int
    backoff_s: float
    max_backoff_s: float


def retry_delay(tries: int, error: ForgeError, budget: RetryBudget) -> float:
    """Seconds before the next try: the forge's Retry-After, else doubling from backoff_s."""
    if error.retry_after is not None:
        return max(error.retry_after, 0.0)
    return exponential_delay(tries, base_s=budget.backoff_s, max_s=budget.max_backoff_s)


async def defer_or_fail(
    store: QueueStore,
    job: Job,
    error: ForgeError,
    *,
    now: datetime,
    stage: Stage,
    message: str,
    budget: RetryBudget,
    fence: Fence | None = None,
) -> tuple[Literal["deferred", "failed"], str]:
    """Defer a retryable failure with backoff while tries remain; else end the job failed.

    With a `fence`, either write lands only while that attempt still holds the job's claim.
    """
    context = {"job_id": job.id, "forge": job.forge}
    prefix = _ACTION_PREFIX[stage]
    if may_pass_later(error):
        tries = (job.planning_failures if stage == "planning" else job.posting_failures) + 1
        if tries < budget.max_attempts:
            delay = retry_delay(tries, error, budget)
            recorded = await store.defer_job(
                job.id,
                now=now,
                retry_at=now + timedelta(seconds=delay),
                error=message,
                kind=stage,
                fence=fence,
            )
            log.warning(
                "job %s: %s; try %d of %d again in %.0f s",
                job.id,
                message,
                tries,
                budget.max_attempts,
                delay,
                extra={"action": f"{prefix}_deferred", **context},
            )
            return "deferred", f"{message} (try {recorded})"
        message = f"{message} (gave up after {tries} tries)"
    await store.finish_job(
        job.id, now=now, state=JobState.FAILED, error=message, actor=_ACTOR[stage], fence=fence
    )
    log.error("job %s failed: %s", job.id, message, extra={"action": f"{prefix}_failed", **context})
    return "failed", message
