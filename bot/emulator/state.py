"""The emulator's state: seeded pull requests, recorded requests and posts, faults to inject."""

from __future__ import annotations

import copy
import hashlib
import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from bot.emulator.limits import (
    GITHUB_CONTENT_LIMITS,
    GITLAB_CONTENT_LIMITS,
    ContentLedger,
    ContentLimits,
)
from bot.forges.base import Clock, utc_now
from bot.model import FileChange, Forge

GITHUB_DOCS = "https://docs.github.com/rest"
REVIEW_DOCS = "https://docs.github.com/rest/pulls/reviews#create-a-review-for-a-pull-request"
SECONDARY_LIMIT_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
    "If you reach out to GitHub Support for help, please include the request ID {request_id}."
)
SECONDARY_LIMIT_DOCS = (
    "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"
)
LINE_OUTSIDE_DIFF = (
    "Pull request review thread line must be part of the diff and "
    "Pull request review thread diff hunk can't be blank"
)
START_LINE_AFTER = "pull_request_review_thread.start_line must precede the end line."
START_LINE_OUTSIDE_HUNK = (
    "pull_request_review_thread.start_line must be part of the same hunk as the line."
)
REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
AWARD_EMOJI = ("thumbsup", "thumbsdown", "eyes", "confused", "heart", "tada", "rocket", "smile")
BOT_LOGIN = "review-bot[bot]"
GITLAB_BOT = "review-bot"


@dataclass(slots=True)
class Fault:
    """One injected answer for a route: an error status, a rate limit, or a delay."""

    status: int | None = 502  # None: answer normally (after the delay)
    delay_s: float = 0.0
    retry_after: float | None = None
    message: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    after_handling: bool = False  # the request takes effect, but its answer is lost

    @classmethod
    def server_error(cls, status: int = 502) -> Fault:
        return cls(status=status)

    @classmethod
    def lost_response(cls, status: int = 502) -> Fault:
        return cls(status=status, after_handling=True)

    @classmethod
    def secondary_rate_limit(cls, retry_after: float = 60.0) -> Fault:
        return cls(status=403, retry_after=retry_after, message=SECONDARY_LIMIT_MESSAGE)

    @classmethod
    def too_many_requests(cls, retry_after: float = 30.0) -> Fault:
        return cls(status=429, retry_after=retry_after)

    @classmethod
    def slow(cls, delay_s: float) -> Fault:
        return cls(status=None, delay_s=delay_s)

    @classmethod
    def late_answer(cls, delay_s: float) -> Fault:
        """The request takes effect at once; its (normal) answer comes `delay_s` later."""
        return cls(status=None, delay_s=delay_s, after_handling=True)


@dataclass(slots=True)
class Record:
    """Something a client created on the emulated forge."""

    forge: Forge
    kind: str  # review, issue_comment, reaction, discussion, note, award_emoji
    repo: str
    number: int | None
    body: str | None
    data: dict[str, Any]


@dataclass(slots=True)
class RequestLog:
    """One request the emulator answered."""

    method: str
    path: str
    route: str
    status: int
    at: datetime
    # The request's Accept and X-GitHub-Api-Version, as sent (None when absent).
    accept: str | None = None
    api_version: str | None = None
    # Who asked: a GitHub installation or token, a GitLab token (as `identity_of` names them).
    identity: str = ""


@dataclass(slots=True)
class Version:
    """One pushed state of a PR/MR (GitLab's diff version)."""

    id: int
    base_sha: str
    start_sha: str
    head_sha: str
    files: list[FileChange]
    created_at: datetime


@dataclass(slots=True)
class EmulatedPull:
    """A seeded pull request (GitHub) or merge request (GitLab)."""

    forge: Forge
    repo: str
    number: int
    id: int
    title: str
    author: str
    base_ref: str
    head_ref: str
    versions: list[Version]
    labels: list[str] = field(default_factory=list)
    draft: bool = False
    state: str = "open"
    project_id: int | None = None
    created_at: datetime | None = None
    reviews: list[dict[str, Any]] = field(default_factory=list)
    comments: list[dict[str, Any]] = field(default_factory=list)  # GitHub issue comments
    discussions: list[dict[str, Any]] = field(default_factory=list)  # GitLab
    notes: list[dict[str, Any]] = field(default_factory=list)  # GitLab, all notes

    @property
    def newest(self) -> Version:
        return self.versions[-1]

    @property
    def files(self) -> list[FileChange]:
        return self.newest.files


class EmulatorState:
    """Everything the emulator knows and everything clients did to it."""

    def __init__(self, *, clock: Clock = utc_now) -> None:
        self.clock = clock
        self.started_at = clock()  # objects' fixed times derive from it (stable ETags)
        self.pulls: dict[tuple[str, str, int], EmulatedPull] = {}
        self.records: list[Record] = []
        self.requests: list[RequestLog] = []
        self.faults: dict[str, deque[Fault]] = {}
        self.github_tokens: set[str] = set()  # empty: any plain token is accepted
        self.gitlab_tokens: set[str] = set()
        # The GitLab release answered as: before 15.7 there is no merge request /diffs.
        self.gitlab_version: tuple[int, int] = (17, 0)
        self.apps: dict[str, str] = {}  # app id -> public key PEM
        self.installations: dict[str, int] = {}  # repo -> installation id
        self.issued_tokens: dict[str, tuple[int, datetime]] = {}
        self.permissions: dict[tuple[str, str], str] = {}  # GitHub (repo, login) -> role
        self.access_levels: dict[tuple[str, str], int] = {}  # GitLab (path, username) -> level
        self.users: dict[str, int] = {}
        self.projects: dict[str, int] = {}
        # check runs and commit statuses, served by bot.emulator.checks
        self.check_runs: dict[int, dict[str, Any]] = {}
        self.commit_statuses: list[dict[str, Any]] = []
        # GitLab status writes refused by its state machine: (project, sha, from, to).
        self.refused_transitions: list[tuple[str, str, str, str]] = []
        # Secondary limits on content-creating requests per identity (bot.emulator.limits).
        self.content_limits: dict[Forge, ContentLimits] = {
            "github": GITHUB_CONTENT_LIMITS,
            "gitlab": GITLAB_CONTENT_LIMITS,
        }
        self.content = ContentLedger()
        self._ids = itertools.count(1001)
        self._shas = itertools.count(1)

    # -- seeding -------------------------------------------------------------------------

    def next_id(self) -> int:
        return next(self._ids)

    def make_sha(self, hint: str = "") -> str:
        return hashlib.sha1(f"{hint}:{next(self._shas)}".encode()).hexdigest()

    def user_id(self, login: str) -> int:
        if login not in self.users:
            self.users[login] = self.next_id()
        return self.users[login]

    def project_id(self, path: str) -> int:
        if path not in self.projects:
            self.projects[path] = self.next_id()
        return self.projects[path]

    def add_pull(
        self,
        forge: Forge,
        repo: str,
        number: int,
        *,
        files: Sequence[FileChange],
        head_sha: str | None = None,
        base_sha: str | None = None,
        base_ref: str = "main",
        head_ref: str | None = None,
        title: str | None = None,
        author: str = "octocat",
        labels: Sequence[str] = (),
        draft: bool = False,
        installation_id: int | None = None,
        project_id: int | None = None,
    ) -> EmulatedPull:
        """Seed a PR (github) or MR (gitlab) with its changed files."""
        base = base_sha or self.make_sha(f"{repo}:{number}:base")
        version = Version(
            id=self.next_id(),
            base_sha=base,
            start_sha=base,
            head_sha=head_sha or self.make_sha(f"{repo}:{number}:head"),
            files=list(files),
            created_at=self.clock(),
        )
        if forge == "gitlab":
            if project_id is not None:
                self.projects[repo] = project_id
            project_id = self.project_id(repo)
        else:
            self.installations.setdefault(repo, installation_id or 1)
        self.user_id(author)
        pull = EmulatedPull(
            forge=forge,
            repo=repo,
            number=number,
            id=self.next_id(),
            title=title or f"Change {number} in {repo}",
            author=author,
            base_ref=base_ref,
            head_ref=head_ref or f"feature/change-{number}",
            versions=[version],
            labels=list(labels),
            draft=draft,
            project_id=project_id,
            created_at=self.clock(),
        )
        self.pulls[(forge, repo, number)] = pull
        return pull

    def push(
        self,
        forge: Forge,
        repo: str,
        number: int,
        *,
        files: Sequence[FileChange] | None = None,
        head_sha: str | None = None,
    ) -> Version:
        """Simulate a new push: a new head sha (and optionally new files)."""
        pull = self.get_pull(forge, repo, number)
        previous = pull.newest
        version = Version(
            id=self.next_id(),
            base_sha=previous.base_sha,
            start_sha=previous.start_sha,
            head_sha=head_sha or self.make_sha(f"{repo}:{number}:push"),
            files=list(files) if files is not None else list(previous.files),
            created_at=self.clock(),
        )
        pull.versions.append(version)
        return version

    def get_pull(self, forge: Forge, repo: str, number: int) -> EmulatedPull:
        return self.pulls[(forge, repo, number)]

    def set_permission(self, repo: str, user: str, role: str) -> None:
        """GitHub: give `user` a role (admin, maintain, write, triage, read, none)."""
        self.user_id(user)
        self.permissions[(repo, user)] = role

    def set_access_level(self, repo: str, user: str, level: int) -> None:
        """GitLab: make `user` a member with an access level (10..50)."""
        self.user_id(user)
        self.access_levels[(repo, user)] = level

    def register_app(self, app_id: str, public_key_pem: str) -> None:
        self.apps[str(app_id)] = public_key_pem

    def add_fault(self, route: str, fault: Fault, *, times: int = 1) -> None:
        """Queue `fault` for the next `times` requests of `route` (a route name, see ROUTES)."""
        queue = self.faults.setdefault(route, deque())
        for _ in range(times):
            queue.append(copy.copy(fault))

    # -- inspection ----------------------------------------------------------------------

    def posted(
        self,
        *,
        forge: Forge | None = None,
        kind: str | None = None,
        repo: str | None = None,
        number: int | None = None,
    ) -> list[Record]:
        """What clients created, filtered."""
        return [
            item
            for item in self.records
            if (forge is None or item.forge == forge)
            and (kind is None or item.kind == kind)
            and (repo is None or item.repo == repo)
            and (number is None or item.number == number)
        ]

    def set_content_limits(
        self, forge: Forge, *, per_minute: int, per_hour: int, time_scale: float = 1.0
    ) -> None:
        """Change a forge's limits on content-creating requests (0: that window is off)."""
        self.content_limits[forge] = ContentLimits(per_minute, per_hour, time_scale)

    def count_requests(self, route: str, *, status: int | None = None) -> int:
        return sum(
            1
            for item in self.requests
            if item.route == route and (status is None or item.status == status)
        )


EMULATOR_STATE: web.AppKey[EmulatorState] = web.AppKey("emulator_state", EmulatorState)
