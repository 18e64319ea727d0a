"""An in-memory forge for replays and scheduling tests: the forge client interface in memory.

The replay swaps the forge and nothing else: the planner fetches a diff from here (for a trace
request, one text file per entry of `file_lines`, each that many added lines) and the poster
posts the review here, at the clock's time, through the same calls it makes against GitHub or
GitLab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.clock import Clock
from bot.errors import ForgeNotFound
from bot.forges.base import Permission, PostedReview, PullChanges, Reaction, ReviewToPost
from bot.forges.statuses import StatusUpdate, StatusWritten
from bot.model import FORGES, FileChange
from bot.sim.trace import TraceRequest, head_sha_for


def added_lines_patch(lines: int) -> str:
    """A unified diff hunk that adds `lines` short lines to a new file."""
    return f"@@ -0,0 +1,{lines} @@\n" + "+x\n" * lines


def trace_files(request: TraceRequest) -> tuple[FileChange, ...]:
    """The changed files fetching the diff of a trace request would show."""
    return tuple(
        FileChange(
            path=f"src/{request.repo.rsplit('/', 1)[-1]}/module_{index}.py",
            additions=lines,
            patch=added_lines_patch(lines),
            status="added",
        )
        for index, lines in enumerate(request.file_lines)
        if lines > 0
    )


@dataclass(frozen=True, slots=True)
class PostedAt:
    """A review the replay's forge received, and when (virtual time)."""

    review: PostedReview
    repo: str
    number: int
    at: datetime


class InMemoryForge:
    """One forge's changes, and the reviews posted on them."""

    def __init__(self, forge: str, clock: Clock) -> None:
        if forge not in FORGES:
            raise ValueError(f"unknown forge {forge!r}: expected one of {FORGES}")
        self.forge = forge
        self.clock = clock
        self._changes: dict[tuple[str, int], PullChanges] = {}
        self.posted: dict[int, PostedAt] = {}  # by job id
        self.statuses: list[StatusUpdate] = []
        self._posted_on: dict[tuple[str, int], list[PostedReview]] = {}

    def add_change(
        self,
        repo: str,
        number: int,
        files: Sequence[FileChange],
        *,
        head_sha: str,
        base_sha: str = "0" * 40,
        total_files: int | None = None,
    ) -> None:
        """Make a change fetchable with these files (its newest push)."""
        self._changes[(repo, number)] = PullChanges(
            base_sha=base_sha,
            head_sha=head_sha,
            start_sha=base_sha,
            files=tuple(files),
            total_files=total_files,
        )

    def add_request(self, request: TraceRequest) -> None:
        """Make a trace request's change fetchable (its push has happened)."""
        self.add_change(
            request.repo,
            request.number,
            trace_files(request),
            head_sha=head_sha_for(request),
            base_sha=f"base-{request.base_ref}",
            total_files=request.files_changed,
        )

    def use_installation(self, repo: str, installation_id: int | None) -> None:
        """No installations in memory."""

    async def fetch_changes(
        self,
        repo: str,
        number: int,
        *,
        project_id: int | None = None,
        installation_id: int | None = None,
    ) -> PullChanges:
        """The diff of a known change; raises ForgeNotFound for any other."""
        try:
            return self._changes[(repo, number)]
        except KeyError:
            raise ForgeNotFound(f"{self.forge} {repo}#{number} is not known") from None

    async def read_file_at(
        self,
        repo: str,
        path: str,
        *,
        ref: str,
        blob_sha: str | None = None,
        project_id: int | None = None,
        installation_id: int | None = None,
    ) -> str | None:
        """A trace carries no file contents: none is ever found."""
        return None

    async def find_posted_review(self, repo: str, number: int, marker: str) -> PostedReview | None:
        """A review posted on this change whose body carries `marker`."""
        for review in self._posted_on.get((repo, number), ()):
            if marker in review.body:
                return review
        return None

    async def post_review(self, repo: str, number: int, review: ReviewToPost) -> PostedReview:
        """Keep the review, with every inline comment placed, at the clock's time."""
        if (repo, number) not in self._changes:
            raise ForgeNotFound(f"{self.forge} {repo}#{number} is not known")
        posted = PostedReview(
            id=len(self.posted) + 1,
            job_id=review.job_id,
            body=review.body,
            inline_posted=len(review.comments),
        )
        self.posted[review.job_id] = PostedAt(posted, repo, number, self.clock.now())
        self._posted_on.setdefault((repo, number), []).append(posted)
        return posted

    async def find_comment(self, repo: str, number: int, marker: str) -> int | None:
        """Comments (slash-command answers) are not replayed: none is ever found."""
        return None

    async def post_comment(
        self, repo: str, number: int, body: str, *, marker: str | None = None
    ) -> int:
        """Comments (slash-command answers) are not replayed: accepted and dropped."""
        return 0

    async def add_reaction(
        self, repo: str, comment_id: int, reaction: Reaction, *, number: int | None = None
    ) -> None:
        """Reactions are not part of a replay."""

    async def get_permission(self, repo: str, user: str) -> Permission:
        """Everyone may write (slash commands are not replayed)."""
        return "write"

    async def publish_status(self, update: StatusUpdate) -> StatusWritten:
        """Keep the status write (a commit status: there is no App here)."""
        self.statuses.append(update)
        return StatusWritten(kind="commit_status")


def memory_forges(clock: Clock) -> dict[str, InMemoryForge]:
    """One in-memory forge per forge name."""
    return {forge: InMemoryForge(forge, clock) for forge in FORGES}


__all__ = ["InMemoryForge", "PostedAt", "added_lines_patch", "memory_forges", "trace_files"]
