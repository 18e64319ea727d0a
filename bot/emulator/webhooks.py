"""Webhooks the forges send: events built from a pull request, signed and delivered."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bot.emulator.github_json import github_pull
from bot.emulator.gitlab import gitlab_user
from bot.emulator.state import EmulatedPull, EmulatorState
from bot.model import Forge


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
    pull_request = github_pull(state, pull)
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
        "user": gitlab_user(state, pull.author),
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
