"""The webhooks the emulator sends the bot itself when changed from outside: a pull request
opened or pushed to, a person's comment; built from its own objects, signed as the forges do."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from bot.emulator.github_json import github_repository, github_user
from bot.emulator.gitlab import gitlab_user
from bot.emulator.http import public_view
from bot.emulator.state import EmulatedPull, EmulatorState
from bot.emulator.webhooks import (
    github_pull_request_hook,
    gitlab_merge_request_hook,
    send_webhook,
)
from bot.model import Forge

GITHUB_EVENTS = {"pull": "pull_request", "comment": "issue_comment"}
GITLAB_EVENTS = {"pull": "Merge Request Hook", "comment": "Note Hook"}


@dataclass(frozen=True, slots=True)
class HookTarget:
    """Where the bot listens (its base URL) and the secrets it checks deliveries with."""

    url: str
    github_secret: str = ""
    gitlab_token: str = ""

    def endpoint(self, forge: Forge) -> str:
        return f"{self.url.rstrip('/')}/webhooks/{forge}"

    def secret(self, forge: Forge) -> str:
        return self.github_secret if forge == "github" else self.gitlab_token


@dataclass(frozen=True, slots=True)
class Hook:
    """One delivery: the forge's event name and its payload."""

    forge: Forge
    event: str
    payload: dict[str, Any]


def pull_hook(state: EmulatorState, pull: EmulatedPull, *, before: str | None = None) -> Hook:
    """`pull_request` opened (or synchronize after `before`), or GitLab's open (or update)."""
    if pull.forge == "github":
        installation = state.installations.get(pull.repo, 1)
        action = "opened" if before is None else "synchronize"
        payload = github_pull_request_hook(state, pull, action=action, installation_id=installation)
        if before is not None:
            payload["before"], payload["after"] = before, pull.newest.head_sha
        return Hook("github", GITHUB_EVENTS["pull"], payload)
    payload = gitlab_merge_request_hook(state, pull, action="open" if before is None else "update")
    if before is not None:
        payload["object_attributes"]["oldrev"] = before
    return Hook("gitlab", GITLAB_EVENTS["pull"], payload)


def comment_hook(state: EmulatorState, pull: EmulatedPull, comment: dict[str, Any]) -> Hook:
    """`issue_comment` created on the pull request, or GitLab's Note Hook on the merge request."""
    if pull.forge == "github":
        api = f"https://api.github.com/repos/{pull.repo}"
        issue = {
            "number": pull.number,
            "title": pull.title,
            "state": pull.state,
            "user": github_user(state, pull.author),
            "url": f"{api}/issues/{pull.number}",
            "html_url": f"https://github.com/{pull.repo}/pull/{pull.number}",
            "pull_request": {"url": f"{api}/pulls/{pull.number}"},
        }
        payload: dict[str, Any] = {
            "action": "created",
            "issue": issue,
            "comment": public_view(comment),
            "repository": github_repository(state, pull.repo),
            "sender": comment["user"],
            "installation": {"id": state.installations.get(pull.repo, 1)},
        }
        return Hook("github", GITHUB_EVENTS["comment"], payload)
    web_url = f"https://gitlab.example.com/{pull.repo}"
    author = comment["author"]["username"]
    payload = {
        "object_kind": "note",
        "event_type": "note",
        "user": gitlab_user(state, author),
        "project_id": pull.project_id,
        "project": {
            "id": pull.project_id,
            "path_with_namespace": pull.repo,
            "web_url": web_url,
            "default_branch": "main",
        },
        "object_attributes": {
            "id": comment["id"],
            "note": comment["body"],
            "noteable_type": "MergeRequest",
            "author_id": comment["author"]["id"],
            "project_id": pull.project_id,
            "created_at": comment["created_at"],
            "updated_at": comment["updated_at"],
            "system": False,
            "action": "create",
            "url": f"{web_url}/-/merge_requests/{pull.number}#note_{comment['id']}",
        },
        "merge_request": {
            "id": pull.id,
            "iid": pull.number,
            "title": pull.title,
            "source_branch": pull.head_ref,
            "target_branch": pull.base_ref,
            "last_commit": {"id": pull.newest.head_sha},
        },
    }
    return Hook("gitlab", GITLAB_EVENTS["comment"], payload)


async def deliver(target: HookTarget, hook: Hook) -> dict[str, Any]:
    """Send the delivery; what the bot answered, or why it could not be reached."""
    try:
        answer = await send_webhook(
            target.endpoint(hook.forge),
            hook.forge,
            hook.event,
            hook.payload,
            target.secret(hook.forge),
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        return {"url": target.endpoint(hook.forge), "error": f"not delivered: {exc!r}"}
    try:
        said: Any = json.loads(answer.body)
    except ValueError:
        said = answer.body
    return {
        "url": target.endpoint(hook.forge),
        "status": answer.status,
        "answer": said,
        "delivery_id": answer.delivery_id,
    }


HOOK_TARGET = web.AppKey[HookTarget | None]("hook_target")


async def send_hook(request: web.Request, hook: Hook, *, send: bool = True) -> dict[str, Any]:
    """The delivery as the control API shows it, sent to the bot when there is one."""
    target = request.app.get(HOOK_TARGET)
    shown: dict[str, Any] = {"event": hook.event, "payload": hook.payload}
    if target is None or not send:
        return {"webhook": shown, "delivered": None}
    return {"webhook": shown, "delivered": await deliver(target, hook)}


__all__ = [
    "HOOK_TARGET",
    "Hook",
    "HookTarget",
    "comment_hook",
    "deliver",
    "pull_hook",
    "send_hook",
]
