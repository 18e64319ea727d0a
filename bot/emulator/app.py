"""The emulator's aiohttp application: the route table, authentication, fault injection."""

from __future__ import annotations

import asyncio
import math
import uuid
from email.utils import format_datetime
from typing import Any
from urllib.parse import unquote

import jwt
from aiohttp import web

from bot.emulator.activity import ACTIVITY_ROUTES
from bot.emulator.checks import CHECK_ROUTES
from bot.emulator.github import (
    github_access_token,
    github_create_comment,
    github_create_reaction,
    github_create_review,
    github_files,
    github_get_pull,
    github_installation,
    github_list_comments,
    github_list_reviews,
    github_permission,
)
from bot.emulator.gitlab import (
    gitlab_award_emoji,
    gitlab_changes,
    gitlab_create_discussion,
    gitlab_create_note,
    gitlab_diffs,
    gitlab_get_mr,
    gitlab_list_discussions,
    gitlab_list_notes,
    gitlab_member,
    gitlab_users,
    gitlab_versions,
)
from bot.emulator.graphql import GRAPHQL_ROUTES
from bot.emulator.hooks import HookTarget
from bot.emulator.http import (
    GITHUB_REPO,
    GITLAB_MR,
    Context,
    Reply,
    Route,
    define_route,
    github_error,
    not_found,
)
from bot.emulator.limits import CONTENT_METHODS, NOT_CONTENT_ROUTES, entity_tag, matches
from bot.emulator.manage import add_control_routes
from bot.emulator.outside import add_change_routes
from bot.emulator.quiet import QUIET_ROUTES
from bot.emulator.state import (
    BOT_LOGIN,
    EMULATOR_STATE,
    GITHUB_DOCS,
    GITLAB_BOT,
    SECONDARY_LIMIT_DOCS,
    SECONDARY_LIMIT_MESSAGE,
    EmulatorState,
    Fault,
    RequestLog,
)
from bot.model import Forge

# The GitHub and GitLab routes the forge clients use, by name (faults are queued per name).
FORGE_ROUTES: tuple[Route, ...] = (
    define_route(
        "github.access_token",
        "POST",
        "/app/installations/{installation_id}/access_tokens",
        github_access_token,
        "github",
    ),
    define_route(
        "github.installation", "GET", f"{GITHUB_REPO}/installation", github_installation, "github"
    ),
    define_route(
        "github.pull", "GET", f"{GITHUB_REPO}/pulls/{{number}}", github_get_pull, "github"
    ),
    define_route(
        "github.files", "GET", f"{GITHUB_REPO}/pulls/{{number}}/files", github_files, "github"
    ),
    define_route(
        "github.reviews.list",
        "GET",
        f"{GITHUB_REPO}/pulls/{{number}}/reviews",
        github_list_reviews,
        "github",
    ),
    define_route(
        "github.reviews.create",
        "POST",
        f"{GITHUB_REPO}/pulls/{{number}}/reviews",
        github_create_review,
        "github",
    ),
    define_route(
        "github.comments.list",
        "GET",
        f"{GITHUB_REPO}/issues/{{number}}/comments",
        github_list_comments,
        "github",
    ),
    define_route(
        "github.comments.create",
        "POST",
        f"{GITHUB_REPO}/issues/{{number}}/comments",
        github_create_comment,
        "github",
    ),
    define_route(
        "github.reactions.create",
        "POST",
        f"{GITHUB_REPO}/issues/comments/{{comment_id}}/reactions",
        github_create_reaction,
        "github",
    ),
    define_route(
        "github.permission",
        "GET",
        f"{GITHUB_REPO}/collaborators/{{username}}/permission",
        github_permission,
        "github",
    ),
    define_route("gitlab.merge_request", "GET", GITLAB_MR, gitlab_get_mr, "gitlab"),
    define_route("gitlab.versions", "GET", f"{GITLAB_MR}/versions", gitlab_versions, "gitlab"),
    define_route("gitlab.diffs", "GET", f"{GITLAB_MR}/diffs", gitlab_diffs, "gitlab"),
    define_route("gitlab.changes", "GET", f"{GITLAB_MR}/changes", gitlab_changes, "gitlab"),
    define_route(
        "gitlab.discussions.list",
        "GET",
        f"{GITLAB_MR}/discussions",
        gitlab_list_discussions,
        "gitlab",
    ),
    define_route(
        "gitlab.discussions.create",
        "POST",
        f"{GITLAB_MR}/discussions",
        gitlab_create_discussion,
        "gitlab",
    ),
    define_route("gitlab.notes.list", "GET", f"{GITLAB_MR}/notes", gitlab_list_notes, "gitlab"),
    define_route("gitlab.notes.create", "POST", f"{GITLAB_MR}/notes", gitlab_create_note, "gitlab"),
    define_route(
        "gitlab.award_emoji",
        "POST",
        f"{GITLAB_MR}/notes/{{note_id}}/award_emoji",
        gitlab_award_emoji,
        "gitlab",
    ),
    define_route(
        "gitlab.member",
        "GET",
        "/api/v4/projects/{project}/members/all/{user_id}",
        gitlab_member,
        "gitlab",
    ),
    define_route("gitlab.users", "GET", "/api/v4/users", gitlab_users, "gitlab"),
)

# Quiet reviews' routes (edits, resolution, compare, contents) and check runs / commit
# statuses live in their own modules.
ROUTES: tuple[Route, ...] = (
    *FORGE_ROUTES,
    *QUIET_ROUTES,
    *CHECK_ROUTES,
    *ACTIVITY_ROUTES,
    *GRAPHQL_ROUTES,
)


def _authenticate(ctx: Context, route: Route) -> None:
    state, headers = ctx.state, ctx.request.headers
    if route.forge == "gitlab":
        token = headers.get("PRIVATE-TOKEN") or headers.get("Authorization", "").removeprefix(
            "Bearer "
        )
        if not token or (state.gitlab_tokens and token not in state.gitlab_tokens):
            raise Reply(401, {"message": "401 Unauthorized"})
        ctx.user = GITLAB_BOT
        return
    scheme, _, credential = headers.get("Authorization", "").partition(" ")
    scheme = scheme.lower()
    if route.name in ("github.access_token", "github.installation"):
        if scheme != "bearer":
            raise github_error(401, "A JSON web token could not be decoded")
        _verify_app_jwt(state, credential)
        return
    if scheme not in ("token", "bearer") or not credential:
        raise github_error(401, "Requires authentication")
    issued = state.issued_tokens.get(credential)
    if issued is not None:
        installation, expires = issued
        if state.clock() >= expires:
            raise github_error(401, "Bad credentials")
        ctx.installation = installation
        ctx.user = BOT_LOGIN
        return
    if state.github_tokens and credential not in state.github_tokens:
        raise github_error(401, "Bad credentials")
    ctx.user = BOT_LOGIN


# GitHub's limit on an App JWT's life: it expires at most ten minutes after GitHub's now.
JWT_MAX_AHEAD_S = 600


def _verify_app_jwt(state: EmulatorState, token: str) -> None:
    """Check an App's JWT as GitHub does: its signature, and its times against the forge's
    own clock (not the caller's), with GitHub's words for each refusal."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
        key = state.apps.get(str(claims.get("iss")))
        if key is None:
            raise github_error(401, "Integration not found")
        claims = jwt.decode(
            token, key, algorithms=["RS256"], options={"verify_exp": False, "verify_iat": False}
        )
    except jwt.PyJWTError as exc:
        raise github_error(401, "A JSON web token could not be decoded") from exc
    now = state.clock().timestamp()
    issued, expires = claims.get("iat"), claims.get("exp")
    if not isinstance(issued, int) or issued > now:
        raise github_error(
            401, "'Issued at' claim ('iat') must be an Integer representing a time in the past."
        )
    if not isinstance(expires, int) or expires <= now:
        raise github_error(
            401,
            "'Expiration time' claim ('exp') must be a numeric value representing the future "
            "time at which the assertion expires.",
        )
    if expires > now + JWT_MAX_AHEAD_S:
        raise github_error(401, "'Expiration time' claim ('exp') is too far in the future")


def _fault_reply(forge: Forge, fault: Fault) -> Reply:
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
    return Reply(fault.status, body, headers)


def create_emulator_app(
    state: EmulatorState, *, hooks: HookTarget | None = None
) -> web.Application:
    """Build the aiohttp app that answers as GitHub (at /) and GitLab (under /api/v4); changes
    made through its control API send their webhooks to `hooks` when given."""

    async def dispatch(request: web.Request) -> web.StreamResponse:
        raw_path = request.raw_path.split("?", 1)[0]
        base_url = f"{request.scheme}://{request.host}"
        route: Route | None = None
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
        forge: Forge = "gitlab" if raw_path.startswith(("/api/v4/", "/api/graphql")) else "github"
        ctx = Context(state, request, params, forge, base_url)
        try:
            if route is None:
                if path_matched:
                    raise Reply(405, {"message": "405 Method Not Allowed"})
                raise not_found(forge)
            if forge == "github":
                _check_api_version(request.headers.get("X-GitHub-Api-Version"))
            fault = _next_fault(state, route.name)
            if fault is not None and fault.delay_s > 0 and not fault.after_handling:
                await asyncio.sleep(fault.delay_s)
            if fault is not None and fault.status is not None and not fault.after_handling:
                raise _fault_reply(forge, fault)
            _authenticate(ctx, route)
            _admit_content(ctx, route)
            body = await route.handler(ctx)
            if fault is not None and fault.after_handling and fault.delay_s > 0:
                await asyncio.sleep(fault.delay_s)  # done on the forge, the answer still to come
            if fault is not None and fault.status is not None:
                raise _fault_reply(forge, fault)
            response = _answer(ctx, route, body)
        except Reply as reply:
            response = web.json_response(reply.body, status=reply.status, headers=reply.headers)
        if forge == "github":
            response.headers.setdefault("X-GitHub-Request-Id", uuid.uuid4().hex[:20].upper())
        # The forge's own clock, which a client may be off from (aiohttp would send ours).
        response.headers["Date"] = format_datetime(state.clock(), usegmt=True)
        state.requests.append(
            RequestLog(
                request.method,
                raw_path,
                route.name if route else "",
                response.status,
                state.clock(),
                accept=request.headers.get("Accept"),
                api_version=request.headers.get("X-GitHub-Api-Version"),
                identity=_identity(ctx),
            )
        )
        return response

    app = web.Application()
    app[EMULATOR_STATE] = state
    add_control_routes(app)  # /_emulator/*: held PRs, new PRs from outside, what was posted
    add_change_routes(app, hooks)  # /_emulator/*: pushes, files, comments, activity
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


# REST API versions GitHub serves; a request naming another one is refused with a 400.
GITHUB_API_VERSIONS = frozenset({"2022-11-28", "2026-03-10"})


def _identity(ctx: Context) -> str:
    """Whose budget a request counts against: an installation, else the credential."""
    if ctx.installation is not None:
        return f"github:installation:{ctx.installation}"
    headers = ctx.request.headers
    if ctx.forge == "gitlab":
        token = headers.get("PRIVATE-TOKEN") or headers.get("Authorization") or ""
        return f"gitlab:{token.removeprefix('Bearer ')}"
    return f"github:{headers.get('Authorization', '').partition(' ')[2]}"


def _admit_content(ctx: Context, route: Route) -> None:
    """Refuse a content-creating request past the forge's secondary limits."""
    if ctx.request.method not in CONTENT_METHODS or route.name in NOT_CONTENT_ROUTES:
        return
    state = ctx.state
    wait = state.content.admit(_identity(ctx), state.clock(), state.content_limits[ctx.forge])
    if wait is None:
        return
    retry_after = str(max(1, math.ceil(wait)))
    if ctx.forge == "github":
        raise _fault_reply("github", Fault(status=403, retry_after=float(retry_after)))
    raise Reply(429, {"message": "Retry later"}, {"Retry-After": retry_after})


def _answer(ctx: Context, route: Route, body: Any) -> web.Response:
    """The JSON answer; an unchanged GitHub read answers 304 to its ETag (free of the
    primary rate limit on GitHub)."""
    if ctx.status == 204:
        return web.Response(status=204, headers=ctx.headers)
    if ctx.forge != "github" or ctx.request.method != "GET" or ctx.status != 200:
        return web.json_response(body, status=ctx.status, headers=ctx.headers)
    tag = entity_tag([body, ctx.headers.get("Link")])
    ctx.headers["ETag"] = tag
    if matches(ctx.request.headers.get("If-None-Match"), tag):
        return web.Response(status=304, headers=ctx.headers)
    return web.json_response(body, status=ctx.status, headers=ctx.headers)


def _check_api_version(version: str | None) -> None:
    if version is not None and version not in GITHUB_API_VERSIONS:
        raise github_error(400, f"API version '{version}' is not supported.")


def _next_fault(state: EmulatorState, route: str) -> Fault | None:
    queue = state.faults.get(route)
    if queue:
        return queue.popleft()
    return None
