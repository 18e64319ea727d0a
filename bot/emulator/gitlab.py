"""GitLab's REST subset: merge requests, versions, diffs, discussions, notes, emoji, members."""

from __future__ import annotations

import hashlib
from typing import Any

from bot.emulator.http import Context, Reply, iso_time, not_found, paginate, public_view
from bot.emulator.state import AWARD_EMOJI, EmulatedPull, EmulatorState, Record
from bot.forges.base import DiffLines, parse_diff_lines


def gitlab_user(state: EmulatorState, username: str) -> dict[str, Any]:
    user_id = state.user_id(username)
    return {
        "id": user_id,
        "username": username,
        "name": username.replace("-", " ").title(),
        "state": "active",
        "locked": False,
        "avatar_url": f"https://secure.gravatar.com/avatar/{user_id}?s=80&d=identicon",
        "web_url": f"https://gitlab.example.com/{username}",
    }


def gitlab_note(
    state: EmulatorState,
    pull: EmulatedPull,
    *,
    user: str,
    body: str,
    position: dict[str, Any] | None = None,
    discussion_id: str | None = None,
) -> dict[str, Any]:
    now = state.clock().isoformat().replace("+00:00", "Z")
    note: dict[str, Any] = {
        "id": state.next_id(),
        "type": "DiffNote" if position else None,
        "body": body,
        "attachment": None,
        "author": gitlab_user(state, user),
        "created_at": now,
        "updated_at": now,
        "system": False,
        "noteable_id": pull.id,
        "noteable_type": "MergeRequest",
        "project_id": pull.project_id,
        "noteable_iid": pull.number,
        "resolvable": position is not None,
        "confidential": False,
        "internal": False,
        "commands_changes": {},
        "_awards": [],
    }
    if position is not None:
        note["position"] = position
        note["resolved"] = False
    if discussion_id is not None:
        note["discussion_id"] = discussion_id
    return note


def gitlab_pull_of(ctx: Context) -> EmulatedPull:
    raw = ctx.params["project"]
    if raw.isdigit():
        path = next((key for key, value in ctx.state.projects.items() if value == int(raw)), None)
    else:
        path = raw if raw in ctx.state.projects else None
    if path is None:
        raise Reply(404, {"message": "404 Project Not Found"})
    pull = ctx.state.pulls.get(("gitlab", path, int(ctx.params["iid"])))
    if pull is None:
        raise not_found("gitlab")
    return pull


async def gitlab_get_mr(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    version = pull.newest
    return {
        "id": pull.id,
        "iid": pull.number,
        "project_id": pull.project_id,
        "title": pull.title,
        "state": "opened" if pull.state == "open" else pull.state,
        "draft": pull.draft,
        "source_branch": pull.head_ref,
        "target_branch": pull.base_ref,
        "sha": version.head_sha,
        "labels": pull.labels,
        "author": gitlab_user(ctx.state, pull.author),
        "diff_refs": {
            "base_sha": version.base_sha,
            "head_sha": version.head_sha,
            "start_sha": version.start_sha,
        },
        "changes_count": str(len(version.files)),
        "web_url": f"https://gitlab.example.com/{pull.repo}/-/merge_requests/{pull.number}",
    }


async def gitlab_versions(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    entries = [
        {
            "id": version.id,
            "head_commit_sha": version.head_sha,
            "base_commit_sha": version.base_sha,
            "start_commit_sha": version.start_sha,
            "created_at": version.created_at.isoformat().replace("+00:00", "Z"),
            "merge_request_id": pull.id,
            "state": "collected",
            "real_size": str(len(version.files)),
        }
        for version in reversed(pull.versions)  # newest first, as GitLab lists them
    ]
    return paginate(ctx, entries, default=20, maximum=100)


def _gitlab_diff_entries(pull: EmulatedPull) -> list[dict[str, Any]]:
    entries = []
    for item in pull.files:
        too_large = item.patch is None and item.changed_lines > 0
        entries.append(
            {
                "old_path": item.previous_path or item.path,
                "new_path": item.path,
                "a_mode": "0" if item.status == "added" else "100644",
                "b_mode": "0" if item.status == "removed" else "100644",
                "new_file": item.status == "added",
                "renamed_file": item.status == "renamed",
                "deleted_file": item.status == "removed",
                "generated_file": False,
                "too_large": too_large,
                "collapsed": False,
                "diff": "" if item.patch is None else item.patch + "\n",
            }
        )
    return entries


async def gitlab_diffs(ctx: Context) -> Any:
    if ctx.state.gitlab_version < (15, 7):
        raise Reply(404, {"error": "404 Not Found"})  # the route does not exist yet
    entries = _gitlab_diff_entries(gitlab_pull_of(ctx))
    return paginate(ctx, entries, default=20, maximum=100)


async def gitlab_changes(ctx: Context) -> Any:
    """The MR with its `changes` (deprecated in 15.7 in favour of /diffs, served by both)."""
    answer = await gitlab_get_mr(ctx)
    answer["changes"] = _gitlab_diff_entries(gitlab_pull_of(ctx))
    answer["overflow"] = False
    return answer


def _bad_position(detail: str) -> Reply:
    return Reply(400, {"message": f"400 Bad request - Note {detail}"})


def _check_position(pull: EmulatedPull, position: Any) -> None:
    if not isinstance(position, dict):
        raise _bad_position('{:position=>["must be a valid json schema"]}')
    if position.get("position_type") != "text":
        raise _bad_position('{:position_type=>["is not included in the list"]}')
    version = next(
        (
            item
            for item in pull.versions
            if (item.base_sha, item.start_sha, item.head_sha)
            == (position.get("base_sha"), position.get("start_sha"), position.get("head_sha"))
        ),
        None,
    )
    if version is None:
        raise _bad_position('{:position=>["is incomplete"], :line_code=>["can\'t be blank"]}')
    new_path, old_path = position.get("new_path"), position.get("old_path")
    changed = next((item for item in version.files if item.path == new_path), None)
    # GitLab computes the line code from both paths: a renamed file needs its old one.
    if changed is None or old_path != (changed.previous_path or changed.path):
        raise _bad_position('{:line_code=>["can\'t be blank", "must be a valid line code"]}')
    lines: DiffLines = parse_diff_lines(changed.patch)
    new_line, old_line = position.get("new_line"), position.get("old_line")
    new_line = int(new_line) if new_line not in (None, "") else None
    old_line = int(old_line) if old_line not in (None, "") else None
    valid = False
    if new_line is not None and old_line is None:
        valid = new_line in lines.added
    elif old_line is not None and new_line is None:
        valid = old_line in lines.removed
    elif old_line is not None and new_line is not None:
        valid = lines.context.get(new_line) == old_line
    if not valid:
        raise _bad_position('{:line_code=>["can\'t be blank", "must be a valid line code"]}')


async def gitlab_create_discussion(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not body:
        raise Reply(400, {"error": "body is missing"})
    position = data.get("position")
    if position is not None:
        _check_position(pull, position)
    discussion_id = hashlib.sha1(str(ctx.state.next_id()).encode()).hexdigest()
    note = gitlab_note(
        ctx.state, pull, user=ctx.user, body=body, position=position, discussion_id=discussion_id
    )
    pull.notes.append(note)
    discussion = {"id": discussion_id, "individual_note": False, "notes": [public_view(note)]}
    pull.discussions.append(discussion)
    ctx.state.records.append(
        Record(
            "gitlab",
            "discussion",
            pull.repo,
            pull.number,
            body,
            {"position": position, "id": discussion_id, "note_id": note["id"]},
        )
    )
    ctx.status = 201
    return discussion


async def gitlab_list_discussions(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    return paginate(ctx, pull.discussions, default=20, maximum=100)


async def gitlab_create_note(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    data = await ctx.json()
    body = data.get("body") if isinstance(data, dict) else None
    if not body:
        raise Reply(400, {"error": "body is missing"})
    if len(body) > 1_000_000:
        raise Reply(400, {"message": {"note": ["is too long (maximum is 1000000 characters)"]}})
    note = gitlab_note(ctx.state, pull, user=ctx.user, body=body)
    pull.notes.append(note)
    ctx.state.records.append(
        Record("gitlab", "note", pull.repo, pull.number, body, {"id": note["id"]})
    )
    ctx.status = 201
    return public_view(note)


async def gitlab_list_notes(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    notes = [public_view(item) for item in reversed(pull.notes)]  # newest first by default
    return paginate(ctx, notes, default=20, maximum=100)


async def gitlab_award_emoji(ctx: Context) -> Any:
    pull = gitlab_pull_of(ctx)
    note_id = int(ctx.params["note_id"])
    note = next((item for item in pull.notes if item["id"] == note_id), None)
    if note is None:
        raise Reply(404, {"message": "404 Note Not Found"})
    data = await ctx.json()
    name = data.get("name") if isinstance(data, dict) else None
    if name not in AWARD_EMOJI:
        raise Reply(400, {"message": {"name": ["is not a valid emoji name"]}})
    if any(
        item["name"] == name and item["user"]["username"] == ctx.user for item in note["_awards"]
    ):
        raise Reply(404, {"message": "404 Award Emoji Name has already been taken"})
    award = {
        "id": ctx.state.next_id(),
        "name": name,
        "user": gitlab_user(ctx.state, ctx.user),
        "created_at": ctx.state.clock().isoformat().replace("+00:00", "Z"),
        "updated_at": ctx.state.clock().isoformat().replace("+00:00", "Z"),
        "awardable_id": note_id,
        "awardable_type": "Note",
    }
    note["_awards"].append(award)
    ctx.state.records.append(
        Record("gitlab", "award_emoji", pull.repo, pull.number, name, {"note_id": note_id})
    )
    ctx.status = 201
    return award


async def gitlab_member(ctx: Context) -> Any:
    raw = ctx.params["project"]
    path = (
        raw
        if not raw.isdigit()
        else next((key for key, value in ctx.state.projects.items() if value == int(raw)), None)
    )
    if path is None or path not in ctx.state.projects:
        raise Reply(404, {"message": "404 Project Not Found"})
    user_id = int(ctx.params["user_id"])
    username = next((name for name, value in ctx.state.users.items() if value == user_id), None)
    level = ctx.state.access_levels.get((path, username or ""))
    if username is None or level is None:
        raise not_found("gitlab")
    member = gitlab_user(ctx.state, username)
    member.update(
        {
            "access_level": level,
            "expires_at": None,
            "created_at": iso_time(ctx.state.clock()),
            "membership_state": "active",
        }
    )
    return member


async def gitlab_users(ctx: Context) -> Any:
    username = ctx.request.query.get("username")
    names = [username] if username else list(ctx.state.users)
    found = [gitlab_user(ctx.state, name) for name in names if name in ctx.state.users]
    return paginate(ctx, found, default=20, maximum=100)


def seed_note(state: EmulatorState, repo: str, number: int, *, user: str, body: str) -> int:
    """Seed a person's note on a GitLab MR; returns its id."""
    pull = state.get_pull("gitlab", repo, number)
    note = gitlab_note(state, pull, user=user, body=body)
    pull.notes.append(note)
    return int(note["id"])
