"""Slash commands end to end: real payloads through the aiohttp app, the worker, the emulator."""

from __future__ import annotations

import asyncio
import itertools
import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from bot.app import create_app
from bot.clock import VirtualClock
from bot.commands.decide import REPLY_MARKER
from bot.commands.worker import (
    COMMAND_WORKER_KEY,
    CommandWorker,
    CommandWorkerSettings,
)
from bot.emulator import (
    Fault,
    ForgeEmulator,
    build_github_issue_comment_event,
)
from bot.forges.base import ForgeClient
from bot.model import ChunkState, JobState, Level
from bot.queue.store import QueueStore
from bot.sched.mlfq import MlfqSettings, ServiceEstimator
from bot.status.eta import Capacity
from bot.status.publisher import StatusPublisher
from tests.support import commands_harness
from tests.support.commands_harness import GITLAB_REPO, REPO, SETTINGS, Harness
from tests.support.factories import plans
from tests.support.web import ClientMaker
from tests.support.webhook_fixtures import load_payload

pytestmark = pytest.mark.emulator(github_tokens=set(), gitlab_tokens=set())

# The app over loopback, the emulator, the command worker (tests.support.commands_harness).
forges = commands_harness.forges
harness = commands_harness.harness

# -- each command --------------------------------------------------------------------------


async def test_a_writer_raises_a_job_which_keeps_its_time_and_done_chunks(
    harness: Harness,
) -> None:
    number, job_id = await harness.open_pull(labels=["refactor"])
    await harness.store.plan_job(job_id, plans(10, 10, 10), now=harness.clock.now())
    leased = await harness.store.fetch_chunk(levels=[Level.P2], owner="gpu-1",
                                             now=harness.clock.now(), lease_s=60)  # fmt: skip
    assert leased is not None
    await harness.store.finish_chunk(leased.chunk.id, owner="gpu-1", now=harness.clock.now(),
                                     gpu_seconds=3.0, result={"comments": []})  # fmt: skip
    before = await harness.store.get_job(job_id)
    assert before is not None and before.level is Level.P2
    harness.state.set_permission(REPO, "lead", "write")
    harness.clock.advance(60)

    comment_id, answer = await harness.comment(number, "/review priority p1", user="lead")
    assert answer["status"] == "recorded"
    assert await harness.commands_history(job_id) == []  # the handler only records
    reports = await harness.work()

    assert [r.outcome for r in reports] == ["command_done"]
    after = await harness.store.get_job(job_id)
    assert after is not None
    assert (after.level, after.base_level) == (Level.P1, Level.P2)
    assert after.enqueued_at == before.enqueued_at
    chunks = await harness.store.chunk_results(job_id)
    assert [c.state for c in chunks].count(ChunkState.DONE) == 1
    assert {c.level for c in chunks if c.state is ChunkState.QUEUED} == {Level.P1}
    (entry,) = await harness.commands_history(job_id)
    assert (entry.actor, entry.to_value) == ("lead", "accepted")
    assert entry.detail is not None
    assert (entry.detail["from_level"], entry.detail["to_level"], entry.detail["raise"]) == (
        "P2", "P1", True)  # fmt: skip
    level_changes = [e for e in await harness.store.job_history(job_id) if e.kind == "level"]
    assert [(e.from_value, e.to_value, e.actor) for e in level_changes] == [("P2", "P1", "lead")]
    (reply,) = harness.replies(number)
    assert reply.body is not None and "from P2 to P1" in reply.body
    assert reply.body.endswith(REPLY_MARKER)
    assert harness.reactions(comment_id) == ["eyes", "+1"]


async def test_the_author_lowers_their_pr_and_aging_still_raises_it(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    await harness.store.plan_job(job_id, plans(10), now=harness.clock.now())
    await harness.comment(number, "/review priority p3", user="dev1")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P3
    harness.clock.advance(1801)
    assert await harness.store.apply_aging(now=harness.clock.now(), interval_s=1800) == 1
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P2


async def test_a_reader_may_not_raise(harness: Harness) -> None:
    number, job_id = await harness.open_pull(labels=["refactor"])
    comment_id, _ = await harness.comment(number, "/review priority p1", user="visitor")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P2
    (reply,) = harness.replies(number)
    assert reply.body is not None
    assert "Refused" in reply.body and "needs `write` access" in reply.body
    assert "`visitor` has `read`" in reply.body
    assert harness.reactions(comment_id) == ["eyes", "-1"]
    (entry,) = await harness.commands_history(job_id)
    assert (entry.actor, entry.to_value) == ("visitor", "refused")


async def test_an_unknown_user_has_no_access(harness: Harness) -> None:
    number, job_id = await harness.open_pull()
    comment_id = harness.state.next_id()
    fixture = load_payload("github/issue_comment.created.json")
    payload = build_github_issue_comment_event(
        fixture.payload, body="/review cancel", repo=REPO, number=number, author="ghost",
        comment_id=comment_id)  # fmt: skip
    await harness.deliver("github", "issue_comment", payload)
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.state is JobState.QUEUED
    (reply,) = harness.replies(number)
    assert reply.body is not None and "`ghost` has `none`" in reply.body


async def test_p0_is_refused_and_the_trigger_named(harness: Harness) -> None:
    number, job_id = await harness.open_pull()
    harness.state.set_permission(REPO, "owner", "admin")
    await harness.comment(number, "/review priority p0", user="owner")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P1
    (reply,) = harness.replies(number)
    assert reply.body is not None
    assert "P0 cannot be set by a command" in reply.body
    assert "rule `hotfix`: a change into `hotfix/**`" in reply.body
    (entry,) = await harness.commands_history(job_id)
    assert entry.to_value == "refused" and entry.detail is not None
    assert entry.detail["argument"] == "P0"


async def test_the_daily_raise_quota_holds_and_resets_at_midnight(harness: Harness) -> None:
    number, job_id = await harness.open_pull(labels=["dependencies"])  # P3
    harness.state.set_permission(REPO, "lead", "maintain")
    for _ in range(5):
        await harness.comment(number, "/review priority p2\n/review priority p3", user="lead")
    await harness.work()
    await harness.comment(number, "/review priority p2", user="lead")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P3
    last = harness.replies(number)[-1]
    assert last.body is not None and "used all 5 raises allowed per day" in last.body
    outcomes = [(e.detail or {}).get("raise") for e in await harness.commands_history(job_id)
                if e.to_value == "accepted"]  # fmt: skip
    assert outcomes.count(True) == 5
    # Another user's quota is their own.
    harness.state.set_permission(REPO, "lead2", "write")
    await harness.comment(number, "/review priority p1", user="lead2")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P1
    await harness.comment(number, "/review priority p3", user="lead2")
    await harness.work()
    # The next UTC day the quota starts again.
    now = harness.clock.now()
    harness.clock.set((now + timedelta(days=1)).replace(hour=0, minute=0, second=1))
    await harness.comment(number, "/review priority p2", user="lead")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P2


async def test_cancel_by_the_author_and_not_by_a_stranger(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    await harness.comment(number, "/review cancel", user="stranger")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.state is JobState.QUEUED
    await harness.comment(number, "/review cancel", user="dev1")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.state is JobState.CANCELLED
    first, second = harness.replies(number)
    assert first.body is not None and "cancelling needs authorship" in first.body
    assert second.body is not None and f"Cancelled the queued review of this PR (job {job_id}" in (
        second.body
    )
    assert [e.to_value for e in await harness.commands_history(job_id)] == ["refused", "accepted"]


async def test_status_tells_level_reason_place_estimate_and_wait(harness: Harness) -> None:
    _, first_job = await harness.open_pull()
    number, job_id = await harness.open_pull(labels=["refactor"])
    await harness.store.plan_job(first_job, plans(10), now=harness.clock.now())
    await harness.store.plan_job(job_id, plans(10, 10), now=harness.clock.now())
    harness.clock.advance(125)
    await harness.comment(number, "/review status", user="anyone")
    await harness.work()
    (reply,) = harness.replies(number)
    body = reply.body or ""
    assert f"Review job {job_id}: **queued** at **P2**" in body
    assert "why: `large change (label refactor)`" in body
    assert "place in queue: 2nd in line (1 ahead)" in body
    assert "estimated start: in about " in body and "review in about " in body
    assert "waiting so far: 2 min" in body
    (entry,) = await harness.commands_history(job_id)
    assert entry.to_value == "accepted" and entry.actor == "anyone"


async def test_status_says_the_place_and_eta_the_commit_status_says(harness: Harness) -> None:
    """One function for both: the status publisher keeps the model it estimates with, and
    `/review status` runs the same dry run over the same queue with it."""
    numbers = []
    for _ in range(12):
        number, job_id = await harness.open_pull()
        await harness.store.plan_job(job_id, plans(40, 40), now=harness.clock.now())
        numbers.append(number)
    statuses = StatusPublisher(
        harness.store.status,
        {"github": harness.forges["github"]},
        clock=harness.clock,
        capacity=Capacity(slots=2, mlfq=MlfqSettings(reserved_slots=0)),
        estimator=ServiceEstimator.with_prior,
    )
    await statuses.publish_once(harness.clock.now())
    last = numbers[-1]
    head = harness.state.get_pull("github", REPO, last).newest.head_sha
    [written] = [item for item in harness.state.commit_statuses if item["sha"] == head]
    place, eta = written["description"].split(" · ")[1:3]
    assert place == "12th in line" and eta.startswith("review in about ")
    await harness.comment(last, "/review status", user="anyone")
    await harness.work()
    (reply,) = harness.replies(last)
    assert reply.body is not None
    assert f"place in queue: {place} (11 ahead)" in reply.body
    assert f"- {eta}" in reply.body


async def test_help(harness: Harness) -> None:
    number, _ = await harness.open_pull()
    comment_id, _ = await harness.comment(number, "/REVIEW HELP", user="anyone")
    await harness.work()
    (reply,) = harness.replies(number)
    assert reply.body is not None and "/review priority p1|p2|p3" in reply.body
    assert harness.reactions(comment_id) == ["eyes", "+1"]


async def test_review_requeues_only_once_the_last_review_ended(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    await harness.comment(number, "/review", user="dev1")
    await harness.work()
    assert len(await harness.store.list_jobs()) == 1
    assert "already queued" in (harness.replies(number)[-1].body or "")
    await harness.store.finish_job(job_id, now=harness.clock.now(), state=JobState.DONE)
    harness.clock.advance(30)
    await harness.comment(number, "/review", user="dev1")
    await harness.work()
    jobs = await harness.store.list_jobs()
    assert len(jobs) == 2
    new = jobs[0]
    assert new.id != job_id and new.state is JobState.QUEUED and new.level is Level.P1
    assert new.head_sha == jobs[1].head_sha
    assert f"job {new.id}" in (harness.replies(number)[-1].body or "")
    (entry,) = [e for e in await harness.commands_history(job_id) if e.to_value == "accepted"]
    assert entry.detail is not None and entry.detail["new_job_id"] == new.id


async def test_gitlab_developer_raises_and_reporter_is_refused(harness: Harness) -> None:
    number, project_id, job_id = await harness.open_merge_request()
    harness.state.set_access_level(GITLAB_REPO, "reporter", 20)
    harness.state.set_access_level(GITLAB_REPO, "developer", 30)
    await harness.note(number, project_id, "/review priority p3", user="developer")
    await harness.work()
    refused_note, _ = await harness.note(number, project_id, "/review priority p1",
                                         user="reporter")  # fmt: skip
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P3
    lowered, refused = harness.replies(number, "gitlab")
    assert "from P1 to P3" in (lowered.body or "")
    assert "`reporter` has `triage`" in (refused.body or "")
    assert harness.reactions(refused_note) == ["eyes", "thumbsdown"]
    await harness.note(number, project_id, "/review priority p1", user="developer")
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P1


# -- replays, hostile input, the bot itself ------------------------------------------------


async def test_a_replayed_delivery_executes_nothing_twice(harness: Harness) -> None:
    number, job_id = await harness.open_pull(labels=["refactor"])
    harness.state.set_permission(REPO, "lead", "write")
    delivery = str(uuid.uuid4())
    _, first = await harness.comment(number, "/review priority p1", user="lead",
                                     delivery_id=delivery)  # fmt: skip
    await harness.work()
    fixture = load_payload("github/issue_comment.created.json")
    payload = build_github_issue_comment_event(
        fixture.payload, body="/review priority p1", repo=REPO, number=number, author="lead",
        comment_id=harness.state.get_pull("github", REPO, number).comments[-1]["id"])  # fmt: skip
    again = await harness.deliver("github", "issue_comment", payload, delivery)
    assert (first["status"], again["status"]) == ("recorded", "duplicate")
    assert await harness.work() == []
    assert len(harness.replies(number)) == 1
    assert len(await harness.commands_history(job_id)) == 1
    assert (await harness.delivery_outcomes())[delivery] == "command_done"


async def test_a_claim_whose_worker_died_is_taken_over_once(harness: Harness) -> None:
    number, job_id = await harness.open_pull(labels=["refactor"])
    harness.state.set_permission(REPO, "lead", "write")
    await harness.comment(number, "/review priority p1", user="lead")
    inbox = harness.store.commands
    claimed = await inbox.claim_pending_commands(
        owner="dead-worker", now=harness.clock.now(), limit=10, lease_s=120, max_age_s=3600
    )
    assert len(claimed) == 1
    assert await harness.work() == []  # still leased to the dead worker
    harness.clock.advance(121)
    (report,) = await harness.work()
    assert report.outcome == "command_done"
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P1
    assert not await inbox.mark_command_done(
        claimed[0], owner="dead-worker", outcome="command_done", result={}, job_id=None
    )
    assert len(harness.replies(number)) == 1


async def test_a_stale_claim_attempt_writes_nothing_even_for_the_same_worker(
    harness: Harness,
) -> None:
    number, _ = await harness.open_pull()
    await harness.comment(number, "/review status", user="lead")
    inbox = harness.store.commands
    claim = {"limit": 10, "lease_s": 120, "max_age_s": 3600}
    [stale] = await inbox.claim_pending_commands(owner="w", now=harness.clock.now(), **claim)
    harness.clock.advance(121)  # the worker paused past its lease; it takes the claim again
    [fresh] = await inbox.claim_pending_commands(owner="w", now=harness.clock.now(), **claim)
    assert fresh.attempts == stale.attempts + 1
    assert not await inbox.holds(stale, owner="w")
    outbox = [{"kind": "reply", "body": "stale"}]
    assert not await inbox.save_outbox(stale, owner="w", outbox=outbox, result={}, job_id=None)
    assert not await inbox.mark_command_done(
        stale, owner="w", outcome="command_done", result={}, job_id=None
    )
    assert await inbox.holds(fresh, owner="w")
    assert await inbox.mark_command_done(
        fresh, owner="w", outcome="command_done", result={}, job_id=None
    )


async def test_concurrent_workers_claim_each_delivery_once(harness: Harness) -> None:
    number, job_id = await harness.open_pull()
    for index in range(12):
        await harness.comment(number, "/review status", user=f"user{index}")
    workers = [
        CommandWorker(
            harness.store,
            forges=harness.forges,
            policies=harness.worker.policies,
            clock=harness.clock,
            settings=CommandWorkerSettings(owner=f"w{i}", batch=2),
        )
        for i in range(4)
    ]

    async def drain(worker: CommandWorker) -> int:
        done = 0
        while batch := await worker.run_once():
            done += len(batch)
        return done

    counts = await asyncio.gather(*(drain(worker) for worker in workers))
    assert sum(counts) == 12
    assert len(harness.replies(number)) == 12
    assert len(await harness.commands_history(job_id)) == 12


async def test_many_commands_at_once_are_capped_and_run_in_order(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    body = "\n".join(["/review priority p3", "/review priority p2"] * 10)
    comment_id, answer = await harness.comment(number, body, user="dev1")
    assert len(answer["commands"]) == 5
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P3  # p3, (p2 refused: a raise), p3, ...
    (reply,) = harness.replies(number)
    assert "15 more were ignored" in (reply.body or "")
    history = await harness.commands_history(job_id)
    assert len(history) == 6  # five commands and the cap notice
    assert harness.reactions(comment_id) == ["eyes", "-1"]


async def test_a_huge_comment_runs_only_its_commands(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    body = "/review cancel\n" + ("A" * 1000 + "\n") * 1000 + "/review priority p3"
    _, answer = await harness.comment(number, body, user="dev1")
    assert [c["verb"] for c in answer["commands"]] == ["cancel"]
    await harness.work()
    job = await harness.store.get_job(job_id)
    assert job is not None and job.state is JobState.CANCELLED and job.level is Level.P1
    (reply,) = harness.replies(number)
    assert len(reply.body or "") < 2000


@pytest.mark.parametrize(
    "body",
    ["／review cancel", "/rеview cancel", "/review\u00a0cancel", "/re\u200bview cancel",
     "> /review cancel", "```\n/review cancel\n```"],
)  # fmt: skip
async def test_look_alikes_execute_nothing(harness: Harness, body: str) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    _, answer = await harness.comment(number, body, user="dev1")
    assert answer["status"] == "ignored"
    assert await harness.work() == []
    job = await harness.store.get_job(job_id)
    assert job is not None and job.state is JobState.QUEUED
    assert harness.replies(number) == []


async def test_malformed_and_hostile_commands_get_safe_refusals(harness: Harness) -> None:
    # git allows < > @ in branch names; the hotfix rule's reason quotes the branch.
    hostile_branch = "hotfix/<img src=x onerror=alert(1)>@everyone"
    number, job_id = await harness.open_pull(author="dev1", base_ref=hostile_branch)
    body = "/review <script>x</script> @everyone\n/review ſtatus\n/review status"
    await harness.comment(number, body, user="dev1")
    await harness.work()
    (reply,) = harness.replies(number)
    text = reply.body or ""
    assert "<script" not in text and "<img" not in text
    assert "@everyone" not in re.sub(r"`[^`\n]*`", "", text)  # only inside code spans
    assert "hotfix/‹img src=x onerror=alert(1)›@everyone" in text
    assert text.count("Refused") == 2
    assert f"Review job {job_id}" in text
    history = await harness.commands_history(job_id)
    assert sorted(e.to_value or "" for e in history) == ["accepted", "refused", "refused"]


async def test_the_bots_own_comments_are_never_commands(harness: Harness) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    _, answer = await harness.comment(number, "/review cancel", user="review-bot[bot]",
                                      user_type="Bot")  # fmt: skip
    assert answer["status"] == "ignored"
    await harness.comment(number, "/review help", user="dev1")
    await harness.work()
    (reply,) = harness.replies(number)
    # The bot's reply (which quotes commands) comes back as a webhook: nothing is parsed.
    for user in ("review-bot[bot]", "dev1"):
        _, echoed = await harness.comment(number, reply.body or "", user=user)
        assert echoed["status"] == "ignored"
    assert await harness.work() == []
    job = await harness.store.get_job(job_id)
    assert job is not None and job.state is JobState.QUEUED


async def test_the_app_runs_the_worker_and_notify_wakes_it(
    store: QueueStore,
    aiohttp_client: ClientMaker,
    clock: VirtualClock,
    emulator: ForgeEmulator,
    forges: dict[str, ForgeClient],
) -> None:
    app = create_app(SETTINGS, store=store, clock=clock, forges=forges)
    client = await aiohttp_client(app)
    harness = Harness(client, store, clock, emulator.state, app[COMMAND_WORKER_KEY], forges,
                      itertools.count(1))  # fmt: skip
    assert harness.worker.settings.poll_s >= 2.0
    number, job_id = await harness.open_pull(author="dev1")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await harness.comment(number, "/review priority p3", user="dev1")
    while not harness.replies(number):
        assert loop.time() - started < 10, "the worker never ran the command"
        await asyncio.sleep(0.02)
    elapsed = loop.time() - started
    job = await store.get_job(job_id)
    assert job is not None and job.level is Level.P3
    # Woken by NOTIFY, not by its 2 s poll.
    assert elapsed < 1.5, elapsed


# -- replies and reactions the forge does not take at once ---------------------------------


async def delivery_detail(harness: Harness, delivery_id: str) -> tuple[str, dict[str, Any]]:
    async with harness.store.engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT outcome, detail FROM webhook_deliveries WHERE delivery_id = :id"),
                {"id": delivery_id},
            )
        ).one()
    return row.outcome, dict(row.detail or {})


async def test_a_reply_the_forge_fails_is_deferred_in_the_database_then_posted_once(
    harness: Harness,
) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    # Both in-process attempts of the reply fail: the worker hands it back to the database.
    harness.state.add_fault("github.comments.create", Fault.server_error(502), times=2)
    comment_id, _ = await harness.comment(
        number, "/review priority p3", user="dev1", delivery_id="cmd-deferred"
    )

    [first] = await harness.work()

    assert first.outcome == "command_reply_pending"
    outcome, detail = await delivery_detail(harness, "cmd-deferred")
    assert outcome == "command_reply_pending"
    assert [item["kind"] for item in detail["outbox"]] == ["reply", "reaction"]
    assert detail["outbox_tries"] == 1 and "502" in detail["outbox_error"]
    assert harness.replies(number) == []
    job = await harness.store.get_job(job_id)
    assert job is not None and job.level is Level.P3  # the command itself took effect
    assert await harness.work() == []  # nothing before its retry time (30 s)

    harness.clock.advance(seconds=31)
    [second] = await harness.work()

    assert second.outcome == "command_done" and second.reply_id is not None
    (reply,) = harness.replies(number)
    assert reply.body is not None and "P3" in reply.body and reply.body.endswith(REPLY_MARKER)
    assert harness.reactions(comment_id) == ["eyes", "+1"]
    assert len(await harness.commands_history(job_id)) == 1  # executed once, replied once
    outcome, detail = await delivery_detail(harness, "cmd-deferred")
    assert (outcome, detail["outbox"], detail["reply_id"]) == ("command_done", [], reply.data["id"])


async def test_a_reply_and_reaction_refused_for_auth_are_deferred_never_dropped(
    harness: Harness,
) -> None:
    """401 (a clock off, a token rotated) is not a refusal of the message: it waits, as a
    review would, and goes out once the forge takes the credentials again."""
    number, _ = await harness.open_pull(author="dev1")
    comment_id, _ = await harness.comment(
        number, "/review status", user="dev1", delivery_id="cmd-auth"
    )
    harness.state.add_fault("github.reactions.create", Fault(status=None))  # eyes: normal
    # (A 401 is not retried at once: the call path already tried fresh credentials.)
    harness.state.add_fault("github.comments.create", Fault(status=401, message="Bad credentials"))
    harness.state.add_fault("github.reactions.create", Fault(status=401, message="Bad credentials"))

    [first] = await harness.work()
    assert first.outcome == "command_reply_pending"
    outcome, detail = await delivery_detail(harness, "cmd-auth")
    assert outcome == "command_reply_pending"
    assert [item["kind"] for item in detail["outbox"]] == ["reply", "reaction"]
    assert "401" in detail["outbox_error"] and "reply_error" not in detail
    assert harness.replies(number) == []

    harness.clock.advance(seconds=31)
    [second] = await harness.work()  # the reply goes out; the reaction is refused again
    assert second.outcome == "command_reply_pending"
    assert len(harness.replies(number)) == 1 and harness.reactions(comment_id) == ["eyes"]

    harness.clock.advance(seconds=61)
    [third] = await harness.work()
    assert third.outcome == "command_done"
    assert len(harness.replies(number)) == 1
    assert harness.reactions(comment_id) == ["eyes", "+1"]
    _, detail = await delivery_detail(harness, "cmd-auth")
    assert "reply_error" not in detail


async def test_a_reply_stored_although_its_answer_was_lost_is_not_posted_again(
    harness: Harness,
) -> None:
    number, _ = await harness.open_pull(author="dev1")
    # GitHub stores the comment but the answer is lost, and the look for it fails too: the
    # deferred retry must find the stored reply by its marker instead of posting a second one.
    harness.state.add_fault("github.comments.create", Fault.lost_response(502))
    harness.state.add_fault("github.comments.list", Fault.server_error(502), times=2)
    comment_id, _ = await harness.comment(number, "/review status", user="dev1")

    [first] = await harness.work()
    assert first.outcome == "command_reply_pending"
    assert len(harness.replies(number)) == 1  # stored by the forge, unknown to the worker

    harness.clock.advance(seconds=31)
    [second] = await harness.work()

    assert second.outcome == "command_done"
    (reply,) = harness.replies(number)
    assert second.reply_id == reply.data["id"]
    assert harness.reactions(comment_id) == ["eyes", "+1"]


async def test_a_lost_answer_inside_one_pass_is_found_by_the_marker(harness: Harness) -> None:
    number, _ = await harness.open_pull(author="dev1")
    harness.state.add_fault("github.comments.create", Fault.lost_response(502))
    await harness.comment(number, "/review status", user="dev1")

    [report] = await harness.work()

    assert report.outcome == "command_done"
    (reply,) = harness.replies(number)
    assert report.reply_id == reply.data["id"]


async def test_a_failed_reaction_is_retried_without_posting_the_reply_again(
    harness: Harness,
) -> None:
    number, _ = await harness.open_pull(author="dev1")
    # the eyes acknowledgment succeeds; the final reaction fails twice (both attempts)
    comment_id, _ = await harness.comment(number, "/review status", user="dev1")
    harness.state.add_fault("github.reactions.create", Fault(status=None))  # eyes: normal
    harness.state.add_fault("github.reactions.create", Fault.server_error(503), times=2)

    [first] = await harness.work()
    assert first.outcome == "command_reply_pending"
    assert len(harness.replies(number)) == 1
    assert harness.reactions(comment_id) == ["eyes"]

    harness.clock.advance(seconds=31)
    [second] = await harness.work()

    assert second.outcome == "command_done"
    (reply,) = harness.replies(number)
    assert second.reply_id == reply.data["id"]  # remembered from the first pass
    assert harness.reactions(comment_id) == ["eyes", "+1"]


async def test_a_gitlab_reply_is_deferred_and_posted_once(harness: Harness) -> None:
    number, project_id, _ = await harness.open_merge_request(author="dev1")
    harness.state.add_fault("gitlab.notes.create", Fault.server_error(502), times=2)
    note_id, _ = await harness.note(number, project_id, "/review status", user="dev1")

    [first] = await harness.work()
    assert first.outcome == "command_reply_pending"
    assert harness.replies(number, "gitlab") == []

    harness.clock.advance(seconds=31)
    [second] = await harness.work()

    assert second.outcome == "command_done"
    (reply,) = harness.replies(number, "gitlab")
    assert reply.body is not None and reply.body.endswith(REPLY_MARKER)
    assert harness.reactions(note_id) == ["eyes", "thumbsup"]


async def test_a_reply_the_forge_keeps_failing_is_given_up_with_the_reason(
    harness: Harness,
) -> None:
    number, job_id = await harness.open_pull(author="dev1")
    harness.state.add_fault("github.comments.create", Fault.server_error(502), times=100)
    await harness.comment(number, "/review cancel", user="dev1", delivery_id="cmd-doomed")

    outcomes = [report.outcome for report in await harness.work()]
    for _ in range(6):
        harness.clock.advance(seconds=1000)  # past the longest backoff (900 s)
        outcomes += [report.outcome for report in await harness.work()]

    assert outcomes == ["command_reply_pending"] * 4 + ["command_done"]
    outcome, detail = await delivery_detail(harness, "cmd-doomed")
    assert outcome == "command_done"
    assert detail["reply_error"].startswith("gave up after 5 tries")
    assert harness.replies(number) == []
    job = await harness.store.get_job(job_id)
    assert job is not None and job.state is JobState.CANCELLED
    assert len(await harness.commands_history(job_id)) == 1
