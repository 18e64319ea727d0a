"""What is on a pull request or a commit now: reviews, their inline comments, comments, commit
statuses and check runs. Served to the bot as GitHub lists them (review comments of a pull
request, statuses of a commit) and to people by the control API (`/_emulator/activity`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from bot.diff import parse_hunks
from bot.emulator.github_json import github_user
from bot.emulator.http import (
    GITHUB_REPO,
    Context,
    Route,
    check_repo_token,
    define_route,
    github_error,
    not_found,
    paginate,
    public_view,
)
from bot.emulator.repository import history_of
from bot.emulator.state import EmulatedPull, EmulatorState


def _diff_hunk(patch: str | None, line: Any, side: str) -> str:
    """The hunk a comment sits in, up to its line, as GitHub's `diff_hunk` shows it."""
    for hunk in parse_hunks(patch):
        shown = [hunk.header]
        for diff_line in hunk.lines:
            shown.append(f"{diff_line.kind}{diff_line.text}")
            at = diff_line.old_line if side == "LEFT" else diff_line.new_line
            if at == line:
                return "\n".join(shown)
    return ""


def review_comments(state: EmulatorState, pull: EmulatedPull) -> Iterator[dict[str, Any]]:
    """The inline comments of the pull request's reviews, oldest first, in GitHub's shape."""
    api = f"https://api.github.com/repos/{pull.repo}/pulls"
    html = f"https://github.com/{pull.repo}/pull/{pull.number}"
    for review in pull.reviews:
        version = next(
            (item for item in pull.versions if item.head_sha == review["commit_id"]), pull.newest
        )
        patches = {change.path: change.patch for change in version.files}
        for comment in review.get("_comments", ()):
            if "_id" not in comment:
                comment["_id"] = state.next_id()  # ids are given once, on first listing
            comment_id = comment["_id"]
            side = str(comment.get("side") or "RIGHT")
            line = comment.get("line")
            links = {
                "self": {"href": f"{api}/comments/{comment_id}"},
                "html": {"href": f"{html}#discussion_r{comment_id}"},
                "pull_request": {"href": f"{api}/{pull.number}"},
            }
            yield {
                "url": links["self"]["href"],
                "pull_request_review_id": review["id"],
                "id": comment_id,
                "node_id": f"PRRC_{comment_id}",
                "diff_hunk": _diff_hunk(patches.get(comment["path"]), line, side),
                "path": comment["path"],
                "commit_id": review["commit_id"],
                "original_commit_id": review["commit_id"],
                "user": github_user(state, review["_user"]),
                "body": comment["body"],
                "created_at": review["submitted_at"],
                "updated_at": review["submitted_at"],
                "html_url": links["html"]["href"],
                "pull_request_url": links["pull_request"]["href"],
                "author_association": "NONE",
                "_links": links,
                "line": line,
                "original_line": line,
                "side": side,
                "subject_type": "line",
            }


def _known_sha(state: EmulatorState, forge: str, repo: str, sha: str) -> bool:
    return sha in history_of(state).commits or any(
        pull.forge == forge
        and pull.repo == repo
        and any(version.head_sha == sha for version in pull.versions)
        for pull in state.pulls.values()
    )


def commit_statuses(state: EmulatorState, forge: str, repo: str, sha: str) -> list[dict[str, Any]]:
    """Every status written on the commit, newest first (GitHub's order)."""
    return [
        {key: value for key, value in public_view(item).items() if key != "sha"}
        for item in reversed(state.commit_statuses)
        if item["_forge"] == forge and item["_repo"] == repo and item["sha"] == sha
    ]


async def _github_review_comments(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    pull = ctx.state.pulls.get(("github", repo, int(ctx.params["number"])))
    if pull is None:
        raise not_found("github")
    check_repo_token(ctx, repo)
    return paginate(ctx, list(review_comments(ctx.state, pull)), default=30, maximum=100)


async def _github_commit_statuses(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    sha = ctx.params["sha"]
    if not _known_sha(ctx.state, "github", repo, sha):
        raise github_error(404, f"No commit found for SHA: {sha}")
    return paginate(ctx, commit_statuses(ctx.state, "github", repo, sha), default=30, maximum=100)


ACTIVITY_ROUTES: tuple[Route, ...] = (
    define_route(
        "github.review_comments.list",
        "GET",
        f"{GITHUB_REPO}/pulls/{{number}}/comments",
        _github_review_comments,
        "github",
    ),
    define_route(
        "github.statuses.list",
        "GET",
        f"{GITHUB_REPO}/commits/{{sha}}/statuses",
        _github_commit_statuses,
        "github",
    ),
)


def _on(shas: set[str], sha: Any) -> bool:
    return sha in shas


def activity(state: EmulatorState, pull: EmulatedPull, *, sha: str | None = None) -> dict[str, Any]:
    """What is on the pull request now (or on one of its commits, `sha`): reviews with their
    inline comments, comments (as edited since), statuses and check runs, oldest first."""
    shas = {sha} if sha else {version.head_sha for version in pull.versions}
    if pull.forge == "github":
        inline: dict[int, list[dict[str, Any]]] = {}
        for comment in review_comments(state, pull):
            inline.setdefault(comment["pull_request_review_id"], []).append(
                {key: comment[key] for key in ("id", "path", "line", "side", "body")}
            )
        reviews = [
            {
                "id": review["id"],
                "commit_id": review["commit_id"],
                "state": review["state"],
                "body": review["body"],
                "comments": inline.get(review["id"], []),
            }
            for review in pull.reviews
            if _on(shas, review["commit_id"])
        ]
        comments = [
            {
                "id": item["id"],
                "author": item["user"]["login"],
                "body": item["body"],
                "created_at": item["created_at"],
                "updated_at": item["updated_at"],
                "edited": item["updated_at"] != item["created_at"],
            }
            for item in pull.comments
        ]
    else:
        reviews = [
            {
                "id": discussion["id"],
                "commit_id": (discussion["notes"][0].get("position") or {}).get("head_sha"),
                "comments": [
                    {
                        "id": note["id"],
                        "path": (note.get("position") or {}).get("new_path"),
                        "line": (note.get("position") or {}).get("new_line"),
                        "body": note["body"],
                        "resolved": note.get("resolved"),
                    }
                    for note in discussion["notes"]
                ],
            }
            for discussion in pull.discussions
            if discussion.get("notes")
            and (discussion["notes"][0].get("position") or {}).get("head_sha") in shas
        ]
        comments = [
            {
                "id": note["id"],
                "author": note["author"]["username"],
                "body": note["body"],
                "created_at": note["created_at"],
                "updated_at": note["updated_at"],
                "edited": note["updated_at"] != note["created_at"],
            }
            for note in pull.notes
            if not note.get("position")
        ]
    statuses = [
        {
            key: item.get(key)
            for key in ("sha", "state", "status", "context", "name", "description", "target_url")
            if key in item
        }
        for item in state.commit_statuses
        if item["_forge"] == pull.forge and item["_repo"] == pull.repo and item["sha"] in shas
    ]
    check_runs = [
        {
            "id": run["id"],
            "head_sha": run["head_sha"],
            "name": run["name"],
            "status": run["status"],
            "conclusion": run.get("conclusion"),
            "title": (run.get("output") or {}).get("title"),
            "summary": (run.get("output") or {}).get("summary"),
        }
        for run in state.check_runs.values()
        if run["_repo"] == pull.repo and run["head_sha"] in shas and pull.forge == "github"
    ]
    return {
        "reviews": reviews,
        "comments": comments,
        "statuses": statuses,
        "check_runs": check_runs,
    }


def record_number(state: EmulatorState, record_data: Mapping[str, Any], repo: str) -> int | None:
    """The pull request a status or check run record is about (found by its commit)."""
    sha = record_data.get("sha")
    if sha is None and "/statuses/" in str(record_data.get("url")):
        sha = str(record_data["url"]).rsplit("/", 1)[-1]
    if sha is None:
        run = state.check_runs.get(int(record_data.get("id") or 0))
        sha = run["head_sha"] if run is not None else None
    for pull in state.pulls.values():
        if pull.repo == repo and any(version.head_sha == sha for version in pull.versions):
            return pull.number
    return None


__all__ = [
    "ACTIVITY_ROUTES",
    "activity",
    "commit_statuses",
    "record_number",
    "review_comments",
]
