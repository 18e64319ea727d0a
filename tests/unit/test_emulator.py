"""The forge emulator: GitHub-documented shapes, real rejections, faults, signed webhooks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gidgethub import sansio

from bot.emulator import (
    SECONDARY_LIMIT_MESSAGE,
    Fault,
    ForgeEmulator,
    build_github_issue_comment_event,
    build_github_pull_request_event,
    build_gitlab_merge_request_event,
    build_gitlab_note_event,
    generate_file_changes,
    send_webhook,
    serve_emulator,
)
from bot.forges.base import (
    append_marker,
    find_marker,
    parse_diff_lines,
    render_marker,
)
from tests.support.openapi import call, load_shared_json, response_schema, schema_errors
from tests.support.webhook_fixtures import load_payload

pytestmark = pytest.mark.emulator(
    github_tokens={"test-token"}, gitlab_tokens=set(), virtual_clock=False
)

SMALL = generate_file_changes(changed_lines=8, files=1, seed=99)
REPO = "acme/shop"


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


# -- GitHub shapes against GitHub's own description ----------------------------------------


async def test_github_responses_match_the_openapi_subset(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    spec = load_shared_json("openapi", "github-rest-subset.json")
    files = generate_file_changes(changed_lines=40, files=3, seed=1, binary_files=1)
    pull = emulator.state.add_pull("github", REPO, 5, files=files, labels=["bug"])
    emulator.state.set_permission(REPO, "alice", "write")
    base = f"{emulator.github_url}/repos/{REPO}"
    line = min(parse_diff_lines(files[0].patch).added)
    review_body = {
        "body": append_marker("Summary", 1),
        "event": "COMMENT",
        "commit_id": pull.newest.head_sha,
        "comments": [{"path": files[0].path, "line": line, "side": "RIGHT", "body": "x"}],
    }
    comment_status, comment, _ = await call(
        http, "POST", f"{base}/issues/5/comments", body={"body": "hi"}
    )
    checks = [
        ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}", f"{base}/pulls/5", None, 200),
        (
            "GET",
            "/repos/{owner}/{repo}/pulls/{pull_number}/files",
            f"{base}/pulls/5/files",
            None,
            200,
        ),
        (
            "POST",
            "/repos/{owner}/{repo}/pulls/{pull_number}/reviews",
            f"{base}/pulls/5/reviews",
            review_body,
            200,
        ),
        (
            "GET",
            "/repos/{owner}/{repo}/pulls/{pull_number}/reviews",
            f"{base}/pulls/5/reviews",
            None,
            200,
        ),
        (
            "GET",
            "/repos/{owner}/{repo}/collaborators/{username}/permission",
            f"{base}/collaborators/alice/permission",
            None,
            200,
        ),
        (
            "GET",
            "/repos/{owner}/{repo}/issues/{issue_number}/comments",
            f"{base}/issues/5/comments",
            None,
            200,
        ),
        (
            "POST",
            "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions",
            f"{base}/issues/comments/{comment['id']}/reactions",
            {"content": "eyes"},
            201,
        ),
        (
            "POST",
            "/repos/{owner}/{repo}/pulls/{pull_number}/reviews",
            f"{base}/pulls/5/reviews",
            {**review_body, "comments": [{**review_body["comments"][0], "line": 99999}]},
            422,
        ),
    ]
    assert comment_status == 201
    assert (
        schema_errors(
            response_schema(
                spec, "POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments", 201
            ),
            comment,
        )
        == []
    )
    for method, template, url, body, expected in checks:
        status, answer, _ = await call(http, method, url, body=body)
        assert status == expected, (method, url, answer)
        errors = schema_errors(response_schema(spec, method, template, expected), answer)
        assert errors == [], (method, template, errors[:5])


async def issue_access_tokens(emulator: ForgeEmulator, http: aiohttp.ClientSession) -> Any:
    """An installation token for the App's own JWT (201), none for a JWT signed with another
    key (401). The 201's body."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from gidgethub import apps

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    emulator.state.register_app("12", public_pem)
    emulator.state.add_pull("github", REPO, 1, files=[], installation_id=3)
    url = f"{emulator.github_url}/app/installations/3/access_tokens"
    token = apps.get_jwt(app_id="12", private_key=private_pem)

    status, issued, _ = await call(http, "POST", url, headers={"Authorization": f"Bearer {token}"})
    assert status == 201

    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = apps.get_jwt(
        app_id="12",
        private_key=other_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    status, answer, _ = await call(http, "POST", url, headers={"Authorization": f"Bearer {forged}"})
    assert status == 401 and "message" in answer
    return issued


async def test_github_access_tokens_only_for_the_apps_key(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    await issue_access_tokens(emulator, http)


async def test_github_access_token_shape(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    spec = load_shared_json("openapi", "github-rest-subset.json")
    issued = await issue_access_tokens(emulator, http)
    template = "/app/installations/{installation_id}/access_tokens"
    assert schema_errors(response_schema(spec, "POST", template, 201), issued) == []


async def test_github_rejects_what_github_rejects(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=2, binary_files=1)
    emulator.state.add_pull("github", REPO, 6, files=files)
    url = f"{emulator.github_url}/repos/{REPO}/pulls/6/reviews"
    added = min(parse_diff_lines(files[0].patch).added)

    def review(**comment: Any) -> dict[str, Any]:
        return {"body": "b", "event": "COMMENT", "comments": [comment]}

    cases = [
        (review(path=files[0].path, line=added + 1000, body="x"), "must be part of the diff"),
        (review(path="not/in/the/pull.py", line=1, body="x"), "Path could not be resolved"),
        (review(path=files[1].path, line=1, body="x"), "must be part of the diff"),  # binary
        (review(path=files[0].path, line=added), '"body" wasn\'t supplied'),
        (review(line=added, body="x"), '"path" wasn\'t supplied'),
        ({"event": "COMMENT", "comments": []}, "Body is required"),
        ({"body": "b", "event": "SHIP_IT"}, "event enum"),
    ]
    for body, text in cases:
        status, answer, _ = await call(http, "POST", url, body=body)
        assert status == 422, body
        assert set(answer) >= {"message", "documentation_url"}
        assert text in answer["message"] + " ".join(answer.get("errors", [])), answer
    assert emulator.state.posted(kind="review") == []

    status, answer, _ = await call(http, "GET", f"{emulator.github_url}/repos/{REPO}/pulls/99")
    assert status == 404 and answer["message"] == "Not Found" and "documentation_url" in answer
    status, answer, _ = await call(
        http, "GET", f"{emulator.github_url}/repos/{REPO}/pulls/6", headers={}
    )
    assert status == 401


async def test_gitlab_rejects_a_bad_position_with_400_message(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=3)
    pull = emulator.state.add_pull("gitlab", "group/app", 2, files=files)
    version = pull.newest
    url = f"{emulator.gitlab_url}/api/v4/projects/group%2Fapp/merge_requests/2/discussions"
    headers = {"PRIVATE-TOKEN": "any"}
    lines = parse_diff_lines(files[0].patch)
    context_new = min(lines.context)
    position = {
        "position_type": "text",
        "base_sha": version.base_sha,
        "start_sha": version.start_sha,
        "head_sha": version.head_sha,
        "new_path": files[0].path,
        "old_path": files[0].path,
    }
    bad = [
        {**position, "new_line": max(lines.added) + 400},
        {**position, "new_line": context_new},  # an unchanged line needs old_line too
        {**position, "head_sha": "0" * 40, "new_line": min(lines.added)},
    ]
    for candidate in bad:
        status, answer, _ = await call(
            http, "POST", url, body={"body": "x", "position": candidate}, headers=headers
        )
        assert status == 400, candidate
        assert answer["message"].startswith("400 Bad request - Note")
    status, answer, _ = await call(http, "POST", url, body={"position": position}, headers=headers)
    assert status == 400 and answer == {"error": "body is missing"}
    good = {**position, "new_line": context_new, "old_line": lines.context[context_new]}
    status, answer, _ = await call(
        http, "POST", url, body={"body": "ok", "position": good}, headers=headers
    )
    assert status == 201 and answer["notes"][0]["type"] == "DiffNote"
    status, answer, _ = await call(
        http,
        "GET",
        f"{emulator.gitlab_url}/api/v4/projects/9999/merge_requests/2/versions",
        headers=headers,
    )
    assert status == 404 and answer == {"message": "404 Project Not Found"}


# -- faults ----------------------------------------------------------------------------------


async def test_faults_are_served_in_order_then_the_route_recovers(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    emulator.state.add_pull("github", REPO, 7, files=SMALL)
    emulator.state.add_fault("github.pull", Fault.secondary_rate_limit(retry_after=45))
    emulator.state.add_fault("github.pull", Fault.too_many_requests(retry_after=5))
    emulator.state.add_fault("github.pull", Fault.server_error(503))
    url = f"{emulator.github_url}/repos/{REPO}/pulls/7"

    status, answer, headers = await call(http, "GET", url)
    assert status == 403 and headers["Retry-After"] == "45"
    assert answer["message"].startswith(SECONDARY_LIMIT_MESSAGE.split("{")[0][:40])
    assert "secondary rate limit" in answer["message"]
    status, _, headers = await call(http, "GET", url)
    assert status == 429 and headers["Retry-After"] == "5"
    status, _, _ = await call(http, "GET", url)
    assert status == 503
    status, answer, _ = await call(http, "GET", url)
    assert status == 200 and answer["number"] == 7


async def test_slow_fault_delays_the_answer(
    emulator: ForgeEmulator, http: aiohttp.ClientSession
) -> None:
    emulator.state.add_pull("github", REPO, 8, files=[])
    emulator.state.add_fault("github.pull", Fault.slow(0.3))
    url = f"{emulator.github_url}/repos/{REPO}/pulls/8"
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, _, _ = await call(http, "GET", url)
    assert status == 200 and loop.time() - started >= 0.3


# -- diff generator and pure helpers -----------------------------------------------------------


@pytest.mark.parametrize(("lines", "files"), [(1, 1), (37, 5), (1200, 120), (500, 3)])
def test_generated_diffs_have_the_asked_size_and_parse_back(lines: int, files: int) -> None:
    changes = generate_file_changes(changed_lines=lines, files=files, seed=lines)
    assert len(changes) == files
    assert sum(item.changed_lines for item in changes) == lines
    for item in changes:
        parsed = parse_diff_lines(item.patch)
        assert (len(parsed.added), len(parsed.removed)) == (item.additions, item.deletions)
    assert generate_file_changes(changed_lines=lines, files=files, seed=lines) == changes


def test_marker_round_trip() -> None:
    body = append_marker("Review of the change.", 123)
    assert render_marker(123) in body
    assert find_marker(body) == 123
    assert append_marker(body, 123) == body
    assert find_marker("no marker <!-- review-bot:job=x -->") is None
    assert find_marker(None) is None


# -- webhooks built from a payload ----------------------------------------------------------------


async def test_github_webhook_is_signed_and_overridden(aiohttp_server: Any) -> None:
    fixture = load_payload("github/pull_request.opened.json").payload
    received: list[sansio.Event] = []

    async def receive(request: web.Request) -> web.Response:
        event = sansio.Event.from_http(request.headers, await request.read(), secret="s3cret")
        received.append(event)
        return web.json_response({"ok": True}, status=202)

    app = web.Application()
    app.router.add_post("/webhooks/github", receive)
    server = await aiohttp_server(app)
    payload = build_github_pull_request_event(
        fixture,
        repo="acme/payments",
        number=42,
        base_ref="hotfix/x",
        head_sha="a" * 40,
        changed_files=12,
        labels=["urgent"],
        author="dependabot[bot]",
        author_type="Bot",
        installation_id=99,
    )

    delivery = await send_webhook(
        str(server.make_url("/webhooks/github")), "github", "pull_request", payload, "s3cret"
    )

    assert delivery.status == 202
    event = received[0]
    assert event.event == "pull_request" and event.delivery_id == delivery.delivery_id
    pull = event.data["pull_request"]
    assert event.data["repository"]["full_name"] == "acme/payments"
    assert (event.data["number"], pull["base"]["ref"], pull["head"]["sha"]) == (
        42,
        "hotfix/x",
        "a" * 40,
    )
    assert pull["changed_files"] == 12 and [label["name"] for label in pull["labels"]] == ["urgent"]
    assert pull["user"] == {
        **fixture["pull_request"]["user"],
        "login": "dependabot[bot]",
        "type": "Bot",
    }
    assert event.data["installation"]["id"] == 99
    assert fixture["pull_request"]["base"]["ref"] != "hotfix/x"  # the fixture is untouched

    wrong = await send_webhook(
        str(server.make_url("/webhooks/github")), "github", "pull_request", payload, "other"
    )
    assert wrong.status == 500  # from_http raised ValidationFailure in the receiver


async def test_gitlab_webhooks_carry_token_and_uuid(aiohttp_server: Any) -> None:
    merge_request = load_payload("gitlab/merge_request.open.json").payload
    note = load_payload("gitlab/note.merge_request.json").payload
    comment = load_payload("github/issue_comment.created.json").payload
    seen: list[tuple[Mapping[str, str], Any]] = []

    async def receive(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.json()))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", receive)
    server = await aiohttp_server(app)
    url = str(server.make_url("/hook"))
    mr_payload = build_gitlab_merge_request_event(
        merge_request,
        repo="acme/platform/api",
        project_id=321,
        number=8,
        base_ref="hotfix/db",
        head_sha="b" * 40,
        labels=["P1"],
        author="carol",
    )
    note_payload = build_gitlab_note_event(
        note, body="/review priority p1", number=8, project_id=321, author="carol"
    )
    command = build_github_issue_comment_event(
        comment, body="/review status", number=3, author="alice"
    )

    first = await send_webhook(url, "gitlab", "Merge Request Hook", mr_payload, "tok")
    await send_webhook(url, "gitlab", "Note Hook", note_payload, "tok")

    headers, body = seen[0]
    assert headers["X-Gitlab-Token"] == "tok" and headers["X-Gitlab-Event"] == "Merge Request Hook"
    assert headers["X-Gitlab-Event-UUID"] == first.delivery_id == headers["Idempotency-Key"]
    attributes = body["object_attributes"]
    assert (attributes["iid"], attributes["target_branch"], attributes["last_commit"]["id"]) == (
        8,
        "hotfix/db",
        "b" * 40,
    )
    assert body["project"]["path_with_namespace"] == "acme/platform/api"
    assert [label["title"] for label in body["labels"]] == ["P1"]
    assert seen[1][1]["object_attributes"]["note"] == "/review priority p1"
    assert seen[1][1]["merge_request"]["iid"] == 8
    assert command["comment"]["body"] == "/review status" and command["issue"]["number"] == 3


async def test_serve_emulator_serves_seeded_pulls_until_stopped(
    http: aiohttp.ClientSession,
) -> None:
    stop = asyncio.Event()
    ready: asyncio.Queue[ForgeEmulator] = asyncio.Queue()
    task = asyncio.create_task(serve_emulator(0, stop=stop, on_ready=ready.put_nowait))
    running = await asyncio.wait_for(ready.get(), timeout=5)

    status, answer, _ = await call(http, "GET", f"{running.github_url}/repos/acme/shop/pulls/1")
    assert status == 200 and answer["base"]["ref"] == "hotfix/checkout"
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    with pytest.raises(aiohttp.ClientConnectionError):
        await call(http, "GET", f"{running.github_url}/repos/acme/shop/pulls/1")
