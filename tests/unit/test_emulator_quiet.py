"""The emulator's quiet-review routes answer with GitHub's documented shapes (../shared/openapi)
and GitLab's, and behave like the forges: ancestry, default-branch files, edits, resolution."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bot.clock import VirtualClock
from bot.emulator import ForgeEmulator
from bot.emulator.quiet import open_pull_from_trees, push_tree, set_default_file
from bot.forges.quiet import quiet_forge_for
from tests.support.openapi import call, load_shared_json, response_schema, schema_errors
from tests.support.pipeline_helpers import GITHUB_TOKEN, emulator_forges

pytestmark = pytest.mark.emulator(
    github_tokens={"test-token"}, gitlab_tokens=set(), virtual_clock=False
)

REPO = "acme/shop"
GITLAB = {"PRIVATE-TOKEN": "gl-token"}
BASE = {"app/a.py": "a = 1\nb = 2\nc = 3\n"}
HEAD = {"app/a.py": "a = 1\nb = 20\nc = 3\n", "app/new.py": "x = 1\n"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


async def compare_contents_and_comment_edit(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> list[tuple[str, str, Any]]:
    """Compare two heads (ahead, and diverged after a force push), read a file at the default
    branch, edit a comment: checked for what they answer, and the answers with their
    operations."""
    state = emulator.state
    pull = open_pull_from_trees(state, "github", REPO, 3, base=BASE, head=HEAD)
    first = pull.newest.head_sha
    push_tree(state, "github", REPO, 3, {**HEAD, "app/new.py": "x = 2\n"})
    second = pull.newest.head_sha
    push_tree(state, "github", REPO, 3, {**HEAD, "app/new.py": "x = 3\n"}, force=True)
    rewritten = pull.newest.head_sha
    set_default_file(state, REPO, ".review-bot.yaml", "version: 1\n")
    base = f"{emulator.github_url}/repos/{REPO}"

    status, ahead, _ = await call(http, "GET", f"{base}/compare/{first}...{second}")
    assert status == 200 and ahead["status"] == "ahead" and ahead["ahead_by"] == 1
    assert [item["filename"] for item in ahead["files"]] == ["app/new.py"]
    assert ahead["files"][0]["patch"] == "@@ -1 +1 @@\n-x = 1\n+x = 2"
    _, diverged, _ = await call(http, "GET", f"{base}/compare/{second}...{rewritten}")
    assert diverged["status"] == "diverged" and diverged["behind_by"] == 2
    status, contents, _ = await call(http, "GET", f"{base}/contents/.review-bot.yaml")
    assert status == 200 and base64.b64decode(contents["content"]) == b"version: 1\n"
    missing, _, _ = await call(http, "GET", f"{base}/contents/nothing.yaml")
    assert missing == 404
    _, comment, _ = await call(http, "POST", f"{base}/issues/3/comments", body={"body": "one"})
    status, edited, _ = await call(
        http, "PATCH", f"{base}/issues/comments/{comment['id']}", body={"body": "two"}
    )
    assert status == 200 and edited["body"] == "two" and pull.comments[0]["body"] == "two"
    return [
        ("GET", "/repos/{owner}/{repo}/compare/{basehead}", ahead),
        ("GET", "/repos/{owner}/{repo}/compare/{basehead}", diverged),
        ("GET", "/repos/{owner}/{repo}/contents/{path}", contents),
        ("PATCH", "/repos/{owner}/{repo}/issues/comments/{comment_id}", edited),
    ]


async def test_github_compare_contents_and_comment_edit(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    await compare_contents_and_comment_edit(emulator, http)


async def test_github_compare_contents_and_comment_edit_match_the_openapi_subset(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    spec = load_shared_json("openapi", "github-rest-subset.json")
    for method, template, answer in await compare_contents_and_comment_edit(emulator, http):
        errors = schema_errors(response_schema(spec, method, template, 200), answer)
        assert errors == [], (template, errors[:5])


async def test_gitlab_merge_base_versions_files_note_edits_and_resolution(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    state = emulator.state
    project = "acme%2Fapi"
    pull = open_pull_from_trees(state, "gitlab", "acme/api", 4, base=BASE, head=HEAD)
    first = pull.newest.head_sha
    push_tree(state, "gitlab", "acme/api", 4, {**HEAD, "app/new.py": "x = 2\n"})
    second = pull.newest.head_sha
    set_default_file(state, "acme/api", ".review-bot.yaml", "version: 1\n")
    api = f"{emulator.gitlab_url}/api/v4/projects/{project}"
    mr = f"{api}/merge_requests/4"

    status, found, _ = await call(
        http, "GET", f"{api}/repository/merge_base?refs[]={first}&refs[]={second}", headers=GITLAB
    )
    assert status == 200 and found["id"] == first
    version_id = pull.versions[0].id
    _, version, _ = await call(http, "GET", f"{mr}/versions/{version_id}", headers=GITLAB)
    assert version["head_commit_sha"] == first
    assert [item["new_path"] for item in version["diffs"]] == ["app/a.py", "app/new.py"]
    status, file, _ = await call(
        http, "GET", f"{api}/repository/files/.review-bot.yaml?ref=HEAD", headers=GITLAB
    )
    assert status == 200 and base64.b64decode(file["content"]) == b"version: 1\n"
    assert len(file["blob_id"]) == 40
    _, note, _ = await call(http, "POST", f"{mr}/notes", body={"body": "one"}, headers=GITLAB)
    status, edited, _ = await call(
        http, "PUT", f"{mr}/notes/{note['id']}", body={"body": "two"}, headers=GITLAB
    )
    assert status == 200 and edited["body"] == "two"
    line = {"base_sha": pull.newest.base_sha, "start_sha": pull.newest.start_sha}
    position = {
        "position_type": "text",
        **line,
        "head_sha": second,
        "new_path": "app/new.py",
        "old_path": "app/new.py",
        "new_line": 1,
    }
    _, discussion, _ = await call(
        http, "POST", f"{mr}/discussions", body={"body": "x?", "position": position}, headers=GITLAB
    )
    status, resolved, _ = await call(
        http, "PUT", f"{mr}/discussions/{discussion['id']}", body={"resolved": True}, headers=GITLAB
    )
    assert status == 200 and resolved["notes"][0]["resolved"] is True
    missing, _, _ = await call(
        http, "PUT", f"{mr}/discussions/nope", body={"resolved": True}, headers=GITLAB
    )
    assert missing == 404


async def test_a_compare_over_githubs_file_limit_means_a_full_review(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    state = emulator.state
    state.github_tokens.add(GITHUB_TOKEN)
    base = {f"app/m{i}.py": f"x = {i}\n" for i in range(320)}
    head = {path: text + "y = 1\n" for path, text in base.items()}
    pull = open_pull_from_trees(state, "github", REPO, 5, base=base, head=head)
    first = pull.newest.head_sha
    push_tree(state, "github", REPO, 5, {path: text + "z = 2\n" for path, text in head.items()})
    async with emulator_forges(emulator, clock) as forges:
        quiet = quiet_forge_for(forges["github"])
        assert quiet is not None
        changes = await forges["github"].fetch_changes(REPO, 5)
        increment = await quiet.increment_since(REPO, 5, since=first, changes=changes)
    assert increment.mode == "full" and "compare file limit" in increment.reason
    assert len(increment.files) == 320
