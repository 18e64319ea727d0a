"""Narrow a job's diff to what changed since the pull request's last reviewed head (I/O).

The planner calls this between fetching the diff and chunking it. The decisions are pure
(bot.review.increment); this reads the last reviewed head from the store and asks the forge.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bot.forges.base import ForgeClient, PullChanges
from bot.forges.quiet import quiet_forge_for
from bot.model import Job
from bot.queue.findings import FindingStore, PullRef
from bot.review.increment import Increment, full_review, level_note

log = logging.getLogger(__name__)

# `/review full` stores this in the job's request: review everything, not the increment.
FULL_REVIEW_KEY = "review_mode"


@dataclass(frozen=True, slots=True)
class ReviewScope:
    """The diff a job reviews, what its request keeps of why, and a note for its level."""

    changes: PullChanges
    details: Mapping[str, Any] = field(default_factory=dict)
    level_note: str | None = None
    wait_for: int | None = None  # an older review of the pull request is still underway


def scope_of(changes: PullChanges, increment: Increment) -> ReviewScope:
    """The narrowed changes of an increment (pure)."""
    narrowed = changes
    if increment.mode == "incremental":
        narrowed = replace(
            changes, files=increment.files, truncated=False, total_files=len(increment.files)
        )
    note = level_note(increment)
    details = {**increment.details(), "level_note": note}
    return ReviewScope(narrowed, {"increment": details}, note)


class IncrementNarrower:
    """The planner's hook: a review after the first covers only what changed since."""

    def __init__(self, findings: FindingStore, forges: Mapping[str, ForgeClient]) -> None:
        self.findings = findings
        self.forges = forges

    async def __call__(self, job: Job, changes: PullChanges) -> ReviewScope:
        """The scope of `job`; raises ForgeError from the forge like fetching the diff does."""
        pull = PullRef(job.forge, job.repo, job.number)
        underway = await self.findings.review_underway(pull, job_id=job.id)
        if underway is not None:
            return ReviewScope(changes, wait_for=underway)
        if job.request.get(FULL_REVIEW_KEY) == "full":
            return scope_of(changes, full_review(changes.files, "a full review was asked for"))
        last = await self.findings.last_reviewed(pull, job_id=job.id)
        if last is None:
            reason = "the first review of this pull request"
            return scope_of(changes, full_review(changes.files, reason))
        client = self.forges.get(job.forge)
        quiet = quiet_forge_for(client) if client is not None else None
        if quiet is None:
            return scope_of(changes, full_review(changes.files, "the forge cannot compare"))
        increment = await quiet.increment_since(
            job.repo, job.number, since=last.head_sha, changes=changes
        )
        log.info(
            "job %s: %s review, %s",
            job.id,
            increment.mode,
            increment.reason,
            extra={"action": "review_scope", "job_id": job.id, "forge": job.forge},
        )
        return scope_of(changes, increment)


__all__ = ["FULL_REVIEW_KEY", "IncrementNarrower", "ReviewScope", "scope_of"]
