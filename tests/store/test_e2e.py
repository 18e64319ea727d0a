"""End to end on both forges: signed webhook -> aiohttp app -> PostgreSQL -> dispatcher -> review.

Everything is real and runs over loopback: the emulator sends the deliveries built from
../shared/fixtures, `create_app` takes them, the real dispatcher runs the simulated model (its
time scaled down) and the pipeline posts back to the emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from sqlalchemy import text

from bot.app import create_app
from bot.clock import SystemClock
from bot.components import local_write_budget
from bot.config import DEFAULT_POLICY_DIR
from bot.emulator import (
    EmulatedPull,
    Fault,
    ForgeEmulator,
    build_github_pull_request_event,
    build_gitlab_merge_request_event,
    generate_file_changes,
    send_webhook,
)
from bot.forges.base import RetryPolicy, find_marker
from bot.forges.registry import ForgeOptions, ForgeRegistry, build_forges
from bot.llm.simulated import SimulatedBackend
from bot.model import ChunkState, JobState
from bot.pipeline import build_pipeline
from bot.policy import load_policy_book
from bot.queue.store import QueueStore
from bot.review.chunking import DEFAULT_LINE_BUDGET
from bot.sched.dispatcher import Dispatcher, DispatcherSettings
from bot.sched.mlfq import MlfqSettings
from tests.support.pipeline_helpers import SMELLY, forge_settings
from tests.support.webhook_fixtures import load_payload

pytestmark = [pytest.mark.slow, pytest.mark.emulator(virtual_clock=False)]

SECRET = "e2e-webhook-secret"
GITLAB_SECRET = "e2e-gitlab-token"


class Bot:
    """The bot as `bot serve --role all` runs it: the web app and one dispatcher process."""

    def __init__(
        self, store: QueueStore, db_url: str, emulator: ForgeEmulator, *, time_scale: float
    ) -> None:
        self.store = store
        self.db_url = db_url
        self.emulator = emulator
        self.time_scale = time_scale
        self.settings = forge_settings(
            emulator, github_webhook_secret=SECRET, gitlab_webhook_token=GITLAB_SECRET
        )
        self.policies = load_policy_book(DEFAULT_POLICY_DIR)
        self.server: TestServer | None = None
        self.forges: ForgeRegistry | None = None
        self.dispatcher: Dispatcher | None = None
        self.task: asyncio.Task[None] | None = None
        # Each dispatcher "process" has its own pool, as a process does: a crash takes its
        # connections with it instead of handing ones cut mid-query to the next process.
        self.dispatcher_store: QueueStore | None = None
        self.process_name = ""
        self.generation = 0

    async def start(self, *, slots: int = 4, lease_s: float = 30.0) -> None:
        self.forges = build_forges(
            self.settings,
            options=ForgeOptions(retry=RetryPolicy(attempts=4, base_delay_s=0.05)),
            budget=local_write_budget(
                self.settings, now=SystemClock().now, sleep=asyncio.sleep, post_interval_s=0.0
            ),
        )
        if self.server is None:
            app = create_app(
                self.settings, store=self.store, policies=self.policies, clock=SystemClock()
            )
            self.server = TestServer(app, host="127.0.0.1")
            await self.server.start_server()
        self.generation += 1
        self.process_name = f"e2e-dispatcher-{self.generation}"
        self.dispatcher_store = QueueStore.from_url(
            self.db_url, pool_size=4, application_name=self.process_name
        )
        self.dispatcher = build_pipeline(
            self.dispatcher_store,
            forges=self.forges,
            policies=self.policies,
            backend=SimulatedBackend(sleep=asyncio.sleep, time_scale=self.time_scale),
            clock=SystemClock(),
            dispatcher=DispatcherSettings(
                owner=f"dispatcher-{self.generation}",
                slots=slots,
                poll_s=0.2,
                lease_s=lease_s,
                heartbeat_s=lease_s / 3,
                maintenance_s=0.2,
                mlfq=MlfqSettings(reserved_slots=0),
            ),
        ).dispatcher
        self.task = asyncio.create_task(self.dispatcher.run(database_url=self.db_url))

    async def crash(self) -> None:
        """Kill the dispatcher as a lost process would die: no release, leases left behind."""
        assert self.dispatcher is not None and self.task is not None
        dispatcher, main = self.dispatcher, self.task
        # A process dies at once; tasks only end at their next await, and a cancel that lands
        # inside a database call can be taken for an outage and retried (a run that waited
        # for the tasks once hung for 300 s). So cancel until the whole dispatcher is gone.
        # Its connections end on the server as a dead process's do, and the server rolls
        # back whatever they were doing.
        deadline = asyncio.get_running_loop().time() + 20.0
        while not main.done() or dispatcher._tasks:
            assert asyncio.get_running_loop().time() < deadline, "the dispatcher outlived its crash"
            tasks = [main, *dispatcher._tasks]
            for task in tasks:
                task.cancel()
            await self.store.connector.fetch_all(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = :name"
                ),
                {"name": self.process_name},
            )
            await asyncio.wait(tasks, timeout=0.5)
        assert self.dispatcher_store is not None
        await self.dispatcher_store.close()
        self.dispatcher_store = None
        if self.forges is not None:
            await self.forges.close()

    async def stop(self) -> None:
        if self.dispatcher is not None and self.task is not None and not self.task.done():
            self.dispatcher.stop()
            await asyncio.wait_for(self.task, timeout=10)
        if self.forges is not None:
            await self.forges.close()
        if self.dispatcher_store is not None:
            await self.dispatcher_store.close()
        if self.server is not None:
            await self.server.close()

    def url(self, forge: str) -> str:
        assert self.server is not None
        return str(self.server.make_url(f"/webhooks/{forge}"))

    async def send_github(self, pull: EmulatedPull, *, action: str = "opened") -> dict[str, Any]:
        name = "pull_request.opened.json" if action == "opened" else "pull_request.synchronize.json"
        payload = build_github_pull_request_event(
            load_payload(f"github/{name}").payload,
            action=action,
            repo=pull.repo,
            number=pull.number,
            title=pull.title,
            base_ref=pull.base_ref,
            head_ref=pull.head_ref,
            base_sha=pull.newest.base_sha,
            head_sha=pull.newest.head_sha,
            labels=[],
            draft=False,
            author="octocat",
            author_type="User",
            changed_files=len(pull.files),
            additions=sum(item.additions for item in pull.files),
            deletions=sum(item.deletions for item in pull.files),
            installation_id=1,
        )
        answer = await send_webhook(self.url("github"), "github", "pull_request", payload, SECRET)
        assert answer.status in (200, 202), answer.body
        return dict(json.loads(answer.body))

    async def send_gitlab(self, pull: EmulatedPull) -> dict[str, Any]:
        payload = build_gitlab_merge_request_event(
            load_payload("gitlab/merge_request.open.json").payload,
            action="open",
            repo=pull.repo,
            project_id=pull.project_id,
            number=pull.number,
            title=pull.title,
            base_ref=pull.base_ref,
            head_ref=pull.head_ref,
            head_sha=pull.newest.head_sha,
            labels=[],
            author="octocat",
            author_is_bot=False,
            draft=False,
        )
        answer = await send_webhook(
            self.url("gitlab"), "gitlab", "Merge Request Hook", payload, GITLAB_SECRET
        )
        assert answer.status in (200, 202), answer.body
        return dict(json.loads(answer.body))


async def until(check: Callable[[], Awaitable[bool]], *, timeout_s: float = 20.0) -> None:
    """Wait for a condition the bot's own tasks bring about."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.05)


async def job_state(store: QueueStore, job_id: int) -> JobState:
    job = await store.get_job(job_id)
    assert job is not None
    return job.state


def posted_reviews(emulator: ForgeEmulator, pull: EmulatedPull) -> list[Any]:
    kind = "review" if pull.forge == "github" else "note"
    return emulator.state.posted(kind=kind, repo=pull.repo, number=pull.number)


@pytest.fixture
async def bot(store: QueueStore, db_url: str, emulator: ForgeEmulator) -> AsyncIterator[Bot]:
    running = Bot(store, db_url, emulator, time_scale=0.01)
    try:
        yield running
    finally:
        await running.stop()


async def test_webhooks_on_both_forges_end_in_one_posted_review_each(
    bot: Bot, emulator: ForgeEmulator, store: QueueStore
) -> None:
    # Over one chunk's line budget: the review takes several calls.
    files = [
        *generate_file_changes(changed_lines=DEFAULT_LINE_BUDGET + 100, files=4, seed=21),
        SMELLY,
    ]
    github = emulator.state.add_pull("github", "acme/shop", 31, files=files)
    gitlab = emulator.state.add_pull("gitlab", "acme/platform/api", 32, files=files)
    await bot.start()

    github_answer = await bot.send_github(github)
    gitlab_answer = await bot.send_gitlab(gitlab)
    assert github_answer["status"] == gitlab_answer["status"] == "queued"
    ids = [github_answer["job_id"], gitlab_answer["job_id"]]
    await until(lambda: _all_done(store, ids))

    [review] = posted_reviews(emulator, github)
    assert find_marker(review.body) == ids[0]
    assert review.data["commit_id"] == github.newest.head_sha
    assert any(c["path"] == "app/handler.py" for c in review.data["comments"])
    [note] = posted_reviews(emulator, gitlab)
    assert find_marker(note.body) == ids[1]
    assert emulator.state.posted(kind="discussion", repo=gitlab.repo, number=32)
    for job_id in ids:
        chunks = await store.chunk_results(job_id)
        assert len(chunks) >= 2 and all(c.state == ChunkState.DONE for c in chunks)


async def _all_done(store: QueueStore, ids: list[int]) -> bool:
    states = [await job_state(store, job_id) for job_id in ids]
    assert JobState.FAILED not in states and JobState.DEAD not in states, states
    return all(state == JobState.DONE for state in states)


async def test_a_push_during_review_supersedes_it_and_only_the_newest_is_posted(
    store: QueueStore, db_url: str, emulator: ForgeEmulator
) -> None:
    # About 1.1 s a chunk of the first review (3 s overhead and 330 lines at 0.15 s, scaled):
    # it is still running when the push arrives, and the newest review ends within 3 s.
    bot = Bot(store, db_url, emulator, time_scale=0.02)
    try:
        files = generate_file_changes(changed_lines=2000, files=10, seed=22)
        pull = emulator.state.add_pull("github", "acme/shop", 41, files=files)
        await bot.start(slots=1)
        first = (await bot.send_github(pull))["job_id"]
        await until(lambda: _chunks_done(store, first, at_least=1))

        emulator.state.push("github", "acme/shop", 41, files=[*files[:3], SMELLY])
        answer = await bot.send_github(pull, action="synchronize")
        second = answer["job_id"]
        assert answer["superseded"] == [first]
        await until(lambda: _all_done(store, [second]))
        await asyncio.sleep(0.5)  # a chunk of the old job still in flight finishes here

        assert await job_state(store, first) == JobState.SUPERSEDED
        [review] = posted_reviews(emulator, pull)
        assert review.data["commit_id"] == pull.newest.head_sha
        assert find_marker(review.body) == second
    finally:
        await bot.stop()


async def _chunks_done(store: QueueStore, job_id: int, *, at_least: int) -> bool:
    job = await store.get_job(job_id)
    return job is not None and job.chunks_done >= at_least


async def test_a_crash_between_chunks_resumes_without_loss_or_duplicates(
    store: QueueStore, db_url: str, emulator: ForgeEmulator
) -> None:
    # About 3 s a chunk: the crash finds the third of several chunks running, even on a
    # loaded machine (at half that, a crash slowed by the load could find the job done).
    bot = Bot(store, db_url, emulator, time_scale=0.05)
    try:
        files = [*generate_file_changes(changed_lines=1600, files=8, seed=23), SMELLY]
        pull = emulator.state.add_pull("github", "acme/shop", 51, files=files)
        await bot.start(slots=1, lease_s=1.0)
        job_id = (await bot.send_github(pull))["job_id"]
        await until(lambda: _chunks_done(store, job_id, at_least=2))

        await bot.crash()
        job = await store.get_job(job_id)
        assert job is not None and job.state == JobState.RUNNING
        assert 2 <= job.chunks_done < job.chunks_total
        await bot.start(slots=2, lease_s=1.0)  # a new process; the old lease expires
        await until(lambda: _all_done(store, [job_id]))

        chunks = await store.chunk_results(job_id)
        assert [c.seq for c in chunks] == list(range(job.chunks_total))
        assert all(c.state == ChunkState.DONE and c.result for c in chunks)
        finished = await store.get_job(job_id)
        assert finished is not None and finished.chunks_done == finished.chunks_total
        [review] = posted_reviews(emulator, pull)
        assert "Partial review" not in (review.body or "")
        assert find_marker(review.body) == job_id
    finally:
        await bot.stop()


@pytest.mark.parametrize(
    "fault",
    [
        Fault.server_error(502),
        Fault.secondary_rate_limit(retry_after=1),
        Fault.lost_response(502),
    ],
    ids=["5xx", "secondary-limit", "lost-response"],
)
async def test_forge_faults_while_posting_end_in_exactly_one_review(
    bot: Bot, emulator: ForgeEmulator, store: QueueStore, fault: Fault
) -> None:
    github = emulator.state.add_pull("github", "acme/shop", 61, files=[SMELLY])
    gitlab = emulator.state.add_pull("gitlab", "acme/platform/api", 62, files=[SMELLY])
    emulator.state.add_fault("github.reviews.create", fault)
    gitlab_fault = Fault.too_many_requests(retry_after=1) if fault.status == 403 else fault
    emulator.state.add_fault("gitlab.notes.create", gitlab_fault)
    await bot.start()

    ids = [(await bot.send_github(github))["job_id"], (await bot.send_gitlab(gitlab))["job_id"]]
    await until(lambda: _all_done(store, ids))

    assert len(posted_reviews(emulator, github)) == 1
    assert len(posted_reviews(emulator, gitlab)) == 1
    assert emulator.state.count_requests("github.reviews.create", status=fault.status) == 1


async def test_a_pull_request_that_is_gone_ends_cancelled(
    bot: Bot, emulator: ForgeEmulator, store: QueueStore
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 71, files=[SMELLY])
    await bot.start()
    del emulator.state.pulls[("github", "acme/shop", 71)]  # deleted before the bot fetched it

    job_id = (await bot.send_github(pull))["job_id"]
    await until(lambda: _is(store, job_id, JobState.CANCELLED))

    job = await store.get_job(job_id)
    assert job is not None and job.last_error is not None and "404" in job.last_error
    assert emulator.state.posted(kind="review") == []


async def _is(store: QueueStore, job_id: int, state: JobState) -> bool:
    with contextlib.suppress(AssertionError):
        return await job_state(store, job_id) == state
    return False
