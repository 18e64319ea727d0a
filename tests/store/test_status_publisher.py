"""Statuses on the forge end to end: real PostgreSQL, the real clients, the emulator."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text

from bot.clock import VirtualClock
from bot.emulator import Fault, ForgeEmulator, generate_file_changes
from bot.errors import ForgeError
from bot.forges.base import RetryPolicy, always_held, guarded_writes
from bot.forges.github import GitHubClient
from bot.forges.gitlab import GitLabClient
from bot.forges.statuses import StatusUpdate
from bot.model import LEVELS, JobState, Level
from bot.queue.store import QueueStore
from bot.sched.mlfq import MlfqSettings, ServiceEstimator
from bot.status.decide import PublishRules
from bot.status.eta import Capacity
from bot.status.publisher import StatusPublisher, StatusSettings
from tests.support.factories import decide, plans
from tests.support.openapi import load_shared_json, response_schema, schema_errors
from tests.support.pipeline_helpers import APP_ID, GITHUB_TOKEN, GITLAB_TOKEN, request_for
from tests.support.serving import wait_until
from tests.support.statuses import app_client, publisher

pytestmark = pytest.mark.emulator(github_app=True)

REPO = "acme/shop"
GITLAB_REPO = "acme/platform/api"
FILES = generate_file_changes(changed_lines=40, files=2, seed=4)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


def token_client(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> GitHubClient:
    return GitHubClient(session, base_url=emulator.github_url, token=GITHUB_TOKEN,
                        clock=clock.now, sleep=clock.sleep, post_interval_s=0.0)  # fmt: skip


def gitlab_client(emulator: ForgeEmulator, clock: VirtualClock) -> GitLabClient:
    return GitLabClient(url=emulator.gitlab_url, token=GITLAB_TOKEN, clock=clock.now,
                        sleep=clock.sleep, timeout_s=5.0)  # fmt: skip


async def queue_burst(
    store: QueueStore,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    burst: int,
) -> GitHubClient:
    """`burst` GitHub PRs queued at once; the token client that writes their statuses, paced
    like any content-creating call (one a second)."""
    for number in range(1, burst + 1):
        pull = emulator.state.add_pull("github", REPO, number, files=FILES)
        await queue_job(store, clock, pull, 40)
    return GitHubClient(session, base_url=emulator.github_url, token=GITHUB_TOKEN,
                        clock=clock.now, sleep=clock.sleep, post_interval_s=1.0)  # fmt: skip


async def queue_job(store: QueueStore, clock: VirtualClock, pull: Any, *lines: int) -> int:
    submitted = await store.submit_request(request_for(pull), decide(), now=clock.now())
    assert submitted.job_id is not None
    await store.plan_job(submitted.job_id, plans(*lines), now=clock.now(), rank=[10.0] * len(lines))
    return submitted.job_id


async def run_job(store: QueueStore, clock: VirtualClock, review: dict[str, Any]) -> None:
    """Lease, finish and post (record) every chunk of the queue's job."""
    while True:
        leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
        if leased is None:
            return
        clock.advance(12)
        outcome = await store.finish_chunk(
            leased.chunk.id, owner="w", now=clock.now(), gpu_seconds=12.0, result={}
        )
        if outcome.job_complete:
            await store.finish_job(outcome.job_id, now=clock.now(), review=review)


def check_runs(emulator: ForgeEmulator) -> list[dict[str, Any]]:
    return [r.data["request"] for r in emulator.state.posted(forge="github", kind="check_run")]


async def check_run_round(
    store: QueueStore,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    app_key: tuple[str, str],
) -> list[dict[str, Any]]:
    """A job queued, run and finished with the App's check run published along: one check run
    goes queued, in progress, completed, updated in place. The requests that wrote it."""
    pull = emulator.state.add_pull("github", REPO, 3, files=FILES, installation_id=1)
    job_id = await queue_job(store, clock, pull, 40)
    statuses = publisher(store, {"github": app_client(emulator, session, clock, app_key[0])}, clock)

    first = await statuses.publish_once(clock.now())
    assert (first.written, first.reasons["first"]) == (1, 1)
    assert (await statuses.publish_once(clock.now())).written == 0  # nothing moved
    [created] = check_runs(emulator)
    assert created["name"] == "review-bot" and created["head_sha"] == pull.newest.head_sha
    assert created["status"] == "queued" and created["external_id"] == str(job_id)
    assert created["output"]["title"].startswith("P1 · 1st in line · review in about ")
    assert "**Why P1:** ordinary pull request." in created["output"]["summary"]

    leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
    assert leased is not None
    clock.advance(2)
    assert (await statuses.publish_once(clock.now())).reasons["state"] == 1
    clock.advance(10)
    await store.finish_chunk(leased.chunk.id, owner="w", now=clock.now(), gpu_seconds=12.0,
                             result={})  # fmt: skip
    review = {"counts": {"major": 1, "minor": 2}, "url": "https://github.com/acme/shop/pull/3#r",
              "summary": "Reviewed 2 files."}  # fmt: skip
    await store.finish_job(job_id, now=clock.now(), review=review)
    assert (await statuses.publish_once(clock.now())).reasons["state"] == 1
    clock.advance(1800)  # (within the installation token's hour)
    assert (await statuses.publish_once(clock.now())).written == 0  # completed is final

    requests = check_runs(emulator)
    assert [r.get("status") for r in requests] == ["queued", "in_progress", "completed"]
    # The prior expects 3 + 10 + 0.1 * 40 = 17 s for the call, 2 s of which have passed.
    assert requests[1]["output"]["title"] == "P1 · 0 of 1 parts done · review in about 15 s"
    assert requests[2]["conclusion"] == "neutral"  # a major finding, neutral at major
    assert requests[2]["output"]["title"] == "Reviewed: 3 findings (1 major, 2 minor)"
    assert requests[2]["details_url"] == review["url"]
    assert len(emulator.state.check_runs) == 1
    return requests


async def test_github_app_check_run_goes_queued_in_progress_completed(
    store: QueueStore,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    app_key: tuple[str, str],
) -> None:
    await check_run_round(store, emulator, session, clock, app_key)


async def test_github_app_check_runs_are_what_github_documents(
    store: QueueStore,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    app_key: tuple[str, str],
) -> None:
    """The same round: what was sent and answered is what GitHub's API description documents."""
    spec = load_shared_json("openapi", "github-rest-subset.json")
    requests = await check_run_round(store, emulator, session, clock, app_key)
    run_id = next(iter(emulator.state.check_runs))
    body_schemas = {
        "post": spec["paths"]["/repos/{owner}/{repo}/check-runs"]["post"],
        "patch": spec["paths"]["/repos/{owner}/{repo}/check-runs/{check_run_id}"]["patch"],
    }
    for index, request in enumerate(requests):
        operation = body_schemas["post" if index == 0 else "patch"]
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert schema_errors(schema, request) == []
        for key in ("status", "conclusion"):
            if key in request:
                assert request[key] in schema["properties"][key]["enum"]
    async with session.get(
        f"{emulator.github_url}/repos/{REPO}/check-runs/{run_id}",
        headers={"Authorization": f"token {next(iter(emulator.state.issued_tokens))}"},
    ) as answer:
        body = await answer.json()
    template = "/repos/{owner}/{repo}/check-runs/{check_run_id}"
    assert schema_errors(response_schema(spec, "GET", template, 200), body) == []
    assert (body["status"], body["conclusion"]) == ("completed", "neutral")


async def test_a_clean_review_succeeds_and_a_superseded_one_is_skipped(
    store: QueueStore,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    app_key: tuple[str, str],
) -> None:
    pull = emulator.state.add_pull("github", REPO, 4, files=FILES, installation_id=1)
    old_job = await queue_job(store, clock, pull, 40)
    statuses = publisher(store, {"github": app_client(emulator, session, clock, app_key[0])}, clock)
    await statuses.publish_once(clock.now())
    emulator.state.push("github", REPO, 4)
    new_job = await queue_job(store, clock, pull, 40)  # supersedes the old one
    assert (await store.get_job(old_job)).state == JobState.SUPERSEDED  # type: ignore[union-attr]
    result = await statuses.publish_once(clock.now())
    assert (result.reasons["state"], result.reasons["first"]) == (1, 1)
    await run_job(store, clock, {"counts": {"minor": 1}, "url": "https://example.test/r"})
    clock.advance(1)
    await statuses.publish_once(clock.now())
    runs = {run["external_id"]: run for run in emulator.state.check_runs.values()}
    assert runs[str(old_job)]["conclusion"] == "skipped"
    assert runs[str(old_job)]["output"]["title"].startswith("Not reviewed")
    assert runs[str(new_job)]["conclusion"] == "success"  # only a minor finding


async def test_a_plain_token_writes_commit_statuses(
    store: QueueStore, emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    pull = emulator.state.add_pull("github", REPO, 5, files=FILES)
    await queue_job(store, clock, pull, 40)
    statuses = publisher(store, {"github": token_client(emulator, session, clock)}, clock)
    await statuses.publish_once(clock.now())
    await run_job(store, clock, {"counts": {}, "url": "https://example.test/r"})
    await statuses.publish_once(clock.now())
    written = [r.data for r in emulator.state.posted(forge="github", kind="commit_status")]
    assert [item["state"] for item in written] == ["pending", "success"]
    assert {item["context"] for item in written} == {"review-bot"}
    assert written[0]["description"].startswith("P1 · 1st in line · review in about ")
    assert written[1]["description"] == "Reviewed: no findings"
    assert all(len(item["description"]) <= 140 for item in written)
    assert emulator.state.check_runs == {}


async def test_gitlab_status_goes_pending_then_failed_on_a_critical_finding(
    store: QueueStore, emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    pull = emulator.state.add_pull("gitlab", GITLAB_REPO, 6, files=FILES)
    client = gitlab_client(emulator, clock)
    statuses = publisher(store, {"gitlab": client}, clock)
    await queue_job(store, clock, pull, 40)
    await statuses.publish_once(clock.now())
    clock.advance(120)  # long enough for a move to count, but GitLab gets states only
    await statuses.publish_once(clock.now())
    await run_job(store, clock, {"counts": {"critical": 1}, "url": "https://example.test/r"})
    await statuses.publish_once(clock.now())
    written = [r.data for r in emulator.state.posted(forge="gitlab", kind="commit_status")]
    # The job ended between two passes: pending -> failed is a transition GitLab allows (one
    # write, not two); a critical finding is never green.
    assert [item["status"] for item in written] == ["pending", "failed"]
    assert written[0]["description"].startswith("P1 · 1st in line · review in about ")
    assert written[1]["description"] == "Reviewed: 1 finding (1 critical)"
    assert {item["name"] for item in written} == {"review-bot"}
    assert emulator.state.refused_transitions == []

    # GitLab refuses what its state machine does not allow (running -> running, running ->
    # pending); the emulator enforces it and the client says so.
    other = emulator.state.add_pull("gitlab", GITLAB_REPO, 16, files=FILES)
    update = StatusUpdate(repo=GITLAB_REPO, head_sha=other.newest.head_sha, job_id=1,
                          state="in_progress", title="t", summary="s", description="d",
                          project_id=other.project_id)  # fmt: skip
    await client.publish_status(update)
    for state in ("in_progress", "queued"):
        with pytest.raises(ForgeError) as refused:
            await client.publish_status(replace(update, state=state))  # type: ignore[arg-type]
        assert refused.value.status == 400 and "Cannot transition status" in str(refused.value)
    assert [(was, to) for _, _, was, to in emulator.state.refused_transitions] == [
        ("running", "running"),
        ("running", "pending"),
    ]
    # A finished status is followed by a new one: pending is allowed again.
    await client.publish_status(replace(update, state="completed", conclusion="success"))
    await client.publish_status(replace(update, state="queued"))


async def test_failed_writes_never_stop_the_review_and_are_tried_again(
    store: QueueStore,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    app_key: tuple[str, str],
) -> None:
    pull = emulator.state.add_pull("github", REPO, 7, files=FILES, installation_id=1)
    client = GitHubClient(session, base_url=emulator.github_url, app_id=APP_ID,
                          private_key=app_key[0], clock=clock.now, sleep=clock.sleep,
                          post_interval_s=0.0, retry=RetryPolicy(attempts=1))  # fmt: skip
    statuses = publisher(store, {"github": client}, clock)
    await queue_job(store, clock, pull, 40)
    emulator.state.add_fault("github.check_runs.create", Fault.server_error(502))
    failed = await statuses.publish_once(clock.now())
    assert (failed.written, failed.failed) == (0, 1)
    retried = await statuses.publish_once(clock.now())
    assert (retried.written, retried.reasons["first"]) == (1, 1)

    # A refusal for lack of rights mutes the repository for a while instead of retrying.
    other = emulator.state.add_pull("github", "acme/locked", 1, files=FILES, installation_id=1)
    await queue_job(store, clock, other, 40)
    emulator.state.add_fault(
        "github.check_runs.create",
        Fault(status=403, message="Resource not accessible by integration"),
    )
    refused = await statuses.publish_once(clock.now())
    assert refused.failed == 1
    assert (await statuses.publish_once(clock.now())).failed == 0
    assert emulator.state.count_requests("github.check_runs.create", status=403) == 1


async def test_a_burst_of_a_thousand_reviews_writes_a_status_each_plus_state_changes(
    store: QueueStore, emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    """1,000 reviews queued at once, drained over 60 passes 20 s apart: the statuses stay
    within GitHub's secondary limits (80 content-creating requests a minute, 500 an hour, a
    second apart), final states go out before more first statuses, never two writes for one
    review within a minute unless its state changed."""
    burst = 1000
    client = await queue_burst(store, emulator, session, clock, burst)
    statuses = publisher(store, {"github": client}, clock)
    review = {"counts": {}, "url": "https://example.test/r"}
    # The queue drains at the pace the ETA was given for (two slots, 17 s a review by the
    # estimator's prior), in the virtual time the passes and the writes' pacing take.
    owed, last = 0.0, clock.now()
    for _ in range(60):
        await statuses.publish_once(clock.now())
        clock.advance(20)
        owed += (clock.now() - last).total_seconds() / (17.0 / 2)
        last = clock.now()
        while owed >= 1:
            owed -= 1
            leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
            if leased is None:
                break
            outcome = await store.finish_chunk(
                leased.chunk.id, owner="w", now=clock.now(), gpu_seconds=17.0, result={}
            )
            assert outcome.job_complete
            await store.finish_job(outcome.job_id, now=clock.now(), review=review)
    await statuses.publish_once(clock.now())

    jobs = await store.list_jobs(limit=2 * burst)
    finished = {job.head_sha for job in jobs if job.state == JobState.DONE}
    assert 100 <= len(finished) < burst  # some ended, most still waited when the passes stopped
    writes = [s for s in emulator.state.commit_statuses if s["_forge"] == "github"]
    stamps = sorted(datetime.fromisoformat(s["created_at"].replace("Z", "+00:00")) for s in writes)
    assert all((b - a).total_seconds() >= 1 for a, b in itertools.pairwise(stamps))
    for index, stamp in enumerate(stamps):
        in_minute = sum(1 for other in stamps[index:] if other - stamp < timedelta(minutes=1))
        in_hour = sum(1 for other in stamps[index:] if other - stamp < timedelta(hours=1))
        assert in_minute <= 80 and in_hour <= 500
    assert emulator.state.count_requests("github.statuses.create", status=403) == 0
    # The budget binds: 1,000 first statuses do not fit in an hour's 500 writes. Every
    # finished review's final state went out, and first statuses with what they may spend.
    done = {s["sha"] for s in writes if s["state"] == "success"}
    assert done == finished
    # First statuses leave the hour's room to the final states and reviews that come later.
    first = len({s["sha"] for s in writes if s["state"] == "pending"})
    assert 100 <= first <= 500 * (1 - 0.45), first
    print(f"{burst} queued, {len(finished)} finished: {len(writes)} status writes")
    by_sha: dict[str, list[dict[str, Any]]] = {}
    for write in writes:
        by_sha.setdefault(write["sha"], []).append(write)
    for sha_writes in by_sha.values():
        for before, after in itertools.pairwise(sha_writes):
            if before["state"] == after["state"] and after["state"] == "pending":
                gap = datetime.fromisoformat(after["created_at"].replace("Z", "+00:00")) - (
                    datetime.fromisoformat(before["created_at"].replace("Z", "+00:00"))
                )
                # Same state: only a level change or a quarter's move, at most once a minute
                # (a start of review is a state change with the same GitHub state).
                assert gap.total_seconds() >= 60 or after["description"].startswith("P1 · 0 of")


async def test_a_slow_morning_keeps_eta_news_within_the_hourly_budget(
    store: QueueStore, emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    """300 reviews queued while the engines run 40 times slower than the ETA's estimate, so
    every ETA keeps slipping: each review gets its first status as the write budget's share
    for first statuses allows (44 of GitHub's 80 a minute), and the news (moved ETAs) never
    passes the hourly budget; the rest waits for the next hour."""
    burst, budget = 300, 50
    client = await queue_burst(store, emulator, session, clock, burst)
    statuses = publisher(store, {"github": client}, clock, PublishRules(updates_per_hour=budget))
    news: list[datetime] = []
    deferred = firsts = 0
    for _ in range(150):  # two and a half hours, a pass a minute; nothing finishes
        now = clock.now()
        result = await statuses.publish_once(now)
        assert result.reasons["first"] <= 80 * (1 - 0.45)
        firsts += result.reasons["first"]
        news += [now] * sum(n for reason, n in result.reasons.items() if reason != "first")
        deferred += result.deferred
        clock.advance(60)

    for at in news:  # no rolling hour holds more than the budget
        assert sum(1 for other in news if at <= other < at + timedelta(hours=1)) <= budget
    # The budget is spent, not hoarded, and more was due than it allows.
    assert firsts == burst
    assert len(news) >= 2 * budget
    assert deferred > 0
    writes = [s for s in emulator.state.commit_statuses if s["_forge"] == "github"]
    assert len(writes) == burst + len(news)
    print(f"{burst} queued, nothing finished: {len(news)} ETA updates, {deferred} held back")


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_a_review_that_ends_between_two_passes_still_gets_its_status(
    store: QueueStore,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    app_key: tuple[str, str],
    forge: str,
) -> None:
    """Queued, reviewed and posted before any pass looked: the end of the job owes its status
    (the trigger's outbox), and the one write is the final one."""
    repo = REPO if forge == "github" else GITLAB_REPO
    pull = emulator.state.add_pull(forge, repo, 8, files=FILES, installation_id=1)  # type: ignore[arg-type]
    client: Any = (
        app_client(emulator, session, clock, app_key[0])
        if forge == "github"
        else gitlab_client(emulator, clock)
    )
    statuses = publisher(store, {forge: client}, clock)
    job_id = await queue_job(store, clock, pull, 40)
    await run_job(store, clock, {"counts": {"minor": 1}, "url": "https://example.test/r"})
    result = await statuses.publish_once(clock.now())
    assert (result.written, result.reasons["first"]) == (1, 1)
    if forge == "github":
        [run] = emulator.state.check_runs.values()
        assert (run["external_id"], run["status"], run["conclusion"]) == (
            str(job_id), "completed", "success")  # fmt: skip
    else:
        written = [r.data for r in emulator.state.posted(forge="gitlab", kind="commit_status")]
        assert [item["status"] for item in written] == ["success"]
    async with store.engine.connect() as conn:
        assert await conn.scalar(text("SELECT count(*) FROM status_outbox")) == 0
    assert (await statuses.publish_once(clock.now())).written == 0


async def test_the_publisher_wakes_when_a_job_changes_state_not_on_a_timer(
    store: QueueStore,
    db_url: str,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
) -> None:
    """An hour between passes for news: every state change still shows at once (NOTIFY from
    the trigger on review_jobs)."""
    statuses = StatusPublisher(
        store.status,
        {"github": token_client(emulator, session, clock)},
        clock=clock,
        capacity=Capacity(slots=2, mlfq=MlfqSettings(reserved_slots=0)),
        estimator=ServiceEstimator.with_prior,
        settings=StatusSettings(interval_s=3600.0),
    )
    stop = asyncio.Event()
    running = asyncio.create_task(statuses.run(stop, database_url=db_url))

    def states() -> list[str]:
        return [
            r.data["state"] for r in emulator.state.posted(forge="github", kind="commit_status")
        ]

    async def written(count: int) -> bool:
        return len(states()) >= count

    try:
        pull = emulator.state.add_pull("github", REPO, 9, files=FILES)
        await queue_job(store, clock, pull, 40)
        # Bounds for a loaded machine: the interval (an hour of virtual time) never passes, so
        # only the trigger's NOTIFY can bring either write.
        await wait_until(lambda: written(1), timeout_s=30, what="the queued status")
        await run_job(store, clock, {"counts": {"major": 1}, "url": "https://example.test/r"})
        await wait_until(lambda: written(2), timeout_s=30, what="the final status")
    finally:
        stop.set()
        await running
    assert states()[0] == "pending" and states()[-1] == "failure"


class _StallsAfterFirstWrite:
    """A status writer whose first write reaches the forge and whose answer then waits (the
    publisher is paused with the call on the wire) until `resume` is set."""

    def __init__(self, inner: GitHubClient) -> None:
        self.inner = inner
        self.stalled = asyncio.Event()
        self.resume = asyncio.Event()

    async def publish_status(self, update: StatusUpdate) -> Any:
        written = await self.inner.publish_status(update)
        if not self.stalled.is_set():
            self.stalled.set()
            await self.resume.wait()
        return written


async def test_a_publisher_resuming_after_a_takeover_writes_and_records_nothing(
    store: QueueStore, emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    first, second = (emulator.state.add_pull("github", REPO, n, files=FILES) for n in (21, 22))
    stale_job = await queue_job(store, clock, first, 40)
    other_job = await queue_job(store, clock, second, 40)
    stalling = _StallsAfterFirstWrite(token_client(emulator, session, clock))
    stale = publisher(store, {"github": stalling}, clock)
    fresh = publisher(store, {"github": token_client(emulator, session, clock)}, clock)
    paused = asyncio.create_task(stale.publish_once(clock.now()))
    await wait_until(
        lambda: _is_set(stalling.stalled), timeout_s=10, what="the stale write on the wire"
    )
    # The lease runs out while the stale publisher waits; another takes over, and both reviews
    # end before the stale one resumes.
    clock.advance(stale.settings.lease_s + 1)
    assert (await fresh.publish_once(clock.now())).written == 2
    await run_job(store, clock, {"counts": {}, "url": "https://example.test/r"})
    await run_job(store, clock, {"counts": {}, "url": "https://example.test/r"})
    assert (await fresh.publish_once(clock.now())).written == 2
    stalling.resume.set()
    resumed = await paused
    assert resumed.written == 1  # the write that was on the wire; nothing after it
    # The stale pass cannot tell whether the forge took its write before the new leader's or
    # after: it asks the leader to write the ended job's final status over it, which costs one
    # write more here, where it landed first.
    assert (await fresh.publish_once(clock.now())).written == 1
    written = [r.data for r in emulator.state.posted(forge="github", kind="commit_status")]
    # Each job's statuses end completed; the stale pass wrote nothing about the second job.
    assert [item["state"] for item in written] == ["pending", "pending", "pending", "success",
                                                   "success", "success"]  # fmt: skip
    assert written[-1]["url"].endswith(first.newest.head_sha)
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(text("SELECT job_id, state, writes FROM status_reports ORDER BY 1"))
        ).all()
    assert [tuple(row) for row in rows] == [
        (stale_job, "completed", 3),
        (other_job, "completed", 2),
    ]


async def test_a_final_status_written_as_the_lease_is_taken_over_stays_owed_to_the_new_leader(
    store: QueueStore, emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    """The stale publisher's final write reaches the forge just as its lease is taken over, and
    the new leader's first try at it fails: the job stays owed until the new leader has written
    and recorded its final status (the stale pass's record is fenced, so it settles nothing)."""
    pull = emulator.state.add_pull("github", REPO, 23, files=FILES)
    job = await queue_job(store, clock, pull, 40)
    await run_job(store, clock, {"counts": {}, "url": "https://example.test/r"})
    stalling = _StallsAfterFirstWrite(token_client(emulator, session, clock))
    stale = publisher(store, {"github": stalling}, clock)
    once = GitHubClient(session, base_url=emulator.github_url, token=GITHUB_TOKEN, clock=clock.now,
                        sleep=clock.sleep, post_interval_s=0.0,
                        retry=RetryPolicy(attempts=1))  # fmt: skip
    fresh = publisher(store, {"github": once}, clock)
    paused = asyncio.create_task(stale.publish_once(clock.now()))
    await wait_until(
        lambda: _is_set(stalling.stalled), timeout_s=10, what="the stale write on the wire"
    )
    clock.advance(stale.settings.lease_s + 1)
    emulator.state.add_fault("github.statuses.create", Fault.server_error(502), times=1)
    assert (await fresh.publish_once(clock.now())).failed == 1
    stalling.resume.set()
    assert (await paused).written == 1  # the forge took it; its record is fenced
    async with store.engine.connect() as conn:
        owed = (await conn.execute(text("SELECT job_id FROM status_outbox"))).scalars().all()
    assert owed == [job]
    assert (await fresh.publish_once(clock.now())).written == 1
    async with store.engine.connect() as conn:
        owed = (await conn.execute(text("SELECT job_id FROM status_outbox"))).scalars().all()
        rows = (await conn.execute(text("SELECT job_id, state FROM status_reports"))).all()
    assert owed == [] and [tuple(row) for row in rows] == [(job, "completed")]


async def _is_set(event: asyncio.Event) -> bool:
    return event.is_set()


class _ChecksThenStalls:
    """A status writer paused between its lease check and its request: the first request
    waits until `resume` is set, then goes out whatever the lease says (no forge has
    conditional writes)."""

    def __init__(self, inner: GitHubClient) -> None:
        self.inner = inner
        self.stalled = asyncio.Event()
        self.resume = asyncio.Event()

    async def publish_status(self, update: StatusUpdate) -> Any:
        if not self.stalled.is_set():
            self.stalled.set()
            await self.resume.wait()
            with guarded_writes(always_held):  # its check before the request passed already
                return await self.inner.publish_status(update)
        return await self.inner.publish_status(update)


async def test_a_stale_status_landing_after_the_final_one_is_written_over(
    store: QueueStore, emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    """A paused publisher's "pending" reaches the forge after the new leader wrote the job's
    final status: the stale process notes it, and the leader writes the final status again, so
    the head does not stay shown as waiting for a review that is done."""
    pull = emulator.state.add_pull("github", REPO, 24, files=FILES)
    job = await queue_job(store, clock, pull, 40)
    stalling = _ChecksThenStalls(token_client(emulator, session, clock))
    stale = publisher(store, {"github": stalling}, clock)
    fresh = publisher(store, {"github": token_client(emulator, session, clock)}, clock)
    paused = asyncio.create_task(stale.publish_once(clock.now()))
    await wait_until(lambda: _is_set(stalling.stalled), timeout_s=10, what="the stale check")
    clock.advance(stale.settings.lease_s + 1)
    await run_job(store, clock, {"counts": {}, "url": "https://example.test/r"})
    assert (await fresh.publish_once(clock.now())).written == 1

    def states() -> list[str]:
        head = pull.newest.head_sha
        return [item["state"] for item in emulator.state.commit_statuses if item["sha"] == head]

    assert states() == ["success"]
    stalling.resume.set()
    assert (await paused).written == 1  # the forge took it; its record is fenced
    assert states() == ["success", "pending"]
    async with store.engine.connect() as conn:
        owed = (await conn.execute(text("SELECT job_id FROM status_outbox"))).scalars().all()
    assert owed == [job]
    assert (await fresh.publish_once(clock.now())).written == 1
    assert states() == ["success", "pending", "success"]
    async with store.engine.connect() as conn:
        owed = (await conn.execute(text("SELECT job_id FROM status_outbox"))).scalars().all()
        rows = (await conn.execute(text("SELECT job_id, state FROM status_reports"))).all()
    assert owed == [] and [tuple(row) for row in rows] == [(job, "completed")]


async def test_an_eta_that_keeps_running_long_learns_from_its_misses(
    store: QueueStore, emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock
) -> None:
    """Low load, reviews quicker than the estimator's prior says (17 s said, 7.5 s taken): after
    twenty of them the ETA a new review is shown is about what they take."""
    client = token_client(emulator, session, clock)
    statuses = publisher(store, {"github": client}, clock)

    def eta_of(head: str) -> str:
        [first] = [item for item in emulator.state.commit_statuses if item["sha"] == head][:1]
        return str(first["description"]).split(" · ")[2]

    for number in range(1, 22):
        pull = emulator.state.add_pull("github", REPO, number, files=FILES)
        await queue_job(store, clock, pull, 40)
        await statuses.publish_once(clock.now())
        if number == 1:
            assert eta_of(pull.newest.head_sha) == "review in about 15 s"  # 17 s, the prior's
        if number == 21:
            break
        leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
        assert leased is not None
        clock.advance(7.5)
        await store.finish_chunk(leased.chunk.id, owner="w", now=clock.now(), gpu_seconds=7.5,
                                 result={})  # fmt: skip
        await store.finish_job(leased.chunk.job_id, now=clock.now(), review={"counts": {}})
        await statuses.publish_once(clock.now())
        clock.advance(60)
    # Twenty reviews at 0.44 of their promise: P1's factor is 0.5 (shrunk towards the pooled
    # 0.63, itself towards 1), so 17 s is shown as 8.5 s.
    assert statuses.learner.calibration.factor(Level.P1) == pytest.approx(0.5, abs=0.01)
    assert eta_of(pull.newest.head_sha) == "review in about 10 s"


async def test_a_stacked_review_check_run_says_what_it_waits_for(
    store: QueueStore,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    clock: VirtualClock,
    app_key: tuple[str, str],
) -> None:
    """A pull request stacked on another's review shows that it waits for it, and an ETA
    after it, rather than a place in line it cannot take yet."""
    base_pull = emulator.state.add_pull("github", REPO, 3, files=FILES, installation_id=1)
    base = await queue_job(store, clock, base_pull, 40, 40)
    stacked_pull = emulator.state.add_pull("github", REPO, 4, files=FILES, installation_id=1)
    submitted = await store.submit_request(
        request_for(stacked_pull), decide(), now=clock.now(), depends_on=[base]
    )
    assert submitted.state == JobState.WAITING and submitted.job_id is not None
    await store.plan_job(submitted.job_id, plans(40), now=clock.now(), rank=[10.0])
    statuses = publisher(store, {"github": app_client(emulator, session, clock, app_key[0])}, clock)
    assert (await statuses.publish_once(clock.now())).written == 2
    titles = {r["head_sha"]: r["output"]["title"] for r in check_runs(emulator)}
    assert titles[base_pull.newest.head_sha].startswith("P1 · 1st in line · review in about ")
    stacked = titles[stacked_pull.newest.head_sha]
    assert stacked.startswith(f"P1 · waits for {REPO}#3 · review in about "), stacked
