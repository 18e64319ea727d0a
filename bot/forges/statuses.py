"""A review's status on the forge, forge-neutral: what is written and how each forge names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bot.budget.decide import WriteValue

STATUS_NAME = "review-bot"  # the check run's name, the commit status's context
StatusKind = Literal["check_run", "commit_status"]
GITLAB_DESCRIPTION_LIMIT = 255
GITHUB_DESCRIPTION_LIMIT = 140


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    """One write of a job's status on its head commit."""

    repo: str
    head_sha: str
    job_id: int
    state: Literal["queued", "in_progress", "completed"]
    title: str
    summary: str
    description: str
    conclusion: str | None = None  # check run conclusion when completed
    details_url: str | None = None
    check_run_id: str | None = None  # the run an earlier write created (GitHub App)
    installation_id: int | None = None
    project_id: int | None = None


@dataclass(frozen=True, slots=True)
class StatusWritten:
    """What the forge holds now: a check run (and its id) or a commit status."""

    kind: StatusKind
    external_id: str | None = None


# GitLab's states a finished status has: the next write on its head starts a new status.
GITLAB_FINISHED = frozenset({"success", "failed", "canceled", "skipped"})
# What GitLab's API lets a live status become (its commit status state machine): a pending
# status may run or finish, a running one may only finish; pending -> pending, running ->
# pending and running -> running are refused with 400 "Cannot transition status via ...".
GITLAB_NEXT: dict[str, frozenset[str]] = {
    "pending": frozenset({"running", "success", "failed", "canceled"}),
    "running": frozenset({"success", "failed", "canceled"}),
}


def status_value(update: StatusUpdate) -> WriteValue:
    """What a status write is worth: the final state, the first one, or news."""
    if update.state == "completed":
        return WriteValue.CHECK_COMPLETED
    if update.check_run_id is None:
        return WriteValue.FIRST_STATUS
    return WriteValue.NEWS


def github_commit_state(update: StatusUpdate) -> str:
    """A commit status state (tokens cannot write check runs).

    A review with findings at or above the threshold (conclusion `neutral`) is `failure`, as
    on GitLab: a commit status has no neutral, and green would say the head is clean. Not
    reviewed (skipped, cancelled) is `success`: the description says why.
    """
    if update.state != "completed":
        return "pending"
    return "failure" if update.conclusion == "neutral" else "success"


def gitlab_commit_state(update: StatusUpdate) -> str:
    """GitLab's status: pending, then running, then success, failed (findings at or above the
    threshold) or canceled (not reviewed)."""
    return gitlab_state_of(update.state, update.conclusion)


def gitlab_state_of(state: str, conclusion: str | None) -> str:
    """GitLab's name for a status state and conclusion."""
    if state == "queued":
        return "pending"
    if state == "in_progress":
        return "running"
    if conclusion in ("cancelled", "skipped"):
        return "canceled"
    return "failed" if conclusion == "neutral" else "success"


def gitlab_allows(current: str | None, wanted: str) -> bool:
    """Whether GitLab takes `wanted` on a head whose status (this name) is `current`."""
    if current is None or current in GITLAB_FINISHED:
        return True
    return wanted in GITLAB_NEXT.get(current, frozenset())


def shorten(text: str, limit: int) -> str:
    """Cut a description to the forge's limit."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


__all__ = [
    "GITLAB_FINISHED",
    "GITLAB_NEXT",
    "STATUS_NAME",
    "StatusKind",
    "StatusUpdate",
    "StatusWritten",
    "github_commit_state",
    "gitlab_allows",
    "gitlab_commit_state",
    "gitlab_state_of",
    "shorten",
    "status_value",
]
