"""The check run's Re-run button: a `/review` by whoever pressed it, under the same rules."""

from __future__ import annotations

from typing import Any

from bot.emulator.checks import add_check_run, build_github_check_run_event
from bot.model import JobState
from tests import test_commands_e2e
from tests.test_commands_e2e import REPO, Harness
from tests.test_emulator import load_shared_json

# The slash-command harness: the app over loopback, the emulator, the command worker.
emulator = test_commands_e2e.emulator
forges = test_commands_e2e.forges
harness = test_commands_e2e.harness


async def rerun(harness: Harness, number: int, *, user: str, name: str = "review-bot") -> Any:
    pull = harness.state.get_pull("github", REPO, number)
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


async def test_the_author_re_runs_a_finished_review(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    await harness.store.finish_job(job_id, now=harness.clock.now(), state=JobState.DONE)
    harness.clock.advance(30)

    answer = await rerun(harness, number, user="dev1")
    assert answer["status"] == "recorded"
    await harness.work()
    jobs = await harness.store.list_jobs()
    assert len(jobs) == 2
    new = jobs[0]
    assert new.id != job_id and new.state is JobState.QUEUED
    assert new.head_sha == jobs[1].head_sha  # the same commit, reviewed again
    assert f"job {new.id}" in (harness.replies(number)[-1].body or "")

    # A second press after that review ended queues another one (each press is its own).
    await harness.store.finish_job(new.id, now=harness.clock.now(), state=JobState.DONE)
    await rerun(harness, number, user="dev1")
    await harness.work()
    assert len(await harness.store.list_jobs()) == 3


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

    # A writer may, as with `/review`.
    harness.state.set_permission(REPO, "lead", "write")
    await rerun(harness, number, user="lead")
    await harness.work()
    assert len(await harness.store.list_jobs()) == 2


async def test_other_checks_and_bots_are_ignored(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    await harness.store.finish_job(job_id, now=harness.clock.now(), state=JobState.DONE)
    assert (await rerun(harness, number, user="dev1", name="ci/tests"))["status"] == "ignored"
    assert (await rerun(harness, number, user="dependabot[bot]"))["status"] == "ignored"
    await harness.work()
    assert len(await harness.store.list_jobs()) == 1
