"""Emulator routes for quiet reviews: edit a comment or note, resolve a discussion.

Served as part of bot.emulator.app.ROUTES; answers have the shapes GitHub documents
(../shared/openapi) and GitLab's REST API returns.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
from typing import Any

from bot.diff import split_lines, unified_patch
from bot.emulator.github_json import github_file, github_user
from bot.emulator.gitlab import gitlab_pull_of
from bot.emulator.http import (
    GITHUB_REPO,
    GITLAB_MR,
    Context,
    Reply,
    Route,
    check_repo_token,
    define_route,
    github_error,
    invalid_request,
    iso_time,
    public_view,
)
from bot.emulator.repository import (
    Commit,
    Tree,
    blob_sha,
    file_at,
    history_of,
)
from bot.emulator.state import EmulatedPull, EmulatorState, Record, Version
from bot.model import FileChange, Forge


def _patch(before: str | None, after: str | None) -> tuple[str | None, int, int]:
    patch, additions, deletions = unified_patch(split_lines(before or ""), split_lines(after or ""))
    return patch or None, additions, deletions


def _renames(old: Tree, new: Tree) -> dict[str, str]:
    """Removed paths whose text reappears (at least half alike) under an added path, as git's
    rename detection pairs them: new path -> old path."""
    removed = [path for path in old if path not in new]
    added = [path for path in new if path not in old]
    pairs: dict[str, str] = {}
    for path in added:
        scored = [
            (difflib.SequenceMatcher(None, old[gone], new[path]).ratio(), gone)
            for gone in removed
            if gone not in pairs.values()
        ]
        best = max(scored, default=(0.0, ""))
        if best[0] >= 0.5:
            pairs[path] = best[1]
    return pairs


def diff_trees(old: Tree, new: Tree) -> list[FileChange]:
    """The files two trees differ in, with unified-diff patches as the forges show them
    (a file moved with at least half its text kept is one renamed file)."""
    renames = _renames(old, new)
    moved = set(renames.values())
    changes: list[FileChange] = []
    for path in sorted((set(old) | set(new)) - moved):
        before, after = old.get(renames.get(path, path)), new.get(path)
        if before == after and path not in renames:
            continue
        patch, additions, deletions = _patch(before, after)
        if path in renames:
            changes.append(FileChange(path, additions, deletions, patch, "renamed", renames[path]))
            continue
        status = "added" if before is None else "removed" if after is None else "modified"
        changes.append(FileChange(path, additions, deletions, patch, status))
    return changes


def open_pull_from_trees(
    state: EmulatorState,
    forge: Forge,
    repo: str,
    number: int,
    *,
    base: Tree,
    head: Tree,
    **options: Any,
) -> EmulatedPull:
    """Seed a pull request whose base and head are commits with whole trees."""
    history = history_of(state)
    history.default_trees.setdefault(repo, dict(base))
    base_sha = history.commit(base, parent=None, hint=f"{repo}:base")
    head_sha = history.commit(head, parent=base_sha, hint=f"{repo}:{number}")
    return state.add_pull(
        forge,
        repo,
        number,
        files=diff_trees(base, head),
        base_sha=base_sha,
        head_sha=head_sha,
        **options,
    )


def push_tree(
    state: EmulatorState,
    forge: Forge,
    repo: str,
    number: int,
    tree: Tree,
    *,
    force: bool = False,
    base: Tree | None = None,
) -> Version:
    """Push a commit with this tree on the head (`force`: rewritten history, on the base;
    `base`: onto a new base commit with this tree, as a rebase does)."""
    history = history_of(state)
    pull = state.get_pull(forge, repo, number)
    base_sha = pull.newest.base_sha
    if base is not None:
        base_sha = history.commit(base, parent=base_sha, hint=f"{repo}:rebase-base")
        history.default_trees[repo] = dict(base)
        force = True
    parent = base_sha if force else pull.newest.head_sha
    head_sha = history.commit(tree, parent=parent, hint=f"{repo}:{number}:push")
    version = state.push(
        forge,
        repo,
        number,
        files=diff_trees(history.commits[base_sha].tree, tree),
        head_sha=head_sha,
    )
    version.base_sha = version.start_sha = base_sha
    return version


def set_default_file(state: EmulatorState, repo: str, path: str, text: str | None) -> None:
    """Put a file on (or, with None, remove it from) the repository's default branch."""
    tree = history_of(state).default_trees.setdefault(repo, {})
    if text is None:
        tree.pop(path, None)
    else:
        tree[path] = text


async def _github_contents(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    path = ctx.params["path"]
    ref = ctx.request.query.get("ref")
    text = file_at(ctx.state, repo, path, ref)
    if text is None:
        raise github_error(404, "Not Found")
    sha = blob_sha(text)
    api = f"https://api.github.com/repos/{repo}"
    links = {
        "self": f"{api}/contents/{path}",
        "git": f"{api}/git/blobs/{sha}",
        "html": f"https://github.com/{repo}/blob/{ref or 'main'}/{path}",
    }
    return {
        "type": "file",
        "encoding": "base64",
        "size": len(text.encode()),
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "content": base64.encodebytes(text.encode()).decode(),
        "sha": sha,
        "url": links["self"],
        "git_url": links["git"],
        "html_url": links["html"],
        "download_url": f"https://raw.githubusercontent.com/{repo}/{ref or 'main'}/{path}",
        "_links": links,
    }


async def _gitlab_file(ctx: Context) -> Any:
    repo = _gitlab_project_path(ctx)
    ref = ctx.request.query.get("ref")
    if not ref:
        raise Reply(400, {"error": "ref is missing"})
    path = ctx.params["file_path"]
    text = file_at(ctx.state, repo, path, ref)
    if text is None:
        raise Reply(404, {"message": "404 File Not Found"})
    data = text.encode()
    return {
        "file_name": path.rsplit("/", 1)[-1],
        "file_path": path,
        "size": len(data),
        "encoding": "base64",
        "content": base64.b64encode(data).decode(),
        "content_sha256": hashlib.sha256(data).hexdigest(),
        "ref": ref,
        "blob_id": blob_sha(text),
        "commit_id": hashlib.sha1(data).hexdigest(),
        "last_commit_id": hashlib.sha1(data).hexdigest(),
        "execute_filemode": False,
    }


def _commit_json(state: EmulatorState, repo: str, commit: Commit) -> dict[str, Any]:
    api = f"https://api.github.com/repos/{repo}"
    person = {"name": "Octo Cat", "email": "octocat@example.com", "date": "2026-01-05T09:00:00Z"}
    return {
        "url": f"{api}/commits/{commit.sha}",
        "sha": commit.sha,
        "node_id": f"C_{commit.sha[:16]}",
        "html_url": f"https://github.com/{repo}/commit/{commit.sha}",
        "comments_url": f"{api}/commits/{commit.sha}/comments",
        "commit": {
            "url": f"{api}/git/commits/{commit.sha}",
            "author": person,
            "committer": person,
            "message": f"Commit {commit.sha[:7]}",
            "comment_count": 0,
            "tree": {"sha": commit.sha, "url": f"{api}/git/trees/{commit.sha}"},
        },
        "author": github_user(state, "octocat"),
        "committer": github_user(state, "octocat"),
        "parents": (
            [{"sha": commit.parent, "url": f"{api}/commits/{commit.parent}"}]
            if commit.parent
            else []
        ),
    }


async def _github_compare(ctx: Context) -> Any:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    base, separator, head = ctx.params["basehead"].partition("...")
    history = history_of(ctx.state)
    if not separator or base not in history.commits or head not in history.commits:
        raise github_error(404, "Not Found")
    head_chain, base_chain = history.ancestors(head), history.ancestors(base)
    merge_base = next((sha for sha in head_chain if sha in set(base_chain)), base)
    ahead_by = head_chain.index(merge_base) if merge_base in head_chain else len(head_chain)
    behind_by = base_chain.index(merge_base) if merge_base in base_chain else len(base_chain)
    if base == head:
        status = "identical"
    elif behind_by == 0:
        status = "ahead"
    elif ahead_by == 0:
        status = "behind"
    else:
        status = "diverged"
    files = diff_trees(history.commits[merge_base].tree, history.commits[head].tree)
    pull_like = next(
        (pull for pull in ctx.state.pulls.values() if pull.repo == repo),
        None,
    )
    commits = [history.commits[sha] for sha in reversed(head_chain[:ahead_by])]
    html = f"https://github.com/{repo}/compare/{base}...{head}"
    return {
        "url": f"https://api.github.com/repos/{repo}/compare/{base}...{head}",
        "html_url": html,
        "permalink_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "base_commit": _commit_json(ctx.state, repo, history.commits[base]),
        "merge_base_commit": _commit_json(ctx.state, repo, history.commits[merge_base]),
        "status": status,
        "ahead_by": ahead_by,
        "behind_by": behind_by,
        "total_commits": ahead_by,
        "commits": [_commit_json(ctx.state, repo, commit) for commit in commits],
        # GitHub lists at most 300 files of a compare.
        "files": [github_file(pull_like, item) for item in files[:300]] if pull_like else [],
    }


def _gitlab_project_path(ctx: Context) -> str:
    raw = ctx.params["project"]
    if raw.isdigit():
        path = next((key for key, value in ctx.state.projects.items() if value == int(raw)), None)
    else:
        path = raw if raw in ctx.state.projects else None
    if path is None:
        raise Reply(404, {"message": "404 Project Not Found"})
    return path


async def _gitlab_merge_base(ctx: Context) -> Any:
    _gitlab_project_path(ctx)
    refs = ctx.request.query.getall("refs[]", [])
    history = history_of(ctx.state)
    if len(refs) < 2 or any(ref not in history.commits for ref in refs):
        raise Reply(400, {"message": "Provide at least 2 refs"})
    first = set(history.ancestors(refs[0]))
    common = next((sha for sha in history.ancestors(refs[1]) if sha in first), None)
    if common is None:
        raise Reply(404, {"message": "404 Merge Base Not Found"})
    return {"id": common, "short_id": common[:8], "title": f"Commit {common[:7]}"}


async def _gitlab_version(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    version_id = int(ctx.params["version_id"])
    version = next((item for item in pull.versions if item.id == version_id), None)
    if version is None:
        raise Reply(404, {"message": "404 Not found"})
    diffs = [
        {
            "old_path": item.previous_path or item.path,
            "new_path": item.path,
            "new_file": item.status == "added",
            "renamed_file": item.status == "renamed",
            "deleted_file": item.status == "removed",
            "too_large": item.patch is None and item.changed_lines > 0,
            "collapsed": False,
            "diff": "" if item.patch is None else item.patch + "\n",
        }
        for item in version.files
    ]
    return {
        "id": version.id,
        "head_commit_sha": version.head_sha,
        "base_commit_sha": version.base_sha,
        "start_commit_sha": version.start_sha,
        "created_at": version.created_at.isoformat().replace("+00:00", "Z"),
        "merge_request_id": pull.id,
        "state": "collected",
        "real_size": str(len(version.files)),
        "commits": [],
        "diffs": diffs,
    }


def _find_github_comment(ctx: Context) -> tuple[Any, dict[str, Any]]:
    repo = f"{ctx.params['owner']}/{ctx.params['repo']}"
    check_repo_token(ctx, repo)
    comment_id = int(ctx.params["comment_id"])
    for pull in ctx.state.pulls.values():
        if pull.forge != "github" or pull.repo != repo:
            continue
        for comment in pull.comments:
            if comment["id"] == comment_id:
                return pull, comment
    raise github_error(404, "Not Found")


async def _github_edit_comment(ctx: Context) -> Any:
    pull, comment = _find_github_comment(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not isinstance(body, str) or not body:
        raise invalid_request('"body" wasn\'t supplied.')
    if comment["user"]["login"] != ctx.user:
        raise github_error(403, "Resource not accessible by integration")
    comment["body"] = body
    comment["updated_at"] = iso_time(ctx.state.clock())
    ctx.state.records.append(
        Record("github", "comment_edit", pull.repo, pull.number, body, {"id": comment["id"]})
    )
    return public_view(comment)


def _gitlab_note(ctx: Context) -> tuple[EmulatedPull, dict[str, Any]]:
    """The merge request and its note the path names (404 when there is none)."""
    pull = gitlab_pull_of(ctx)
    note_id = int(ctx.params["note_id"])
    note = next((item for item in pull.notes if item["id"] == note_id), None)
    if note is None:
        raise Reply(404, {"message": "404 Note Not Found"})
    return pull, note


async def _gitlab_edit_note(ctx: Context) -> Any:
    pull, note = _gitlab_note(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not body:
        raise Reply(400, {"error": "body is missing"})
    if note["author"]["username"] != ctx.user:
        raise Reply(403, {"message": "403 Forbidden"})
    note["body"] = body
    note["updated_at"] = ctx.state.clock().isoformat().replace("+00:00", "Z")
    ctx.state.records.append(
        Record("gitlab", "note_edit", pull.repo, pull.number, body, {"id": note["id"]})
    )
    return public_view(note)


async def _github_delete_comment(ctx: Context) -> Any:
    pull, comment = _find_github_comment(ctx)
    if comment["user"]["login"] != ctx.user:
        raise github_error(403, "Resource not accessible by integration")
    pull.comments.remove(comment)
    ctx.state.records.append(
        Record("github", "comment_delete", pull.repo, pull.number, None, {"id": comment["id"]})
    )
    ctx.status = 204
    return None


async def _gitlab_delete_note(ctx: Context) -> Any:
    pull, note = _gitlab_note(ctx)
    if note["author"]["username"] != ctx.user:
        raise Reply(403, {"message": "403 Forbidden"})
    pull.notes.remove(note)
    # A note that opened or replied in a discussion leaves it; a discussion left empty goes too.
    for discussion in list(pull.discussions):
        discussion["notes"] = [item for item in discussion["notes"] if item["id"] != note["id"]]
        if not discussion["notes"]:
            pull.discussions.remove(discussion)
    ctx.state.records.append(
        Record("gitlab", "note_delete", pull.repo, pull.number, None, {"id": note["id"]})
    )
    ctx.status = 204
    return None


async def _gitlab_resolve_discussion(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    discussion = next(
        (item for item in pull.discussions if item["id"] == ctx.params["discussion_id"]), None
    )
    if discussion is None:
        raise Reply(404, {"message": "404 Discussion Not Found"})
    data = await ctx.json()
    raw = data.get("resolved") if isinstance(data, dict) else None
    if raw is None:
        raw = ctx.request.query.get("resolved")
    if raw in (None, ""):
        raise Reply(400, {"error": "resolved is missing"})
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


QUIET_ROUTES: tuple[Route, ...] = (
    define_route(
        "github.contents", "GET", f"{GITHUB_REPO}/contents/{{+path}}", _github_contents, "github"
    ),
    define_route(
        "gitlab.file",
        "GET",
        "/api/v4/projects/{project}/repository/files/{file_path}",
        _gitlab_file,
        "gitlab",
    ),
    define_route(
        "github.compare", "GET", f"{GITHUB_REPO}/compare/{{basehead}}", _github_compare, "github"
    ),
    define_route(
        "gitlab.merge_base",
        "GET",
        "/api/v4/projects/{project}/repository/merge_base",
        _gitlab_merge_base,
        "gitlab",
    ),
    define_route(
        "gitlab.version", "GET", f"{GITLAB_MR}/versions/{{version_id}}", _gitlab_version, "gitlab"
    ),
    define_route(
        "github.comments.edit",
        "PATCH",
        f"{GITHUB_REPO}/issues/comments/{{comment_id}}",
        _github_edit_comment,
        "github",
    ),
    define_route(
        "gitlab.notes.edit", "PUT", f"{GITLAB_MR}/notes/{{note_id}}", _gitlab_edit_note, "gitlab"
    ),
    define_route(
        "github.comments.delete",
        "DELETE",
        f"{GITHUB_REPO}/issues/comments/{{comment_id}}",
        _github_delete_comment,
        "github",
    ),
    define_route(
        "gitlab.notes.delete",
        "DELETE",
        f"{GITLAB_MR}/notes/{{note_id}}",
        _gitlab_delete_note,
        "gitlab",
    ),
    define_route(
        "gitlab.discussions.resolve",
        "PUT",
        f"{GITLAB_MR}/discussions/{{discussion_id}}",
        _gitlab_resolve_discussion,
        "gitlab",
    ),
)
