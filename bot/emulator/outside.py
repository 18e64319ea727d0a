"""The control API's routes that change a held pull request from outside and show what is on it:

    POST /_emulator/push       push commits: {"forge", "repo", "number", "files": {path: text or
                               null}, "renames": {old: new}, "force": bool, "base_files": {...}}
                               (`base_files`: a rebase onto a base branch so changed)
    GET  /_emulator/files      ?forge=&repo=&ref=: the files on a branch or at a commit
    PUT  /_emulator/files      set files on a branch: {"forge", "repo", "branch", "files"}; the
                               default branch (main) is where the bot reads .review-bot.yaml, a
                               pull request's head branch takes them as a push
    POST /_emulator/comments   a person's comment: {"forge", "repo", "number", "author", "body"}
    GET  /_emulator/activity   ?forge=&repo=&number=[&sha=]: reviews, comments, statuses, checks

Each change answers with the webhook the forge would send for it and, when the emulator was
started with a bot to send to (`bot emulator --bot-url`), what the bot answered to it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from bot.emulator.activity import activity
from bot.emulator.hooks import HOOK_TARGET, HookTarget, comment_hook, pull_hook, send_hook
from bot.emulator.manage import (
    CONTROL_PREFIX,
    PullSpecError,
    pull_json,
    tree_from_json,
)
from bot.emulator.pushes import (
    Pushed,
    PushError,
    add_comment,
    branch_files,
    push_changes,
    set_branch_files,
)
from bot.emulator.state import EMULATOR_STATE, EmulatedPull, EmulatorState
from bot.model import Forge


class BadChange(ValueError):
    """A control request that names nothing held or asks for the impossible (status, message)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _base_url(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


async def _body(request: web.Request) -> Mapping[str, Any]:
    try:
        data = await request.json()
    except ValueError as exc:
        raise BadChange("the body must be JSON") from exc
    if not isinstance(data, Mapping):
        raise BadChange("the body must be a JSON object")
    return data


def _forge(value: Any) -> Forge:
    if value not in ("github", "gitlab"):
        raise BadChange("forge must be github or gitlab")
    return "github" if value == "github" else "gitlab"


def _pull(state: EmulatorState, data: Mapping[str, Any]) -> EmulatedPull:
    forge = _forge(data.get("forge", "github"))
    repo, number = data.get("repo"), data.get("number")
    if not isinstance(repo, str) or not repo:
        raise BadChange("repo must be a non-empty string")
    try:
        number = int(number)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise BadChange("number must be an integer") from exc
    pull = state.pulls.get((forge, repo, number))
    if pull is None:
        raise BadChange(f"{forge} {repo}#{number} is not held (POST /_emulator/prs)", status=404)
    return pull


def _flag(data: Mapping[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise BadChange(f"{key} must be true or false")
    return value


def _pushed_json(pushed: Pushed, base_url: str) -> dict[str, Any]:
    return {
        "kind": pushed.kind,
        "before": pushed.before,
        "after": pushed.after,
        "files": [
            {
                "path": change.path,
                "status": change.status,
                "additions": change.additions,
                "deletions": change.deletions,
                **({"previous_path": change.previous_path} if change.previous_path else {}),
            }
            for change in pushed.files
        ],
        "pr": pull_json(pushed.pull, base_url),
    }


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _answer(handler: Handler) -> Handler:
    """The handler, with a refused change answered 400 (404: nothing held by that name)."""

    async def handle(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except (BadChange, PushError, PullSpecError) as exc:
            status = exc.status if isinstance(exc, BadChange) else 400
            return web.json_response({"error": str(exc)}, status=status)

    return handle


async def handle_push(request: web.Request) -> web.Response:
    """POST /_emulator/push."""
    state = request.app[EMULATOR_STATE]
    data = await _body(request)
    pull = _pull(state, data)
    files = tree_from_json(data.get("files", {}), where="files", deletions=True)
    renames = tree_from_json(data.get("renames", {}), where="renames")
    base_files = data.get("base_files")
    force = _flag(data, "force", False)
    if not files and not renames and base_files is None and not force:
        raise BadChange("nothing to push: give files, renames, base_files or force")
    pushed = push_changes(
        state,
        pull.forge,
        pull.repo,
        pull.number,
        files=files,
        renames=renames,
        force=force,
        base_files=(
            None
            if base_files is None
            else tree_from_json(base_files, where="base_files", deletions=True)
        ),
    )
    answer = _pushed_json(pushed, _base_url(request))
    hook = pull_hook(state, pull, before=pushed.before)
    answer.update(await send_hook(request, hook, send=_flag(data, "send", True)))
    return web.json_response(answer, status=201)


async def handle_files(request: web.Request) -> web.Response:
    """PUT /_emulator/files."""
    state = request.app[EMULATOR_STATE]
    data = await _body(request)
    forge = _forge(data.get("forge", "github"))
    repo, branch = data.get("repo"), data.get("branch", "main")
    if not isinstance(repo, str) or not repo or not isinstance(branch, str) or not branch:
        raise BadChange("repo and branch must be non-empty strings")
    files = tree_from_json(data.get("files"), where="files", deletions=True)
    pushed = set_branch_files(state, forge, repo, branch, files)
    answer: dict[str, Any] = {"repo": repo, "branch": branch, "files": sorted(files)}
    if pushed is not None:
        answer["push"] = _pushed_json(pushed, _base_url(request))
        hook = pull_hook(state, pushed.pull, before=pushed.before)
        answer.update(await send_hook(request, hook, send=_flag(data, "send", True)))
    return web.json_response(answer)


async def handle_read_files(request: web.Request) -> web.Response:
    """GET /_emulator/files?forge=&repo=&ref= (a branch or a commit sha; default main)."""
    state = request.app[EMULATOR_STATE]
    query = request.query
    forge, repo = _forge(query.get("forge", "github")), query.get("repo", "")
    if not repo:
        raise BadChange("repo must be given")
    ref = query.get("ref") or "main"
    return web.json_response(
        {"repo": repo, "ref": ref, "files": branch_files(state, forge, repo, ref)}
    )


async def handle_comment(request: web.Request) -> web.Response:
    """POST /_emulator/comments."""
    state = request.app[EMULATOR_STATE]
    data = await _body(request)
    pull = _pull(state, data)
    author, body = data.get("author"), data.get("body")
    if not isinstance(author, str) or not author or not isinstance(body, str) or not body:
        raise BadChange("author and body must be non-empty strings")
    comment = add_comment(state, pull.forge, pull.repo, pull.number, author=author, body=body)
    answer: dict[str, Any] = {"id": comment["id"], "author": author, "body": body}
    answer.update(await send_hook(request, comment_hook(state, pull, comment), send=True))
    return web.json_response(answer, status=201)


async def handle_activity(request: web.Request) -> web.Response:
    """GET /_emulator/activity."""
    state = request.app[EMULATOR_STATE]
    pull = _pull(state, request.query)
    sha = request.query.get("sha") or None
    answer = {"pr": pull_json(pull, _base_url(request)), **activity(state, pull, sha=sha)}
    return web.json_response(answer)


async def handle_send_opened(request: web.Request) -> web.Response:
    """POST /_emulator/prs/opened: send the `opened` webhook of a held pull request again."""
    state = request.app[EMULATOR_STATE]
    pull = _pull(state, await _body(request))
    answer: dict[str, Any] = {"pr": pull_json(pull, _base_url(request))}
    answer.update(await send_hook(request, pull_hook(state, pull), send=True))
    return web.json_response(answer)


def add_change_routes(app: web.Application, hooks: HookTarget | None) -> None:
    """Register the routes that change pull requests from outside; call before the catch-all."""
    app[HOOK_TARGET] = hooks
    app.router.add_post(f"{CONTROL_PREFIX}/push", _answer(handle_push))
    app.router.add_put(f"{CONTROL_PREFIX}/files", _answer(handle_files))
    app.router.add_get(f"{CONTROL_PREFIX}/files", _answer(handle_read_files))
    app.router.add_post(f"{CONTROL_PREFIX}/comments", _answer(handle_comment))
    app.router.add_get(f"{CONTROL_PREFIX}/activity", _answer(handle_activity))
    app.router.add_post(f"{CONTROL_PREFIX}/prs/opened", _answer(handle_send_opened))


__all__ = ["add_change_routes"]
