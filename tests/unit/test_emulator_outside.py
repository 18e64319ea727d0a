"""Changing held pull requests from outside: pushes with history, force-pushes, rebases, files
on a branch, comments; and what is on a pull request or a commit, as GitHub lists it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest

from bot.emulator import EmulatorState, ForgeEmulator, generate_file_changes
from bot.emulator.pushes import PushError, push_changes, sides_from_patch
from bot.emulator.quiet import diff_trees
from bot.intake.normalize import Commands, normalize_delivery
from bot.intake.verify import Delivery
from tests.support.openapi import load_shared_json, response_schema, schema_errors

pytestmark = pytest.mark.emulator(github_tokens=set(), gitlab_tokens=set(), virtual_clock=False)

AUTH = {"Authorization": "token anything"}
BASE = {"shop/orders.py": "def load(path):\n    return open(path).read()\n"}
HEAD = {
    "shop/orders.py": "def load(path):\n    with open(path) as f:\n        return f.read()\n",
    "shop/report.py": "def report(total):\n    print(total)\n",
}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, Any]:
    async with http.request(method, url, json=body, headers=AUTH) as answer:
        return answer.status, await answer.json()


async def open_pull(
    emulator: ForgeEmulator, http: aiohttp.ClientSession, forge: str = "github"
) -> dict[str, Any]:
    repo = "acme/shop" if forge == "github" else "acme/platform/api"
    description = {"forge": forge, "repo": repo, "number": 7, "base": BASE, "head": HEAD}
    status, answer = await call(http, "POST", f"{emulator.base_url}/_emulator/prs", description)
    assert status == 201, answer
    assert answer["webhooks"] == [
        {"event": "pull_request" if forge == "github" else "Merge Request Hook", "delivered": None}
    ]
    return dict(answer["prs"][0])


async def compare(
    emulator: ForgeEmulator, http: aiohttp.ClientSession, base: str, head: str
) -> dict[str, Any]:
    url = f"{emulator.base_url}/repos/acme/shop/compare/{base}...{head}"
    status, answer = await call(http, "GET", url)
    assert status == 200, answer
    return dict(answer)


def test_sides_rebuilt_from_a_patch_give_the_patch_back() -> None:
    for change in generate_file_changes(changed_lines=60, files=3, seed=4):
        before, after = sides_from_patch(change.patch, "modified")
        [again] = diff_trees({"f": before or ""}, {"f": after or ""})
        assert (again.additions, again.deletions) == (change.additions, change.deletions)
    assert sides_from_patch("@@ -0,0 +1,2 @@\n+a\n+b", "added") == (None, "a\nb\n")
    assert sides_from_patch("@@ -1,2 +0,0 @@\n-a\n-b", "removed") == ("a\nb\n", None)


def test_a_moved_file_is_one_renamed_file() -> None:
    text = "".join(f"line {n}\n" for n in range(20))
    [moved] = diff_trees({"a.py": text}, {"b.py": text})
    assert (moved.path, moved.status, moved.previous_path, moved.patch) == (
        "b.py",
        "renamed",
        "a.py",
        None,
    )
    [edited] = diff_trees({"a.py": text}, {"b.py": text.replace("line 3", "line three")})
    assert edited.status == "renamed" and edited.additions == edited.deletions == 1
    unlike = diff_trees({"a.py": text}, {"b.py": "something else entirely\n"})
    assert sorted(change.status for change in unlike) == ["added", "removed"]


async def test_a_push_is_a_child_of_the_head_so_the_compare_shows_only_it(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    pull = await open_pull(emulator, http)
    edited = HEAD["shop/report.py"].replace("print(total)", "return total")
    status, pushed = await call(
        http,
        "POST",
        f"{emulator.base_url}/_emulator/push",
        {"repo": "acme/shop", "number": 7, "files": {"shop/report.py": edited}},
    )
    assert status == 201, pushed
    assert (pushed["kind"], pushed["before"]) == ("push", pull["head_sha"])
    assert pushed["pr"]["versions"] == [pull["head_sha"], pushed["after"]]
    # The webhook a forge would send (not sent: no bot to send to).
    assert pushed["webhook"]["event"] == "pull_request" and pushed["delivered"] is None
    payload = pushed["webhook"]["payload"]
    assert (payload["action"], payload["before"], payload["after"]) == (
        "synchronize",
        pull["head_sha"],
        pushed["after"],
    )
    answer = await compare(emulator, http, pull["head_sha"], pushed["after"])
    assert (answer["status"], answer["ahead_by"]) == ("ahead", 1)
    assert [item["filename"] for item in answer["files"]] == ["shop/report.py"]
    # The pull request's own diff still runs from the base.
    status, files = await call(http, "GET", f"{pull['api_url']}/files")
    assert {item["filename"]: item["status"] for item in files} == {
        "shop/orders.py": "modified",
        "shop/report.py": "added",
    }


async def test_deletions_renames_force_pushes_and_rebases(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    pull = await open_pull(emulator, http)
    push_url = f"{emulator.base_url}/_emulator/push"
    where = {"repo": "acme/shop", "number": 7}
    status, moved = await call(
        http,
        "POST",
        push_url,
        {
            **where,
            "renames": {"shop/report.py": "shop/reports.py"},
            "files": {"shop/orders.py": None},
        },
    )
    assert status == 201, moved
    # Against the base, the pull request now removes one file and adds another...
    assert {item["path"]: item["status"] for item in moved["files"]} == {
        "shop/orders.py": "removed",
        "shop/reports.py": "added",
    }
    # ...and against the old head, the push renamed one.
    answer = await compare(emulator, http, pull["head_sha"], moved["after"])
    assert {item["filename"]: item["status"] for item in answer["files"]} == {
        "shop/orders.py": "removed",
        "shop/reports.py": "renamed",
    }
    assert answer["files"][1]["previous_filename"] == "shop/report.py"

    status, forced = await call(http, "POST", push_url, {**where, "force": True})
    assert (status, forced["kind"]) == (201, "force-push")
    answer = await compare(emulator, http, moved["after"], forced["after"])
    assert answer["status"] == "diverged"  # the old head is no longer an ancestor

    base_text = "VERSION = 2\n"
    status, rebased = await call(
        http, "POST", push_url, {**where, "base_files": {"shop/version.py": base_text}}
    )
    assert (status, rebased["kind"]) == (201, "rebase")
    assert rebased["pr"]["base_sha"] != pull["base_sha"]
    # The pull request's own change is the same; the base's new file is not part of it.
    assert [item["path"] for item in rebased["files"]] == ["shop/orders.py", "shop/reports.py"]
    assert (await compare(emulator, http, forced["after"], rebased["after"]))["status"] == (
        "diverged"
    )
    status, tree = await call(
        http, "GET", f"{emulator.base_url}/_emulator/files?repo=acme/shop&ref={rebased['after']}"
    )
    assert tree["files"]["shop/version.py"] == base_text
    assert tree["files"]["shop/reports.py"] == HEAD["shop/report.py"]


async def test_a_push_onto_a_pull_seeded_from_patches(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    files = generate_file_changes(changed_lines=40, files=2, seed=3)
    seeded = emulator.state.add_pull("gitlab", "acme/platform/api", 2, files=files)
    old_head = seeded.newest.head_sha
    status, pushed = await call(
        http,
        "POST",
        f"{emulator.base_url}/_emulator/push",
        {"forge": "gitlab", "repo": "acme/platform/api", "number": 2, "files": {"new.py": "x\n"}},
    )
    assert status == 201, pushed
    assert pushed["webhook"]["event"] == "Merge Request Hook"
    assert pushed["webhook"]["payload"]["object_attributes"]["oldrev"] == old_head
    project = f"{emulator.base_url}/api/v4/projects/acme%2Fplatform%2Fapi"
    query = f"refs[]={old_head}&refs[]={pushed['after']}"
    status, base = await call(http, "GET", f"{project}/repository/merge_base?{query}")
    assert (status, base["id"]) == (200, old_head)  # the old head is an ancestor
    paths = {item["path"] for item in pushed["files"]}
    assert paths == {files[0].path, files[1].path, "new.py"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"repo": "acme/shop", "number": 99, "files": {"a": "b"}}, 404, "is not held"),
        ({"repo": "acme/shop", "number": 7}, 400, "nothing to push"),
        ({"repo": "acme/shop", "number": 7, "files": {"nope.py": None}}, 400, "not there"),
        ({"repo": "acme/shop", "number": 7, "files": {"a.py": 3}}, 400, "string or null"),
        ({"repo": "acme/shop", "number": 7, "renames": {"x": "y"}}, 400, "x is not in the head"),
        ({"repo": "acme/shop", "number": 7, "force": "yes"}, 400, "force must be true or false"),
        ({"forge": "bitbucket", "repo": "a/b", "number": 1}, 400, "forge must be github"),
    ],
)
async def test_bad_pushes_are_refused_and_change_nothing(
    emulator: ForgeEmulator,
    http: aiohttp.ClientSession,
    body: Mapping[str, Any],
    status: int,
    message: str,
) -> None:
    pull = await open_pull(emulator, http)
    answered, answer = await call(http, "POST", f"{emulator.base_url}/_emulator/push", body)
    assert answered == status and message in answer["error"], answer
    held = emulator.state.get_pull("github", "acme/shop", 7)
    assert [version.head_sha for version in held.versions] == [pull["head_sha"]]


async def test_files_on_the_default_branch_and_on_a_head_branch(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    pull = await open_pull(emulator, http)
    files_url = f"{emulator.base_url}/_emulator/files"
    settings = "version: 1\npaths:\n  exclude: ['docs/**']\n"
    status, answer = await call(
        http, "PUT", files_url, {"repo": "acme/shop", "files": {".review-bot.yaml": settings}}
    )
    assert (status, answer["branch"], "push" in answer) == (200, "main", False)
    # What the bot reads its settings from: the contents API of the default branch.
    status, contents = await call(
        http, "GET", f"{emulator.base_url}/repos/acme/shop/contents/.review-bot.yaml"
    )
    assert status == 200 and contents["type"] == "file"
    status, answer = await call(
        http,
        "PUT",
        files_url,
        {"repo": "acme/shop", "branch": pull["head_ref"], "files": {"docs/a.md": "# A\n"}},
    )
    assert status == 200 and answer["push"]["before"] == pull["head_sha"]
    assert "docs/a.md" in {item["path"] for item in answer["push"]["files"]}
    status, answer = await call(
        http, "PUT", files_url, {"repo": "acme/shop", "branch": "nope", "files": {"a": "b"}}
    )
    assert status == 400 and "known: main, feature/change-7" in answer["error"]


async def test_a_comment_is_on_the_pull_and_its_webhook_is_shown(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    await open_pull(emulator, http)
    await open_pull(emulator, http, "gitlab")
    for forge, repo, event in (
        ("github", "acme/shop", "issue_comment"),
        ("gitlab", "acme/platform/api", "Note Hook"),
    ):
        status, answer = await call(
            http,
            "POST",
            f"{emulator.base_url}/_emulator/comments",
            {"forge": forge, "repo": repo, "number": 7, "author": "dev1", "body": "/review"},
        )
        assert status == 201 and answer["webhook"]["event"] == event, answer
        status, view = await call(
            http,
            "GET",
            f"{emulator.base_url}/_emulator/activity?forge={forge}&repo={repo}&number=7",
        )
        assert [(c["author"], c["body"]) for c in view["comments"]] == [("dev1", "/review")]


async def test_our_comment_webhooks_carry_what_the_bot_reads(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    """Built from the emulator's own objects (no recorded payloads needed), the comment
    deliveries normalize to the commands they carry, as the recorded ones do."""
    await open_pull(emulator, http)
    await open_pull(emulator, http, "gitlab")
    for forge, repo, event in (
        ("github", "acme/shop", "issue_comment"),
        ("gitlab", "acme/platform/api", "Note Hook"),
    ):
        _, answer = await call(
            http,
            "POST",
            f"{emulator.base_url}/_emulator/comments",
            {"forge": forge, "repo": repo, "number": 7, "author": "dev1", "body": "/review full"},
        )
        delivery = Delivery(forge, event, "d1", answer["webhook"]["payload"])
        normalized = normalize_delivery(delivery, bot_login="review-bot")
        assert isinstance(normalized, Commands), normalized
        assert (normalized.repo, normalized.number, normalized.author) == (repo, 7, "dev1")
        assert normalized.comment_id == answer["id"]
        assert [command.argument for command in normalized.commands] == ["full"]


async def review_comments_and_statuses(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> tuple[Any, Any, str]:
    """A review with one comment and two statuses on a pull request's head: GitHub's listings of
    its review comments and of the head's statuses (checked for what they hold), and the head."""
    pull = await open_pull(emulator, http)
    repo_api = f"{emulator.base_url}/repos/acme/shop"
    sha = pull["head_sha"]
    status, _ = await call(
        http,
        "POST",
        f"{repo_api}/pulls/7/reviews",
        {
            "event": "COMMENT",
            "body": "Review",
            "commit_id": sha,
            "comments": [{"path": "shop/report.py", "line": 2, "side": "RIGHT", "body": "Print?"}],
        },
    )
    assert status == 200
    for state in ("pending", "success"):
        status, _ = await call(
            http, "POST", f"{repo_api}/statuses/{sha}", {"state": state, "context": "review-bot"}
        )
        assert status == 201
    status, comments = await call(http, "GET", f"{repo_api}/pulls/7/comments")
    assert status == 200
    [comment] = comments
    assert (comment["path"], comment["line"], comment["body"], comment["commit_id"]) == (
        "shop/report.py",
        2,
        "Print?",
        sha,
    )
    assert comment["diff_hunk"].endswith("+    print(total)")
    status, statuses = await call(http, "GET", f"{repo_api}/commits/{sha}/statuses")
    assert status == 200 and [item["state"] for item in statuses] == ["success", "pending"]
    status, _ = await call(http, "GET", f"{repo_api}/commits/{'0' * 40}/statuses")
    assert status == 404
    return comments, statuses, sha


async def test_review_comments_and_statuses_as_github_lists_them(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    _, _, sha = await review_comments_and_statuses(emulator, http)

    # The control API shows them per pull request and per commit, statuses included.
    status, posted = await call(http, "GET", f"{emulator.base_url}/_emulator/posted?number=7")
    assert status == 200
    assert [item["kind"] for item in posted["posted"]] == [
        "review",
        "commit_status",
        "commit_status",
    ]
    status, view = await call(
        http, "GET", f"{emulator.base_url}/_emulator/activity?repo=acme/shop&number=7&sha={sha}"
    )
    assert status == 200
    assert [item["state"] for item in view["statuses"]] == ["pending", "success"]
    assert [c["body"] for c in view["reviews"][0]["comments"]] == ["Print?"]


async def test_review_comments_and_statuses_match_the_openapi_subset(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    openapi = load_shared_json("openapi", "github-rest-subset.json")
    comments, statuses, _ = await review_comments_and_statuses(emulator, http)
    template = "/repos/{owner}/{repo}/pulls/{pull_number}/comments"
    assert schema_errors(response_schema(openapi, "GET", template, 200), comments) == []
    status_schema = response_schema(openapi, "POST", "/repos/{owner}/{repo}/statuses/{sha}", 201)
    assert all(schema_errors(status_schema, item) == [] for item in statuses)


def test_push_changes_refuses_an_unknown_path_without_a_trace() -> None:
    state = EmulatorState()
    state.add_pull("github", "a/b", 1, files=generate_file_changes(changed_lines=5, files=1))
    with pytest.raises(PushError, match=r"gone\.py cannot be deleted"):
        push_changes(state, "github", "a/b", 1, files={"gone.py": None})
    assert len(state.get_pull("github", "a/b", 1).versions) == 1
