"""The emulator's check runs and commit statuses (GitHub) and commit statuses (GitLab).

Served as part of bot.emulator.app.ROUTES; shapes follow GitHub's description in
shared/openapi, and GitLab's rule that a status cannot be set to the state it already has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.emulator.github_json import github_repository, github_user
from bot.emulator.gitlab import gitlab_user
from bot.emulator.http import (
    Context,
    Reply,
    Route,
    check_repo_token,
    define_route,
    github_error,
    invalid_request,
    iso_time,
    not_found,
    paginate,
)
from bot.emulator.state import EmulatedPull, EmulatorState, Record

CHECK_STATUSES = ("queued", "in_progress", "completed")
CHECK_CONCLUSIONS = (
    "action_required", "cancelled", "failure", "neutral", "success", "skipped", "stale",
    "timed_out",
)  # fmt: skip
COMMIT_STATES = ("error", "failure", "pending", "success")
GITLAB_STATES = ("pending", "running", "success", "failed", "canceled", "skipped")
# GitLab's commit status state machine (app/models/commit_status.rb) as its API drives it: each
# state asked for is an event, allowed only from the states listed. A running or pending status
# of the same name on the commit is the one updated; otherwise a new one starts at `created`.
GITLAB_EVENTS = {"pending": "enqueue", "running": "run", "success": "succeed", "failed": "drop",
                 "canceled": "cancel", "skipped": "skip"}  # fmt: skip
GITLAB_FROM: Mapping[str, frozenset[str]] = {
    "pending": frozenset({"created"}),
    "running": frozenset({"created", "pending"}),  # a new one is enqueued first, then run
    "success": frozenset({"created", "pending", "running"}),
    "failed": frozenset({"created", "pending", "running"}),
    "canceled": frozenset({"created", "pending", "running"}),
    "skipped": frozenset({"created", "pending"}),
}
APP_ID = 1
APP_SLUG = "review-bot"


def _pull_with_sha(state: EmulatorState, forge: str, repo: str, sha: str) -> EmulatedPull | None:
    for pull in state.pulls.values():
        if (
            pull.forge == forge
            and pull.repo == repo
            and any(version.head_sha == sha for version in pull.versions)
        ):
            return pull
    return None


def _app(state: EmulatorState) -> dict[str, Any]:
    created = iso_time(state.clock())
    return {
        "id": APP_ID,
        "slug": APP_SLUG,
        "node_id": "A_1",
        "owner": github_user(state, "acme"),
        "name": "review-bot",
        "description": "AI code review with a scheduled queue",
        "external_url": "https://review-bot.example.com",
        "html_url": f"https://github.com/apps/{APP_SLUG}",
        "created_at": created,
        "updated_at": created,
        "permissions": {"checks": "write", "pull_requests": "write", "metadata": "read"},
        "events": ["check_run", "pull_request", "issue_comment"],
    }


def _check_run(state: EmulatorState, run: Mapping[str, Any]) -> dict[str, Any]:
    repo = run["_repo"]
    api = f"https://api.github.com/repos/{repo}"
    pull = _pull_with_sha(state, "github", repo, run["head_sha"])
    pulls = []
    if pull is not None:
        short_repo = {"id": state.project_id(f"github:{repo}"), "url": api, "name": repo}
        pulls.append(
            {
                "id": pull.id,
                "number": pull.number,
                "url": f"{api}/pulls/{pull.number}",
                "head": {"ref": pull.head_ref, "sha": run["head_sha"], "repo": short_repo},
                "base": {"ref": pull.base_ref, "sha": pull.newest.base_sha, "repo": short_repo},
            }
        )
    output = run.get("output") or {}
    return {
        "id": run["id"],
        "head_sha": run["head_sha"],
        "node_id": f"CR_{run['id']}",
        "external_id": run.get("external_id"),
        "url": f"{api}/check-runs/{run['id']}",
        "html_url": f"https://github.com/{repo}/runs/{run['id']}",
        "details_url": run.get("details_url"),
        "status": run["status"],
        "conclusion": run.get("conclusion"),
        "started_at": run.get("started_at"),
        "completed_at": run.get("completed_at"),
        "output": {
            "title": output.get("title"),
            "summary": output.get("summary"),
            "text": output.get("text"),
            "annotations_count": 0,
            "annotations_url": f"{api}/check-runs/{run['id']}/annotations",
        },
        "name": run["name"],
        "check_suite": {"id": run["_suite"]},
        "app": _app(state),
        "pull_requests": pulls,
    }


def _apply_check_fields(run: dict[str, Any], data: Mapping[str, Any], now: str) -> None:
    """Validate and apply the writable fields of a check run, as GitHub does."""
    status = data.get("status")
    if status is not None and status not in CHECK_STATUSES:
        raise invalid_request(f'"{status}" is not a member of the status enum.')
    conclusion = data.get("conclusion")
    if conclusion is not None and conclusion not in CHECK_CONCLUSIONS:
        raise invalid_request(f'"{conclusion}" is not a member of the conclusion enum.')
    if status == "completed" and conclusion is None and run.get("conclusion") is None:
        raise github_error(
            422, "Invalid request.\n\nNo conclusion provided for a completed check run."
        )
    output = data.get("output")
    if output is not None:
        if not isinstance(output, dict) or not output.get("title") or not output.get("summary"):
            raise invalid_request('"title" and "summary" are required in "output".')
        if len(str(output["summary"])) > 65535:
            raise invalid_request('"summary" is longer than 65535 characters.')
        run["output"] = dict(output)
    for key in ("details_url", "external_id", "name", "started_at"):
        if data.get(key) is not None:
            run[key] = data[key]
    if status is not None:
        run["status"] = status
    if conclusion is not None:
        # Providing a conclusion completes the run.
        run["conclusion"] = conclusion
        run["status"] = "completed"
        run["completed_at"] = data.get("completed_at") or now
    elif status == "in_progress" and not run.get("started_at"):
        run["started_at"] = now


def _require_app(ctx: Context) -> None:
    if ctx.installation is None:
        raise github_error(403, "You must authenticate via a GitHub App.")


async def _github_create_check_run(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    _require_app(ctx)
    data = await ctx.json()
    if not isinstance(data, dict):
        raise invalid_request("Body must be a JSON object.")
    for required in ("name", "head_sha"):
        if not data.get(required):
            raise invalid_request(f'"{required}" wasn\'t supplied.')
    if _pull_with_sha(ctx.state, "github", repo, str(data["head_sha"])) is None:
        raise github_error(422, "Validation Failed", errors=["No commit found for SHA"])
    now = iso_time(ctx.state.clock())
    run: dict[str, Any] = {
        "id": ctx.state.next_id(),
        "_repo": repo,
        "_suite": ctx.state.next_id(),
        "name": data["name"],
        "head_sha": data["head_sha"],
        "status": "queued",
        "started_at": now,
    }
    _apply_check_fields(run, data, now)
    ctx.state.check_runs[run["id"]] = run
    ctx.state.records.append(
        Record("github", "check_run", repo, None, None, {"id": run["id"], "request": data})
    )
    ctx.status = 201
    return _check_run(ctx.state, run)


def _stored_run(ctx: Context) -> dict[str, Any]:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    _require_app(ctx)
    run = ctx.state.check_runs.get(int(ctx.params["check_run_id"]))
    if run is None or run["_repo"] != repo:
        raise not_found("github")
    return run


async def _github_update_check_run(ctx: Context) -> Any:
    run = _stored_run(ctx)
    data = await ctx.json()
    if not isinstance(data, dict):
        raise invalid_request("Body must be a JSON object.")
    _apply_check_fields(run, data, iso_time(ctx.state.clock()))
    ctx.state.records.append(
        Record("github", "check_run", run["_repo"], None, None, {"id": run["id"], "request": data})
    )
    return _check_run(ctx.state, run)


async def _github_get_check_run(ctx: Context) -> Any:
    return _check_run(ctx.state, _stored_run(ctx))


async def _github_create_status(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    data = await ctx.json()
    if not isinstance(data, dict) or data.get("state") not in COMMIT_STATES:
        raise github_error(
            422, "Validation Failed", errors=[{"resource": "Status", "field": "state",
                                               "code": "custom", "message": "state is invalid"}]
        )  # fmt: skip
    sha = ctx.params["sha"]
    if _pull_with_sha(ctx.state, "github", repo, sha) is None:
        raise github_error(422, "No commit found for SHA: " + sha)
    now = iso_time(ctx.state.clock())
    status_id = ctx.state.next_id()
    answer = {
        "url": f"https://api.github.com/repos/{repo}/statuses/{sha}",
        "avatar_url": None,
        "id": status_id,
        "node_id": f"SC_{status_id}",
        "state": data["state"],
        "description": data.get("description"),
        "target_url": data.get("target_url"),
        "context": data.get("context") or "default",
        "created_at": now,
        "updated_at": now,
        "creator": github_user(ctx.state, ctx.user),
    }
    ctx.state.commit_statuses.append({"_forge": "github", "_repo": repo, "sha": sha, **answer})
    ctx.state.records.append(Record("github", "commit_status", repo, None, None, dict(answer)))
    ctx.status = 201
    return answer


def _gitlab_project_path(ctx: Context) -> str:
    raw = ctx.params["project"]
    if raw.isdigit():
        path = next((key for key, value in ctx.state.projects.items() if value == int(raw)), None)
    else:
        path = raw if raw in ctx.state.projects else None
    if path is None:
        raise Reply(404, {"message": "404 Project Not Found"})
    return path


def _gitlab_status(state: EmulatorState, stored: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in stored.items() if not key.startswith("_")} | {
        "author": gitlab_user(state, stored["_author"])
    }


async def _gitlab_create_status(ctx: Context) -> Any:
    path = _gitlab_project_path(ctx)
    sha = ctx.params["sha"]
    pull = _pull_with_sha(ctx.state, "gitlab", path, sha)
    if pull is None:
        raise Reply(404, {"message": "404 Commit Not Found"})
    data = await ctx.json()
    wanted = data.get("state") if isinstance(data, dict) else None
    if wanted not in GITLAB_STATES:
        raise Reply(400, {"error": "state does not have a valid value"})
    name = str(data.get("name") or data.get("context") or "default")
    current = next(
        (
            item
            for item in reversed(ctx.state.commit_statuses)
            if item["_forge"] == "gitlab" and item["_repo"] == path and item["sha"] == sha
            and item["name"] == name
        ),
        None,
    )  # fmt: skip
    if current is not None and current["status"] not in ("pending", "running"):
        current = None  # finished: the write starts a new status
    was = "created" if current is None else str(current["status"])
    if was not in GITLAB_FROM[str(wanted)]:
        event = GITLAB_EVENTS[str(wanted)]
        ctx.state.refused_transitions.append((path, sha, was, str(wanted)))
        raise Reply(
            400,
            {
                "message": f"Cannot transition status via :{event} from :{was} "
                f'(Reason(s): Status cannot transition via "{event}")'
            },
        )
    now = ctx.state.clock().isoformat().replace("+00:00", "Z")
    finished = wanted in ("success", "failed", "canceled", "skipped")
    stored: dict[str, Any] = {
        "_forge": "gitlab",
        "_repo": path,
        "_author": "review-bot",
        "id": current["id"] if current is not None else ctx.state.next_id(),
        "sha": sha,
        "ref": data.get("ref") or pull.head_ref,
        "status": wanted,
        "name": name,
        "target_url": data.get("target_url"),
        "description": data.get("description"),
        "created_at": current["created_at"] if current is not None else now,
        "started_at": now if wanted == "running" else (current or {}).get("started_at"),
        "finished_at": now if finished else None,
        "allow_failure": False,
        "coverage": None,
        "pipeline_id": data.get("pipeline_id"),
    }
    ctx.state.commit_statuses.append(stored)
    answer = _gitlab_status(ctx.state, stored)
    ctx.state.records.append(Record("gitlab", "commit_status", path, pull.number, None, answer))
    ctx.status = 201
    return answer


async def _gitlab_list_statuses(ctx: Context) -> Any:
    path = _gitlab_project_path(ctx)
    sha = ctx.params["sha"]
    newest: dict[str, dict[str, Any]] = {}
    for item in ctx.state.commit_statuses:
        if item["_forge"] == "gitlab" and item["_repo"] == path and item["sha"] == sha:
            newest[item["name"]] = item
    found = [_gitlab_status(ctx.state, item) for item in newest.values()]
    return paginate(ctx, found, default=20, maximum=100)


GITHUB_REPO = "/repos/{owner}/{repo}"
CHECK_ROUTES: tuple[Route, ...] = (
    define_route(
        "github.check_runs.create",
        "POST",
        f"{GITHUB_REPO}/check-runs",
        _github_create_check_run,
        "github",
    ),
    define_route(
        "github.check_runs.update",
        "PATCH",
        f"{GITHUB_REPO}/check-runs/{{check_run_id}}",
        _github_update_check_run,
        "github",
    ),
    define_route(
        "github.check_runs.get",
        "GET",
        f"{GITHUB_REPO}/check-runs/{{check_run_id}}",
        _github_get_check_run,
        "github",
    ),
    define_route(
        "github.statuses.create",
        "POST",
        f"{GITHUB_REPO}/statuses/{{sha}}",
        _github_create_status,
        "github",
    ),
    define_route(
        "gitlab.statuses.create",
        "POST",
        "/api/v4/projects/{project}/statuses/{sha}",
        _gitlab_create_status,
        "gitlab",
    ),
    define_route(
        "gitlab.statuses.list",
        "GET",
        "/api/v4/projects/{project}/repository/commits/{sha}/statuses",
        _gitlab_list_statuses,
        "gitlab",
    ),
)


def add_check_run(
    state: EmulatorState,
    *,
    repo: str,
    head_sha: str,
    name: str = "review-bot",
    conclusion: str | None = "success",
) -> int:
    """Seed a check run on a commit (as an App would have written it); returns its id."""
    now = iso_time(state.clock())
    run_id = state.next_id()
    state.check_runs[run_id] = {
        "id": run_id,
        "_repo": repo,
        "_suite": state.next_id(),
        "name": name,
        "head_sha": head_sha,
        "status": "completed" if conclusion else "queued",
        "conclusion": conclusion,
        "started_at": now,
        "completed_at": now if conclusion else None,
        "output": {"title": "Reviewed", "summary": "Reviewed."},
    }
    return run_id


def build_github_check_run_event(
    state: EmulatorState,
    *,
    repo: str,
    check_run_id: int,
    sender: str,
    action: str = "rerequested",
    installation_id: int | None = None,
) -> dict[str, Any]:
    """A `check_run` delivery for a run the emulator holds, in the shape of GitHub's schema."""
    run = state.check_runs[check_run_id]
    payload: dict[str, Any] = {
        "action": action,
        "check_run": _check_run(state, run),
        "repository": github_repository(state, repo),
        "sender": github_user(state, sender),
        "installation": {
            "id": installation_id or state.installations.get(repo, 1),
            "node_id": "I_1",
        },
    }
    payload["check_run"]["check_suite"] = {
        "id": run["_suite"],
        "node_id": f"CS_{run['_suite']}",
        "head_branch": None,
        "head_sha": run["head_sha"],
        "status": "completed" if run["status"] == "completed" else "queued",
        "conclusion": run.get("conclusion"),
        "url": f"https://api.github.com/repos/{repo}/check-suites/{run['_suite']}",
        "before": None,
        "after": None,
        "pull_requests": payload["check_run"]["pull_requests"],
        "app": _app(state),
        "created_at": run["started_at"],
        "updated_at": run.get("completed_at") or run["started_at"],
    }
    return payload


__all__ = ["CHECK_ROUTES", "add_check_run", "build_github_check_run_event"]
