"""Emulator routes for quiet reviews: edit a comment or note, resolve a discussion.

Registered by bot.forges.emulator; answers have the shapes GitHub documents
(../shared/openapi) and GitLab's REST API returns.
"""

from __future__ import annotations

from typing import Any

from bot.forges.emulator import (
    GITHUB_REPO,
    GITLAB_MR,
    Record,
    _check_repo_token,
    _Context,
    _github_error,
    _gitlab_pull_of,
    _invalid_request,
    _iso,
    _public,
    _Reply,
    _Route,
    _route,
)


def _find_github_comment(ctx: _Context) -> tuple[Any, dict[str, Any]]:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    _check_repo_token(ctx, repo)
    comment_id = int(ctx.params["comment_id"])
    for pull in ctx.state.pulls.values():
        if pull.forge != "github" or pull.repo != repo:
            continue
        for comment in pull.comments:
            if comment["id"] == comment_id:
                return pull, comment
    raise _github_error(404, "Not Found")


async def _github_edit_comment(ctx: _Context) -> Any:
    pull, comment = _find_github_comment(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not isinstance(body, str) or not body:
        raise _invalid_request('"body" wasn\'t supplied.')
    if comment["user"]["login"] != ctx.user:
        raise _github_error(403, "Resource not accessible by integration")
    comment["body"] = body
    comment["updated_at"] = _iso(ctx.state.clock())
    ctx.state.records.append(
        Record("github", "comment_edit", pull.repo, pull.number, body, {"id": comment["id"]})
    )
    return _public(comment)


async def _gitlab_edit_note(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    note_id = int(ctx.params["note_id"])
    note = next((item for item in pull.notes if item["id"] == note_id), None)
    if note is None:
        raise _Reply(404, {"message": "404 Note Not Found"})
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not body:
        raise _Reply(400, {"error": "body is missing"})
    if note["author"]["username"] != ctx.user:
        raise _Reply(403, {"message": "403 Forbidden"})
    note["body"] = body
    note["updated_at"] = ctx.state.clock().isoformat().replace("+00:00", "Z")
    ctx.state.records.append(
        Record("gitlab", "note_edit", pull.repo, pull.number, body, {"id": note_id})
    )
    return _public(note)


async def _gitlab_resolve_discussion(ctx: _Context) -> Any:
    pull = _gitlab_pull_of(ctx)
    discussion = next(
        (item for item in pull.discussions if item["id"] == ctx.params["discussion_id"]), None
    )
    if discussion is None:
        raise _Reply(404, {"message": "404 Discussion Not Found"})
    data = await ctx.json()
    raw = data.get("resolved") if isinstance(data, dict) else None
    if raw is None:
        raw = ctx.request.query.get("resolved")
    if raw in (None, ""):
        raise _Reply(400, {"error": "resolved is missing"})
    resolved = raw is True or str(raw).lower() == "true"
    for listed in discussion["notes"]:
        if listed.get("resolvable"):
            listed["resolved"] = resolved
    ids = {listed["id"] for listed in discussion["notes"]}
    for note in pull.notes:
        if note["id"] in ids and note.get("resolvable"):
            note["resolved"] = resolved
    ctx.state.records.append(
        Record(
            "gitlab",
            "discussion_resolve",
            pull.repo,
            pull.number,
            None,
            {"id": discussion["id"], "resolved": resolved},
        )
    )
    return discussion


QUIET_ROUTES: tuple[_Route, ...] = (
    _route(
        "github.comments.edit",
        "PATCH",
        f"{GITHUB_REPO}/issues/comments/{{comment_id}}",
        _github_edit_comment,
        "github",
    ),
    _route(
        "gitlab.notes.edit", "PUT", f"{GITLAB_MR}/notes/{{note_id}}", _gitlab_edit_note, "gitlab"
    ),
    _route(
        "gitlab.discussions.resolve",
        "PUT",
        f"{GITLAB_MR}/discussions/{{discussion_id}}",
        _gitlab_resolve_discussion,
        "gitlab",
    ),
)
