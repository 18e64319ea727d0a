"""Narrow a job's diff to what changed since the pull request's last reviewed head (I/O).

The planner calls this between fetching the diff and chunking it. The decisions are pure
(bot.increment); this reads the last reviewed head from the store and asks the forge.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from bot.forges.base import ForgeClient, PullChanges
from bot.forges.quiet import QuietForge, quiet_forge_for
from bot.increment import Increment, full_review, level_note
from bot.model import Job
from bot.queue.findings import FindingStore, PullRef
from bot.review.repo_settings import (
    SETTINGS_PATH,
    RepoSettings,
    RepoSettingsError,
    parse_repo_settings,
    select_files,
)

log = logging.getLogger(__name__)

# How often a review waiting for another review of its pull request looks again.
WAIT_BEHIND_S = 5.0
# `/review full` stores this in the job's request extras: review everything, not the increment.
FULL_REVIEW_KEY = "review_mode"


@dataclass(frozen=True, slots=True)
class ReviewScope:
    """The diff a job reviews, what its request keeps of why, and a note for its level."""

    changes: PullChanges
    details: Mapping[str, Any] = field(default_factory=dict)
    level_note: str | None = None
    cancel: str | None = None  # the repository's settings say not to review it, and why
    wait_for: int | None = None  # an older review of the pull request is still underway


def scope_of(
    changes: PullChanges,
    increment: Increment,
    settings: Mapping[str, Any] | None = None,
) -> ReviewScope:
    """The narrowed changes of an increment, with what the repository's settings add (pure)."""
    narrowed = changes
    if increment.mode == "incremental":
        narrowed = replace(
            changes, files=increment.files, truncated=False, total_files=len(increment.files)
        )
    note = level_note(increment)
    details = {**(settings or {}), "increment": {**increment.details(), "level_note": note}}
    return ReviewScope(narrowed, details, note)


def settings_details(
    settings: RepoSettings, notes: Sequence[str], excluded: Sequence[str]
) -> dict[str, Any]:
    """What a job's request keeps of the repository's settings (pure)."""
    details: dict[str, Any] = {"settings_notes": list(notes), "excluded": list(excluded)}
    quiet: dict[str, Any] = {}
    if settings.min_severity is not None:
        quiet["min_inline_severity"] = settings.min_severity
    if settings.max_comments is not None:
        quiet["inline_cap"] = settings.max_comments
    if quiet:
        details["quiet"] = quiet
    if settings.instructions:
        details["instructions"] = [{"path": i.glob, "text": i.text} for i in settings.instructions]
    return details


def settings_refusal(job: Job, settings: RepoSettings) -> str | None:
    """Why the repository's settings say not to review this job, or None (pure)."""
    asked = bool((job.pull_details.get("extra") or {}).get("requested_by"))
    if not settings.auto and not asked:
        return f"automatic reviews are off in {SETTINGS_PATH}; ask with /review"
    if not settings.drafts and job.pull_details.get("draft"):
        return f"drafts are not reviewed ({SETTINGS_PATH})"
    return None


class IncrementNarrower:
    """The planner's hook: a review after the first covers only what changed since."""

    def __init__(self, findings: FindingStore, forges: Mapping[str, ForgeClient]) -> None:
        self.findings = findings
        self.forges = forges
        # (forge, repo) -> (blob sha, settings, problems): a file is parsed once per content.
        self._settings: dict[tuple[str, str], tuple[str, RepoSettings, tuple[str, ...]]] = {}

    async def repo_settings(
        self, job: Job, quiet: QuietForge
    ) -> tuple[RepoSettings, tuple[str, ...]]:
        """The repository's settings from its default branch, and any problem with them."""
        found = await quiet.read_default_file(job.repo, SETTINGS_PATH)
        if found is None:
            return RepoSettings(), ()
        key = (job.forge, job.repo)
        cached = self._settings.get(key)
        if cached is not None and cached[0] == found.blob_sha:
            return cached[1], cached[2]
        notes: tuple[str, ...] = ()
        try:
            parsed = parse_repo_settings(found.text)
        except RepoSettingsError as exc:
            # One note per problem, so a file with several is fixed in one go.
            *earlier, last = exc.problems
            notes = (
                *(f"`{problem}`" for problem in earlier),
                f"`{last}`; the server's defaults apply.",
            )
            parsed = RepoSettings()
            log.warning(
                "job %s: %s",
                job.id,
                exc,
                extra={"action": "repo_settings_broken", "job_id": job.id},
            )
        self._settings[key] = (found.blob_sha, parsed, notes)
        return parsed, notes

    async def __call__(self, job: Job, changes: PullChanges, now: datetime) -> ReviewScope:
        """The scope of `job`; raises ForgeError from the forge like fetching the diff does."""
        pull = PullRef(job.forge, job.repo, job.number)
        underway = await self.findings.review_underway(pull, job_id=job.id)
        if underway is not None:
            # The next review starts from the head the one underway reviews: plan after it.
            retry_at = now + timedelta(seconds=WAIT_BEHIND_S)
            await self.findings.plan_later(job.id, retry_at=retry_at)
            return ReviewScope(changes, wait_for=underway)
        client = self.forges.get(job.forge)
        quiet = quiet_forge_for(client) if client is not None else None
        if quiet is None:
            return scope_of(changes, full_review(changes.files, "the forge cannot compare"))
        settings, notes = await self.repo_settings(job, quiet)
        refusal = settings_refusal(job, settings)
        if refusal is not None:
            return ReviewScope(changes, cancel=refusal)
        kept, excluded = select_files(changes.files, settings)
        changes = replace(changes, files=kept)
        extra = settings_details(settings, notes, excluded)
        if (job.pull_details.get("extra") or {}).get(FULL_REVIEW_KEY) == "full":
            reason = "a full review was asked for"
            return scope_of(changes, full_review(changes.files, reason), extra)
        last = await self.findings.last_reviewed(pull, job_id=job.id)
        if last is None:
            reason = "the first review of this pull request"
            return scope_of(changes, full_review(changes.files, reason), extra)
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
        return scope_of(changes, increment, extra)


__all__ = ["FULL_REVIEW_KEY", "IncrementNarrower", "ReviewScope", "scope_of"]
