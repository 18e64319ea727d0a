"""What the dispatcher and poster need from a forge, plus the pure helpers both forges share."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol, TypeVar, runtime_checkable

from bot.diff import fence_for, parse_hunks, split_lines
from bot.errors import ForgeError, LeaseLost
from bot.forges.statuses import StatusUpdate, StatusWritten
from bot.model import FileChange
from bot.retry import call_with_retries, exponential_delay

logger = logging.getLogger(__name__)

Permission = Literal["admin", "maintain", "write", "triage", "read", "none"]
PERMISSIONS: tuple[Permission, ...] = ("admin", "maintain", "write", "triage", "read", "none")
Reaction = Literal["eyes", "+1", "-1", "confused"]
Side = Literal["LEFT", "RIGHT"]

# GitHub lists at most 3,000 files of a pull request; GitLab's diffs are capped the same way here.
MAX_FILES = 3000

MARKER_PATTERN = re.compile(r"<!-- review-bot:job=(\d+) -->")
# The hidden marker that finds a pull request's living summary again (after a crash, or from
# another process).
SUMMARY_MARKER = "<!-- review-bot:summary -->"

Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]
T = TypeVar("T")


def utc_now() -> datetime:
    """Return the current time, timezone-aware UTC."""
    return datetime.now(UTC)


class ForgePermissionDenied(ForgeError):
    """The forge refused the call for lack of rights (not a rate limit); retrying will not help."""

    @property
    def retryable(self) -> bool:
        return False


class ForgeAuthRefused(ForgeError):
    """The forge did not accept our credentials (401): a clock off, a key or token rotated.

    Retrying at once does not help (the call path already tried a fresh token); a later try
    may, so replies, reactions and reviews refused this way are deferred, never dropped.
    """

    @property
    def retryable(self) -> bool:
        return False


def may_pass_later(error: ForgeError) -> bool:
    """Whether waiting may help: what a retry may fix, or credentials refused for now."""
    return error.retryable or isinstance(error, ForgeAuthRefused)


class ForgeCredentialsExpired(ForgeError):
    """A cached credential was refused (revoked or rotated); a fresh one may be fetched."""

    @property
    def retryable(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class PullChanges:
    """A pull/merge request's diff: the shas it is based on and its changed files."""

    base_sha: str
    head_sha: str
    start_sha: str
    files: tuple[FileChange, ...]
    truncated: bool = False  # the forge listed fewer files than the change has
    total_files: int | None = None
    # The title and description as the forge holds them now (None: not read with the diff).
    title: str | None = None
    description: str | None = None


@dataclass(frozen=True, slots=True)
class InlineComment:
    """One comment on a diff line; `side` RIGHT is the new file, LEFT the old one.

    From the review's own stored diff, not the forge's current one (a push may have moved it
    on): `start_line` opens a range ending at `line` on the same side; `old_path` is a renamed
    file's path before the rename; `line_pair` is the line's (old, new) numbers, which GitLab
    needs both of for an unchanged line. `suggestion` is replacement code for exactly the
    lines start_line..line, all on the RIGHT side of one hunk (the poster checks), which the
    forge renders as its suggestion block.
    """

    path: str
    line: int
    body: str
    side: Side = "RIGHT"
    start_line: int | None = None
    old_path: str | None = None
    line_pair: tuple[int | None, int | None] | None = None
    suggestion: str | None = None


@dataclass(frozen=True, slots=True)
class ReviewToPost:
    """A review assembled from chunk results, ready to post once."""

    job_id: int
    body: str
    comments: tuple[InlineComment, ...] = ()
    head_sha: str | None = None
    base_sha: str | None = None
    start_sha: str | None = None
    # No earlier attempt of the job can have posted it (its first posting claim): the forge
    # is not searched for it first. A lost answer to the write itself is still looked up.
    first_attempt: bool = False


@dataclass(frozen=True, slots=True)
class PostedReview:
    """What a forge holds of a review we posted (found again through its marker)."""

    id: int
    job_id: int | None
    body: str
    url: str | None = None
    inline_posted: int = 0
    inline_rejected: int = 0
    summary_only: bool = False  # inline comments were refused; the summary lists them
    already_posted: bool = False
    rejected: tuple[int, ...] = ()  # indexes of the review's comments the forge refused


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry a retryable forge error."""

    attempts: int = 4
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0


# Reads for a review's context are worth one retry, not a planning delay: the review goes on
# without them.
READ_RETRY = RetryPolicy(attempts=2, base_delay_s=0.5, max_delay_s=2.0)


@runtime_checkable
class ReadsManyFiles(Protocol):
    """A forge client that reads many files at one commit in one request (GitHub's GraphQL
    API): planning then reads every file a review could use at once, where a client without
    it reads them one request each, only as far as the prompts have room."""

    async def read_files_at(
        self,
        repo: str,
        paths: Sequence[str],
        *,
        ref: str,
        blob_shas: Mapping[str, str | None],
        installation_id: int | None = None,
    ) -> Mapping[str, str | None]:
        """Each path's text at commit `ref` (None when it is not there or not text), every
        path answered. Raises ForgeError when the forge would not answer the request."""
        ...


class ForgeClient(Protocol):
    """The forge operations the dispatcher, poster and command handler use."""

    def use_installation(self, repo: str, installation_id: int | None) -> None:
        """Remember the installation a webhook named for `repo` (GitHub Apps; else nothing)."""

    async def fetch_changes(
        self,
        repo: str,
        number: int,
        *,
        project_id: int | None = None,
        installation_id: int | None = None,
    ) -> PullChanges: ...

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
        """A file's text at commit `ref`; None when it is not there or not text."""

    async def find_posted_review(
        self, repo: str, number: int, marker: str
    ) -> PostedReview | None: ...

    async def post_review(self, repo: str, number: int, review: ReviewToPost) -> PostedReview: ...

    async def find_comment(self, repo: str, number: int, marker: str) -> int | None: ...

    async def post_comment(
        self, repo: str, number: int, body: str, *, marker: str | None = None
    ) -> int: ...

    async def add_reaction(
        self, repo: str, comment_id: int, reaction: Reaction, *, number: int | None = None
    ) -> None: ...

    async def get_permission(self, repo: str, user: str) -> Permission: ...

    async def publish_status(self, update: StatusUpdate) -> StatusWritten: ...


def render_marker(job_id: int) -> str:
    """Render the hidden marker that ties a posted body to its job."""
    return f"<!-- review-bot:job={int(job_id)} -->"


def render_reply_marker(delivery_row_id: int) -> str:
    """The hidden marker of the reply to one command delivery (found again on a retry)."""
    return f"<!-- review-bot:reply={int(delivery_row_id)} -->"


def find_marker(body: str | None) -> int | None:
    """Return the job id of the first marker in `body`, or None."""
    if not body:
        return None
    match = MARKER_PATTERN.search(body)
    return int(match.group(1)) if match else None


def append_marker(body: str, job_id: int) -> str:
    """Return `body` with the job's marker appended (once)."""
    marker = render_marker(job_id)
    if marker in body:
        return body
    return f"{body.rstrip()}\n\n{marker}"


def render_summary_only(review: ReviewToPost, reason: str) -> str:
    """Render a summary that lists the findings the forge would not place inline."""
    lines = [review.body.rstrip(), "", f"_Inline comments could not be placed ({reason}):_", ""]
    for comment in review.comments:
        first_line = split_lines(comment.body.strip())[0] if comment.body.strip() else ""
        side = "old" if comment.side == "LEFT" else "new"
        lines.append(f"- `{comment.path}` line {comment.line} ({side}): {first_line}")
    return append_marker("\n".join(lines), review.job_id)


def with_suggestion(body: str, suggestion: str | None, *, info: str = "suggestion") -> str:
    """A comment body with its replacement code as a suggestion block (`info` names the
    block: GitHub's "suggestion", GitLab's "suggestion:-N+M")."""
    if suggestion is None:
        return body
    code = suggestion.rstrip("\n")
    fence = fence_for(code)
    return f"{body}\n\n{fence}{info}\n{code}\n{fence}"


@dataclass(frozen=True, slots=True)
class DiffLines:
    """Which lines of a unified diff can carry a comment."""

    added: frozenset[int]  # new-file line numbers of `+` lines
    removed: frozenset[int]  # old-file line numbers of `-` lines
    context: Mapping[int, int]  # new-file line number -> old-file line number of ` ` lines

    def has_line(self, line: int, side: Side) -> bool:
        if side == "RIGHT":
            return line in self.added or line in self.context
        return line in self.removed or line in self.context.values()

    def line_pair(self, line: int, side: Side) -> tuple[int | None, int | None]:
        """Return (old_line, new_line) of a commentable line, as GitLab positions need them."""
        if side == "RIGHT":
            if line in self.added:
                return None, line
            if line in self.context:
                return self.context[line], line
        else:
            if line in self.removed:
                return line, None
            for new_line, old_line in self.context.items():
                if old_line == line:
                    return old_line, new_line
        raise ValueError(f"line {line} ({side}) is not part of the diff")


def parse_diff_lines(patch: str | None) -> DiffLines:
    """Map a unified diff's hunks to the old/new line numbers a comment may point at.

    Lines past a hunk header's counts are left out (see bot.diff.Hunk.trusted_lines).
    """
    added: set[int] = set()
    removed: set[int] = set()
    context: dict[int, int] = {}
    for hunk in parse_hunks(patch):
        for line in hunk.trusted_lines:
            if line.kind == "+" and line.new_line is not None:
                added.add(line.new_line)
            elif line.kind == "-" and line.old_line is not None:
                removed.add(line.old_line)
            elif line.new_line is not None and line.old_line is not None:
                context[line.new_line] = line.old_line
    return DiffLines(frozenset(added), frozenset(removed), context)


def count_patch_lines(patch: str | None) -> tuple[int, int]:
    """Count (additions, deletions) of a unified diff."""
    added = removed = 0
    for hunk in parse_hunks(patch):
        for line in hunk.lines:
            added += line.kind == "+"
            removed += line.kind == "-"
    return added, removed


WriteGuard = Callable[[], Awaitable[bool]]
# The check each forge call must pass right before it goes out (after pacing and a retry's
# wait, which can take seconds): set by the holder of the lease the writes follow from, so a
# process paused past its lease sends nothing it was about to send when it resumes.
_WRITE_GUARD: ContextVar[WriteGuard | None] = ContextVar("forge_write_guard", default=None)


@contextlib.contextmanager
def guarded_writes(guard: WriteGuard) -> Iterator[None]:
    """Within the block, every forge call first asks `guard` (LeaseLost when it says no)."""
    token = _WRITE_GUARD.set(guard)
    try:
        yield
    finally:
        _WRITE_GUARD.reset(token)


async def always_held() -> bool:
    """A guard for writes that are safe whoever holds the lease (taking back one's own)."""
    return True


async def write_guard_holds() -> bool:
    """Whether the block's guard (if any) still says yes: asked after a write, it tells whether
    the write went out after the lease was lost (sent by a process that resumed past it)."""
    guard = _WRITE_GUARD.get()
    return guard is None or await guard()


async def check_write_guard(action: str) -> None:
    """Raise LeaseLost when the block's guard (if any) says the lease is gone."""
    guard = _WRITE_GUARD.get()
    if guard is not None and not await guard():
        raise LeaseLost(f"{action}: the lease this forge call follows from was lost")


async def retry_forge_call(
    call: Callable[[], Awaitable[T]],
    *,
    sleep: Sleep,
    policy: RetryPolicy,
    action: str,
    on_retry: Callable[[ForgeError], Awaitable[None]] | None = None,
) -> T:
    """Run `call`, retrying retryable ForgeErrors with backoff or their Retry-After; re-raises."""

    def delay(error: BaseException, attempt: int) -> float:
        if isinstance(error, ForgeError) and error.retry_after is not None:
            return max(0.0, error.retry_after)
        return exponential_delay(attempt, base_s=policy.base_delay_s, max_s=policy.max_delay_s)

    async def before_retry(error: BaseException, attempt: int, seconds: float) -> None:
        assert isinstance(error, ForgeError)
        logger.warning(
            "forge call %s failed (%s), retry %d in %.1fs",
            action,
            error,
            attempt,
            seconds,
            extra={"action": "forge_retry", "forge_action": action, "status": error.status},
        )
        if on_retry is not None:
            await on_retry(error)

    return await call_with_retries(
        call,
        attempts=policy.attempts,
        retryable=lambda error: isinstance(error, ForgeError) and error.retryable,
        delay=delay,
        sleep=sleep,
        before_retry=before_retry,
    )
