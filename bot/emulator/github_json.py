"""GitHub's JSON as it sends it: users, repositories, pull requests, files, comments, reviews."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from bot.emulator.http import Context, iso_time
from bot.emulator.state import EmulatedPull, EmulatorState
from bot.model import FileChange


def github_user(state: EmulatorState, login: str, *, bot: bool = False) -> dict[str, Any]:
    user_id = state.user_id(login)
    api = f"https://api.github.com/users/{login}"
    return {
        "login": login,
        "id": user_id,
        "node_id": f"U_{user_id}",
        "avatar_url": f"https://avatars.githubusercontent.com/u/{user_id}?v=4",
        "gravatar_id": "",
        "url": api,
        "html_url": f"https://github.com/{login}",
        "followers_url": f"{api}/followers",
        "following_url": f"{api}/following{{/other_user}}",
        "gists_url": f"{api}/gists{{/gist_id}}",
        "starred_url": f"{api}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{api}/subscriptions",
        "organizations_url": f"{api}/orgs",
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events{{/privacy}}",
        "received_events_url": f"{api}/received_events",
        "type": "Bot" if bot or login.endswith("[bot]") else "User",
        "site_admin": False,
    }


_REPO_URLS = (
    "archive_url:/{archive_format}{/ref}",
    "assignees_url:/assignees{/user}",
    "blobs_url:/git/blobs{/sha}",
    "branches_url:/branches{/branch}",
    "collaborators_url:/collaborators{/collaborator}",
    "comments_url:/comments{/number}",
    "commits_url:/commits{/sha}",
    "compare_url:/compare/{base}...{head}",
    "contents_url:/contents/{+path}",
    "contributors_url:/contributors",
    "deployments_url:/deployments",
    "downloads_url:/downloads",
    "events_url:/events",
    "forks_url:/forks",
    "git_commits_url:/git/commits{/sha}",
    "git_refs_url:/git/refs{/sha}",
    "git_tags_url:/git/tags{/sha}",
    "hooks_url:/hooks",
    "issue_comment_url:/issues/comments{/number}",
    "issue_events_url:/issues/events{/number}",
    "issues_url:/issues{/number}",
    "keys_url:/keys{/key_id}",
    "labels_url:/labels{/name}",
    "languages_url:/languages",
    "merges_url:/merges",
    "milestones_url:/milestones{/number}",
    "notifications_url:/notifications{?since,all,participating}",
    "pulls_url:/pulls{/number}",
    "releases_url:/releases{/id}",
    "stargazers_url:/stargazers",
    "statuses_url:/statuses/{sha}",
    "subscribers_url:/subscribers",
    "subscription_url:/subscription",
    "tags_url:/tags",
    "teams_url:/teams",
    "trees_url:/git/trees{/sha}",
)


def github_repository(state: EmulatorState, repo: str) -> dict[str, Any]:
    owner, _, name = repo.partition("/")
    api = f"https://api.github.com/repos/{repo}"
    created = iso_time(state.started_at - timedelta(days=400))
    data: dict[str, Any] = {
        "id": state.project_id(f"github:{repo}"),
        "node_id": f"R_{repo}",
        "name": name,
        "full_name": repo,
        "owner": github_user(state, owner),
        "private": False,
        "html_url": f"https://github.com/{repo}",
        "description": None,
        "fork": False,
        "url": api,
        "homepage": None,
        "language": "Python",
        "forks": 0,
        "forks_count": 0,
        "stargazers_count": 0,
        "watchers_count": 0,
        "watchers": 0,
        "size": 1024,
        "open_issues": 0,
        "open_issues_count": 0,
        "default_branch": "main",
        "has_issues": True,
        "has_projects": True,
        "has_wiki": True,
        "has_pages": False,
        "has_downloads": True,
        "archived": False,
        "disabled": False,
        "mirror_url": None,
        "license": None,
        "pushed_at": created,
        "created_at": created,
        "updated_at": created,
        "git_url": f"git://github.com/{repo}.git",
        "ssh_url": f"git@github.com:{repo}.git",
        "clone_url": f"https://github.com/{repo}.git",
        "svn_url": f"https://github.com/{repo}",
    }
    for entry in _REPO_URLS:
        key, _, suffix = entry.partition(":")
        data[key] = api + suffix
    return data


def github_pull(state: EmulatorState, pull: EmulatedPull) -> dict[str, Any]:
    api = f"https://api.github.com/repos/{pull.repo}"
    html = f"https://github.com/{pull.repo}/pull/{pull.number}"
    version = pull.newest
    created = iso_time(pull.created_at or state.clock())
    repository = github_repository(state, pull.repo)
    owner = pull.repo.partition("/")[0]

    def side(ref: str, sha: str, login: str) -> dict[str, Any]:
        return {
            "label": f"{login}:{ref}",
            "ref": ref,
            "sha": sha,
            "user": github_user(state, login),
            "repo": repository,
        }

    return {
        "url": f"{api}/pulls/{pull.number}",
        "id": pull.id,
        "node_id": f"PR_{pull.id}",
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "issue_url": f"{api}/issues/{pull.number}",
        "commits_url": f"{api}/pulls/{pull.number}/commits",
        "review_comments_url": f"{api}/pulls/{pull.number}/comments",
        "review_comment_url": f"{api}/pulls/comments{{/number}}",
        "comments_url": f"{api}/issues/{pull.number}/comments",
        "statuses_url": f"{api}/statuses/{version.head_sha}",
        "number": pull.number,
        "state": pull.state,
        "locked": False,
        "title": pull.title,
        "user": github_user(state, pull.author),
        "body": None,
        "labels": [
            {
                "id": index + 1,
                "node_id": f"L_{index}",
                "url": f"{api}/labels/{label}",
                "name": label,
                "description": None,
                "color": "ededed",
                "default": False,
            }
            for index, label in enumerate(pull.labels)
        ],
        "milestone": None,
        "active_lock_reason": None,
        "created_at": created,
        "updated_at": iso_time(version.created_at),
        "closed_at": None,
        "merged_at": None,
        "merge_commit_sha": None,
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "head": side(pull.head_ref, version.head_sha, pull.author),
        "base": side(pull.base_ref, version.base_sha, owner),
        "_links": {
            name: {"href": href}
            for name, href in (
                ("self", f"{api}/pulls/{pull.number}"),
                ("html", html),
                ("issue", f"{api}/issues/{pull.number}"),
                ("comments", f"{api}/issues/{pull.number}/comments"),
                ("review_comments", f"{api}/pulls/{pull.number}/comments"),
                ("review_comment", f"{api}/pulls/comments{{/number}}"),
                ("commits", f"{api}/pulls/{pull.number}/commits"),
                ("statuses", f"{api}/statuses/{version.head_sha}"),
            )
        },
        "author_association": "CONTRIBUTOR",
        "auto_merge": None,
        "draft": pull.draft,
        "merged": False,
        "mergeable": True,
        "rebaseable": True,
        "mergeable_state": "clean",
        "merged_by": None,
        "comments": len(pull.comments),
        "review_comments": sum(len(item.get("_comments", [])) for item in pull.reviews),
        "maintainer_can_modify": False,
        "commits": len(pull.versions),
        "additions": sum(item.additions for item in version.files),
        "deletions": sum(item.deletions for item in version.files),
        "changed_files": len(version.files),
    }


def github_file(
    pull: EmulatedPull, item: FileChange, *, blob_sha: str | None = None
) -> dict[str, Any]:
    """A pull request's file as GitHub lists it; `sha` is the file's blob at the head (made up
    from the patch when the caller does not know it)."""
    sha = blob_sha or hashlib.sha1(f"{item.path}:{item.patch}".encode()).hexdigest()
    head = pull.newest.head_sha
    data: dict[str, Any] = {
        "sha": sha,
        "filename": item.path,
        "status": item.status,
        "additions": item.additions,
        "deletions": item.deletions,
        "changes": item.additions + item.deletions,
        "blob_url": f"https://github.com/{pull.repo}/blob/{head}/{item.path}",
        "raw_url": f"https://github.com/{pull.repo}/raw/{head}/{item.path}",
        "contents_url": f"https://api.github.com/repos/{pull.repo}/contents/{item.path}?ref={head}",
    }
    if item.patch is not None:
        data["patch"] = item.patch
    if item.previous_path:
        data["previous_filename"] = item.previous_path
    return data


def github_issue_comment(
    state: EmulatorState, pull: EmulatedPull, *, user: str, body: str, base_url: str
) -> dict[str, Any]:
    comment_id = state.next_id()
    api = f"https://api.github.com/repos/{pull.repo}"
    now = iso_time(state.clock())
    return {
        "id": comment_id,
        "node_id": f"IC_{comment_id}",
        "url": f"{api}/issues/comments/{comment_id}",
        "html_url": f"https://github.com/{pull.repo}/pull/{pull.number}#issuecomment-{comment_id}",
        "issue_url": f"{api}/issues/{pull.number}",
        "body": body,
        "user": github_user(state, user),
        "created_at": now,
        "updated_at": now,
        "author_association": "NONE",
        "_reactions": [],
    }


def github_review(ctx: Context, pull: EmulatedPull, review: Mapping[str, Any]) -> dict[str, Any]:
    api = f"https://api.github.com/repos/{pull.repo}/pulls/{pull.number}"
    html = f"https://github.com/{pull.repo}/pull/{pull.number}#pullrequestreview-{review['id']}"
    return {
        "id": review["id"],
        "node_id": f"PRR_{review['id']}",
        "user": github_user(ctx.state, review["_user"]),
        "body": review["body"],
        "state": review["state"],
        "html_url": html,
        "pull_request_url": api,
        "_links": {"html": {"href": html}, "pull_request": {"href": api}},
        "submitted_at": review["submitted_at"],
        "commit_id": review["commit_id"],
        "author_association": "NONE",
    }
