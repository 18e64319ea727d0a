"""A review's status on the forge, forge-neutral: what is written and how each forge names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


def github_commit_state(update: StatusUpdate) -> str:
    """A commit status state (tokens cannot write check runs).

    Ended reviews are `success` whatever they found: the bot informs and never blocks a merge;
    the description says what happened.
    """
    return "pending" if update.state != "completed" else "success"


def gitlab_commit_state(update: StatusUpdate) -> str:
    """GitLab's status: pending, then running, then success (canceled when not reviewed)."""
    if update.state == "queued":
        return "pending"
    if update.state == "in_progress":
        return "running"
    return "canceled" if update.conclusion in ("cancelled", "skipped") else "success"


def shorten(text: str, limit: int) -> str:
    """Cut a description to the forge's limit."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


__all__ = [
    "STATUS_NAME",
    "StatusKind",
    "StatusUpdate",
    "StatusWritten",
    "github_commit_state",
    "gitlab_commit_state",
    "shorten",
]
