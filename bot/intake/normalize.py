"""Turn verified forge payloads into forge-neutral requests, commands or a reason to ignore."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from bot.commands.parse import is_bot_comment, parse_commands
from bot.errors import WebhookError
from bot.forges.statuses import STATUS_NAME
from bot.intake.verify import Delivery
from bot.model import MAX_DESCRIPTION_CHARS, Command, Forge, ReviewRequest

KNOWN_BOTS = frozenset(
    {"dependabot", "dependabot-preview", "renovate", "renovate-bot", "renovatebot"}
)
# GitLab names project and group access-token users like project_123_bot_0123abcd.
_GITLAB_TOKEN_BOT = re.compile(r"(project|group)_\d+_bot(_[0-9a-f]+)?", re.ASCII)

GITHUB_PULL_REQUEST_ACTIONS = frozenset(
    {"opened", "reopened", "synchronize", "ready_for_review", "edited", "labeled", "unlabeled"}
)
GITLAB_MERGE_REQUEST_ACTIONS = {"open": "opened", "reopen": "reopened", "merge": "merged"}

T = TypeVar("T")
MAX_BIGINT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Ignored:
    """A delivery that asks for nothing; `reason` says why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Pong:
    """GitHub's ping: the hook works."""

    zen: str | None = None


@dataclass(frozen=True, slots=True)
class Commands:
    """Slash commands from one comment, with the parse errors to reply with."""

    forge: Forge
    repo: str
    number: int
    author: str
    comment_id: int
    commands: tuple[Command, ...]
    errors: tuple[str, ...] = ()
    project_id: int | None = None
    installation_id: int | None = None


@dataclass(frozen=True, slots=True)
class Closed:
    """A PR/MR closed without merging: its queued review is no longer wanted."""

    forge: Forge
    repo: str
    number: int
    reason: str


Normalized = ReviewRequest | Commands | Closed | Ignored | Pong


def is_bot_author(login: str, *, user_type: str | None = None) -> bool:
    """Tell whether an account is an automation (GitHub Bot type, `[bot]` suffix, known names)."""
    lowered = login.lower()
    return (
        user_type == "Bot"
        or lowered.endswith("[bot]")
        or lowered in KNOWN_BOTS
        or _GITLAB_TOKEN_BOT.fullmatch(lowered) is not None
    )


def normalize_delivery(delivery: Delivery, *, bot_login: str = "review-bot") -> Normalized:
    """Map a verified delivery to what it asks for; raises WebhookError(400) naming a bad field."""
    payload = delivery.payload
    if delivery.forge == "github":
        if delivery.event == "ping":
            zen = payload.get("zen")
            return Pong(zen=clean_text(zen) if isinstance(zen, str) else None)
        if delivery.event == "pull_request":
            return _github_pull_request(payload, delivery.delivery_id)
        if delivery.event == "issue_comment":
            return _github_comment(payload, delivery.delivery_id, bot_login=bot_login)
        if delivery.event == "check_run":
            return _github_check_run(payload, delivery.delivery_id)
        return Ignored(f"GitHub event {_shown(delivery.event)} is not one the bot acts on")
    kind = delivery.event
    if kind in ("System Hook", "Service Hook"):
        object_kind = payload.get("object_kind")
        kind = {"merge_request": "Merge Request Hook", "note": "Note Hook"}.get(
            object_kind if isinstance(object_kind, str) else "", kind
        )
    if kind == "Merge Request Hook":
        return _gitlab_merge_request(payload, delivery.delivery_id)
    if kind == "Note Hook":
        return _gitlab_note(payload, delivery.delivery_id, bot_login=bot_login)
    return Ignored(f"GitLab event {_shown(delivery.event)} is not one the bot acts on")


def _github_pull_request(payload: Mapping[str, Any], delivery_id: str) -> Normalized:
    """Normalize a GitHub `pull_request` event."""
    action = _field(payload, "action", str)
    pull = _field(payload, "pull_request", dict)
    if action == "closed":
        if not _optional(pull, "merged", bool, path="pull_request.merged"):
            repository = _field(payload, "repository", dict)
            return Closed(
                forge="github",
                repo=clean_text(_field(repository, "full_name", str, path="repository.full_name")),
                number=_field(pull, "number", int, path="pull_request.number"),
                reason="pull request closed without merging",
            )
        action = "merged"
    elif action not in GITHUB_PULL_REQUEST_ACTIONS:
        return Ignored(f"pull_request action {_shown(action)} does not change what to review")
    if action == "edited" and "base" not in (_optional(payload, "changes", dict) or {}):
        return Ignored("pull request edited without a base change (title or body only)")
    user = _field(pull, "user", dict, path="pull_request.user")
    login = _field(user, "login", str, path="pull_request.user.login")
    base = _field(pull, "base", dict, path="pull_request.base")
    head = _field(pull, "head", dict, path="pull_request.head")
    installation = _optional(payload, "installation", dict, path="installation") or {}
    return ReviewRequest(
        forge="github",
        repo=_field(_field(payload, "repository", dict), "full_name", str, "repository.full_name"),
        number=_field(pull, "number", int, path="pull_request.number"),
        title=_optional(pull, "title", str, path="pull_request.title") or "",
        author=login,
        author_is_bot=is_bot_author(
            login, user_type=_optional(user, "type", str, path="pull_request.user.type")
        ),
        base_ref=_field(base, "ref", str, path="pull_request.base.ref"),
        head_ref=_field(head, "ref", str, path="pull_request.head.ref"),
        base_sha=_field(base, "sha", str, path="pull_request.base.sha"),
        head_sha=_field(head, "sha", str, path="pull_request.head.sha"),
        event="pull_request",
        action=action,
        draft=bool(_optional(pull, "draft", bool, path="pull_request.draft")),
        merged=action == "merged",
        labels=_label_names(pull.get("labels"), key="name", path="pull_request.labels"),
        files_changed=_optional(pull, "changed_files", int, path="pull_request.changed_files"),
        additions=_optional(pull, "additions", int, path="pull_request.additions"),
        deletions=_optional(pull, "deletions", int, path="pull_request.deletions"),
        installation_id=_optional(installation, "id", int, path="installation.id"),
        web_url=_optional(pull, "html_url", str, path="pull_request.html_url"),
        delivery_id=delivery_id,
        description=_description(_optional(pull, "body", str, path="pull_request.body")),
    )


def _github_comment(payload: Mapping[str, Any], delivery_id: str, *, bot_login: str) -> Normalized:
    """Normalize a GitHub `issue_comment` event into slash commands."""
    action = _field(payload, "action", str)
    issue = _field(payload, "issue", dict)
    if issue.get("pull_request") is None:
        return Ignored("comment on an issue, not on a pull request")
    if action != "created":
        return Ignored(f"comment {action}: only new comments carry commands")
    comment = _field(payload, "comment", dict)
    user = _field(comment, "user", dict, path="comment.user")
    author = _field(user, "login", str, path="comment.user.login")
    body = _optional(comment, "body", str, path="comment.body") or ""
    installation = _optional(payload, "installation", dict, path="installation") or {}
    return _commands(
        forge="github",
        repo=_field(_field(payload, "repository", dict), "full_name", str, "repository.full_name"),
        number=_field(issue, "number", int, path="issue.number"),
        author=author,
        author_is_bot=is_bot_author(
            author, user_type=_optional(user, "type", str, path="comment.user.type")
        ),
        comment_id=_field(comment, "id", int, path="comment.id"),
        body=body,
        bot_login=bot_login,
        project_id=None,
        installation_id=_optional(installation, "id", int, path="installation.id"),
        delivery_id=delivery_id,
    )


def _github_check_run(payload: Mapping[str, Any], delivery_id: str) -> Normalized:
    """The Re-run button of the bot's check run: the head's status again, by whoever pressed it
    (a new review only when the last one did not end in a posted review)."""
    action = _field(payload, "action", str)
    if action != "rerequested":
        return Ignored(f"check_run {_shown(action)}: only a re-run asks for a review")
    check_run = _field(payload, "check_run", dict)
    if _optional(check_run, "name", str, path="check_run.name") != STATUS_NAME:
        return Ignored("a re-run of another check")
    pulls = _optional(check_run, "pull_requests", list, path="check_run.pull_requests") or []
    if not pulls or not isinstance(pulls[0], dict):
        return Ignored("a re-run of a check on no open pull request")
    sender = _field(payload, "sender", dict)
    author = _field(sender, "login", str, path="sender.login")
    if is_bot_author(author, user_type=_optional(sender, "type", str, path="sender.type")):
        return Ignored(f"re-run by the bot account {_shown(author)}")
    repo = _field(_field(payload, "repository", dict), "full_name", str, "repository.full_name")
    number = _field(pulls[0], "number", int, path="check_run.pull_requests[0].number")
    installation = _optional(payload, "installation", dict, path="installation") or {}
    installation_id = _optional(installation, "id", int, path="installation.id")
    command = Command(
        forge="github",
        repo=repo,
        number=number,
        author=author,
        comment_id=0,  # no comment to react to
        verb="rerun",
        raw="/review (the check run's Re-run button)",
        installation_id=installation_id,
        delivery_id=delivery_id,
    )
    return Commands(
        forge="github",
        repo=repo,
        number=number,
        author=author,
        comment_id=0,
        commands=(command,),
        installation_id=installation_id,
    )


def _gitlab_merge_request(payload: Mapping[str, Any], delivery_id: str) -> Normalized:
    """Normalize a GitLab Merge Request Hook."""
    attributes = _field(payload, "object_attributes", dict)
    raw_action = _field(attributes, "action", str, path="object_attributes.action")
    changes = _optional(payload, "changes", dict, path="changes") or {}
    action = GITLAB_MERGE_REQUEST_ACTIONS.get(raw_action)
    if raw_action == "update":
        if attributes.get("oldrev"):
            action = "synchronize"
        elif "target_branch" in changes:
            action = "edited"
        elif "labels" in changes:
            action = "labeled"
        elif _became_ready(changes):
            action = "ready_for_review"
        else:
            return Ignored("merge request updated without new commits, base or label change")
    if raw_action == "close":
        project = _field(payload, "project", dict)
        return Closed(
            forge="gitlab",
            repo=clean_text(
                _field(project, "path_with_namespace", str, path="project.path_with_namespace")
            ),
            number=_field(attributes, "iid", int, path="object_attributes.iid"),
            reason="merge request closed without merging",
        )
    if action is None:
        return Ignored(f"merge request action {_shown(raw_action)} does not change what to review")
    project = _field(payload, "project", dict)
    user = _field(payload, "user", dict)
    # The hook names the acting user only (the author is a numeric id); for open, reopen and
    # pushes the actor is the one whose work is reviewed.
    author = _field(user, "username", str, path="user.username")
    last_commit = _field(attributes, "last_commit", dict, path="object_attributes.last_commit")
    labels = payload.get("labels")
    if labels is None:
        labels = attributes.get("labels")
    draft = _optional(attributes, "draft", bool, path="object_attributes.draft")
    work_in_progress = _optional(
        attributes, "work_in_progress", bool, path="object_attributes.work_in_progress"
    )
    return ReviewRequest(
        forge="gitlab",
        repo=_field(project, "path_with_namespace", str, path="project.path_with_namespace"),
        number=_field(attributes, "iid", int, path="object_attributes.iid"),
        title=_optional(attributes, "title", str, path="object_attributes.title") or "",
        author=author,
        author_is_bot=is_bot_author(author),
        base_ref=_field(attributes, "target_branch", str, path="object_attributes.target_branch"),
        head_ref=_field(attributes, "source_branch", str, path="object_attributes.source_branch"),
        base_sha="",
        head_sha=_field(last_commit, "id", str, path="object_attributes.last_commit.id"),
        event="merge_request",
        action=action,
        draft=bool(draft or work_in_progress),
        merged=action == "merged",
        labels=_label_names(labels, key="title", path="labels"),
        project_id=_optional(project, "id", int, path="project.id"),
        web_url=_optional(attributes, "url", str, path="object_attributes.url"),
        delivery_id=delivery_id,
        description=_description(
            _optional(attributes, "description", str, path="object_attributes.description")
        ),
    )


def _description(text: str | None) -> str:
    """A description as a job keeps it: at most MAX_DESCRIPTION_CHARS characters."""
    return (text or "")[:MAX_DESCRIPTION_CHARS]


def _gitlab_note(payload: Mapping[str, Any], delivery_id: str, *, bot_login: str) -> Normalized:
    """Normalize a GitLab Note Hook on a merge request into slash commands."""
    attributes = _field(payload, "object_attributes", dict)
    noteable = _optional(attributes, "noteable_type", str, path="object_attributes.noteable_type")
    if noteable != "MergeRequest":
        where = _shown(noteable) if noteable else "thing"
        return Ignored(f"comment on a {where}, not on a merge request")
    if attributes.get("system"):
        return Ignored("system note")
    action = _optional(attributes, "action", str, path="object_attributes.action")
    if action not in (None, "create"):
        return Ignored(f"comment {action}: only new comments carry commands")
    user = _field(payload, "user", dict)
    author = _field(user, "username", str, path="user.username")
    project = _field(payload, "project", dict)
    merge_request = _field(payload, "merge_request", dict)
    return _commands(
        forge="gitlab",
        repo=_field(project, "path_with_namespace", str, path="project.path_with_namespace"),
        number=_field(merge_request, "iid", int, path="merge_request.iid"),
        author=author,
        author_is_bot=is_bot_author(author),
        comment_id=_field(attributes, "id", int, path="object_attributes.id"),
        body=_optional(attributes, "note", str, path="object_attributes.note") or "",
        bot_login=bot_login,
        project_id=_optional(project, "id", int, path="project.id"),
        installation_id=None,
        delivery_id=delivery_id,
    )


def _commands(
    *,
    forge: Forge,
    repo: str,
    number: int,
    author: str,
    author_is_bot: bool,
    comment_id: int,
    body: str,
    bot_login: str,
    project_id: int | None,
    installation_id: int | None,
    delivery_id: str,
) -> Normalized:
    """Parse a comment body into Commands, or say why it carries none."""
    if is_bot_comment(body, author=author, bot_login=bot_login):
        return Ignored("the bot's own comment")
    if author_is_bot:
        # Bots answering bots loop; no automation may steer the queue.
        return Ignored(f"comment by the bot account {_shown(author)}")
    result = parse_commands(body, author=author, bot_login=bot_login)
    if result.empty:
        return Ignored("comment has no /review command")
    commands = tuple(
        Command(
            forge=forge,
            repo=repo,
            number=number,
            author=author,
            comment_id=comment_id,
            verb=parsed.verb,
            argument=parsed.argument,
            raw=parsed.raw,
            project_id=project_id,
            installation_id=installation_id,
            delivery_id=delivery_id,
        )
        for parsed in result.commands
    )
    return Commands(
        forge=forge,
        repo=repo,
        number=number,
        author=author,
        comment_id=comment_id,
        commands=commands,
        errors=result.errors,
        project_id=project_id,
        installation_id=installation_id,
    )


def _became_ready(changes: Mapping[str, Any]) -> bool:
    """Tell whether a GitLab update took the merge request out of draft."""
    for name in ("draft", "work_in_progress"):
        change = changes.get(name)
        if isinstance(change, dict) and (change.get("previous"), change.get("current")) == (
            True,
            False,
        ):
            return True
    return False


def _label_names(value: Any, *, key: str, path: str) -> tuple[str, ...]:
    """Read label names from a list of label objects (or plain strings)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise WebhookError(f"field {path} must be a list", status=400)
    names: list[str] = []
    for item in value:
        name = item.get(key) if isinstance(item, dict) else item
        if not isinstance(name, str):
            raise WebhookError(f"field {path} must hold labels with a {key!r} string", status=400)
        names.append(clean_text(name))
    return tuple(names)


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "an object"}


def _field(container: Mapping[str, Any], key: str, kind: type[T], path: str | None = None) -> T:
    """Read a required field of the given type; raises WebhookError(400) naming it."""
    value = _optional(container, key, kind, path=path)
    if value is None:
        raise WebhookError(f"missing field {path or key}", status=400)
    return value


def _optional(
    container: Mapping[str, Any], key: str, kind: type[T], path: str | None = None
) -> T | None:
    """Read an optional field (absent or null is None); raises WebhookError(400) on a bad type."""
    value = container.get(key)
    if value is None:
        return None
    # bool is an int in Python; a count of `true` files is a broken payload.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WebhookError(f"field {path or key} must be {_TYPE_NAMES.get(kind, kind)}", status=400)
    if isinstance(value, int) and not 0 <= value <= MAX_BIGINT:
        raise WebhookError(f"field {path or key} is out of range", status=400)
    if isinstance(value, str):
        return clean_text(value)  # type: ignore[return-value]
    return value


def clean_text(value: str) -> str:
    """Make a payload string storable: PostgreSQL text holds no NUL and no lone surrogate."""
    if value.isascii():
        return value.replace("\x00", "\ufffd")
    return value.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


def _shown(value: object) -> str:
    """A payload value as quoted in a reason: repr (so control characters are escaped), short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
