"""What every emulated route shares: the request context, replies, errors and pagination."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from bot.emulator.state import GITHUB_DOCS, REVIEW_DOCS, EmulatorState
from bot.model import Forge


def iso_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def public_view(item: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the emulator's private bookkeeping keys from a stored object."""
    return {key: value for key, value in item.items() if not key.startswith("_")}


class Reply(Exception):
    """Raised by handlers to answer with an error status and body."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


def github_error(
    status: int,
    message: str,
    *,
    errors: list[Any] | None = None,
    documentation_url: str = GITHUB_DOCS,
) -> Reply:
    body: dict[str, Any] = {"message": message, "documentation_url": documentation_url}
    if errors is not None:
        body["errors"] = errors
    body["status"] = str(status)
    return Reply(status, body)


def not_found(forge: Forge) -> Reply:
    if forge == "github":
        return github_error(404, "Not Found")
    return Reply(404, {"message": "404 Not found"})


Handler = Callable[["Context"], Awaitable[Any]]


@dataclass(slots=True)
class Context:
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
                raise github_error(400, "Problems parsing JSON") from exc
            raise Reply(400, {"error": "body is not valid JSON"}) from exc

    def query_int(self, name: str, default: int, *, maximum: int) -> int:
        value = self.request.query.get(name, "")
        return max(1, min(maximum, int(value))) if value.isdigit() else default


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    forge: Forge


def paginate(ctx: Context, items: Sequence[Any], *, default: int, maximum: int) -> list[Any]:
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


def check_repo_token(ctx: Context, repo: str) -> None:
    issued = ctx.installation
    if issued is not None and ctx.state.installations.get(repo) != issued:
        raise not_found("github")  # an installation token sees only its installation's repos


def invalid_request(message: str) -> Reply:
    return github_error(422, f"Invalid request.\n\n{message}", documentation_url=REVIEW_DOCS)


def define_route(name: str, method: str, template: str, handler: Handler, forge: Forge) -> Route:
    # {name} is one path segment, {+name} any number of them (a file path).
    pattern = re.sub(r"\{\+(\w+)\}", r"(?P<\1>.+)", template)
    pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
    return Route(name, method, re.compile(f"^{pattern}$"), handler, forge)


GITHUB_REPO = "/repos/{owner}/{repo}"
GITLAB_MR = "/api/v4/projects/{project}/merge_requests/{iid}"
