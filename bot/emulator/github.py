"""GitHub's REST subset: pulls, files, reviews, comments, reactions, permissions, App tokens."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from bot.diff import parse_hunks, split_lines
from bot.emulator.github_json import (
    github_file,
    github_issue_comment,
    github_pull,
    github_review,
    github_user,
)
from bot.emulator.http import (
    Context,
    check_repo_token,
    github_error,
    invalid_request,
    iso_time,
    not_found,
    paginate,
    public_view,
)
from bot.emulator.repository import blob_sha_at
from bot.emulator.state import (
    LINE_OUTSIDE_DIFF,
    REACTIONS,
    REVIEW_DOCS,
    START_LINE_AFTER,
    START_LINE_OUTSIDE_HUNK,
    EmulatedPull,
    EmulatorState,
    Record,
)
from bot.forges.base import parse_diff_lines


def _github_pull_of(ctx: Context) -> EmulatedPull:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    pull = ctx.state.pulls.get(("github", repo, int(ctx.params["number"])))
    if pull is None:
        raise not_found("github")
    check_repo_token(ctx, repo)
    return pull


async def github_access_token(ctx: Context) -> Any:
    installation = int(ctx.params["installation_id"])
    if installation not in set(ctx.state.installations.values()):
        raise not_found("github")
    token = f"ghs_{uuid.uuid4().hex}"
    expires = ctx.state.clock() + timedelta(hours=1)
    ctx.state.issued_tokens[token] = (installation, expires)
    ctx.status = 201
    return {
        "token": token,
        "expires_at": iso_time(expires),
        "permissions": {
            "pull_requests": "write",
            "issues": "write",
            "metadata": "read",
            "checks": "write",
        },
        "repository_selection": "all",
    }


async def github_installation(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    installation = ctx.state.installations.get(repo)
    if installation is None:
        raise not_found("github")
    return {
        "id": installation,
        "app_id": int(next(iter(ctx.state.apps), "1")),
        "target_type": "Organization",
        "account": github_user(ctx.state, repo.split("/")[0]),
    }


async def github_get_pull(ctx: Context) -> Any:
    return github_pull(ctx.state, _github_pull_of(ctx))


async def github_files(ctx: Context) -> Any:
    pull = _github_pull_of(ctx)
    head = pull.newest.head_sha
    files = [
        github_file(pull, item, blob_sha=blob_sha_at(ctx.state, pull.repo, item.path, head))
        for item in pull.files[:3000]  # GitHub lists 3,000 at most
    ]
    return paginate(ctx, files, default=30, maximum=100)


async def github_list_reviews(ctx: Context) -> Any:
    pull = _github_pull_of(ctx)
    reviews = [github_review(ctx, pull, item) for item in pull.reviews]
    return paginate(ctx, reviews, default=30, maximum=100)


async def github_create_review(ctx: Context) -> Any:
    pull = _github_pull_of(ctx)
    data = await ctx.json()
    if not isinstance(data, dict):
        raise invalid_request("Body must be a JSON object.")
    event = data.get("event")
    if event is not None and event not in ("APPROVE", "REQUEST_CHANGES", "COMMENT"):
        raise invalid_request(f'"{event}" is not a member of the event enum.')
    body = data.get("body")
    if event in ("COMMENT", "REQUEST_CHANGES") and not body:
        raise github_error(
            422,
            "Unprocessable Entity",
            errors=["Body is required for this event"],
            documentation_url=REVIEW_DOCS,
        )
    commit_id = data.get("commit_id") or pull.newest.head_sha
    if commit_id not in {version.head_sha for version in pull.versions}:
        raise github_error(
            422,
            "Unprocessable Entity",
            errors=["Commit could not be resolved"],
            documentation_url=REVIEW_DOCS,
        )
    comments = data.get("comments") or []
    if not isinstance(comments, list):
        raise invalid_request('"comments" is not an array.')
    version = next(item for item in pull.versions if item.head_sha == commit_id)
    patches = {item.path: item.patch for item in version.files}
    errors: list[str] = []
    for comment in comments:
        if not isinstance(comment, dict):
            raise invalid_request("comments items must be objects.")
        for required in ("path", "body"):
            if not comment.get(required):
                raise invalid_request(f'"{required}" wasn\'t supplied.')
        path = comment["path"]
        if path not in patches:
            errors.append("Path could not be resolved")
            continue
        line, side = comment.get("line"), comment.get("side", "RIGHT")
        if side not in ("LEFT", "RIGHT"):
            raise invalid_request(f'"{side}" is not a member of the side enum.')
        if comment.get("position") is not None and line is None:
            position = comment["position"]
            valid = isinstance(position, int) and 1 <= position < len(
                split_lines(patches[path] or "")
            )
        else:
            valid = isinstance(line, int) and parse_diff_lines(patches[path]).has_line(line, side)
        if not valid:
            errors.append(LINE_OUTSIDE_DIFF)
        elif comment.get("start_line") is not None:
            errors.extend(range_errors(patches[path], comment, side))
    if errors:
        raise github_error(
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
        "submitted_at": iso_time(ctx.state.clock()),
    }
    pull.reviews.append(review)
    answer = github_review(ctx, pull, review)
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


def range_errors(patch: str | None, comment: dict[str, Any], side: str) -> list[str]:
    """What GitHub says of a multi-line comment's start: before the line, in the same hunk."""
    start, line = comment["start_line"], comment["line"]
    start_side = comment.get("start_side", side)
    if start_side not in ("LEFT", "RIGHT"):
        raise invalid_request(f'"{start_side}" is not a member of the start_side enum.')
    if not isinstance(start, int) or start >= line:
        return [START_LINE_AFTER]
    for hunk in parse_hunks(patch):
        numbers = {
            (item.new_line if start_side == "RIGHT" else item.old_line)
            for item in hunk.trusted_lines
        }
        ends = {
            (item.new_line if side == "RIGHT" else item.old_line) for item in hunk.trusted_lines
        }
        if start in numbers and line in ends:
            return []
    return [START_LINE_OUTSIDE_HUNK]


async def github_list_comments(ctx: Context) -> Any:
    pull = _github_pull_of(ctx)
    return paginate(ctx, [public_view(item) for item in pull.comments], default=30, maximum=100)


async def github_create_comment(ctx: Context) -> Any:
    pull = _github_pull_of(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not isinstance(body, str) or not body:
        raise invalid_request('"body" wasn\'t supplied.')
    if len(body) > 65536:
        raise github_error(
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
    comment = github_issue_comment(ctx.state, pull, user=ctx.user, body=body, base_url="")
    pull.comments.append(comment)
    ctx.state.records.append(
        Record("github", "issue_comment", pull.repo, pull.number, body, {"id": comment["id"]})
    )
    ctx.status = 201
    return public_view(comment)


async def github_create_reaction(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    comment_id = int(ctx.params["comment_id"])
    found = None
    for pull in ctx.state.pulls.values():
        if pull.forge == "github" and pull.repo == repo:
            found = next((item for item in pull.comments if item["id"] == comment_id), None)
            if found is not None:
                break
    if found is None:
        raise not_found("github")
    data = await ctx.json()
    content = data.get("content") if isinstance(data, dict) else None
    if content not in REACTIONS:
        raise invalid_request(f'"{content}" is not a member of the content enum.')
    for reaction in found["_reactions"]:
        if reaction["content"] == content and reaction["user"]["login"] == ctx.user:
            return reaction  # GitHub answers 200 with the existing reaction
    reaction = {
        "id": ctx.state.next_id(),
        "node_id": f"REA_{comment_id}",
        "user": github_user(ctx.state, ctx.user),
        "content": content,
        "created_at": iso_time(ctx.state.clock()),
    }
    found["_reactions"].append(reaction)
    ctx.state.records.append(
        Record("github", "reaction", repo, None, content, {"comment_id": comment_id})
    )
    ctx.status = 201
    return reaction


async def github_permission(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    user = ctx.params["username"]
    if user not in ctx.state.users:
        raise not_found("github")
    role = ctx.state.permissions.get((repo, user), "read")
    legacy = {"maintain": "write", "triage": "read"}.get(role, role)
    collaborator = github_user(ctx.state, user)
    collaborator["role_name"] = role
    return {"permission": legacy, "role_name": role, "user": collaborator}


def seed_issue_comment(
    state: EmulatorState, repo: str, number: int, *, user: str, body: str
) -> int:
    """Seed a person's comment on a GitHub PR (e.g. a slash command); returns its id."""
    pull = state.get_pull("github", repo, number)
    comment = github_issue_comment(state, pull, user=user, body=body, base_url="")
    pull.comments.append(comment)
    return int(comment["id"])
