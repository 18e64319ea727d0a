"""Shape checks for the identifiers a webhook carries, before anything stores them.

Signed deliveries are trusted to come from the forge, not to be sane: a proxy, a test hook or a
forge bug can send a 5,000-character sha or a repository with no owner. Each check raises
WebhookError(400) naming the payload field, so the sender sees what to fix.
"""

from __future__ import annotations

import re

from bot.errors import WebhookError
from bot.intake.normalize import Closed, Commands, Normalized
from bot.logsafe import escaped
from bot.model import Forge, ReviewRequest

# SHA-1 object names (40 hex digits) and SHA-256 ones (64).
SHA = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")
# GitHub: owner 1-39 letters, digits, hyphens (and _ for managed users); repository name
# letters, digits, . _ -.
GITHUB_OWNER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,38}")
GITHUB_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
# GitLab: namespace/…/project, each path segment letters, digits, _ . - (not starting with - or .).
GITLAB_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")
GITLAB_MAX_SEGMENTS = 21  # 20 levels of nested groups and the project
MAX_REF_CHARS = 255
MAX_LOGIN_CHARS = 255
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# Where each value sits in each forge's payload, so the 400 names the field the sender wrote.
FIELDS: dict[Forge, dict[str, str]] = {
    "github": {
        "repo": "repository.full_name",
        "head_sha": "pull_request.head.sha",
        "base_sha": "pull_request.base.sha",
        "head_ref": "pull_request.head.ref",
        "base_ref": "pull_request.base.ref",
        "author": "pull_request.user.login",
        "commenter": "comment.user.login",
    },
    "gitlab": {
        "repo": "project.path_with_namespace",
        "head_sha": "object_attributes.last_commit.id",
        "head_ref": "object_attributes.source_branch",
        "base_ref": "object_attributes.target_branch",
        "author": "user.username",
        "commenter": "user.username",
    },
}


def check_shape(outcome: Normalized) -> None:
    """Raise WebhookError(400) naming the first field of `outcome` with an impossible shape."""
    if isinstance(outcome, ReviewRequest):
        fields = FIELDS[outcome.forge]
        check_repo(outcome.repo, forge=outcome.forge, field=fields["repo"])
        check_sha(outcome.head_sha, field=fields["head_sha"])
        if outcome.forge == "github":  # GitLab's merge request hook carries no base sha
            check_sha(outcome.base_sha, field=fields["base_sha"])
        check_ref(outcome.head_ref, field=fields["head_ref"])
        check_ref(outcome.base_ref, field=fields["base_ref"])
        check_login(outcome.author, field=fields["author"])
    elif isinstance(outcome, Commands):
        fields = FIELDS[outcome.forge]
        check_repo(outcome.repo, forge=outcome.forge, field=fields["repo"])
        check_login(outcome.author, field=fields["commenter"])
    elif isinstance(outcome, Closed):
        check_repo(outcome.repo, forge=outcome.forge, field=FIELDS[outcome.forge]["repo"])


def check_sha(value: str, *, field: str) -> None:
    """A commit id: 40 or 64 hexadecimal digits."""
    if SHA.fullmatch(value) is None:
        raise WebhookError(
            f"field {field} must be a commit id of 40 or 64 hex digits, got "
            f"{len(value)} characters: {escaped(value, limit=60)}",
            status=400,
        )


def check_repo(value: str, *, forge: Forge, field: str) -> None:
    """A repository path: `owner/name` on GitHub, `group[/subgroup…]/project` on GitLab."""
    segments = value.split("/")
    if forge == "github":
        valid = (
            len(segments) == 2
            and GITHUB_OWNER.fullmatch(segments[0]) is not None
            and GITHUB_NAME.fullmatch(segments[1]) is not None
            and segments[1] not in (".", "..")
        )
        expected = "owner/name (owner: letters, digits, - _; name: letters, digits, . _ -)"
    else:
        valid = 2 <= len(segments) <= GITLAB_MAX_SEGMENTS and all(
            GITLAB_SEGMENT.fullmatch(segment) is not None for segment in segments
        )
        expected = "group/project (each part: letters, digits, _ . -)"
    if not valid:
        raise WebhookError(
            f"field {field} must be {expected}, got {escaped(value, limit=80)}", status=400
        )


def check_ref(value: str, *, field: str) -> None:
    """A branch name: non-empty, at most 255 characters, no control characters."""
    if not value or len(value) > MAX_REF_CHARS or CONTROL.search(value):
        raise WebhookError(
            f"field {field} must be a branch name of 1-{MAX_REF_CHARS} printable characters, "
            f"got {len(value)} characters: {escaped(value, limit=60)}",
            status=400,
        )


def check_login(value: str, *, field: str) -> None:
    """An account name: non-empty, at most 255 characters, no control characters."""
    if not value or len(value) > MAX_LOGIN_CHARS or CONTROL.search(value):
        raise WebhookError(
            f"field {field} must be an account name of 1-{MAX_LOGIN_CHARS} printable "
            f"characters, got {escaped(value, limit=60)}",
            status=400,
        )
