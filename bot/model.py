"""Forge-neutral data the whole pipeline speaks: requests, levels, jobs, chunks."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NewType

Forge = Literal["github", "gitlab"]
FORGES: tuple[Forge, ...] = ("github", "gitlab")

JobId = NewType("JobId", int)
ChunkId = NewType("ChunkId", int)


class Level(enum.IntEnum):
    """Priority level; a smaller number is more urgent."""

    P0 = 0
    P1 = 1
    P2 = 2
    P3 = 3

    @classmethod
    def parse(cls, text: str) -> Level:
        """Parse `P2`, `p2` or `2`; raises ValueError on anything else."""
        cleaned = text.strip().upper().removeprefix("P")
        if cleaned not in {"0", "1", "2", "3"}:
            raise ValueError(f"not a level: {text!r} (expected P0, P1, P2 or P3)")
        return cls(int(cleaned))

    def __str__(self) -> str:
        return self.name


LEVELS: tuple[Level, ...] = (Level.P0, Level.P1, Level.P2, Level.P3)

# Severities of a review finding, most severe first.
SEVERITIES: tuple[str, ...] = ("critical", "major", "minor", "info")
# Where the bot anchored a finding (bot.review.anchor): the named line, the quoted line, a
# changed line nearby, or nowhere (listed in the summary only).
ANCHOR_OUTCOMES: tuple[str, ...] = ("exact", "by_quote", "nearby", "summary_only")


class JobState(enum.StrEnum):
    """Life cycle of a review job."""

    WAITING = "waiting"  # blocked on dependencies (stacked PRs)
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # posting or planning failed for good, error kept
    DEAD = "dead"  # a chunk exhausted its attempts
    SUPERSEDED = "superseded"  # a newer push replaced it
    CANCELLED = "cancelled"


TERMINAL_JOB_STATES: frozenset[JobState] = frozenset(
    {JobState.DONE, JobState.FAILED, JobState.DEAD, JobState.SUPERSEDED, JobState.CANCELLED}
)


class ChunkState(enum.StrEnum):
    """Life cycle of one chunk (one LLM call)."""

    BLOCKED = "blocked"  # its job waits for dependencies
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class FileChange:
    """One changed file as the chunker and the prompt see it."""

    path: str
    additions: int = 0
    deletions: int = 0
    patch: str | None = None  # unified diff hunks; None for binary or too-large files
    status: str = "modified"
    previous_path: str | None = None
    blob_sha: str | None = None  # the file's blob at the head, when the forge lists it

    @property
    def changed_lines(self) -> int:
        return self.additions + self.deletions


# Characters of a pull request's description kept with its job (the prompt shows less).
MAX_DESCRIPTION_CHARS = 4000
# Prompt tokens a chunk keeps for the pull request's title, description and code context.
DEFAULT_CONTEXT_TOKENS = 1536


@dataclass(frozen=True, slots=True)
class ReviewRequest:
    """One forge event that may ask for a review, normalized across forges."""

    forge: Forge
    repo: str  # "owner/name" on GitHub, "group/project" path on GitLab
    number: int
    title: str
    author: str
    author_is_bot: bool
    base_ref: str
    head_ref: str
    base_sha: str
    head_sha: str
    event: str  # "pull_request" or "merge_request"
    action: str  # normalized: opened, reopened, synchronize, ready_for_review, edited,
    # labeled, unlabeled, closed, merged
    draft: bool = False
    merged: bool = False
    labels: tuple[str, ...] = ()
    files_changed: int | None = None
    additions: int | None = None
    deletions: int | None = None
    installation_id: int | None = None
    project_id: int | None = None  # GitLab's numeric project id
    web_url: str | None = None
    delivery_id: str | None = None
    depends_on_refs: tuple[str, ...] = ()
    # The author's description (untrusted text; the prompt fences it), cut at intake.
    description: str = ""

    @property
    def changed_lines(self) -> int | None:
        if self.additions is None or self.deletions is None:
            return None
        return self.additions + self.deletions


@dataclass(frozen=True, slots=True)
class Command:
    """A slash command found in a PR/MR comment."""

    forge: Forge
    repo: str
    number: int
    author: str
    comment_id: int
    verb: str  # review, priority, cancel, status, help
    argument: str | None = None
    raw: str = ""
    project_id: int | None = None
    installation_id: int | None = None
    delivery_id: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """What the policy says about a request: its level, why, and whether to review at all."""

    level: Level
    reasons: tuple[str, ...]
    review: bool = True
    rule: str | None = None
    size_pending: bool = False  # size rules could not be checked; evaluate again after the diff


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """A chunk before it is stored: which files (or hunks) it covers and how big it is."""

    files: tuple[Mapping[str, Any], ...]
    lines: int


@dataclass(slots=True)
class Job:
    """A review job as the store returns it."""

    id: JobId
    forge: Forge
    repo: str
    number: int
    head_sha: str
    base_level: Level
    level: Level
    state: JobState
    enqueued_at: datetime
    ready_at: datetime | None = None
    first_started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int = 0
    last_error: str | None = None
    reasons: tuple[str, ...] = ()
    title: str = ""
    author: str = ""
    base_ref: str = ""
    head_ref: str = ""
    base_sha: str = ""
    total_lines: int = 0
    chunks_total: int = 0
    chunks_done: int = 0
    gpu_seconds: float = 0.0
    depends_on: tuple[int, ...] = ()
    planned: bool = False
    # What the webhook said of the pull request (title, description, draft, the installation
    # or project to answer through, who asked) and what planning added to it (the diff's
    # heads, the increment, skipped and excluded files, settings notes, context reads): the
    # review_jobs.request column.
    pull_details: Mapping[str, Any] = field(default_factory=dict)
    # The attempt numbers of the job's planning and posting claims (fencing tokens).
    planning_attempt: int = 0
    posting_attempt: int = 0
    # After a failed planning or posting try: when the next may start, how many failed.
    retry_at: datetime | None = None
    planning_failures: int = 0
    posting_failures: int = 0


@dataclass(slots=True)
class Chunk:
    """A leased or stored chunk."""

    id: ChunkId
    job_id: JobId
    seq: int
    level: Level
    state: ChunkState
    files: tuple[Mapping[str, Any], ...]
    lines: int
    attempts: int = 0
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    gpu_seconds: float | None = None
    result: Mapping[str, Any] | None = None
    last_error: str | None = None
    lease_attempt: int = 0  # the lease's fencing token: grows on every lease
