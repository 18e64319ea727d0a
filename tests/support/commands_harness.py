"""Slash commands end to end: the app over loopback, the forge emulator, the command worker."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from sqlalchemy import text

from bot.app import create_app
from bot.clock import VirtualClock
from bot.commands.worker import (
    CommandWorker,
    DeliveryReport,
)
from bot.config import DEFAULT_POLICY_DIR, ForgeSettings, Settings
from bot.emulator import (
    EmulatorState,
    ForgeEmulator,
    Record,
    build_github_issue_comment_event,
    build_github_pull_request_event,
    build_gitlab_merge_request_event,
    build_gitlab_note_event,
    generate_file_changes,
    seed_issue_comment,
    seed_note,
)
from bot.forges.base import ForgeClient, RetryPolicy
from bot.forges.github import GitHubClient
from bot.forges.gitlab import GitLabClient
from bot.policy import load_policy_book
from bot.queue.store import HistoryEntry, QueueStore
from tests.support.web import ClientMaker
from tests.support.webhook_fixtures import GITHUB_SECRET, GITLAB_TOKEN, Fixture, load_payload

SETTINGS = Settings(
    forges=ForgeSettings(github_webhook_secret=GITHUB_SECRET, gitlab_webhook_token=GITLAB_TOKEN)
)
REPO = "acme/shop"
GITLAB_REPO = "acme/platform/api"
Client = TestClient[web.Request, web.Application]


async def no_sleep(seconds: float) -> None:
    """Forge retries and spacing do not wait in tests."""


@dataclass
class Harness:
    """The app over loopback, the forge emulator, the worker, and what they share."""

    client: Client
    store: QueueStore
    clock: VirtualClock
    state: EmulatorState
    worker: CommandWorker
    forges: dict[str, ForgeClient]
    pull_numbers: itertools.count[int]

    # -- GitHub ------------------------------------------------------------------------

    async def open_pull(
        self,
        *,
        author: str = "dev1",
        labels: Sequence[str] = (),
        base_ref: str = "main",
        head_ref: str | None = None,
    ) -> tuple[int, int]:
        """Seed a PR on the emulator and deliver its `opened` webhook; returns (number, job)."""
        number = next(self.pull_numbers)
        pull = self.state.add_pull(
            "github",
            REPO,
            number,
            files=generate_file_changes(changed_lines=30, files=2, seed=number),
            author=author,
            labels=labels,
            base_ref=base_ref,
        )
        payload = build_github_pull_request_event(
            load_payload("github/pull_request.opened.json").payload,
            repo=REPO,
            number=number,
            author=author,
            labels=labels,
            base_ref=base_ref,
            head_ref=head_ref,
            head_sha=pull.newest.head_sha,
            base_sha=pull.newest.base_sha,
        )
        answer = await self.deliver("github", "pull_request", payload)
        assert answer["status"] == "queued", answer
        return number, int(answer["job_id"])

    async def comment(
        self,
        number: int,
        body: str,
        *,
        user: str,
        delivery_id: str | None = None,
        user_type: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """A human comment on the PR, delivered as GitHub would; returns (comment id, answer)."""
        comment_id = seed_issue_comment(self.state, REPO, number, user=user, body=body)
        fixture = load_payload("github/issue_comment.created.json")
        payload = build_github_issue_comment_event(
            fixture.payload,
            body=body,
            repo=REPO,
            number=number,
            author=user,
            author_type=user_type,
            comment_id=comment_id,
        )
        return comment_id, await self.deliver("github", "issue_comment", payload, delivery_id)

    # -- GitLab ------------------------------------------------------------------------

    async def open_merge_request(self, *, author: str = "dev1") -> tuple[int, int, int]:
        """Seed an MR and deliver its Merge Request Hook; returns (iid, project id, job)."""
        number = next(self.pull_numbers)
        self.state.add_pull(
            "gitlab",
            GITLAB_REPO,
            number,
            files=generate_file_changes(changed_lines=30, files=2, seed=number),
            author=author,
        )
        pull = self.state.get_pull("gitlab", GITLAB_REPO, number)
        assert pull.project_id is not None
        payload = build_gitlab_merge_request_event(
            load_payload("gitlab/merge_request.open.json").payload,
            action="open",
            repo=GITLAB_REPO,
            project_id=pull.project_id,
            number=number,
            author=author,
            head_sha=pull.newest.head_sha,
            base_ref="main",
        )
        answer = await self.deliver("gitlab", "Merge Request Hook", payload)
        assert answer["status"] == "queued", answer
        return number, pull.project_id, int(answer["job_id"])

    async def note(
        self, number: int, project_id: int, body: str, *, user: str
    ) -> tuple[int, dict[str, Any]]:
        note_id = seed_note(self.state, GITLAB_REPO, number, user=user, body=body)
        payload = build_gitlab_note_event(
            load_payload("gitlab/note.merge_request.json").payload,
            body=body,
            repo=GITLAB_REPO,
            project_id=project_id,
            number=number,
            author=user,
            note_id=note_id,
        )
        return note_id, await self.deliver("gitlab", "Note Hook", payload)

    # -- plumbing ----------------------------------------------------------------------

    async def deliver(
        self, forge: str, event: str, payload: Any, delivery_id: str | None = None
    ) -> dict[str, Any]:
        fixture = Fixture("built", forge, event, json.dumps(payload).encode())
        response = await self.client.post(
            f"/webhooks/{forge}", data=fixture.body, headers=fixture.headers(delivery_id)
        )
        assert response.status < 300, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer

    async def work(self) -> list[DeliveryReport]:
        """Let the command worker execute everything pending."""
        reports: list[DeliveryReport] = []
        while batch := await self.worker.run_once():
            reports.extend(batch)
        return reports

    def replies(self, number: int, forge: str = "github") -> list[Record]:
        kind = "issue_comment" if forge == "github" else "note"
        return self.state.posted(forge=forge, kind=kind, number=number)  # type: ignore[arg-type]

    def reactions(self, comment_id: int) -> list[str]:
        return [
            str(record.body)
            for record in self.state.records
            if record.kind in ("reaction", "award_emoji")
            and comment_id in (record.data.get("comment_id"), record.data.get("note_id"))
        ]

    async def commands_history(self, job_id: int) -> list[HistoryEntry]:
        return [entry for entry in await self.store.job_history(job_id) if entry.kind == "command"]

    async def delivery_outcomes(self) -> dict[str, str]:
        async with self.store.engine.connect() as conn:
            rows = await conn.execute(text("SELECT delivery_id, outcome FROM webhook_deliveries"))
            return {row.delivery_id: row.outcome for row in rows}


@pytest.fixture
async def forges(
    emulator: ForgeEmulator, clock: VirtualClock
) -> AsyncIterator[dict[str, ForgeClient]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        retry = RetryPolicy(attempts=2, base_delay_s=0.0)
        github = GitHubClient(session, base_url=emulator.github_url, token="t", clock=clock.now,
                              sleep=no_sleep, retry=retry, post_interval_s=0.0)  # fmt: skip
        gitlab = GitLabClient(url=emulator.gitlab_url, token="glpat-t", clock=clock.now,
                              sleep=no_sleep, retry=retry, timeout_s=5.0)  # fmt: skip
        yield {"github": github, "gitlab": gitlab}


@pytest.fixture
async def harness(
    store: QueueStore,
    aiohttp_client: ClientMaker,
    clock: VirtualClock,
    emulator: ForgeEmulator,
    forges: dict[str, ForgeClient],
) -> Harness:
    policies = load_policy_book(DEFAULT_POLICY_DIR)
    # No forges given to the app: this test drives the worker itself, deterministically.
    client = await aiohttp_client(create_app(SETTINGS, store=store, clock=clock))
    worker = CommandWorker(store, forges=forges, policies=policies, clock=clock)
    return Harness(client, store, clock, emulator.state, worker, forges, itertools.count(1))
