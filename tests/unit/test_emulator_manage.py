"""The emulator's control surface: the PRs it holds, PRs from outside, what the bot posted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from bot import cli
from bot.emulator import ForgeEmulator, serve_emulator
from bot.emulator.manage import (
    PullSpecError,
    pull_spec_from_json,
    pull_spec_from_webhook,
    pull_specs_from_text,
)
from tests.support.webhook_fixtures import load_payload

HEAD = "9" * 40
GITHUB_DELIVERY: dict[str, Any] = {
    "action": "opened",
    "repository": {"full_name": "someone/tool"},
    "pull_request": {
        "number": 17,
        "title": "Parse flags",
        "user": {"login": "dev1"},
        "base": {"ref": "main", "sha": "1" * 40},
        "head": {"ref": "flags", "sha": HEAD},
        "labels": [{"name": "cli"}],
        "additions": 30,
        "deletions": 5,
        "changed_files": 3,
    },
}
AUTH = {"Authorization": "token anything"}


def test_a_description_with_generated_or_given_files() -> None:
    generated = pull_spec_from_json(
        {"repo": "acme/x", "number": 3, "changed_lines": 50, "file_count": 2}
    )
    assert (generated.forge, generated.repo, generated.number) == ("github", "acme/x", 3)
    assert len(generated.files) == 2
    assert sum(f.additions + f.deletions for f in generated.files) >= 50
    given = pull_spec_from_json(
        {
            "forge": "gitlab",
            "repo": "group/sub/project",
            "number": 1,
            "head_sha": HEAD,
            "files": [{"path": "a.py", "patch": "@@ -1 +1 @@\n-a\n+b", "additions": 1}],
        }
    )
    assert [(f.path, f.additions, f.status) for f in given.files] == [("a.py", 1, "modified")]
    assert given.head_sha == HEAD


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "the body must be a JSON object"),
        ({"repo": "acme/x"}, "number must be an integer from 1"),
        ({"repo": "noslash", "number": 1}, "repo must be owner/name"),
        ({"forge": "bitbucket", "repo": "a/b", "number": 1}, "forge must be github or gitlab"),
        ({"repo": "a/b", "number": 1, "files": [{"patch": "x"}]}, "files[0].path must be"),
        ({"repo": "a/b", "number": 1, "labels": "x"}, "labels must be a list of strings"),
        ({"webhook": {"action": "opened"}}, "neither a GitHub pull_request delivery"),
        ({"webhook": {"pull_request": {"number": 1}}}, "webhook lacks the field"),
    ],
)
def test_bad_descriptions_name_the_field(data: Any, message: str) -> None:
    with pytest.raises(PullSpecError) as caught:
        pull_spec_from_json(data)
    assert message in str(caught.value)


def test_the_pull_a_webhook_names() -> None:
    spec = pull_spec_from_webhook(GITHUB_DELIVERY)
    assert (spec.forge, spec.repo, spec.number, spec.head_sha) == (
        "github",
        "someone/tool",
        17,
        HEAD,
    )
    assert (spec.base_ref, spec.head_ref, spec.labels, spec.author) == (
        "main",
        "flags",
        ("cli",),
        "dev1",
    )
    assert len(spec.files) == 3


def test_the_deliveries_name_their_pulls() -> None:
    github = load_payload("github/pull_request.opened.json").payload
    gitlab = load_payload("gitlab/merge_request.open.json").payload
    from_github = pull_spec_from_webhook(github)
    from_gitlab = pull_spec_from_webhook(gitlab)
    pull = github["pull_request"]
    assert (from_github.repo, from_github.number, from_github.head_sha) == (
        github["repository"]["full_name"],
        pull["number"],
        pull["head"]["sha"],
    )
    attributes = gitlab["object_attributes"]
    assert (from_gitlab.repo, from_gitlab.number, from_gitlab.head_sha) == (
        gitlab["project"]["path_with_namespace"],
        attributes["iid"],
        attributes["last_commit"]["id"],
    )


def test_files_of_descriptions_in_any_of_three_shapes() -> None:
    one = {"repo": "a/b", "number": 1}
    assert len(pull_specs_from_text(json.dumps(one), source="f")) == 1
    assert len(pull_specs_from_text(json.dumps([one, {**one, "number": 2}]), source="f")) == 2
    lines = json.dumps(one) + "\n\n" + json.dumps({**one, "number": 3}) + "\n"
    assert [spec.number for spec in pull_specs_from_text(lines, source="f")] == [1, 3]
    with pytest.raises(PullSpecError, match=r"^f:2: "):
        pull_specs_from_text(json.dumps(one) + "\n{broken\n", source="f")
    with pytest.raises(PullSpecError, match=r"^f\[1\]: number"):
        pull_specs_from_text(json.dumps([one, {"repo": "a/b"}]), source="f")


async def test_pulls_from_outside_over_http_and_what_was_posted() -> None:
    async with ForgeEmulator() as emulator, aiohttp.ClientSession() as http:
        control = f"{emulator.base_url}/_emulator"
        async with http.post(f"{control}/prs", json={"webhook": GITHUB_DELIVERY}) as answer:
            assert answer.status == 201
            added = (await answer.json())["prs"]
        assert [(p["repo"], p["number"], p["head_sha"]) for p in added] == [
            ("someone/tool", 17, HEAD)
        ]
        # The bot now finds the PR the delivery names, instead of a 404 that reads as "gone".
        async with http.get(added[0]["api_url"], headers=AUTH) as answer:
            assert answer.status == 200
            assert (await answer.json())["head"]["sha"] == HEAD
        async with http.get(f"{added[0]['api_url']}/files", headers=AUTH) as answer:
            assert answer.status == 200 and len(await answer.json()) == 3

        gitlab = {"forge": "gitlab", "repo": "group/app", "number": 4}
        async with http.post(f"{control}/prs", json=[gitlab]) as answer:
            assert answer.status == 201
        project = quote("group/app", safe="")
        url = f"{emulator.base_url}/api/v4/projects/{project}/merge_requests/4"
        async with http.get(url, headers={"PRIVATE-TOKEN": "x"}) as answer:
            assert answer.status == 200
        async with http.post(f"{control}/prs", json={"repo": "a/b"}) as answer:
            assert answer.status == 400
            assert "number must be" in (await answer.json())["error"]

        async with http.get(f"{control}/prs") as answer:
            held = {(p["forge"], p["repo"], p["number"]) for p in (await answer.json())["prs"]}
        assert held == {("github", "someone/tool", 17), ("gitlab", "group/app", 4)}

        comments = f"{emulator.base_url}/repos/someone/tool/issues/17/comments"
        async with http.post(comments, json={"body": "looks fine"}, headers=AUTH) as answer:
            assert answer.status == 201
        async with http.get(f"{control}/posted?forge=github&number=17") as answer:
            posted = (await answer.json())["posted"]
        assert [(p["kind"], p["repo"], p["body"]) for p in posted] == [
            ("issue_comment", "someone/tool", "looks fine")
        ]
        async with http.get(f"{control}/posted?forge=gitlab") as answer:
            assert (await answer.json())["posted"] == []

        # A later push of the same PR (a new head) becomes a new version, not a second PR.
        pushed = json.loads(json.dumps(GITHUB_DELIVERY))
        pushed["pull_request"]["head"]["sha"] = "8" * 40
        async with http.post(f"{control}/prs", json={"webhook": pushed}) as answer:
            assert (await answer.json())["prs"][0]["head_sha"] == "8" * 40
        assert len(emulator.state.pulls) == 2


async def test_bot_emulator_prints_its_pulls_and_takes_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prs = tmp_path / "prs.json"
    prs.write_text(json.dumps([{"webhook": GITHUB_DELIVERY}]))
    stop = asyncio.Event()
    ready: asyncio.Queue[ForgeEmulator] = asyncio.Queue()
    task = asyncio.create_task(
        serve_emulator(0, stop=stop, on_ready=ready.put_nowait, prs_file=str(prs))
    )
    running = await asyncio.wait_for(ready.get(), timeout=5)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    banner = capsys.readouterr().out
    assert f"GitHub API at {running.base_url}" in banner
    assert f"github someone/tool#17  head {HEAD}" in banner
    assert "github acme/shop#1" in banner and "gitlab acme/platform/api#1" in banner
    assert f"GET {running.base_url}/_emulator/posted" in banner
    assert f"POST {running.base_url}/_emulator/prs" in banner


def test_bot_emulator_refuses_a_bad_prs_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prs = tmp_path / "prs.json"
    prs.write_text(json.dumps([{"repo": "a/b"}]))
    assert cli.main(["emulator", "--port", "0", "--prs", str(prs)]) == 2
    assert f"--prs: {prs}[0]: number must be" in capsys.readouterr().err
