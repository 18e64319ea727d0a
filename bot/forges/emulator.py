"""Loopback GitHub/GitLab REST emulator: seeded PRs, recorded posts, real errors, faults, hooks."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import itertools
import json
import logging
import random
import re
import signal
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlencode

import aiohttp
import jwt
from aiohttp import web

from bot.forges.base import Clock, DiffLines, parse_diff_lines, utc_now
from bot.model import FileChange, Forge

logger = logging.getLogger(__name__)

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
REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
AWARD_EMOJI = ("thumbsup", "thumbsdown", "eyes", "confused", "heart", "tada", "rocket", "smile")
BOT_LOGIN = "review-bot[bot]"
GITLAB_BOT = "review-bot"


# -- state ---------------------------------------------------------------------------------


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
        # check runs and commit statuses, served by bot.forges.emulator_checks
        self.check_runs: dict[int, dict[str, Any]] = {}
        self.commit_statuses: list[dict[str, Any]] = []
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

    def add_issue_comment(self, repo: str, number: int, *, user: str, body: str) -> int:
        """Seed a human comment on a GitHub PR (e.g. a slash command); returns its id."""
        pull = self.get_pull("github", repo, number)
        comment = _github_issue_comment(self, pull, user=user, body=body, base_url="")
        pull.comments.append(comment)
        return int(comment["id"])

    def add_note(self, repo: str, number: int, *, user: str, body: str) -> int:
        """Seed a human note on a GitLab MR; returns its id."""
        pull = self.get_pull("gitlab", repo, number)
        note = _gitlab_note(self, pull, user=user, body=body)
        pull.notes.append(note)
        return int(note["id"])

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

    def count_requests(self, route: str, *, status: int | None = None) -> int:
        return sum(
            1
            for item in self.requests
            if item.route == route and (status is None or item.status == status)
        )


EMULATOR_STATE: web.AppKey[EmulatorState] = web.AppKey("emulator_state", EmulatorState)


# -- diff generation -----------------------------------------------------------------------

_WORDS = (
    "order",
    "invoice",
    "session",
    "token",
    "cache",
    "queue",
    "user",
    "report",
    "payment",
    "config",
    "schema",
    "limit",
    "retry",
    "buffer",
    "record",
    "account",
    "index",
    "event",
)


def _code_line(rng: random.Random) -> str:
    first, second = rng.choice(_WORDS), rng.choice(_WORDS)
    templates = (
        f"    {first}_{second} = load_{first}({second}_id, timeout={rng.randint(1, 90)})",
        f"    if {first}.{second} is None:",
        f'        raise {first.title()}Error(f"missing {second}: {{{first}!r}}")',
        f"    return [{first} for {first} in {second}s if {first}.active]",
        f'    logger.info("{first} %s updated", {second}.id)',
        f"    {first}.{second}_count += {rng.randint(1, 9)}",
        f"def {first}_{second}({second}: {second.title()}) -> {first.title()}:",
        f"    await self.{first}_store.save({second}, now=now)",
    )
    return rng.choice(templates)


def generate_patch(rng: random.Random, changed_lines: int) -> tuple[str, int, int]:
    """Build a plausible unified diff with about `changed_lines` +/- lines; (patch, adds, dels)."""
    hunks: list[str] = []
    additions = deletions = 0
    old_line = new_line = rng.randint(1, 40)
    remaining = max(1, changed_lines)
    while remaining > 0:
        size = min(remaining, rng.randint(1, 12))
        removed = rng.randint(0, size // 2) if size > 1 else 0
        added = size - removed
        before = [f" {_code_line(rng)}" for _ in range(3)]
        after = [f" {_code_line(rng)}" for _ in range(3)]
        body = before + [f"-{_code_line(rng)}" for _ in range(removed)]
        body += [f"+{_code_line(rng)}" for _ in range(added)] + after
        old_count, new_count = 6 + removed, 6 + added
        hunks.append(f"@@ -{old_line},{old_count} +{new_line},{new_count} @@")
        hunks.extend(body)
        additions += added
        deletions += removed
        remaining -= size
        gap = rng.randint(5, 60)
        old_line += old_count + gap
        new_line += new_count + gap
    return "\n".join(hunks), additions, deletions


def generate_file_changes(
    *,
    changed_lines: int,
    files: int,
    seed: int = 0,
    binary_files: int = 0,
    prefix: str = "src",
) -> list[FileChange]:
    """Plausible changed files: `changed_lines` +/- lines over `files` text files, plus binaries."""
    rng = random.Random(seed)
    result: list[FileChange] = []
    per_file = (
        [
            changed_lines // files + (1 if index < changed_lines % files else 0)
            for index in range(files)
        ]
        if files
        else []
    )
    for index, lines in enumerate(per_file):
        package, module = rng.choice(_WORDS), rng.choice(_WORDS)
        path = f"{prefix}/{package}/{module}_{index}.py"
        patch, additions, deletions = generate_patch(rng, max(1, lines))
        status = "added" if deletions == 0 and rng.random() < 0.2 else "modified"
        result.append(
            FileChange(
                path=path, additions=additions, deletions=deletions, patch=patch, status=status
            )
        )
    for index in range(binary_files):
        result.append(FileChange(path=f"assets/image_{index}.png", patch=None, status="added"))
    return result


# -- shapes --------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _github_user(state: EmulatorState, login: str, *, bot: bool = False) -> dict[str, Any]:
    user_id = state.user_id(login)
    api = f"https://api.github.com/users/{login}"
    return {
        "login": login,
        "id": user_id,
        "node_id": f"U_{user_id}",
        "avatar_url": f"https://avatars.githubusercontent.com/u/{user_id}?v=4",
        "gravatar_id": "",
        "url": api,
        "html_url": f"https://github.com/{login}",
        "followers_url": f"{api}/followers",
        "following_url": f"{api}/following{{/other_user}}",
        "gists_url": f"{api}/gists{{/gist_id}}",
        "starred_url": f"{api}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{api}/subscriptions",
        "organizations_url": f"{api}/orgs",
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events{{/privacy}}",
        "received_events_url": f"{api}/received_events",
        "type": "Bot" if bot or login.endswith("[bot]") else "User",
        "site_admin": False,
    }


_REPO_URLS = (
    "archive_url:/{archive_format}{/ref}",
    "assignees_url:/assignees{/user}",
    "blobs_url:/git/blobs{/sha}",
    "branches_url:/branches{/branch}",
    "collaborators_url:/collaborators{/collaborator}",
    "comments_url:/comments{/number}",
    "commits_url:/commits{/sha}",
    "compare_url:/compare/{base}...{head}",
    "contents_url:/contents/{+path}",
    "contributors_url:/contributors",
    "deployments_url:/deployments",
    "downloads_url:/downloads",
    "events_url:/events",
    "forks_url:/forks",
    "git_commits_url:/git/commits{/sha}",
    "git_refs_url:/git/refs{/sha}",
    "git_tags_url:/git/tags{/sha}",
    "hooks_url:/hooks",
    "issue_comment_url:/issues/comments{/number}",
    "issue_events_url:/issues/events{/number}",
    "issues_url:/issues{/number}",
    "keys_url:/keys{/key_id}",
    "labels_url:/labels{/name}",
    "languages_url:/languages",
    "merges_url:/merges",
    "milestones_url:/milestones{/number}",
    "notifications_url:/notifications{?since,all,participating}",
    "pulls_url:/pulls{/number}",
    "releases_url:/releases{/id}",
    "stargazers_url:/stargazers",
    "statuses_url:/statuses/{sha}",
    "subscribers_url:/subscribers",
    "subscription_url:/subscription",
    "tags_url:/tags",
    "teams_url:/teams",
    "trees_url:/git/trees{/sha}",
)


def _github_repository(state: EmulatorState, repo: str) -> dict[str, Any]:
    owner, _, name = repo.partition("/")
    api = f"https://api.github.com/repos/{repo}"
    created = _iso(state.clock() - timedelta(days=400))
    data: dict[str, Any] = {
        "id": state.project_id(f"github:{repo}"),
        "node_id": f"R_{repo}",
        "name": name,
        "full_name": repo,
        "owner": _github_user(state, owner),
        "private": False,
        "html_url": f"https://github.com/{repo}",
        "description": None,
        "fork": False,
        "url": api,
        "homepage": None,
        "language": "Python",
        "forks": 0,
        "forks_count": 0,
        "stargazers_count": 0,
        "watchers_count": 0,
        "watchers": 0,
        "size": 1024,
        "open_issues": 0,
        "open_issues_count": 0,
        "default_branch": "main",
        "has_issues": True,
        "has_projects": True,
        "has_wiki": True,
        "has_pages": False,
        "has_downloads": True,
        "archived": False,
        "disabled": False,
        "mirror_url": None,
        "license": None,
        "pushed_at": created,
        "created_at": created,
        "updated_at": created,
        "git_url": f"git://github.com/{repo}.git",
        "ssh_url": f"git@github.com:{repo}.git",
        "clone_url": f"https://github.com/{repo}.git",
        "svn_url": f"https://github.com/{repo}",
    }
    for entry in _REPO_URLS:
        key, _, suffix = entry.partition(":")
        data[key] = api + suffix
    return data


def _github_pull(state: EmulatorState, pull: EmulatedPull) -> dict[str, Any]:
    api = f"https://api.github.com/repos/{pull.repo}"
    html = f"https://github.com/{pull.repo}/pull/{pull.number}"
    version = pull.newest
    created = _iso(pull.created_at or state.clock())
    repository = _github_repository(state, pull.repo)
    owner = pull.repo.partition("/")[0]

    def side(ref: str, sha: str, login: str) -> dict[str, Any]:
        return {
            "label": f"{login}:{ref}",
            "ref": ref,
            "sha": sha,
            "user": _github_user(state, login),
            "repo": repository,
        }

    return {
        "url": f"{api}/pulls/{pull.number}",
        "id": pull.id,
        "node_id": f"PR_{pull.id}",
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "issue_url": f"{api}/issues/{pull.number}",
        "commits_url": f"{api}/pulls/{pull.number}/commits",
        "review_comments_url": f"{api}/pulls/{pull.number}/comments",
        "review_comment_url": f"{api}/pulls/comments{{/number}}",
        "comments_url": f"{api}/issues/{pull.number}/comments",
        "statuses_url": f"{api}/statuses/{version.head_sha}",
        "number": pull.number,
        "state": pull.state,
        "locked": False,
        "title": pull.title,
        "user": _github_user(state, pull.author),
        "body": None,
        "labels": [
            {
                "id": index + 1,
                "node_id": f"L_{index}",
                "url": f"{api}/labels/{label}",
                "name": label,
                "description": None,
                "color": "ededed",
                "default": False,
            }
            for index, label in enumerate(pull.labels)
        ],
        "milestone": None,
        "active_lock_reason": None,
        "created_at": created,
        "updated_at": _iso(version.created_at),
        "closed_at": None,
        "merged_at": None,
        "merge_commit_sha": None,
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "head": side(pull.head_ref, version.head_sha, pull.author),
        "base": side(pull.base_ref, version.base_sha, owner),
        "_links": {
            name: {"href": href}
            for name, href in (
                ("self", f"{api}/pulls/{pull.number}"),
                ("html", html),
                ("issue", f"{api}/issues/{pull.number}"),
                ("comments", f"{api}/issues/{pull.number}/comments"),
                ("review_comments", f"{api}/pulls/{pull.number}/comments"),
                ("review_comment", f"{api}/pulls/comments{{/number}}"),
                ("commits", f"{api}/pulls/{pull.number}/commits"),
                ("statuses", f"{api}/statuses/{version.head_sha}"),
            )
        },
        "author_association": "CONTRIBUTOR",
        "auto_merge": None,
        "draft": pull.draft,
        "merged": False,
        "mergeable": True,
        "rebaseable": True,
        "mergeable_state": "clean",
        "merged_by": None,
        "comments": len(pull.comments),
        "review_comments": sum(len(item.get("_comments", [])) for item in pull.reviews),
        "maintainer_can_modify": False,
        "commits": len(pull.versions),
        "additions": sum(item.additions for item in version.files),
        "deletions": sum(item.deletions for item in version.files),
        "changed_files": len(version.files),
    }


def _github_file(pull: EmulatedPull, item: FileChange) -> dict[str, Any]:
    sha = hashlib.sha1(f"{item.path}:{item.patch}".encode()).hexdigest()
    head = pull.newest.head_sha
    data: dict[str, Any] = {
        "sha": sha,
        "filename": item.path,
        "status": item.status,
        "additions": item.additions,
        "deletions": item.deletions,
        "changes": item.additions + item.deletions,
        "blob_url": f"https://github.com/{pull.repo}/blob/{head}/{item.path}",
        "raw_url": f"https://github.com/{pull.repo}/raw/{head}/{item.path}",
        "contents_url": f"https://api.github.com/repos/{pull.repo}/contents/{item.path}?ref={head}",
    }
    if item.patch is not None:
        data["patch"] = item.patch
    if item.previous_path:
        data["previous_filename"] = item.previous_path
    return data


def _github_issue_comment(
    state: EmulatorState, pull: EmulatedPull, *, user: str, body: str, base_url: str
) -> dict[str, Any]:
    comment_id = state.next_id()
    api = f"https://api.github.com/repos/{pull.repo}"
    now = _iso(state.clock())
    return {
        "id": comment_id,
        "node_id": f"IC_{comment_id}",
        "url": f"{api}/issues/comments/{comment_id}",
        "html_url": f"https://github.com/{pull.repo}/pull/{pull.number}#issuecomment-{comment_id}",
        "issue_url": f"{api}/issues/{pull.number}",
        "body": body,
        "user": _github_user(state, user),
        "created_at": now,
        "updated_at": now,
        "author_association": "NONE",
        "_reactions": [],
    }


def _gitlab_user(state: EmulatorState, username: str) -> dict[str, Any]:
    user_id = state.user_id(username)
    return {
        "id": user_id,
        "username": username,
        "name": username.replace("-", " ").title(),
        "state": "active",
        "locked": False,
        "avatar_url": f"https://secure.gravatar.com/avatar/{user_id}?s=80&d=identicon",
        "web_url": f"https://gitlab.example.com/{username}",
    }


def _gitlab_note(
    state: EmulatorState,
    pull: EmulatedPull,
    *,
    user: str,
    body: str,
    position: dict[str, Any] | None = None,
    discussion_id: str | None = None,
) -> dict[str, Any]:
    now = state.clock().isoformat().replace("+00:00", "Z")
    note: dict[str, Any] = {
        "id": state.next_id(),
        "type": "DiffNote" if position else None,
        "body": body,
        "attachment": None,
        "author": _gitlab_user(state, user),
        "created_at": now,
        "updated_at": now,
        "system": False,
        "noteable_id": pull.id,
        "noteable_type": "MergeRequest",
        "project_id": pull.project_id,
        "noteable_iid": pull.number,
        "resolvable": position is not None,
        "confidential": False,
        "internal": False,
        "commands_changes": {},
        "_awards": [],
    }
    if position is not None:
        note["position"] = position
        note["resolved"] = False
    if discussion_id is not None:
        note["discussion_id"] = discussion_id
    return note


def _public(item: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the emulator's private bookkeeping keys from a stored object."""
    return {key: value for key, value in item.items() if not key.startswith("_")}


# -- HTTP plumbing -------------------------------------------------------------------------


class _Reply(Exception):
    """Raised by handlers to answer with an error status and body."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


def _github_error(
    status: int,
    message: str,
    *,
    errors: list[Any] | None = None,
    documentation_url: str = GITHUB_DOCS,
) -> _Reply:
    body: dict[str, Any] = {"message": message, "documentation_url": documentation_url}
    if errors is not None:
        body["errors"] = errors
    body["status"] = str(status)
    return _Reply(status, body)


def _not_found(forge: Forge) -> _Reply:
    if forge == "github":
        return _github_error(404, "Not Found")
    return _Reply(404, {"message": "404 Not found"})


Handler = Callable[["_Context"], Awaitable[Any]]


@dataclass(slots=True)
class _Context:
    state: EmulatorState
    request: web.Request
    params: dict[str, str]
    forge: Forge
    base_url: str
    user: str = ""
    installation: int | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

    async def json(self) -> Any:
        raw = await self.request.read()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            if self.forge == "github":
                raise _github_error(400, "Problems parsing JSON") from exc
            raise _Reply(400, {"error": "body is not valid JSON"}) from exc

    def query_int(self, name: str, default: int, *, maximum: int) -> int:
        value = self.request.query.get(name, "")
        return max(1, min(maximum, int(value))) if value.isdigit() else default


@dataclass(frozen=True, slots=True)
class _Route:
    name: str
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    forge: Forge


def _paginate(ctx: _Context, items: Sequence[Any], *, default: int, maximum: int) -> list[Any]:
    per_page = ctx.query_int("per_page", default, maximum=maximum)
    page = ctx.query_int("page", 1, maximum=10**6)
    last = max(1, -(-len(items) // per_page))
    path = ctx.request.path

    def link(number: int) -> str:
        query = dict(ctx.request.query)
        query.update({"per_page": str(per_page), "page": str(number)})
        encoded = urlencode(query)
        return f"{ctx.base_url}{ctx.request.raw_path.split('?')[0] or path}?{encoded}"

    links = []
    if page < last:
        links.append(f'<{link(page + 1)}>; rel="next"')
        links.append(f'<{link(last)}>; rel="last"')
    if page > 1:
        links.append(f'<{link(1)}>; rel="first"')
        links.append(f'<{link(page - 1)}>; rel="prev"')
    if links:
        ctx.headers["Link"] = ", ".join(links)
    if ctx.forge == "gitlab":
        ctx.headers.update(
            {
                "X-Page": str(page),
                "X-Per-Page": str(per_page),
                "X-Total": str(len(items)),
                "X-Total-Pages": str(last),
                "X-Next-Page": str(page + 1) if page < last else "",
                "X-Prev-Page": str(page - 1) if page > 1 else "",
            }
        )
    return list(items[(page - 1) * per_page : page * per_page])


# -- GitHub handlers -----------------------------------------------------------------------


def _github_pull_of(ctx: _Context) -> EmulatedPull:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    pull = ctx.state.pulls.get(("github", repo, int(ctx.params["number"])))
    if pull is None:
        raise _not_found("github")
    _check_repo_token(ctx, repo)
    return pull


def _check_repo_token(ctx: _Context, repo: str) -> None:
    issued = ctx.installation
    if issued is not None and ctx.state.installations.get(repo) != issued:
        raise _not_found("github")  # an installation token sees only its installation's repos


async def _github_access_token(ctx: _Context) -> Any:
    installation = int(ctx.params["installation_id"])
    if installation not in set(ctx.state.installations.values()):
        raise _not_found("github")
    token = f"ghs_{uuid.uuid4().hex}"
    expires = ctx.state.clock() + timedelta(hours=1)
    ctx.state.issued_tokens[token] = (installation, expires)
    ctx.status = 201
    return {
        "token": token,
        "expires_at": _iso(expires),
        "permissions": {
            "pull_requests": "write",
            "issues": "write",
            "metadata": "read",
            "checks": "write",
        },
        "repository_selection": "all",
    }


async def _github_installation(ctx: _Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    installation = ctx.state.installations.get(repo)
    if installation is None:
        raise _not_found("github")
    return {
        "id": installation,
        "app_id": int(next(iter(ctx.state.apps), "1")),
        "target_type": "Organization",
        "account": _github_user(ctx.state, repo.split("/")[0]),
    }


async def _github_get_pull(ctx: _Context) -> Any:
    return _github_pull(ctx.state, _github_pull_of(ctx))


async def _github_files(ctx: _Context) -> Any:
    pull = _github_pull_of(ctx)
    files = [_github_file(pull, item) for item in pull.files[:3000]]  # GitHub lists 3,000 at most
    return _paginate(ctx, files, default=30, maximum=100)


def _github_review(ctx: _Context, pull: EmulatedPull, review: Mapping[str, Any]) -> dict[str, Any]:
    api = f"https://api.github.com/repos/{pull.repo}/pulls/{pull.number}"
    html = f"https://github.com/{pull.repo}/pull/{pull.number}#pullrequestreview-{review['id']}"
    return {
        "id": review["id"],
        "node_id": f"PRR_{review['id']}",
        "user": _github_user(ctx.state, review["_user"]),
        "body": review["body"],
        "state": review["state"],
        "html_url": html,
        "pull_request_url": api,
        "_links": {"html": {"href": html}, "pull_request": {"href": api}},
        "submitted_at": review["submitted_at"],
        "commit_id": review["commit_id"],
        "author_association": "NONE",
    }


async def _github_list_reviews(ctx: _Context) -> Any:
    pull = _github_pull_of(ctx)
    reviews = [_github_review(ctx, pull, item) for item in pull.reviews]
    return _paginate(ctx, reviews, default=30, maximum=100)


def _invalid_request(message: str) -> _Reply:
    return _github_error(422, f"Invalid request.\n\n{message}", documentation_url=REVIEW_DOCS)


async def _github_create_review(ctx: _Context) -> Any:
    pull = _github_pull_of(ctx)
    data = await ctx.json()
    if not isinstance(data, dict):
        raise _invalid_request("Body must be a JSON object.")
    event = data.get("event")
    if event is not None and event not in ("APPROVE", "REQUEST_CHANGES", "COMMENT"):
        raise _invalid_request(f'"{event}" is not a member of the event enum.')
    body = data.get("body")
    if event in ("COMMENT", "REQUEST_CHANGES") and not body:
        raise _github_error(
            422,
            "Unprocessable Entity",
            errors=["Body is required for this event"],
            documentation_url=REVIEW_DOCS,
        )
    commit_id = data.get("commit_id") or pull.newest.head_sha
    if commit_id not in {version.head_sha for version in pull.versions}:
        raise _github_error(
            422,
            "Unprocessable Entity",
            errors=["Commit could not be resolved"],
            documentation_url=REVIEW_DOCS,
        )
    comments = data.get("comments") or []
    if not isinstance(comments, list):
        raise _invalid_request('"comments" is not an array.')
    version = next(item for item in pull.versions if item.head_sha == commit_id)
    patches = {item.path: item.patch for item in version.files}
    errors: list[str] = []
    for comment in comments:
        if not isinstance(comment, dict):
            raise _invalid_request("comments items must be objects.")
        for required in ("path", "body"):
            if not comment.get(required):
                raise _invalid_request(f'"{required}" wasn\'t supplied.')
        path = comment["path"]
        if path not in patches:
            errors.append("Path could not be resolved")
            continue
        line, side = comment.get("line"), comment.get("side", "RIGHT")
        if side not in ("LEFT", "RIGHT"):
            raise _invalid_request(f'"{side}" is not a member of the side enum.')
        if comment.get("position") is not None and line is None:
            position = comment["position"]
            valid = isinstance(position, int) and 1 <= position < len(
                (patches[path] or "").splitlines()
            )
        else:
            valid = isinstance(line, int) and parse_diff_lines(patches[path]).has_line(line, side)
        if not valid:
            errors.append(LINE_OUTSIDE_DIFF)
    if errors:
        raise _github_error(
            422, "Unprocessable Entity", errors=errors, documentation_url=REVIEW_DOCS
        )
    state_name = {
        "APPROVE": "APPROVED",
        "REQUEST_CHANGES": "CHANGES_REQUESTED",
        "COMMENT": "COMMENTED",
    }.get(event or "", "PENDING")
    review = {
        "id": ctx.state.next_id(),
        "_user": ctx.user,
        "_comments": comments,
        "body": body or "",
        "state": state_name,
        "commit_id": commit_id,
        "submitted_at": _iso(ctx.state.clock()),
    }
    pull.reviews.append(review)
    answer = _github_review(ctx, pull, review)
    ctx.state.records.append(
        Record(
            "github",
            "review",
            pull.repo,
            pull.number,
            body or "",
            {"comments": comments, "commit_id": commit_id, "event": event, "id": review["id"]},
        )
    )
    return answer


async def _github_list_comments(ctx: _Context) -> Any:
    pull = _github_pull_of(ctx)
    return _paginate(ctx, [_public(item) for item in pull.comments], default=30, maximum=100)


async def _github_create_comment(ctx: _Context) -> Any:
    pull = _github_pull_of(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not isinstance(body, str) or not body:
        raise _invalid_request('"body" wasn\'t supplied.')
    if len(body) > 65536:
        raise _github_error(
            422,
            "Validation Failed",
            errors=[
                {
                    "resource": "IssueComment",
                    "code": "custom",
                    "field": "body",
                    "message": "body is too long (maximum is 65536 characters)",
                }
            ],
        )
    comment = _github_issue_comment(ctx.state, pull, user=ctx.user, body=body, base_url="")
    pull.comments.append(comment)
    ctx.state.records.append(
        Record("github", "issue_comment", pull.repo, pull.number, body, {"id": comment["id"]})
    )
    ctx.status = 201
    return _public(comment)


async def _github_create_reaction(ctx: _Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    _check_repo_token(ctx, repo)
    comment_id = int(ctx.params["comment_id"])
    found = None
    for pull in ctx.state.pulls.values():
        if pull.forge == "github" and pull.repo == repo:
            found = next((item for item in pull.comments if item["id"] == comment_id), None)
            if found is not None:
                break
    if found is None:
        raise _not_found("github")
    data = await ctx.json()
    content = data.get("content") if isinstance(data, dict) else None
    if content not in REACTIONS:
        raise _invalid_request(f'"{content}" is not a member of the content enum.')
    for reaction in found["_reactions"]:
        if reaction["content"] == content and reaction["user"]["login"] == ctx.user:
            return reaction  # GitHub answers 200 with the existing reaction
    reaction = {
        "id": ctx.state.next_id(),
        "node_id": f"REA_{comment_id}",
        "user": _github_user(ctx.state, ctx.user),
        "content": content,
        "created_at": _iso(ctx.state.clock()),
    }
    found["_reactions"].append(reaction)
    ctx.state.records.append(
        Record("github", "reaction", repo, None, content, {"comment_id": comment_id})
    )
    ctx.status = 201
    return reaction


async def _github_permission(ctx: _Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    _check_repo_token(ctx, repo)
    user = ctx.params["username"]
    if user not in ctx.state.users:
        raise _not_found("github")
    role = ctx.state.permissions.get((repo, user), "read")
    legacy = {"maintain": "write", "triage": "read"}.get(role, role)
    collaborator = _github_user(ctx.state, user)
    collaborator["role_name"] = role
    return {"permission": legacy, "role_name": role, "user": collaborator}


# -- GitLab handlers -----------------------------------------------------------------------


def _gitlab_pull_of(ctx: _Context) -> EmulatedPull:
    raw = ctx.params["project"]
    if raw.isdigit():
        path = next((key for key, value in ctx.state.projects.items() if value == int(raw)), None)
    else:
        path = raw if raw in ctx.state.projects else None
    if path is None:
        raise _Reply(404, {"message": "404 Project Not Found"})
    pull = ctx.state.pulls.get(("gitlab", path, int(ctx.params["iid"])))
    if pull is None:
        raise _not_found("gitlab")
    return pull


async def _gitlab_get_mr(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    version = pull.newest
    return {
        "id": pull.id,
        "iid": pull.number,
        "project_id": pull.project_id,
        "title": pull.title,
        "state": "opened" if pull.state == "open" else pull.state,
        "draft": pull.draft,
        "source_branch": pull.head_ref,
        "target_branch": pull.base_ref,
        "sha": version.head_sha,
        "labels": pull.labels,
        "author": _gitlab_user(ctx.state, pull.author),
        "diff_refs": {
            "base_sha": version.base_sha,
            "head_sha": version.head_sha,
            "start_sha": version.start_sha,
        },
        "changes_count": str(len(version.files)),
        "web_url": f"https://gitlab.example.com/{pull.repo}/-/merge_requests/{pull.number}",
    }


async def _gitlab_versions(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    entries = [
        {
            "id": version.id,
            "head_commit_sha": version.head_sha,
            "base_commit_sha": version.base_sha,
            "start_commit_sha": version.start_sha,
            "created_at": version.created_at.isoformat().replace("+00:00", "Z"),
            "merge_request_id": pull.id,
            "state": "collected",
            "real_size": str(len(version.files)),
        }
        for version in reversed(pull.versions)  # newest first, as GitLab lists them
    ]
    return _paginate(ctx, entries, default=20, maximum=100)


def _gitlab_diff_entries(pull: EmulatedPull) -> list[dict[str, Any]]:
    entries = []
    for item in pull.files:
        too_large = item.patch is None and item.changed_lines > 0
        entries.append(
            {
                "old_path": item.previous_path or item.path,
                "new_path": item.path,
                "a_mode": "0" if item.status == "added" else "100644",
                "b_mode": "0" if item.status == "removed" else "100644",
                "new_file": item.status == "added",
                "renamed_file": item.status == "renamed",
                "deleted_file": item.status == "removed",
                "generated_file": False,
                "too_large": too_large,
                "collapsed": False,
                "diff": "" if item.patch is None else item.patch + "\n",
            }
        )
    return entries


async def _gitlab_diffs(ctx: _Context) -> Any:
    if ctx.state.gitlab_version < (15, 7):
        raise _Reply(404, {"error": "404 Not Found"})  # the route does not exist yet
    entries = _gitlab_diff_entries(_gitlab_pull_of(ctx))
    return _paginate(ctx, entries, default=20, maximum=100)


async def _gitlab_changes(ctx: _Context) -> Any:
    """The MR with its `changes` (deprecated in 15.7 in favour of /diffs, served by both)."""
    answer = await _gitlab_get_mr(ctx)
    answer["changes"] = _gitlab_diff_entries(_gitlab_pull_of(ctx))
    answer["overflow"] = False
    return answer


def _bad_position(detail: str) -> _Reply:
    return _Reply(400, {"message": f"400 Bad request - Note {detail}"})


def _check_position(pull: EmulatedPull, position: Any) -> None:
    if not isinstance(position, dict):
        raise _bad_position('{:position=>["must be a valid json schema"]}')
    if position.get("position_type") != "text":
        raise _bad_position('{:position_type=>["is not included in the list"]}')
    version = next(
        (
            item
            for item in pull.versions
            if (item.base_sha, item.start_sha, item.head_sha)
            == (position.get("base_sha"), position.get("start_sha"), position.get("head_sha"))
        ),
        None,
    )
    if version is None:
        raise _bad_position('{:position=>["is incomplete"], :line_code=>["can\'t be blank"]}')
    new_path, old_path = position.get("new_path"), position.get("old_path")
    changed = next((item for item in version.files if item.path == new_path), None)
    # GitLab computes the line code from both paths: a renamed file needs its old one.
    if changed is None or old_path != (changed.previous_path or changed.path):
        raise _bad_position('{:line_code=>["can\'t be blank", "must be a valid line code"]}')
    lines: DiffLines = parse_diff_lines(changed.patch)
    new_line, old_line = position.get("new_line"), position.get("old_line")
    new_line = int(new_line) if new_line not in (None, "") else None
    old_line = int(old_line) if old_line not in (None, "") else None
    valid = False
    if new_line is not None and old_line is None:
        valid = new_line in lines.added
    elif old_line is not None and new_line is None:
        valid = old_line in lines.removed
    elif old_line is not None and new_line is not None:
        valid = lines.context.get(new_line) == old_line
    if not valid:
        raise _bad_position('{:line_code=>["can\'t be blank", "must be a valid line code"]}')


async def _gitlab_create_discussion(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not body:
        raise _Reply(400, {"error": "body is missing"})
    position = data.get("position")
    if position is not None:
        _check_position(pull, position)
    discussion_id = hashlib.sha1(str(ctx.state.next_id()).encode()).hexdigest()
    note = _gitlab_note(
        ctx.state, pull, user=ctx.user, body=body, position=position, discussion_id=discussion_id
    )
    pull.notes.append(note)
    discussion = {"id": discussion_id, "individual_note": False, "notes": [_public(note)]}
    pull.discussions.append(discussion)
    ctx.state.records.append(
        Record(
            "gitlab",
            "discussion",
            pull.repo,
            pull.number,
            body,
            {"position": position, "id": discussion_id},
        )
    )
    ctx.status = 201
    return discussion


async def _gitlab_list_discussions(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    return _paginate(ctx, pull.discussions, default=20, maximum=100)


async def _gitlab_create_note(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not body:
        raise _Reply(400, {"error": "body is missing"})
    if len(body) > 1_000_000:
        raise _Reply(400, {"message": {"note": ["is too long (maximum is 1000000 characters)"]}})
    note = _gitlab_note(ctx.state, pull, user=ctx.user, body=body)
    pull.notes.append(note)
    ctx.state.records.append(
        Record("gitlab", "note", pull.repo, pull.number, body, {"id": note["id"]})
    )
    ctx.status = 201
    return _public(note)


async def _gitlab_list_notes(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    notes = [_public(item) for item in reversed(pull.notes)]  # newest first by default
    return _paginate(ctx, notes, default=20, maximum=100)


async def _gitlab_award_emoji(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    note_id = int(ctx.params["note_id"])
    note = next((item for item in pull.notes if item["id"] == note_id), None)
    if note is None:
        raise _Reply(404, {"message": "404 Note Not Found"})
    data = await ctx.json()
    name = data.get("name") if isinstance(data, dict) else None
    if name not in AWARD_EMOJI:
        raise _Reply(400, {"message": {"name": ["is not a valid emoji name"]}})
    if any(
        item["name"] == name and item["user"]["username"] == ctx.user for item in note["_awards"]
    ):
        raise _Reply(404, {"message": "404 Award Emoji Name has already been taken"})
    award = {
        "id": ctx.state.next_id(),
        "name": name,
        "user": _gitlab_user(ctx.state, ctx.user),
        "created_at": ctx.state.clock().isoformat().replace("+00:00", "Z"),
        "updated_at": ctx.state.clock().isoformat().replace("+00:00", "Z"),
        "awardable_id": note_id,
        "awardable_type": "Note",
    }
    note["_awards"].append(award)
    ctx.state.records.append(
        Record("gitlab", "award_emoji", pull.repo, pull.number, name, {"note_id": note_id})
    )
    ctx.status = 201
    return award


async def _gitlab_member(ctx: _Context) -> Any:
    raw = ctx.params["project"]
    path = (
        raw
        if not raw.isdigit()
        else next((key for key, value in ctx.state.projects.items() if value == int(raw)), None)
    )
    if path is None or path not in ctx.state.projects:
        raise _Reply(404, {"message": "404 Project Not Found"})
    user_id = int(ctx.params["user_id"])
    username = next((name for name, value in ctx.state.users.items() if value == user_id), None)
    level = ctx.state.access_levels.get((path, username or ""))
    if username is None or level is None:
        raise _not_found("gitlab")
    member = _gitlab_user(ctx.state, username)
    member.update(
        {
            "access_level": level,
            "expires_at": None,
            "created_at": _iso(ctx.state.clock()),
            "membership_state": "active",
        }
    )
    return member


async def _gitlab_users(ctx: _Context) -> Any:
    username = ctx.request.query.get("username")
    names = [username] if username else list(ctx.state.users)
    found = [_gitlab_user(ctx.state, name) for name in names if name in ctx.state.users]
    return _paginate(ctx, found, default=20, maximum=100)


# -- routing -------------------------------------------------------------------------------


def _route(name: str, method: str, template: str, handler: Handler, forge: Forge) -> _Route:
    pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
    return _Route(name, method, re.compile(f"^{pattern}$"), handler, forge)


GITHUB_REPO = "/repos/{owner}/{repo}"
GITLAB_MR = "/api/v4/projects/{project}/merge_requests/{iid}"
ROUTES: tuple[_Route, ...] = (
    _route(
        "github.access_token",
        "POST",
        "/app/installations/{installation_id}/access_tokens",
        _github_access_token,
        "github",
    ),
    _route(
        "github.installation", "GET", f"{GITHUB_REPO}/installation", _github_installation, "github"
    ),
    _route("github.pull", "GET", f"{GITHUB_REPO}/pulls/{{number}}", _github_get_pull, "github"),
    _route("github.files", "GET", f"{GITHUB_REPO}/pulls/{{number}}/files", _github_files, "github"),
    _route(
        "github.reviews.list",
        "GET",
        f"{GITHUB_REPO}/pulls/{{number}}/reviews",
        _github_list_reviews,
        "github",
    ),
    _route(
        "github.reviews.create",
        "POST",
        f"{GITHUB_REPO}/pulls/{{number}}/reviews",
        _github_create_review,
        "github",
    ),
    _route(
        "github.comments.list",
        "GET",
        f"{GITHUB_REPO}/issues/{{number}}/comments",
        _github_list_comments,
        "github",
    ),
    _route(
        "github.comments.create",
        "POST",
        f"{GITHUB_REPO}/issues/{{number}}/comments",
        _github_create_comment,
        "github",
    ),
    _route(
        "github.reactions.create",
        "POST",
        f"{GITHUB_REPO}/issues/comments/{{comment_id}}/reactions",
        _github_create_reaction,
        "github",
    ),
    _route(
        "github.permission",
        "GET",
        f"{GITHUB_REPO}/collaborators/{{username}}/permission",
        _github_permission,
        "github",
    ),
    _route("gitlab.merge_request", "GET", GITLAB_MR, _gitlab_get_mr, "gitlab"),
    _route("gitlab.versions", "GET", f"{GITLAB_MR}/versions", _gitlab_versions, "gitlab"),
    _route("gitlab.diffs", "GET", f"{GITLAB_MR}/diffs", _gitlab_diffs, "gitlab"),
    _route("gitlab.changes", "GET", f"{GITLAB_MR}/changes", _gitlab_changes, "gitlab"),
    _route(
        "gitlab.discussions.list",
        "GET",
        f"{GITLAB_MR}/discussions",
        _gitlab_list_discussions,
        "gitlab",
    ),
    _route(
        "gitlab.discussions.create",
        "POST",
        f"{GITLAB_MR}/discussions",
        _gitlab_create_discussion,
        "gitlab",
    ),
    _route("gitlab.notes.list", "GET", f"{GITLAB_MR}/notes", _gitlab_list_notes, "gitlab"),
    _route("gitlab.notes.create", "POST", f"{GITLAB_MR}/notes", _gitlab_create_note, "gitlab"),
    _route(
        "gitlab.award_emoji",
        "POST",
        f"{GITLAB_MR}/notes/{{note_id}}/award_emoji",
        _gitlab_award_emoji,
        "gitlab",
    ),
    _route(
        "gitlab.member",
        "GET",
        "/api/v4/projects/{project}/members/all/{user_id}",
        _gitlab_member,
        "gitlab",
    ),
    _route("gitlab.users", "GET", "/api/v4/users", _gitlab_users, "gitlab"),
)


def register_routes(*routes: _Route) -> None:
    """Serve more routes (bot.forges.emulator_checks adds check runs and commit statuses)."""
    global ROUTES
    ROUTES = (*ROUTES, *routes)


def _authenticate(ctx: _Context, route: _Route) -> None:
    state, headers = ctx.state, ctx.request.headers
    if route.forge == "gitlab":
        token = headers.get("PRIVATE-TOKEN") or headers.get("Authorization", "").removeprefix(
            "Bearer "
        )
        if not token or (state.gitlab_tokens and token not in state.gitlab_tokens):
            raise _Reply(401, {"message": "401 Unauthorized"})
        ctx.user = GITLAB_BOT
        return
    scheme, _, credential = headers.get("Authorization", "").partition(" ")
    scheme = scheme.lower()
    if route.name in ("github.access_token", "github.installation"):
        if scheme != "bearer":
            raise _github_error(401, "A JSON web token could not be decoded")
        _verify_app_jwt(state, credential)
        return
    if scheme not in ("token", "bearer") or not credential:
        raise _github_error(401, "Requires authentication")
    issued = state.issued_tokens.get(credential)
    if issued is not None:
        installation, expires = issued
        if state.clock() >= expires:
            raise _github_error(401, "Bad credentials")
        ctx.installation = installation
        ctx.user = BOT_LOGIN
        return
    if state.github_tokens and credential not in state.github_tokens:
        raise _github_error(401, "Bad credentials")
    ctx.user = BOT_LOGIN


def _verify_app_jwt(state: EmulatorState, token: str) -> None:
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
        key = state.apps.get(str(claims.get("iss")))
        if key is None:
            raise _github_error(401, "Integration not found")
        jwt.decode(token, key, algorithms=["RS256"])
    except jwt.PyJWTError as exc:
        raise _github_error(401, "A JSON web token could not be decoded") from exc


def _fault_reply(forge: Forge, fault: Fault) -> _Reply:
    assert fault.status is not None
    headers = dict(fault.headers)
    if fault.retry_after is not None:
        headers["Retry-After"] = str(int(fault.retry_after))
    if fault.status == 403 and forge == "github":
        request_id = uuid.uuid4().hex[:16].upper()
        body: Any = {
            "message": (fault.message or SECONDARY_LIMIT_MESSAGE).format(request_id=request_id),
            "documentation_url": SECONDARY_LIMIT_DOCS,
        }
    elif fault.status == 429 and forge == "gitlab":
        body = {"message": fault.message or "Retry later"}
    elif forge == "github":
        body = {"message": fault.message or "Server Error"}
        if fault.status < 500:
            body["documentation_url"] = GITHUB_DOCS
    else:
        body = {"message": fault.message or f"{fault.status} Internal Server Error"}
    return _Reply(fault.status, body, headers)


def create_emulator_app(state: EmulatorState) -> web.Application:
    """Build the aiohttp app that answers as GitHub (at /) and GitLab (under /api/v4)."""

    async def dispatch(request: web.Request) -> web.StreamResponse:
        raw_path = request.raw_path.split("?", 1)[0]
        base_url = f"{request.scheme}://{request.host}"
        route: _Route | None = None
        params: dict[str, str] = {}
        path_matched = False
        for candidate in ROUTES:
            match = candidate.pattern.match(raw_path)
            if match:
                path_matched = True
                if candidate.method == request.method:
                    route = candidate
                    params = {key: unquote(value) for key, value in match.groupdict().items()}
                    break
        forge: Forge = "gitlab" if raw_path.startswith("/api/v4/") else "github"
        ctx = _Context(state, request, params, forge, base_url)
        try:
            if route is None:
                if path_matched:
                    raise _Reply(405, {"message": "405 Method Not Allowed"})
                raise _not_found(forge)
            if forge == "github":
                _check_api_version(request.headers.get("X-GitHub-Api-Version"))
            fault = _next_fault(state, route.name)
            if fault is not None and fault.delay_s > 0:
                await asyncio.sleep(fault.delay_s)
            if fault is not None and fault.status is not None and not fault.after_handling:
                raise _fault_reply(forge, fault)
            _authenticate(ctx, route)
            body = await route.handler(ctx)
            if fault is not None and fault.status is not None:
                raise _fault_reply(forge, fault)
            response = web.json_response(body, status=ctx.status, headers=ctx.headers)
        except _Reply as reply:
            response = web.json_response(reply.body, status=reply.status, headers=reply.headers)
        if forge == "github":
            response.headers.setdefault("X-GitHub-Request-Id", uuid.uuid4().hex[:20].upper())
        state.requests.append(
            RequestLog(
                request.method,
                raw_path,
                route.name if route else "",
                response.status,
                state.clock(),
                accept=request.headers.get("Accept"),
                api_version=request.headers.get("X-GitHub-Api-Version"),
            )
        )
        return response

    app = web.Application()
    app[EMULATOR_STATE] = state
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


# REST API versions GitHub serves; a request naming another one is refused with a 400.
GITHUB_API_VERSIONS = frozenset({"2022-11-28", "2026-03-10"})


def _check_api_version(version: str | None) -> None:
    if version is not None and version not in GITHUB_API_VERSIONS:
        raise _github_error(400, f"API version '{version}' is not supported.")


def _next_fault(state: EmulatorState, route: str) -> Fault | None:
    queue = state.faults.get(route)
    if queue:
        return queue.popleft()
    return None


class ForgeEmulator:
    """Runs the emulator app on a loopback port; use as an async context manager."""

    def __init__(
        self, state: EmulatorState | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.state = state or EmulatorState()
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def github_url(self) -> str:
        return self.base_url

    @property
    def gitlab_url(self) -> str:
        return self.base_url  # python-gitlab appends /api/v4

    async def start(self) -> str:
        """Start serving; returns the base URL."""
        runner = web.AppRunner(create_emulator_app(self.state), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        address = runner.addresses[0]
        self.port = int(address[1])
        logger.info(
            "forge emulator listening on %s", self.base_url, extra={"action": "emulator_started"}
        )
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ForgeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


# -- webhooks ------------------------------------------------------------------------------


def _set_repo_github(payload: dict[str, Any], repo: str) -> None:
    owner, _, name = repo.partition("/")
    repository = payload.setdefault("repository", {})
    repository.update(
        {
            "full_name": repo,
            "name": name,
            "html_url": f"https://github.com/{repo}",
            "url": f"https://api.github.com/repos/{repo}",
        }
    )
    repository.setdefault("owner", {})["login"] = owner


def build_github_pull_request_event(
    fixture_payload: Mapping[str, Any],
    *,
    action: str | None = None,
    repo: str | None = None,
    number: int | None = None,
    title: str | None = None,
    base_ref: str | None = None,
    head_ref: str | None = None,
    base_sha: str | None = None,
    head_sha: str | None = None,
    labels: Sequence[str] | None = None,
    author: str | None = None,
    author_type: str | None = None,
    draft: bool | None = None,
    changed_files: int | None = None,
    additions: int | None = None,
    deletions: int | None = None,
    installation_id: int | None = None,
    before: str | None = None,
) -> dict[str, Any]:
    """A `pull_request` delivery shaped like the fixture, with the given fields replaced."""
    payload = copy.deepcopy(dict(fixture_payload))
    pull = payload["pull_request"]
    if action is not None:
        payload["action"] = action
    if repo is not None:
        _set_repo_github(payload, repo)
        for side in ("base", "head"):
            if isinstance(pull.get(side), dict) and isinstance(pull[side].get("repo"), dict):
                pull[side]["repo"]["full_name"] = repo
                pull[side]["repo"]["name"] = repo.partition("/")[2]
                pull[side]["repo"].setdefault("owner", {})["login"] = repo.partition("/")[0]
        pull["url"] = f"https://api.github.com/repos/{repo}/pulls/{pull['number']}"
    if number is not None:
        payload["number"] = number
        pull["number"] = number
    for key, value in (
        ("title", title),
        ("draft", draft),
        ("changed_files", changed_files),
        ("additions", additions),
        ("deletions", deletions),
    ):
        if value is not None:
            pull[key] = value
    for side, ref, sha in (("base", base_ref, base_sha), ("head", head_ref, head_sha)):
        if ref is not None:
            pull[side]["ref"] = ref
            pull[side]["label"] = f"{pull[side].get('label', ':').split(':')[0]}:{ref}"
        if sha is not None:
            pull[side]["sha"] = sha
    if head_sha is not None and "after" in payload:
        payload["after"] = head_sha
    if before is not None:
        payload["before"] = before
    if labels is not None:
        pull["labels"] = [
            {
                "id": 1000 + index,
                "node_id": f"L_{index}",
                "name": name,
                "color": "ededed",
                "default": False,
                "description": None,
                "url": f"https://api.github.com/repos/{repo or 'o/r'}/labels/{name}",
            }
            for index, name in enumerate(labels)
        ]
    if author is not None or author_type is not None:
        user = pull.setdefault("user", {})
        if author is not None:
            user["login"] = author
        if author_type is not None:
            user["type"] = author_type
        payload["sender"] = dict(payload.get("sender") or {}, **user)
    if installation_id is not None:
        payload["installation"] = {"id": installation_id, "node_id": f"I_{installation_id}"}
    return payload


def build_github_issue_comment_event(
    fixture_payload: Mapping[str, Any],
    *,
    body: str,
    repo: str | None = None,
    number: int | None = None,
    author: str | None = None,
    author_type: str | None = None,
    comment_id: int | None = None,
    installation_id: int | None = None,
) -> dict[str, Any]:
    """An `issue_comment` delivery (e.g. a slash command) shaped like the fixture."""
    payload = copy.deepcopy(dict(fixture_payload))
    payload["comment"]["body"] = body
    if repo is not None:
        _set_repo_github(payload, repo)
    if number is not None:
        payload["issue"]["number"] = number
    if comment_id is not None:
        payload["comment"]["id"] = comment_id
    if author is not None or author_type is not None:
        user = payload["comment"].setdefault("user", {})
        if author is not None:
            user["login"] = author
        if author_type is not None:
            user["type"] = author_type
        payload["sender"] = dict(payload.get("sender") or {}, **user)
    if installation_id is not None:
        payload["installation"] = {"id": installation_id, "node_id": f"I_{installation_id}"}
    return payload


def build_gitlab_merge_request_event(
    fixture_payload: Mapping[str, Any],
    *,
    action: str | None = None,
    repo: str | None = None,
    project_id: int | None = None,
    number: int | None = None,
    title: str | None = None,
    base_ref: str | None = None,
    head_ref: str | None = None,
    head_sha: str | None = None,
    oldrev: str | None = None,
    labels: Sequence[str] | None = None,
    author: str | None = None,
    author_is_bot: bool | None = None,
    draft: bool | None = None,
) -> dict[str, Any]:
    """A `Merge Request Hook` delivery shaped like the fixture, with the given fields replaced."""
    payload = copy.deepcopy(dict(fixture_payload))
    attributes = payload["object_attributes"]
    project = payload.setdefault("project", {})
    if action is not None:
        attributes["action"] = action
    if repo is not None:
        project["path_with_namespace"] = repo
        project["name"] = repo.rsplit("/", 1)[-1]
        project["web_url"] = f"https://gitlab.example.com/{repo}"
        attributes["url"] = (
            f"https://gitlab.example.com/{repo}/-/merge_requests/{attributes['iid']}"
        )
    if project_id is not None:
        project["id"] = project_id
        attributes["target_project_id"] = project_id
        attributes["source_project_id"] = project_id
    if number is not None:
        attributes["iid"] = number
    for key, value in (
        ("title", title),
        ("target_branch", base_ref),
        ("source_branch", head_ref),
        ("draft", draft),
    ):
        if value is not None:
            attributes[key] = value
    if draft is not None:
        attributes["work_in_progress"] = draft
    if head_sha is not None:
        attributes.setdefault("last_commit", {})["id"] = head_sha
    if oldrev is not None:
        attributes["oldrev"] = oldrev
    if labels is not None:
        entries = [
            {
                "id": 2000 + index,
                "title": name,
                "color": "#0075ca",
                "project_id": project.get("id"),
                "type": "ProjectLabel",
            }
            for index, name in enumerate(labels)
        ]
        payload["labels"] = entries
        attributes["labels"] = entries
    if author is not None or author_is_bot is not None:
        user = payload.setdefault("user", {})
        if author is not None:
            user["username"] = author
            user["name"] = author
        if author_is_bot is not None:
            user["bot"] = author_is_bot
    return payload


def build_gitlab_note_event(
    fixture_payload: Mapping[str, Any],
    *,
    body: str,
    repo: str | None = None,
    project_id: int | None = None,
    number: int | None = None,
    author: str | None = None,
    note_id: int | None = None,
) -> dict[str, Any]:
    """A `Note Hook` delivery on a merge request (e.g. a slash command)."""
    payload = copy.deepcopy(dict(fixture_payload))
    payload["object_attributes"]["note"] = body
    if repo is not None:
        payload.setdefault("project", {})["path_with_namespace"] = repo
    if project_id is not None:
        payload["project_id"] = project_id
        payload.setdefault("project", {})["id"] = project_id
        payload["object_attributes"]["project_id"] = project_id
    if number is not None:
        payload["merge_request"]["iid"] = number
    if author is not None:
        payload.setdefault("user", {})["username"] = author
    if note_id is not None:
        payload["object_attributes"]["id"] = note_id
    return payload


def github_pull_request_hook(
    state: EmulatorState, pull: EmulatedPull, *, action: str = "opened", installation_id: int = 1
) -> dict[str, Any]:
    """A `pull_request` delivery for a seeded PR, built from the emulator's own API objects
    (for a machine without recorded payloads)."""
    pull_request = _github_pull(state, pull)
    return {
        "action": action,
        "number": pull.number,
        "pull_request": pull_request,
        "repository": pull_request["base"]["repo"],
        "sender": pull_request["user"],
        "installation": {"id": installation_id, "node_id": f"I_{installation_id}"},
    }


def gitlab_merge_request_hook(
    state: EmulatorState, pull: EmulatedPull, *, action: str = "open"
) -> dict[str, Any]:
    """A `Merge Request Hook` delivery for a seeded MR, built from the emulator's own objects
    (for a machine without recorded payloads)."""
    web_url = f"https://gitlab.example.com/{pull.repo}"
    namespace, _, name = pull.repo.rpartition("/")
    project = {
        "id": pull.project_id,
        "name": name,
        "web_url": web_url,
        "namespace": namespace,
        "path_with_namespace": pull.repo,
        "default_branch": "main",
        "git_http_url": f"{web_url}.git",
    }
    labels = [
        {"id": 2000 + index, "title": label, "project_id": pull.project_id, "type": "ProjectLabel"}
        for index, label in enumerate(pull.labels)
    ]
    version = pull.newest
    return {
        "object_kind": "merge_request",
        "event_type": "merge_request",
        "user": _gitlab_user(state, pull.author),
        "project": project,
        "object_attributes": {
            "id": pull.id,
            "iid": pull.number,
            "title": pull.title,
            "action": action,
            "state": "opened",
            "draft": pull.draft,
            "work_in_progress": pull.draft,
            "source_branch": pull.head_ref,
            "target_branch": pull.base_ref,
            "source_project_id": pull.project_id,
            "target_project_id": pull.project_id,
            "last_commit": {"id": version.head_sha, "title": pull.title},
            "labels": labels,
            "url": f"{web_url}/-/merge_requests/{pull.number}",
        },
        "labels": labels,
        "changes": {},
        "repository": {"name": name, "url": f"{web_url}.git", "homepage": web_url},
    }


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """What the bot answered to a delivery."""

    status: int
    body: str
    delivery_id: str


def sign_github_payload(body: bytes, secret: str) -> str:
    """The `X-Hub-Signature-256` value GitHub sends for `body`."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def webhook_headers(
    forge: Forge, event: str, body: bytes, secret: str, delivery_id: str
) -> dict[str, str]:
    """Headers of a real delivery: event name, delivery id, signature or token."""
    if forge == "github":
        return {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/emulator",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery_id,
            "X-GitHub-Hook-ID": "1",
            "X-Hub-Signature-256": sign_github_payload(body, secret),
        }
    return {
        "Content-Type": "application/json",
        "User-Agent": "GitLab/17.0.0",
        "X-Gitlab-Event": event,
        "X-Gitlab-Token": secret,
        "X-Gitlab-Event-UUID": delivery_id,
        "X-Gitlab-Webhook-UUID": "00000000-0000-4000-8000-000000000001",
        "Idempotency-Key": delivery_id,
    }


async def send_webhook(
    url: str,
    forge: Forge,
    event: str,
    payload: Mapping[str, Any],
    secret: str,
    *,
    delivery_id: str | None = None,
    session: aiohttp.ClientSession | None = None,
    timeout_s: float = 10.0,
) -> WebhookDelivery:
    """POST a signed delivery to the bot as GitHub or GitLab would; returns its answer."""
    body = json.dumps(payload).encode()
    delivery = delivery_id or str(uuid.uuid4())
    headers = webhook_headers(forge, event, body, secret, delivery)
    own_session = session is None
    client = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    try:
        async with client.post(url, data=body, headers=headers) as response:
            return WebhookDelivery(response.status, await response.text(), delivery)
    finally:
        if own_session:
            await client.close()


# -- entry point ---------------------------------------------------------------------------


def seed_examples(state: EmulatorState, *, pulls: int = 3, seed: int = 0) -> list[EmulatedPull]:
    """Seed a few PRs and MRs with generated diffs (for `bot emulator`)."""
    made = []
    for index in range(pulls):
        files = generate_file_changes(
            changed_lines=40 + 60 * index, files=2 + index, seed=seed + index
        )
        made.append(
            state.add_pull(
                "github",
                "acme/shop",
                index + 1,
                files=files,
                base_ref="hotfix/checkout" if index == 0 else "main",
            )
        )
        made.append(state.add_pull("gitlab", "acme/platform/api", index + 1, files=files))
    return made


async def serve_emulator(
    port: int,
    *,
    host: str = "127.0.0.1",
    stop: asyncio.Event | None = None,
    seed_pulls: int = 3,
    on_ready: Callable[[ForgeEmulator], object] | None = None,
) -> None:
    """Serve a seeded emulator until `stop` is set (or SIGINT/SIGTERM without one)."""
    state = EmulatorState()
    seed_examples(state, pulls=seed_pulls)
    done = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if stop is None else ()
    for signum in signals:
        loop.add_signal_handler(signum, done.set)
    try:
        async with ForgeEmulator(state, host=host, port=port) as emulator:
            print(
                f"forge emulator: GitHub API at {emulator.github_url}, "
                f"GitLab API at {emulator.gitlab_url}/api/v4",
                flush=True,
            )
            if on_ready is not None:
                on_ready(emulator)
            await done.wait()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def run_emulator(port: int, host: str = "127.0.0.1") -> int:
    """`bot emulator --port N`: serve a seeded emulator until interrupted; returns an exit code."""
    asyncio.run(serve_emulator(port, host=host))
    return 0


# Quiet reviews' routes (comment edits, discussion resolution, compare, contents) live in their
# own module; it builds on the helpers above.
from bot.forges.emulator_quiet import QUIET_ROUTES  # noqa: E402

ROUTES = (*ROUTES, *QUIET_ROUTES)

import bot.forges.emulator_checks  # noqa: E402, F401  (registers its routes on import)
