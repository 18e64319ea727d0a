"""The check run's Re-run button: a `/review` by whoever pressed it, under the same rules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text

from bot.emulator import ForgeEmulator
from bot.emulator.checks import add_check_run, build_github_check_run_event
from bot.model import JobState
from bot.status.publisher import StatusPublisher
from tests.support import commands_harness
from tests.support.commands_harness import REPO, Harness
from tests.support.openapi import load_shared_json
from tests.support.pipeline_helpers import APP_ID
from tests.support.statuses import app_client, publisher

pytestmark = pytest.mark.emulator(github_tokens=set(), gitlab_tokens=set())

# The slash-command harness: the app over loopback, the emulator, the command worker.
forges = commands_harness.forges
harness = commands_harness.harness


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


async def rerun(
    harness: Harness, number: int, *, user: str, name: str = "review-bot", run_id: int | None = None
) -> Any:
    pull = harness.state.get_pull("github", REPO, number)
    if run_id is None:
        run_id = add_check_run(harness.state, repo=REPO, head_sha=pull.newest.head_sha, name=name)
    payload = build_github_check_run_event(
        harness.state, repo=REPO, check_run_id=run_id, sender=user
    )
    return await harness.deliver("github", "check_run", payload)


async def test_the_rerequested_payload_has_what_github_documents(harness: Harness) -> None:
    schema = load_shared_json("openapi", "github-webhooks-subset.json")["webhooks"][
        "check-run-rerequested"
    ]["schema"]
    number, _ = await harness.open_pull(author="dev1")
    pull = harness.state.get_pull("github", REPO, number)
    run_id = add_check_run(harness.state, repo=REPO, head_sha=pull.newest.head_sha)
    payload = build_github_check_run_event(
        harness.state, repo=REPO, check_run_id=run_id, sender="dev1"
    )
    assert payload["action"] in schema["properties"]["action"]["enum"]
    top = [key for key in schema["required"] if key not in payload]
    check_run = schema["properties"]["check_run"]
    assert top == []
    assert [key for key in check_run["required"] if key not in payload["check_run"]] == []


def app_publisher(
    harness: Harness, emulator: ForgeEmulator, session: aiohttp.ClientSession, key: tuple[str, str]
) -> StatusPublisher:
    """The status publisher writing check runs as the App, on the harness's emulator."""
    harness.state.register_app(APP_ID, key[1])
    github = app_client(emulator, session, harness.clock, key[0])
    return publisher(harness.store, {"github": github}, harness.clock)


def runs_of(harness: Harness, head_sha: str) -> list[dict[str, Any]]:
    return [run for run in harness.state.check_runs.values() if run["head_sha"] == head_sha]


async def test_a_re_run_writes_the_head_again_without_a_review_or_a_comment(
    harness: Harness,
    emulator: ForgeEmulator,
    session: aiohttp.ClientSession,
    app_key: tuple[str, str],
) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    head = harness.state.get_pull("github", REPO, number).newest.head_sha
    # The review of this push said one minor thing; the head still has four findings open,
    # two critical, from earlier pushes (what the quiet poster records as open_counts).
    review = {"counts": {"minor": 1}, "open_counts": {"critical": 2, "minor": 2},
              "url": "https://example.test/r"}  # fmt: skip
    await harness.store.finish_job(job_id, now=harness.clock.now(), review=review)
    statuses = app_publisher(harness, emulator, session, app_key)
    await statuses.publish_once(harness.clock.now())
    [first] = runs_of(harness, head)
    assert (first["status"], first["conclusion"]) == ("completed", "neutral")
    assert first["output"]["title"] == "Reviewed: 4 open findings (2 critical, 2 minor) · 1 new"

    for press in range(2):
        harness.clock.advance(30)
        answer = await rerun(harness, number, user="dev1", run_id=first["id"])
        assert answer["status"] == "recorded"
        await harness.work()
        # No new review of an unchanged head, no comment notifying everyone.
        assert [job.id for job in await harness.store.list_jobs()] == [job_id]
        assert harness.replies(number) == []
        written = await statuses.publish_once(harness.clock.now())
        assert written.reasons["republish"] == 1
        runs = runs_of(harness, head)
        assert len(runs) == press + 2  # GitHub asks for a new check run on a Re-run
        assert (runs[-1]["status"], runs[-1]["conclusion"]) == ("completed", "neutral")
        assert runs[-1]["output"]["title"] == first["output"]["title"]
        assert (await statuses.publish_once(harness.clock.now())).written == 0
    history = await harness.commands_history(job_id)
    assert [(entry.actor, entry.to_value) for entry in history] == [("dev1", "accepted")] * 2


async def test_a_re_run_after_a_failed_review_reviews_again_without_a_comment(
    harness: Harness,
) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    await harness.store.finish_job(job_id, now=harness.clock.now(), state=JobState.FAILED)
    harness.clock.advance(30)

    await rerun(harness, number, user="dev1")
    await harness.work()
    jobs = await harness.store.list_jobs()
    assert len(jobs) == 2
    new = jobs[0]
    assert new.id != job_id and new.state is JobState.QUEUED
    assert new.head_sha == jobs[1].head_sha
    assert harness.replies(number) == []


async def test_a_reader_who_is_not_the_author_is_refused(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    await harness.store.finish_job(job_id, now=harness.clock.now(), state=JobState.DONE)
    harness.state.set_permission(REPO, "visitor", "read")

    await rerun(harness, number, user="visitor")
    await harness.work()
    assert len(await harness.store.list_jobs()) == 1
    (reply,) = harness.replies(number)
    assert reply.body is not None and "Refused" in reply.body
    (entry,) = await harness.commands_history(job_id)
    assert (entry.actor, entry.to_value) == ("visitor", "refused")

    # A writer may, as with `/review`: the head's status is written again (no new review).
    harness.state.set_permission(REPO, "lead", "write")
    await rerun(harness, number, user="lead")
    await harness.work()
    assert len(await harness.store.list_jobs()) == 1
    entries = await harness.commands_history(job_id)
    assert [(entry.actor, entry.to_value) for entry in entries][-1] == ("lead", "accepted")
    async with harness.store.engine.connect() as conn:
        owed = await conn.scalar(text("SELECT republish FROM status_outbox WHERE job_id = :id"),
                                 {"id": job_id})  # fmt: skip
    assert owed is True


async def test_other_checks_and_bots_are_ignored(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    await harness.store.finish_job(job_id, now=harness.clock.now(), state=JobState.DONE)
    assert (await rerun(harness, number, user="dev1", name="ci/tests"))["status"] == "ignored"
    assert (await rerun(harness, number, user="dependabot[bot]"))["status"] == "ignored"
    await harness.work()
    assert len(await harness.store.list_jobs()) == 1
