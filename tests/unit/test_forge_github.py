"""The real GitHub client against the forge emulator over loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import gidgethub
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from gidgethub import sansio

from bot.clock import VirtualClock
from bot.emulator import (
    Fault,
    ForgeEmulator,
    generate_file_changes,
    seed_issue_comment,
)
from bot.emulator.state import Record
from bot.errors import ForgeError, ForgeNotFound
from bot.forges.base import (
    ForgePermissionDenied,
    InlineComment,
    RetryPolicy,
    ReviewToPost,
    find_marker,
    parse_diff_lines,
    render_marker,
)
from bot.forges.github import GitHubClient, translate_github_error
from bot.model import FileChange
from tests.support.openapi import call, load_shared_json, schema_errors

pytestmark = pytest.mark.emulator(github_tokens={"test-token"}, gitlab_tokens=set())

SMALL = generate_file_changes(changed_lines=8, files=1, seed=99)
REPO = "acme/shop"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


def make_client(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock, **options: object
) -> GitHubClient:
    return GitHubClient(
        session,
        base_url=emulator.github_url,
        token=options.pop("token", "test-token"),  # type: ignore[arg-type]
        clock=clock.now,
        sleep=clock.sleep,
        **options,  # type: ignore[arg-type]
    )


def first_added_line(change: FileChange) -> int:
    return min(parse_diff_lines(change.patch).added)


async def test_fetch_changes_pages_through_files_and_keeps_binary_without_patch(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=900, files=230, seed=3, binary_files=2)
    pull = emulator.state.add_pull("github", REPO, 7, files=files)
    client = make_client(emulator, session, clock)

    changes = await client.fetch_changes(REPO, 7)

    assert [item.path for item in changes.files] == [item.path for item in files]
    assert [item.patch for item in changes.files] == [item.patch for item in files]
    assert sum(item.changed_lines for item in changes.files) == 900
    assert [item.path for item in changes.files if item.patch is None] == [
        "assets/image_0.png",
        "assets/image_1.png",
    ]
    assert changes.head_sha == pull.newest.head_sha
    assert changes.base_sha == pull.newest.base_sha
    assert not changes.truncated
    assert emulator.state.count_requests("github.files") == 3  # 232 files at 100 a page


async def test_fetch_changes_stops_at_the_3000_file_cap(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    files = [FileChange(path=f"gen/file_{index}.txt", patch=None) for index in range(3005)]
    emulator.state.add_pull("github", REPO, 8, files=files)
    client = make_client(emulator, session, clock)

    changes = await client.fetch_changes(REPO, 8)

    assert len(changes.files) == 3000
    assert changes.truncated
    assert changes.total_files == 3005


async def test_missing_pull_is_forge_not_found(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    client = make_client(emulator, session, clock)
    with pytest.raises(ForgeNotFound) as caught:
        await client.fetch_changes(REPO, 404)
    assert caught.value.status == 404
    assert not caught.value.retryable


async def test_app_auth_caches_the_installation_token_until_five_minutes_before_expiry(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
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
    emulator.state.register_app("4242", public_pem)
    emulator.state.add_pull(
        "github",
        REPO,
        9,
        files=generate_file_changes(changed_lines=20, files=2),
        installation_id=77,
    )
    client = GitHubClient(
        session,
        base_url=emulator.github_url,
        app_id="4242",
        private_key=private_pem,
        clock=clock.now,
        sleep=clock.sleep,
    )

    await client.fetch_changes(REPO, 9, installation_id=77)
    clock.advance(minutes=54)
    await client.fetch_changes(REPO, 9, installation_id=77)
    assert emulator.state.count_requests("github.access_token") == 1

    clock.advance(minutes=2)  # 56 minutes in: inside the five-minute margin
    await client.fetch_changes(REPO, 9, installation_id=77)
    assert emulator.state.count_requests("github.access_token") == 2
    assert client.tokens_issued == 2

    # A token revoked before its expiry is answered 401: the client fetches a new one, once.
    for token in emulator.state.issued_tokens:
        installation, _ = emulator.state.issued_tokens[token]
        emulator.state.issued_tokens[token] = (installation, clock.now())
    await client.fetch_changes(REPO, 9, installation_id=77)
    assert client.tokens_issued == 3

    # Without an installation id the client asks GitHub which installation holds the repo.
    other = GitHubClient(
        session,
        base_url=emulator.github_url,
        app_id="4242",
        private_key=private_pem,
        clock=clock.now,
        sleep=clock.sleep,
    )
    assert await other.get_permission(REPO, "octocat") == "read"
    assert emulator.state.count_requests("github.installation", status=200) == 1


async def test_token_of_another_installation_sees_nothing(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
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
    emulator.state.register_app("1", public_pem)
    files = generate_file_changes(changed_lines=5, files=1)
    emulator.state.add_pull("github", REPO, 1, files=files, installation_id=5)
    emulator.state.add_pull("github", "other/repo", 1, files=files, installation_id=6)
    client = GitHubClient(
        session,
        base_url=emulator.github_url,
        app_id="1",
        private_key=private_pem,
        clock=clock.now,
        sleep=clock.sleep,
    )
    with pytest.raises(ForgeNotFound):
        await client.fetch_changes(REPO, 1, installation_id=6)


async def test_post_review_once_with_marker_and_a_retry_finds_it(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=30, files=2, seed=1)
    pull = emulator.state.add_pull("github", REPO, 11, files=files)
    client = make_client(emulator, session, clock)
    review = ReviewToPost(
        job_id=501,
        body="Two findings.",
        comments=(
            InlineComment(files[0].path, first_added_line(files[0]), "Possible None here."),
            InlineComment(files[1].path, first_added_line(files[1]), "Unbounded retry."),
        ),
        head_sha=pull.newest.head_sha,
    )

    posted = await client.post_review(REPO, 11, review)
    again = await client.post_review(REPO, 11, review)

    records = emulator.state.posted(kind="review", repo=REPO, number=11)
    assert len(records) == 1
    assert render_marker(501) in (records[0].body or "")
    assert find_marker(records[0].body) == 501
    assert records[0].data["event"] == "COMMENT"
    assert [(item["path"], item["line"], item["side"]) for item in records[0].data["comments"]] == [
        (item.path, item.line, "RIGHT") for item in review.comments
    ]
    assert posted.inline_posted == 2 and not posted.already_posted
    assert again.already_posted and again.id == posted.id
    found = await client.find_posted_review(REPO, 11, render_marker(501))
    assert found is not None and found.job_id == 501
    assert await client.find_posted_review(REPO, 11, render_marker(502)) is None


async def test_lost_answer_to_a_review_post_is_not_posted_twice(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=10, files=1, seed=2)
    emulator.state.add_pull("github", REPO, 12, files=files)
    emulator.state.add_fault("github.reviews.create", Fault.lost_response(502))
    client = make_client(emulator, session, clock)

    posted = await client.post_review(REPO, 12, ReviewToPost(job_id=9, body="Looks fine."))

    assert len(emulator.state.posted(kind="review", number=12)) == 1
    assert posted.job_id == 9
    assert emulator.state.count_requests("github.reviews.create") == 1


async def test_comment_outside_the_diff_falls_back_to_a_summary_listing_the_findings(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    files = generate_file_changes(changed_lines=12, files=1, seed=4)
    emulator.state.add_pull("github", REPO, 13, files=files)
    client = make_client(emulator, session, clock)
    outside = max(parse_diff_lines(files[0].patch).added) + 500
    review = ReviewToPost(
        job_id=77,
        body="Summary of the review.",
        comments=(InlineComment(files[0].path, outside, "This line is not in the diff."),),
    )

    posted = await client.post_review(REPO, 13, review)

    assert emulator.state.count_requests("github.reviews.create", status=422) == 1
    records = emulator.state.posted(kind="review", number=13)
    assert len(records) == 1
    assert records[0].data["comments"] == []
    body = records[0].body or ""
    assert f"`{files[0].path}` line {outside}" in body
    assert "could not be placed" in body
    assert find_marker(body) == 77
    assert posted.summary_only and posted.inline_rejected == 1


async def test_server_errors_are_retried_with_backoff(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 14, files=SMALL)
    emulator.state.add_fault("github.files", Fault.server_error(502), times=2)
    client = make_client(emulator, session, clock, retry=RetryPolicy(attempts=4, base_delay_s=2.0))

    changes = await client.fetch_changes(REPO, 14)

    assert len(changes.files) == 1
    assert clock.sleeps == [2.0, 4.0]
    assert emulator.state.count_requests("github.files", status=502) == 2


async def test_server_errors_give_up_after_the_last_attempt(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 15, files=SMALL)
    emulator.state.add_fault("github.pull", Fault.server_error(503), times=3)
    client = make_client(emulator, session, clock, retry=RetryPolicy(attempts=3, base_delay_s=1.0))

    with pytest.raises(ForgeError) as caught:
        await client.fetch_changes(REPO, 15)
    assert caught.value.status == 503 and caught.value.retryable
    assert clock.sleeps == [1.0, 2.0]


async def test_secondary_rate_limit_obeys_retry_after(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 16, files=SMALL)
    emulator.state.add_fault("github.reviews.create", Fault.secondary_rate_limit(retry_after=37))
    client = make_client(emulator, session, clock)

    posted = await client.post_review(REPO, 16, ReviewToPost(job_id=16, body="ok"))

    assert posted.job_id == 16
    assert 37.0 in clock.sleeps
    assert emulator.state.count_requests("github.reviews.create", status=403) == 1
    assert len(emulator.state.posted(kind="review", number=16)) == 1


async def test_too_many_requests_obeys_retry_after(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 17, files=SMALL)
    emulator.state.add_fault("github.comments.create", Fault.too_many_requests(retry_after=12))
    client = make_client(emulator, session, clock)

    comment_id = await client.post_comment(REPO, 17, "Queued at P2.")

    assert 12.0 in clock.sleeps
    records = emulator.state.posted(kind="issue_comment", number=17)
    assert [(item.body, item.data["id"]) for item in records] == [("Queued at P2.", comment_id)]


async def test_content_posts_are_spaced_a_second_apart(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 18, files=SMALL)
    client = make_client(emulator, session, clock)

    for index in range(3):
        await client.post_comment(REPO, 18, f"comment {index}")

    assert clock.sleeps == [1.0, 1.0]
    assert len(emulator.state.posted(kind="issue_comment", number=18)) == 3


async def test_slow_answer_times_out_and_is_retried(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 19, files=SMALL)
    emulator.state.add_fault("github.pull", Fault.slow(0.5))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.1)) as short:
        client = make_client(emulator, short, clock)
        changes = await client.fetch_changes(REPO, 19)
    assert len(changes.files) == 1
    assert clock.sleeps == [1.0]


async def test_reaction_and_permission(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 20, files=SMALL)
    comment_id = seed_issue_comment(
        emulator.state, REPO, 20, user="alice", body="/review priority p1"
    )
    emulator.state.set_permission(REPO, "alice", "maintain")
    emulator.state.set_permission(REPO, "bob", "triage")
    client = make_client(emulator, session, clock)

    await client.add_reaction(REPO, comment_id, "eyes")
    await client.add_reaction(REPO, comment_id, "eyes")  # GitHub keeps one per user and content

    reactions = emulator.state.posted(kind="reaction")
    assert [(item.body, item.data["comment_id"]) for item in reactions] == [("eyes", comment_id)]
    assert await client.get_permission(REPO, "alice") == "maintain"
    assert await client.get_permission(REPO, "bob") == "triage"
    assert await client.get_permission(REPO, "nobody-known") == "none"
    with pytest.raises(ForgeNotFound):
        await client.add_reaction(REPO, 999999, "+1")


async def test_bad_token_is_not_retried(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 21, files=SMALL)
    client = make_client(emulator, session, clock, token="wrong")
    with pytest.raises(ForgeError) as caught:
        await client.fetch_changes(REPO, 21)
    assert caught.value.status == 401
    assert clock.sleeps == []


async def test_exhausted_primary_rate_limit_waits_until_the_reset(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    emulator.state.add_pull("github", REPO, 22, files=SMALL)
    reset = int(clock.now().timestamp()) + 120
    limit_headers = {
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": str(reset),
    }
    exhausted = Fault(
        status=403, message="API rate limit exceeded for installation.", headers=limit_headers
    )
    emulator.state.add_fault("github.pull", exhausted)
    client = make_client(emulator, session, clock)

    changes = await client.fetch_changes(REPO, 22)

    assert len(changes.files) == 1
    assert clock.sleeps == [120.0]


def gidgethub_error(
    status: int, body: dict[str, object], **headers: str
) -> gidgethub.HTTPException:
    raw = json.dumps(body).encode()
    try:
        sansio.decipher_response(status, {"content-type": "application/json", **headers}, raw)
    except gidgethub.HTTPException as exc:
        return exc
    raise AssertionError("decipher_response accepted an error status")


def test_translate_github_error_maps_each_kind_once() -> None:
    now = datetime(2025, 3, 3, 10, 0, tzinfo=UTC)
    reset = str(int(now.timestamp()) + 30)
    primary = gidgethub_error(
        403,
        {"message": "API rate limit exceeded"},
        **{"x-ratelimit-limit": "60", "x-ratelimit-remaining": "0", "x-ratelimit-reset": reset},
    )
    assert isinstance(primary, gidgethub.RateLimitExceeded)
    cases = [
        (primary, ForgeError, 403, 30.0, True),
        (
            gidgethub_error(403, {"message": "You have exceeded a secondary rate limit"}),
            ForgeError,
            403,
            60.0,
            True,
        ),
        (
            gidgethub_error(403, {"message": "Resource not accessible by integration"}),
            ForgePermissionDenied,
            403,
            None,
            False,
        ),
        (
            gidgethub_error(429, {"message": "slow down"}, **{"retry-after": "7"}),
            ForgeError,
            429,
            7.0,
            True,
        ),
        (gidgethub_error(404, {"message": "Not Found"}), ForgeNotFound, 404, None, False),
        (
            gidgethub_error(422, {"message": "Unprocessable Entity", "errors": ["bad line"]}),
            ForgeError,
            422,
            None,
            False,
        ),
        (gidgethub_error(502, {"message": "Server Error"}), ForgeError, 502, None, True),
    ]
    for error, kind, status, retry_after, retryable in cases:
        translated = translate_github_error(error, now=now)
        assert type(translated) is kind, error
        assert (translated.status, translated.retry_after, translated.retryable) == (
            status,
            retry_after,
            retryable,
        ), error


def review_request_schema() -> dict[str, object]:
    spec = load_shared_json("openapi", "github-rest-subset.json")
    operation = spec["paths"]["/repos/{owner}/{repo}/pulls/{pull_number}/reviews"]["post"]
    schema: dict[str, object] = operation["requestBody"]["content"]["application/json"]["schema"]
    return schema


def sent_review(record: Record) -> dict[str, object]:
    """The create-a-review request the emulator accepted, as the bot sent it."""
    data = record.data
    return {
        "body": record.body,
        "event": data["event"],
        "commit_id": data["commit_id"],
        "comments": data["comments"],
    }


async def post_with_one_refused_comment(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> Record:
    """A review of three inline comments, one off the diff: the other two are posted and the
    refused one moves into the summary. The create-a-review request that was accepted."""
    files = generate_file_changes(changed_lines=12, files=2, seed=4)
    emulator.state.add_pull("github", REPO, 21, files=files)
    client = make_client(emulator, session, clock)
    outside = max(parse_diff_lines(files[1].patch).added) + 500
    review = ReviewToPost(
        job_id=78,
        body="Summary of the review.",
        comments=(
            InlineComment(files[0].path, first_added_line(files[0]), "Possible None here."),
            InlineComment(files[1].path, outside, "**Major:** This line is not in the diff."),
            InlineComment(files[1].path, first_added_line(files[1]), "Unbounded retry."),
        ),
    )

    posted = await client.post_review(REPO, 21, review)

    assert emulator.state.count_requests("github.reviews.create", status=422) == 1
    records = emulator.state.posted(kind="review", number=21)
    assert len(records) == 1
    assert [(c["path"], c["line"]) for c in records[0].data["comments"]] == [
        (files[0].path, first_added_line(files[0])),
        (files[1].path, first_added_line(files[1])),
    ]
    body = records[0].body or ""
    # The refused one moved into the summary with its file, line and text.
    assert f"`{files[1].path}` line {outside} (new): **Major:** This line is not in the diff." in (
        body
    )
    assert "Possible None here." not in body
    assert find_marker(body) == 78
    assert (posted.inline_posted, posted.inline_rejected, posted.summary_only) == (2, 1, False)
    assert posted.rejected == (1,)
    return records[0]


async def test_one_refused_comment_does_not_sink_the_others(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    await post_with_one_refused_comment(emulator, session, clock)


async def post_a_suggestion_on_a_range(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> Record:
    """A comment on a range of lines with a suggestion block is accepted as one GitHub
    suggestion. The create-a-review request that was accepted."""
    patch = "@@ -1,3 +1,4 @@\n import os\n-x = 1\n+x = 2\n+y = x / 0\n z = 3"
    files = [FileChange("calc.py", 2, 1, patch)]
    emulator.state.add_pull("github", REPO, 22, files=files)
    client = make_client(emulator, session, clock)
    review = ReviewToPost(
        job_id=79,
        body="Summary.",
        comments=(
            InlineComment(
                "calc.py", 3, "Division by zero.", start_line=2, suggestion="x = 2\ny = x / 1"
            ),
        ),
    )

    posted = await client.post_review(REPO, 22, review)

    assert (posted.inline_posted, posted.inline_rejected) == (1, 0)
    [comment] = emulator.state.posted(kind="review", number=22)[0].data["comments"]
    assert (comment["start_line"], comment["line"], comment["start_side"]) == (2, 3, "RIGHT")
    assert comment["body"] == "Division by zero.\n\n```suggestion\nx = 2\ny = x / 1\n```"
    return emulator.state.posted(kind="review", number=22)[0]


async def test_a_suggestion_block_on_a_range_is_accepted(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    await post_a_suggestion_on_a_range(emulator, session, clock)


async def test_the_reviews_the_client_sends_are_what_github_documents(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    """The requests of the two tests above, against GitHub's own API description."""
    schema = review_request_schema()
    for post in (post_with_one_refused_comment, post_a_suggestion_on_a_range):
        assert schema_errors(schema, sent_review(await post(emulator, session, clock))) == []


async def refuse_what_github_refuses(
    emulator: ForgeEmulator, session: aiohttp.ClientSession
) -> list[tuple[dict[str, object], Any]]:
    """Reviews GitHub refuses with 422 (a line off the diff, a left line not shown, a range
    backwards or across hunks) are refused and post nothing; a range in one hunk is taken.
    Each refused request with its answer."""
    patch = "@@ -1,2 +1,3 @@\n a\n+b\n c\n@@ -20,2 +21,3 @@\n d\n+e\n f"
    emulator.state.add_pull("github", REPO, 23, files=[FileChange("r.py", 2, 0, patch)])
    url = f"{emulator.github_url}/repos/{REPO}/pulls/23/reviews"

    def review(**comment: object) -> dict[str, object]:
        return {"body": "b", "event": "COMMENT", "comments": [{"path": "r.py", **comment}]}

    cases = [
        review(line=5, body="x"),  # not a line of the diff
        review(line=3, side="LEFT", body="x"),  # new line 3 exists, old line 3 is not shown
        review(line=2, start_line=3, body="x"),  # a range that ends before it starts
        review(line=22, start_line=2, body="x"),  # a range across two hunks
    ]
    refused = []
    for body in cases:
        status, answer, _ = await call(session, "POST", url, body=body)
        assert status == 422, body
        refused.append((body, answer))
    assert emulator.state.posted(kind="review", number=23) == []
    status, _, _ = await call(session, "POST", url, body=review(line=22, start_line=21, body="x"))
    assert status == 200
    return refused


async def test_the_emulator_refuses_what_github_refuses(
    emulator: ForgeEmulator, session: aiohttp.ClientSession
) -> None:
    await refuse_what_github_refuses(emulator, session)


async def test_the_emulator_refuses_what_github_refuses_in_githubs_shape(
    emulator: ForgeEmulator, session: aiohttp.ClientSession
) -> None:
    """The same refusals: each request is one GitHub documents, each 422 in GitHub's shape."""
    spec = load_shared_json("openapi", "github-rest-subset.json")
    operation = spec["paths"]["/repos/{owner}/{repo}/pulls/{pull_number}/reviews"]["post"]
    refused = operation["responses"]["422"]["content"]["application/json"]["schema"]
    for body, answer in await refuse_what_github_refuses(emulator, session):
        assert schema_errors(review_request_schema(), body) == []
        assert schema_errors(refused, answer) == [], answer
