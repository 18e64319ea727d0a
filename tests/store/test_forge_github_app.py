"""GitHub as an App: the installation named by the webhook is used; current API headers."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import aiohttp
import jwt
import pytest

from bot.clock import VirtualClock
from bot.components import local_write_budget
from bot.config import DEFAULT_POLICY_DIR
from bot.emulator import (
    EmulatorState,
    ForgeEmulator,
    build_github_pull_request_event,
    seed_issue_comment,
)
from bot.emulator.state import RequestLog
from bot.forges.base import RetryPolicy
from bot.forges.github import (
    GITHUB_ACCEPT,
    GITHUB_API_VERSION,
    GitHubClient,
    app_jwt_claims,
    clock_skew,
)
from bot.forges.registry import ForgeOptions, ForgeRegistry, build_forges
from bot.intake.normalize import normalize_delivery
from bot.intake.verify import Delivery
from bot.llm.simulated import SimulatedBackend
from bot.model import JobState, ReviewRequest
from bot.policy import evaluate, load_policy_book
from bot.queue.store import QueueStore
from bot.review.planner import claim_and_plan_jobs
from bot.review.poster import post_job_review
from tests.conftest import shared_dir
from tests.support.pipeline_helpers import APP_ID, SMELLY, forge_settings, run_all_chunks
from tests.support.webhook_fixtures import load_payload

pytestmark = pytest.mark.emulator(github_tokens=set(), gitlab_tokens=set(), github_app=True)

REPO = "acme/shop"


def app_client(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock, key: str
) -> GitHubClient:
    return GitHubClient(
        session,
        base_url=emulator.github_url,
        app_id=APP_ID,
        private_key=key,
        clock=clock.now,
        sleep=clock.sleep,
        retry=RetryPolicy(attempts=1),
        post_interval_s=0.0,
    )


def request_from_the_webhook(emulator: ForgeEmulator) -> ReviewRequest:
    """A `pull_request.opened` delivery (installation.id 1), pointed at a seeded PR."""
    fixture = load_payload("github/pull_request.opened.json").payload
    pull = emulator.state.get_pull("github", REPO, 7)
    payload = build_github_pull_request_event(
        fixture,
        repo=REPO,
        number=7,
        base_sha=pull.newest.base_sha,
        head_sha=pull.newest.head_sha,
        changed_files=1,
        additions=SMELLY.additions,
        deletions=SMELLY.deletions,
    )
    assert payload["installation"]["id"] == 1  # as delivered, not set by the test
    request = normalize_delivery(Delivery("github", "pull_request", "d-1", payload))
    assert isinstance(request, ReviewRequest)
    return request


async def test_the_installation_from_the_webhook_serves_planning_and_posting(
    store: QueueStore, emulator: ForgeEmulator, clock: VirtualClock, app_key: tuple[str, str]
) -> None:
    """Planned in one process and posted by a freshly started one: neither asks GitHub which
    installation holds the repository; the id the webhook carried is stored with the job."""
    emulator.state.add_pull("github", REPO, 7, files=[SMELLY], installation_id=1)
    emulator.state.installations["other/repo"] = 2
    request = request_from_the_webhook(emulator)
    book = load_policy_book(DEFAULT_POLICY_DIR)
    submitted = await store.submit_request(
        request, evaluate(book.policy_for(REPO), request), now=clock.now()
    )
    assert submitted.job_id is not None
    settings = forge_settings(
        emulator, github_token=None, github_app_id=APP_ID, github_private_key=app_key[0]
    )

    def started() -> ForgeRegistry:
        """The clients a freshly started process builds, its write budget its own."""
        return build_forges(
            settings,
            clock=clock.now,
            sleep=clock.sleep,
            options=ForgeOptions(retry=RetryPolicy(attempts=1)),
            budget=local_write_budget(
                settings, now=clock.now, sleep=clock.sleep, post_interval_s=0.0
            ),
        )

    async with started() as one:
        assert [o.result for o in await claim_and_plan_jobs(store, one, book, now=clock.now())] == [
            "planned"
        ]
    await run_all_chunks(store, SimulatedBackend(), clock)
    async with started() as two:
        outcome = await post_job_review(store, two, submitted.job_id, now=clock.now())
    assert outcome.result == "posted", outcome
    job = await store.get_job(submitted.job_id)
    assert job is not None and job.state == JobState.DONE
    assert emulator.state.count_requests("github.installation") == 0
    assert {installation for installation, _ in emulator.state.issued_tokens.values()} == {1}
    assert len(emulator.state.posted(kind="review", repo=REPO, number=7)) == 1


async def test_without_an_installation_id_github_is_asked_once_per_repository(
    emulator: ForgeEmulator, clock: VirtualClock, app_key: tuple[str, str]
) -> None:
    emulator.state.add_pull("github", REPO, 7, files=[SMELLY], installation_id=3)
    async with aiohttp.ClientSession() as session:
        client = app_client(emulator, session, clock, app_key[0])
        client.use_installation(REPO, None)  # a comment delivered without `installation`
        assert await client.get_permission(REPO, "octocat") == "read"
        await client.post_comment(REPO, 7, "hello")
    assert emulator.state.count_requests("github.installation", status=200) == 1
    assert {installation for installation, _ in emulator.state.issued_tokens.values()} == {3}


async def requests_of_a_round(
    emulator: ForgeEmulator, clock: VirtualClock, app_key: tuple[str, str]
) -> list[RequestLog]:
    """What the App client sends GitHub for one of each call it makes, as the emulator saw it."""
    emulator.state.add_pull("github", REPO, 7, files=[SMELLY], installation_id=1)
    comment = seed_issue_comment(emulator.state, REPO, 7, user="octocat", body="/review status")
    async with aiohttp.ClientSession() as session:
        client = app_client(emulator, session, clock, app_key[0])
        client.use_installation(REPO, 1)
        await client.fetch_changes(REPO, 7)
        await client.post_comment(REPO, 7, "hello")
        await client.add_reaction(REPO, comment, "eyes")
        await client.get_permission(REPO, "octocat")
        await client.find_posted_review(REPO, 7, "<!-- none -->")
        assert await client.find_comment(REPO, 7, "<!-- none -->") is None
    return list(emulator.state.requests)


async def test_every_request_sends_the_current_media_type_and_api_version(
    emulator: ForgeEmulator, clock: VirtualClock, app_key: tuple[str, str]
) -> None:
    sent = await requests_of_a_round(emulator, clock, app_key)
    assert {entry.route for entry in sent} >= {
        "github.access_token",
        "github.pull",
        "github.files",
        "github.comments.create",
        "github.comments.list",
        "github.reactions.create",
        "github.permission",
        "github.reviews.list",
    }
    assert {(entry.accept, entry.api_version) for entry in sent} == {
        (GITHUB_ACCEPT, GITHUB_API_VERSION)
    }
    assert all(entry.status < 400 for entry in sent)


async def test_every_request_is_an_operation_github_documents(
    emulator: ForgeEmulator, clock: VirtualClock, app_key: tuple[str, str]
) -> None:
    """The same round, against GitHub's own API description (../shared/openapi)."""
    spec = json.loads((shared_dir() / "openapi" / "github-rest-subset.json").read_text())
    sent = await requests_of_a_round(emulator, clock, app_key)
    documented = [
        (method.upper(), re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"))
        for path, operations in spec["paths"].items()
        for method in operations
    ]
    undocumented = {
        (entry.method, entry.path)
        for entry in sent
        if not any(m == entry.method and p.match(entry.path) for m, p in documented)
    }
    assert undocumented == set()


async def test_the_emulator_refuses_an_api_version_github_does_not_serve(
    emulator: ForgeEmulator,
) -> None:
    emulator.state.add_pull("github", REPO, 7, files=[SMELLY])
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{emulator.github_url}/repos/{REPO}/pulls/7",
            headers={"X-GitHub-Api-Version": "2011-01-01", "Accept": GITHUB_ACCEPT},
        ) as answer,
    ):
        assert answer.status == 400
        assert "2011-01-01" in (await answer.json())["message"]


async def test_a_bot_clock_90_s_ahead_of_github_is_corrected_from_its_date(
    clock: VirtualClock, app_key: tuple[str, str]
) -> None:
    """GitHub 90 s behind the bot: a JWT issued at the bot's time is in GitHub's future and
    refused. The 401's `Date` explains it: the client takes GitHub's time, tries once more, and
    every later JWT (a token refresh an hour on) is issued at GitHub's time at once."""
    state = EmulatorState(clock=lambda: clock.now() - timedelta(seconds=90))
    state.register_app(APP_ID, app_key[1])
    state.add_pull("github", REPO, 7, files=[SMELLY], installation_id=1)
    comment = seed_issue_comment(state, REPO, 7, user="octocat", body="/review status")
    async with ForgeEmulator(state) as emulator, aiohttp.ClientSession() as session:
        # The failure is real: the bot's own time gives a JWT GitHub refuses.
        claims = app_jwt_claims(APP_ID, github_now=clock.now())
        token = jwt.encode(claims, app_key[0], algorithm="RS256")
        async with session.post(
            f"{emulator.github_url}/app/installations/1/access_tokens",
            headers={"Authorization": f"Bearer {token}", "Accept": GITHUB_ACCEPT},
        ) as refused:
            assert refused.status == 401
            assert "'Issued at' claim" in (await refused.json())["message"]
            skew = clock_skew(refused.headers["Date"], now=clock.now())
            assert skew is not None and -91 <= skew.total_seconds() <= -89

        client = app_client(emulator, session, clock, app_key[0])
        client.use_installation(REPO, 1)
        await client.add_reaction(REPO, comment, "eyes")
        await client.post_comment(REPO, 7, "the reply")
        assert -91 <= client.clock_offset.total_seconds() <= -89
        exchanges = [
            entry.status for entry in state.requests if entry.route == "github.access_token"
        ]
        assert exchanges == [401, 401, 201]  # the probe above, the client's first try, its retry
        clock.advance(3600)  # the token expires: a new one, at GitHub's time from the start
        await client.post_comment(REPO, 7, "later")
        exchanges = [
            entry.status for entry in state.requests if entry.route == "github.access_token"
        ]
        assert exchanges == [401, 401, 201, 201]
    assert [record.body for record in state.posted(kind="reaction", repo=REPO)] == ["eyes"]
    assert [record.body for record in state.posted(kind="issue_comment", repo=REPO, number=7)] == [
        "the reply",
        "later",
    ]
