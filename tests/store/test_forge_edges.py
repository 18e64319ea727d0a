"""Forge edge cases: GitLab's renamed files and releases before 15.7, and a 404 on a part of a
pull/merge request, which is not "the change is gone"."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.clock import VirtualClock
from bot.config import DEFAULT_POLICY_DIR
from bot.emulator import (
    EmulatorState,
    Fault,
    ForgeEmulator,
    build_gitlab_merge_request_event,
    generate_file_changes,
)
from bot.errors import ForgeError, ForgeNotFound
from bot.forges.base import InlineComment, RetryPolicy, ReviewToPost, parse_diff_lines
from bot.forges.gitlab import GitLabClient
from bot.forges.registry import ForgeRegistry
from bot.intake.normalize import normalize_delivery
from bot.intake.verify import Delivery
from bot.llm.simulated import SimulatedBackend
from bot.model import FileChange, JobState, ReviewRequest
from bot.policy import evaluate, load_policy_book
from bot.queue.store import QueueStore
from bot.review.comments import inline_comment, review_diff
from bot.review.parse import Finding
from bot.review.planner import claim_and_plan_jobs
from bot.review.poster import post_job_review
from tests.support.pipeline_helpers import (
    SMELLY,
    emulator_forges,
    request_for,
    run_all_chunks,
)
from tests.support.webhook_fixtures import load_payload

REPO = "acme/platform/api"
RENAMED = FileChange(
    path="src/billing/invoice.py",
    previous_path="src/invoice.py",
    status="renamed",
    additions=2,
    deletions=1,
    patch="@@ -4,3 +4,4 @@\n def total(items):\n-    return sum(items)\n"
    "+    # TODO: rounding\n+    return round(sum(items), 2)\n ",
)


@pytest.fixture
async def forges(emulator: ForgeEmulator, clock: VirtualClock) -> AsyncIterator[ForgeRegistry]:
    async with emulator_forges(emulator, clock) as registry:
        yield registry


def client_of(forges: ForgeRegistry) -> GitLabClient:
    client = forges["gitlab"]
    assert isinstance(client, GitLabClient)
    return client


async def test_a_comment_on_a_renamed_file_carries_the_old_path(
    emulator: ForgeEmulator, forges: ForgeRegistry
) -> None:
    emulator.state.add_pull("gitlab", REPO, 4, files=[RENAMED])
    client = client_of(forges)
    changes = await client.fetch_changes(REPO, 4)
    assert changes.files[0].previous_path == "src/invoice.py"
    added = min(parse_diff_lines(RENAMED.patch).added)
    removed = min(parse_diff_lines(RENAMED.patch).removed)
    review = ReviewToPost(
        job_id=41,
        body="summary",
        comments=(
            InlineComment(RENAMED.path, added, "rounding"),
            InlineComment(RENAMED.path, removed, "was unrounded", side="LEFT"),
        ),
        head_sha=changes.head_sha,
        base_sha=changes.base_sha,
        start_sha=changes.start_sha,
    )
    posted = await client.post_review(REPO, 4, review)
    assert (posted.inline_posted, posted.inline_rejected) == (2, 0)
    positions = [record.data["position"] for record in emulator.state.posted(kind="discussion")]
    assert [(p["old_path"], p["new_path"]) for p in positions] == [
        ("src/invoice.py", "src/billing/invoice.py")
    ] * 2


async def test_gitlab_before_15_7_is_read_through_changes(
    emulator: ForgeEmulator, forges: ForgeRegistry
) -> None:
    emulator.state.gitlab_version = (15, 6)
    files = generate_file_changes(changed_lines=60, files=4, seed=8)
    emulator.state.add_pull("gitlab", REPO, 5, files=files)
    emulator.state.add_pull("gitlab", REPO, 6, files=[RENAMED])
    client = client_of(forges)

    first = await client.fetch_changes(REPO, 5)
    second = await client.fetch_changes(REPO, 6)

    assert [item.path for item in first.files] == [item.path for item in files]
    assert [(i.additions, i.deletions) for i in first.files] == [
        (i.additions, i.deletions) for i in files
    ]
    assert second.files[0].previous_path == RENAMED.previous_path
    # /diffs is tried once; from then on the client knows to read /changes.
    assert emulator.state.count_requests("gitlab.diffs", status=404) == 1
    assert emulator.state.count_requests("gitlab.changes", status=200) == 2


async def test_a_404_on_the_merge_request_itself_still_means_gone(
    emulator: ForgeEmulator, forges: ForgeRegistry
) -> None:
    emulator.state.gitlab_version = (15, 6)
    with pytest.raises(ForgeNotFound):
        await client_of(forges).fetch_changes(REPO, 99)


def merge_request_hook(emulator: ForgeEmulator, number: int) -> ReviewRequest:
    """A Merge Request Hook as GitLab sends it, pointed at a seeded MR."""
    fixture = load_payload("gitlab/merge_request.open.json").payload
    pull = emulator.state.get_pull("gitlab", REPO, number)
    payload = build_gitlab_merge_request_event(
        fixture,
        repo=REPO,
        project_id=pull.project_id,
        number=number,
        head_sha=pull.newest.head_sha,
        base_ref="main",
    )
    request = normalize_delivery(Delivery("gitlab", "Merge Request Hook", "d-1", payload))
    assert isinstance(request, ReviewRequest)
    return request


async def submitted_job(store: QueueStore, emulator: ForgeEmulator, clock: VirtualClock) -> int:
    request = merge_request_hook(emulator, 7)
    book = load_policy_book(DEFAULT_POLICY_DIR)
    result = await store.submit_request(
        request, evaluate(book.policy_for(REPO), request), now=clock.now()
    )
    assert result.job_id is not None
    return result.job_id


async def test_old_gitlab_that_serves_neither_diffs_nor_changes_fails_the_job_with_the_reason(
    store: QueueStore, emulator: ForgeEmulator, forges: ForgeRegistry, clock: VirtualClock
) -> None:
    emulator.state.gitlab_version = (15, 6)
    emulator.state.add_pull("gitlab", REPO, 7, files=[SMELLY])
    emulator.state.add_fault("gitlab.changes", Fault(status=404, message="404 Not Found"))
    job_id = await submitted_job(store, emulator, clock)

    book = load_policy_book(DEFAULT_POLICY_DIR)
    [outcome] = await claim_and_plan_jobs(store, forges, book, now=clock.now())

    assert outcome.result == "failed", outcome
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.FAILED
    assert "404 to both /diffs and /changes" in (job.last_error or "")
    assert "which exists" in (job.last_error or "")


async def test_a_404_on_the_summary_note_of_an_existing_mr_fails_the_post_instead_of_cancelling(
    store: QueueStore, emulator: ForgeEmulator, forges: ForgeRegistry, clock: VirtualClock
) -> None:
    emulator.state.add_pull("gitlab", REPO, 7, files=[SMELLY])
    job_id = await submitted_job(store, emulator, clock)
    book = load_policy_book(DEFAULT_POLICY_DIR)
    assert [o.result for o in await claim_and_plan_jobs(store, forges, book, now=clock.now())] == [
        "planned"
    ]
    await run_all_chunks(store, SimulatedBackend(), clock)
    # A first posting attempt writes without looking for an earlier one's notes.
    emulator.state.add_fault("gitlab.notes.create", Fault(status=404, message="404 Not Found"))

    outcome = await post_job_review(store, forges, job_id, now=clock.now())

    assert outcome.result == "failed", outcome
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.FAILED
    assert "404 to a review post of merge request" in (job.last_error or "")


async def test_a_merge_request_without_a_diff_version_yet_is_retried_not_cancelled(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    state: EmulatorState = emulator.state
    state.add_pull("gitlab", REPO, 8, files=[SMELLY])
    state.get_pull("gitlab", REPO, 8).versions.clear()
    client = GitLabClient(
        url=emulator.gitlab_url,
        token="glpat-test-token",
        clock=clock.now,
        sleep=clock.sleep,
        retry=RetryPolicy(attempts=1),
    )
    with pytest.raises(ForgeError) as raised:
        await client.fetch_changes(REPO, 8)
    assert not isinstance(raised.value, ForgeNotFound)
    assert raised.value.retryable


async def test_a_404_on_the_review_post_of_an_existing_pull_request_fails_instead_of_cancelling(
    store: QueueStore, emulator: ForgeEmulator, forges: ForgeRegistry, clock: VirtualClock
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 9, files=[SMELLY])
    book = load_policy_book(DEFAULT_POLICY_DIR)
    request = request_for(pull)
    submitted = await store.submit_request(
        request, evaluate(book.policy_for(pull.repo), request), now=clock.now()
    )
    assert submitted.job_id is not None
    assert [o.result for o in await claim_and_plan_jobs(store, forges, book, now=clock.now())] == [
        "planned"
    ]
    await run_all_chunks(store, SimulatedBackend(), clock)
    emulator.state.add_fault("github.reviews.create", Fault(status=404, message="Not Found"))

    outcome = await post_job_review(store, forges, submitted.job_id, now=clock.now())

    assert outcome.result == "failed", outcome
    job = await store.get_job(submitted.job_id)
    assert job is not None and job.state == JobState.FAILED
    assert "404 to a review post of pull request acme/shop#9, which exists" in (
        job.last_error or ""
    )
    assert emulator.state.count_requests("github.pull", status=200) >= 1


async def test_after_a_restart_and_a_push_a_renamed_file_keeps_its_old_path(
    emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    unchanged = FileChange(
        path="src/tax.py",
        additions=1,
        deletions=0,
        patch="@@ -10,3 +10,4 @@ def rate():\n     base = 0.2\n+    extra = 0.01\n"
        "     return base\n     # end",
    )
    emulator.state.add_pull("gitlab", REPO, 9, files=[RENAMED, unchanged])
    # The review's chunks keep the diff as the planner read it.
    async with emulator_forges(emulator, clock) as first:
        planned = await client_of(first).fetch_changes(REPO, 9)
    chunk_files = [
        {"path": f.path, "patch": f.patch, "previous_path": f.previous_path, "status": f.status}
        for f in planned.files
    ]
    # A push moves the merge request on; then the process restarts (a fresh client).
    emulator.state.push("gitlab", REPO, 9, files=[RENAMED, unchanged])
    diff = review_diff(chunk_files)
    findings = [
        Finding(RENAMED.path, min(parse_diff_lines(RENAMED.patch).added), "RIGHT", "minor", "a"),
        Finding(RENAMED.path, 5, "LEFT", "minor", "b"),
        Finding("src/tax.py", 12, "RIGHT", "minor", "on an unchanged line"),
    ]
    review = ReviewToPost(
        job_id=42,
        body="summary",
        comments=tuple(inline_comment(f, diff, body=f.body) for f in findings),
        head_sha=planned.head_sha,
        base_sha=planned.base_sha,
        start_sha=planned.start_sha,
    )
    async with emulator_forges(emulator, clock) as restarted:
        posted = await client_of(restarted).post_review(REPO, 9, review)

    assert (posted.inline_posted, posted.inline_rejected) == (3, 0)
    positions = [record.data["position"] for record in emulator.state.posted(kind="discussion")]
    assert [p["old_path"] for p in positions] == ["src/invoice.py", "src/invoice.py", "src/tax.py"]
    assert (positions[2]["old_line"], positions[2]["new_line"]) == (11, 12)
    assert {p["head_sha"] for p in positions} == {planned.head_sha}
