"""Quiet reviews end to end: signed webhooks into the real aiohttp app, a real PostgreSQL, the
forge emulator, the real planner, simulated model and quiet poster, push after push.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from sqlalchemy import text

from bot.app import create_app
from bot.clock import VirtualClock
from bot.commands.worker import CommandWorker
from bot.config import DEFAULT_POLICY_DIR
from bot.emulator import (
    EmulatedPull,
    Fault,
    ForgeEmulator,
    build_github_issue_comment_event,
    build_github_pull_request_event,
    build_gitlab_merge_request_event,
    seed_issue_comment,
    send_webhook,
)
from bot.emulator.quiet import open_pull_from_trees, push_tree, set_default_file
from bot.emulator.repository import history_of
from bot.forges.base import SUMMARY_MARKER
from bot.forges.registry import ForgeRegistry
from bot.llm.base import LLMRequest
from bot.llm.simulated import SimulatedBackend
from bot.model import LEVELS, FileChange, Job, JobState, Level
from bot.policy import load_policy_book
from bot.queue.findings import PullRef
from bot.queue.store import QueueSettings, QueueStore
from bot.review.plan_and_post import ReviewPipeline
from bot.review.prompts import build_messages
from bot.review.quiet_post import QuietPosting
from bot.sched.cost import CostEstimate
from tests.support.pipeline_helpers import (
    emulator_forges,
    forge_settings,
    run_all_chunks,
)
from tests.support.webhook_fixtures import load_payload

SECRET = "quiet-webhook-secret"
GITLAB_SECRET = "quiet-gitlab-token"

HANDLER_V1 = FileChange(
    path="app/handler.py",
    additions=4,
    deletions=1,
    patch="\n".join(
        [
            "@@ -1,3 +1,6 @@",
            " def handle(event):",
            "-    return None",
            "+    print(event)",
            "+    # TODO remove before release",
            '+    token = "hunter2-not-a-real-secret"',
            "+    return event",
            " ",
        ]
    ),
)
# The TODO is gone; the rest of the file's change is as before.
HANDLER_V2 = FileChange(
    path="app/handler.py",
    additions=3,
    deletions=1,
    patch="\n".join(
        [
            "@@ -1,3 +1,5 @@",
            " def handle(event):",
            "-    return None",
            "+    print(event)",
            '+    token = "hunter2-not-a-real-secret"',
            "+    return event",
            " ",
        ]
    ),
)
UTILS = FileChange(
    path="app/utils.py",
    additions=2,
    deletions=0,
    patch="@@ -1,2 +1,4 @@\n import os\n+def home() -> str:\n+    return os.environ['HOME']\n ",
)


class QuietBot:
    """The web app on loopback plus the planner, model and quiet poster, driven step by step."""

    def __init__(
        self, store: QueueStore, emulator: ForgeEmulator, forges: ForgeRegistry, clock: VirtualClock
    ) -> None:
        self.store = store
        self.emulator = emulator
        self.clock = clock
        self.book = load_policy_book(DEFAULT_POLICY_DIR)
        settings = forge_settings(
            emulator, github_webhook_secret=SECRET, gitlab_webhook_token=GITLAB_SECRET
        )
        self.server = TestServer(
            create_app(settings, store=store, policies=self.book, clock=clock), host="127.0.0.1"
        )
        self.findings = store.findings
        self.pipeline = ReviewPipeline(store, forges, self.book, quiet=QuietPosting(self.findings))
        self.backend = SimulatedBackend()
        self.commands = CommandWorker(store, forges=forges, policies=self.book, clock=clock)

    async def command(self, pull: EmulatedPull, body: str) -> None:
        """A slash command commented by the PR's author on GitHub, executed by the worker."""
        comment_id = seed_issue_comment(
            self.emulator.state, pull.repo, pull.number, user=pull.author, body=body
        )
        payload = build_github_issue_comment_event(
            load_payload("github/issue_comment.created.json").payload,
            body=body,
            repo=pull.repo,
            number=pull.number,
            author=pull.author,
            author_type="User",
            comment_id=comment_id,
            installation_id=1,
        )
        answer = await send_webhook(
            str(self.server.make_url("/webhooks/github")),
            "github",
            "issue_comment",
            payload,
            SECRET,
        )
        assert answer.status in (200, 202), answer.body
        while await self.commands.run_once():
            pass

    async def send(self, pull: EmulatedPull, *, action: str, before: str | None = None) -> int:
        """Deliver the pull request event the forge sends for its newest head; the job id."""
        if pull.forge == "github":
            fixture = (
                "pull_request.opened.json"
                if action == "opened"
                else ("pull_request.synchronize.json")
            )
            payload = build_github_pull_request_event(
                load_payload(f"github/{fixture}").payload,
                action=action,
                repo=pull.repo,
                number=pull.number,
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
                before=before,
            )
            answer = await send_webhook(
                str(self.server.make_url("/webhooks/github")),
                "github",
                "pull_request",
                payload,
                SECRET,
            )
        else:
            fixture = (
                "merge_request.open.json" if action == "opened" else "merge_request.update.json"
            )
            payload = build_gitlab_merge_request_event(
                load_payload(f"gitlab/{fixture}").payload,
                action="open" if action == "opened" else "update",
                repo=pull.repo,
                project_id=pull.project_id,
                number=pull.number,
                base_ref=pull.base_ref,
                head_ref=pull.head_ref,
                head_sha=pull.newest.head_sha,
                oldrev=before,
                labels=[],
                author="octocat",
                author_is_bot=False,
                draft=False,
            )
            answer = await send_webhook(
                str(self.server.make_url("/webhooks/gitlab")),
                "gitlab",
                "Merge Request Hook",
                payload,
                GITLAB_SECRET,
            )
        assert answer.status in (200, 202), answer.body
        job_id = json.loads(answer.body)["job_id"]
        assert isinstance(job_id, int)
        return job_id

    async def review(self) -> None:
        """Plan what is pending, run every chunk, post what finished."""
        self.clock.advance(1)
        await self.pipeline.plan_jobs(self.clock.now(), CostEstimate())
        for job_id in await run_all_chunks(self.store, self.backend, self.clock):
            await self.pipeline.job_completed(job_id, self.clock.now())

    async def push(self, pull: EmulatedPull, files: list[FileChange]) -> int:
        """Push a new head with these files, deliver its event, review it; the job id."""
        before = pull.newest.head_sha
        self.emulator.state.push(pull.forge, pull.repo, pull.number, files=files)
        job_id = await self.send(pull, action="synchronize", before=before)
        await self.review()
        return job_id


@pytest.fixture
async def bot(
    store: QueueStore, emulator: ForgeEmulator, clock: VirtualClock
) -> AsyncIterator[QuietBot]:
    # As `bot serve` runs quiet reviews: a newer push leaves a running review to finish.
    quiet_store = QueueStore(store.engine, settings=QueueSettings(supersede_running=False))
    async with emulator_forges(emulator, clock, attempts=3) as forges:
        running = QuietBot(quiet_store, emulator, forges, clock)
        await running.server.start_server()
        try:
            yield running
        finally:
            await running.server.close()


def inline_bodies(emulator: ForgeEmulator, pull: EmulatedPull) -> list[str]:
    """Every inline finding posted on the pull request, in order."""
    if pull.forge == "github":
        return [
            str(comment["body"])
            for record in emulator.state.posted(kind="review", repo=pull.repo, number=pull.number)
            for comment in record.data["comments"]
        ]
    return [
        record.body or ""
        for record in emulator.state.posted(kind="discussion", repo=pull.repo, number=pull.number)
    ]


def summaries(emulator: ForgeEmulator, pull: EmulatedPull) -> list[dict[str, Any]]:
    """The summary comments the pull request holds now."""
    items = pull.comments if pull.forge == "github" else pull.notes
    return [item for item in items if SUMMARY_MARKER in str(item.get("body") or "")]


def summary_edits(emulator: ForgeEmulator, pull: EmulatedPull) -> int:
    kind = "comment_edit" if pull.forge == "github" else "note_edit"
    return len(emulator.state.posted(kind=kind, repo=pull.repo, number=pull.number))


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_a_finding_is_said_once_the_summary_is_edited_in_place_and_fixes_resolve(
    bot: QuietBot, emulator: ForgeEmulator, store: QueueStore, forge: str
) -> None:
    repo = "acme/shop" if forge == "github" else "acme/platform/api"
    pull = emulator.state.add_pull(forge, repo, 7, files=[HANDLER_V1])  # type: ignore[arg-type]
    first = await bot.send(pull, action="opened")
    await bot.review()

    said = inline_bodies(emulator, pull)
    assert any("TODO" in body for body in said)
    assert any("credential" in body for body in said)
    assert len(summaries(emulator, pull)) == 1
    job = await store.get_job(first)
    assert job is not None and job.state == JobState.DONE

    # A push that adds an unrelated clean file: nothing new to say, the summary is edited.
    second = await bot.push(pull, [HANDLER_V1, UTILS])
    assert inline_bodies(emulator, pull) == said
    [summary] = summaries(emulator, pull)
    assert summary_edits(emulator, pull) == 1
    assert "0 new" in summary["body"] and "found again and not repeated" in summary["body"]
    job = await store.get_job(second)
    assert job is not None and job.state == JobState.DONE
    # The head's status concludes from every finding still open on it, not from the push's.
    second_review, first_review = (
        await posted_record(store, second),
        await posted_record(store, first),
    )
    assert sum(second_review["open_counts"].values()) == len(said)
    assert second_review["open_counts"] == first_review["open_counts"]

    # The TODO is fixed: its finding is resolved, nothing is posted, the summary says so.
    await bot.push(pull, [HANDLER_V2, UTILS])
    assert inline_bodies(emulator, pull) == said
    [summary] = summaries(emulator, pull)
    assert "1 resolved" in summary["body"] and "TODO" in summary["body"].split("Resolved")[1]
    findings = await bot.findings.findings_of(PullRef(forge, repo, 7))
    states = {item.body.split(";")[0]: item.state for item in findings}
    assert states["A TODO is left in the change"] == "resolved"
    assert list(states.values()).count("open") == len(said) - 1
    third = await store.find_job(forge=forge, repo=repo, number=7)
    assert third is not None
    assert sum((await posted_record(store, third.id))["open_counts"].values()) == len(said) - 1
    if forge == "gitlab":
        resolved = emulator.state.posted(kind="discussion_resolve", repo=repo, number=7)
        assert len(resolved) == 1 and resolved[0].data["resolved"] is True
        todo = next(d for d in pull.discussions if "TODO" in d["notes"][0]["body"])
        assert todo["notes"][0]["resolved"] is True


async def posted_record(store: QueueStore, job_id: int) -> dict[str, Any]:
    """What the job row keeps of its posted review."""
    async with store.engine.connect() as conn:
        found = await conn.scalar(
            text("SELECT review FROM review_jobs WHERE id = :id"), {"id": job_id}
        )
    assert isinstance(found, dict)
    return found


def module(index: int) -> str:
    return f"def step_{index}(value: int) -> int:\n    return value + {index}\n"


BASE_TREE = {"README.md": "# shop\n", "app/core.py": "def core() -> None:\n    return None\n"}
# 41 new modules: a large change the policy puts at P2 (40 files or more).
HEAD_TREE = {**BASE_TREE, **{f"app/steps/step_{i}.py": module(i) for i in range(41)}}
SMELL = "def run(command: str) -> object:\n    return eval(command)\n"


def pull_tree(state: Any, pull: EmulatedPull) -> dict[str, str]:
    """The tree of the pull request's newest head."""
    return dict(history_of(state).commits[pull.newest.head_sha].tree)


async def chunk_paths(store: QueueStore, job_id: int) -> set[str]:
    return {
        str(file["path"]) for chunk in await store.chunk_results(job_id) for file in chunk.files
    }


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_pushes_are_reviewed_incrementally_and_a_force_push_in_full_with_its_reason(
    bot: QuietBot, emulator: ForgeEmulator, store: QueueStore, forge: str
) -> None:
    repo = "acme/shop" if forge == "github" else "acme/platform/api"
    state = emulator.state
    pull = open_pull_from_trees(state, forge, repo, 9, base=BASE_TREE, head=HEAD_TREE)  # type: ignore[arg-type]
    first = await bot.send(pull, action="opened")
    await bot.review()
    job = await store.get_job(first)
    assert job is not None and job.state == JobState.DONE and job.level == Level.P2
    assert len(await chunk_paths(store, first)) == 41
    assert inline_bodies(emulator, pull) == []

    async def push(tree: dict[str, str], **options: Any) -> Job:
        before = pull.newest.head_sha
        push_tree(state, forge, repo, 9, tree, **options)  # type: ignore[arg-type]
        job_id = await bot.send(pull, action="synchronize", before=before)
        await bot.review()
        done = await store.get_job(job_id)
        assert done is not None and done.state == JobState.DONE, done
        return done

    # Push 1 adds a known smell in one new file: only that file is reviewed, at P1.
    smelly = {**HEAD_TREE, "app/run.py": SMELL}
    second = await push(smelly)
    assert await chunk_paths(store, second.id) == {"app/run.py"}
    assert second.level == Level.P1
    if forge == "github":  # GitLab hooks carry no sizes: its intake level was P1 already
        moves = [e for e in await store.job_history(second.id) if e.kind == "level"]
        assert moves and "judged on the increment" in str(moves[-1].reason)
    [smell] = inline_bodies(emulator, pull)
    assert "unsafe" in smell
    [summary] = summaries(emulator, pull)
    assert "incremental, since" in summary["body"]
    level_line = next(line for line in summary["body"].splitlines() if "**Level:**" in line)
    assert level_line.startswith("**Level:** P1") and "judged on the increment" in level_line

    # Push 2 touches only an unrelated file: its review covers only that file.
    unrelated = {**smelly, "README.md": "# shop\n\nThe shop's backend.\n"}
    third = await push(unrelated)
    assert await chunk_paths(store, third.id) == {"README.md"}
    readme_pr = {**unrelated, "app/steps/step_3.py": module(3) + "# tuned\n"}
    fourth = await push(readme_pr)
    assert await chunk_paths(store, fourth.id) == {"app/steps/step_3.py"}
    assert inline_bodies(emulator, pull) == [smell]

    # A force push rewrites history: a full review that says so, and nothing said twice.
    rewritten = await push(
        {**readme_pr, "app/steps/step_4.py": module(4) + "# again\n"}, force=True
    )
    assert len(await chunk_paths(store, rewritten.id)) == 43
    [summary] = summaries(emulator, pull)
    assert "full review: history was rewritten" in summary["body"]
    assert inline_bodies(emulator, pull) == [smell]

    # An empty rebase onto a base that moved elsewhere: reviewed in full, nothing said twice.
    moved_base = {**BASE_TREE, "app/core.py": BASE_TREE["app/core.py"] + "# upstream\n"}
    rebased_tree = {**pull_tree(state, pull), "app/core.py": moved_base["app/core.py"]}
    rebased = await push(rebased_tree, base=moved_base)
    assert len(await chunk_paths(store, rebased.id)) == 43  # core.py is the base's, not the PR's
    assert inline_bodies(emulator, pull) == [smell]
    assert len(summaries(emulator, pull)) == 1
    assert summary_edits(emulator, pull) == 5


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_repository_settings_shape_the_review_and_a_broken_file_is_named_once(
    bot: QuietBot, emulator: ForgeEmulator, store: QueueStore, forge: str
) -> None:
    repo = "acme/shop" if forge == "github" else "acme/platform/api"
    state = emulator.state
    settings = (
        "inline:\n  min_severity: major\npaths:\n  exclude: ['docs/**']\n"
        "instructions:\n  - path: 'app/**'\n    text: 'Prefer the logger.'\n"
    )
    set_default_file(state, repo, ".review-bot.yaml", settings)
    head = {
        **BASE_TREE,
        "app/core.py": "def core(value):\n    print(value)\n    return eval(value)\n",
        "docs/guide.md": "Use `eval` freely.\n",
    }
    pull = open_pull_from_trees(state, forge, repo, 11, base=BASE_TREE, head=head)  # type: ignore[arg-type]
    first = await bot.send(pull, action="opened")
    await bot.review()

    # The debug print (info) is below the repository's floor: summary only; docs are excluded.
    [said] = inline_bodies(emulator, pull)
    assert "unsafe" in said
    assert await chunk_paths(store, first) == {"app/core.py"}
    job = await store.get_job(first)
    assert job is not None and job.pull_details["instructions"] == [
        {"path": "app/**", "text": "Prefer the logger."}
    ]
    [summary] = summaries(emulator, pull)
    assert (
        "Debug output left in" in summary["body"] and "summary only: below major" in summary["body"]
    )
    assert "`docs/guide.md`: excluded by .review-bot.yaml" in summary["body"]

    # A broken file: the server's defaults apply and the summary names file:line, once.
    set_default_file(state, repo, ".review-bot.yaml", "inline:\n  min_severity: loud\n")
    tree = {**head, "app/core.py": head["app/core.py"] + "# TODO tidy\n"}
    before = pull.newest.head_sha
    push_tree(state, forge, repo, 11, tree)  # type: ignore[arg-type]
    await bot.send(pull, action="synchronize", before=before)
    await bot.review()
    [summary] = summaries(emulator, pull)
    assert ".review-bot.yaml:2: inline.min_severity must be one of" in summary["body"]
    assert "the server's defaults apply" in summary["body"]
    bodies = [
        str(item.get("body")) for item in (pull.comments if forge == "github" else pull.notes)
    ]
    assert sum(".review-bot.yaml:2" in body for body in bodies) == 1
    assert any("TODO" in body for body in inline_bodies(emulator, pull))  # minor: inline again

    # Automatic reviews turned off: a push is not reviewed.
    set_default_file(state, repo, ".review-bot.yaml", "reviews:\n  auto: false\n")
    before = pull.newest.head_sha
    push_tree(state, forge, repo, 11, {**tree, "app/extra.py": SMELL})  # type: ignore[arg-type]
    skipped = await bot.send(pull, action="synchronize", before=before)
    await bot.review()
    job = await store.get_job(skipped)
    assert job is not None and job.state == JobState.CANCELLED
    assert "automatic reviews are off" in str(job.last_error)


async def test_review_full_reviews_everything_and_review_only_what_changed(
    bot: QuietBot, emulator: ForgeEmulator, store: QueueStore
) -> None:
    state = emulator.state
    pull = open_pull_from_trees(state, "github", "acme/shop", 12, base=BASE_TREE, head=HEAD_TREE)
    await bot.send(pull, action="opened")
    await bot.review()
    push_tree(state, "github", "acme/shop", 12, {**HEAD_TREE, "app/run.py": SMELL})
    await bot.send(pull, action="synchronize")
    await bot.review()
    [smell] = inline_bodies(emulator, pull)

    await bot.command(pull, "/review")  # nothing changed since: an empty increment
    await bot.review()
    again = await store.find_job(forge="github", repo="acme/shop", number=12)
    assert again is not None and again.state == JobState.DONE and again.chunks_total == 0
    assert again.pull_details["increment"]["mode"] == "incremental"

    await bot.command(pull, "/review full")
    await bot.review()
    full = await store.find_job(forge="github", repo="acme/shop", number=12)
    assert full is not None and full.id != again.id and full.state == JobState.DONE
    assert len(await chunk_paths(store, full.id)) == 42
    [summary] = summaries(emulator, pull)
    assert "full review: a full review was asked for" in summary["body"]
    assert inline_bodies(emulator, pull) == [smell]


async def test_a_summary_whose_answer_was_lost_is_found_not_posted_twice(
    bot: QuietBot, emulator: ForgeEmulator, store: QueueStore
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 14, files=[HANDLER_V1])
    emulator.state.add_fault("github.comments.create", Fault.lost_response(502))
    job_id = await bot.send(pull, action="opened")
    await bot.review()
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.DONE
    assert len(summaries(emulator, pull)) == 1
    assert emulator.state.count_requests("github.comments.create") == 1


async def test_a_summary_that_fails_to_post_is_retried_without_repeating_anything(
    bot: QuietBot, emulator: ForgeEmulator, store: QueueStore, clock: VirtualClock
) -> None:
    pull = emulator.state.add_pull("github", "acme/shop", 13, files=[HANDLER_V1])
    # Every attempt of the client fails: the review went out, the summary did not.
    emulator.state.add_fault("github.comments.create", Fault.server_error(502), times=3)
    job_id = await bot.send(pull, action="opened")
    await bot.review()
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.RUNNING and "posting" in str(job.last_error)
    said = inline_bodies(emulator, pull)
    assert said

    clock.advance(3600)
    [outcome] = await bot.pipeline.recover(clock.now())
    assert outcome.result == "posted", outcome
    assert inline_bodies(emulator, pull) == said  # the review was found by its marker
    assert len(summaries(emulator, pull)) == 1
    recorded = await bot.findings.findings_of(PullRef("github", "acme/shop", 13))
    assert len(recorded) == len(said) and all(item.state == "open" for item in recorded)
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.DONE


async def test_a_push_while_a_review_runs_lets_it_finish_and_reviews_what_came_after(
    bot: QuietBot, emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    store, state = bot.store, emulator.state
    head = {**BASE_TREE, "app/core.py": "def core(value):\n    return eval(value)\n"}
    pull = open_pull_from_trees(state, "github", "acme/shop", 15, base=BASE_TREE, head=head)
    first = await bot.send(pull, action="opened")
    await bot.pipeline.plan_jobs(clock.now(), CostEstimate())
    leased = await store.fetch_chunk(levels=LEVELS, owner="worker", now=clock.now(), lease_s=60)
    assert leased is not None and leased.chunk.job_id == first  # the review is running

    push_tree(state, "github", "acme/shop", 15, {**head, "app/run.py": SMELL})
    second = await bot.send(pull, action="synchronize")
    running = await store.get_job(first)
    assert running is not None and running.state == JobState.RUNNING  # not superseded
    await bot.pipeline.plan_jobs(clock.now(), CostEstimate())
    waiting = await store.get_job(second)
    assert waiting is not None and not waiting.planned  # it plans after the running review

    answer = await bot.backend.complete(
        LLMRequest(messages=build_messages(leased.chunk.files), metadata={"job_id": first})
    )
    done = await store.finish_chunk(
        leased.chunk.id,
        owner="worker",
        now=clock.now(),
        gpu_seconds=answer.gpu_seconds,
        result={"text": answer.text, "worker": answer.worker},
    )
    assert done.job_complete
    await bot.pipeline.job_completed(first, clock.now())
    clock.advance(10)
    await bot.review()

    finished = [await store.get_job(job_id) for job_id in (first, second)]
    assert [job.state if job else None for job in finished] == [JobState.DONE, JobState.DONE]
    assert finished[1] is not None
    assert finished[1].pull_details["increment"]["since"] == pull.versions[0].head_sha
    assert await chunk_paths(store, second) == {"app/run.py"}
    said = inline_bodies(emulator, pull)
    assert len(said) == 2 and all("unsafe" in body for body in said)  # core.py, then run.py
    assert len(summaries(emulator, pull)) == 1


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_a_review_finds_its_summary_from_the_queue_not_by_reading_the_comments(
    bot: QuietBot, emulator: ForgeEmulator, store: QueueStore, forge: str
) -> None:
    """Reviews of an opened pull request and of the pushes after it never list the comments,
    reviews or discussions to find what they wrote: the first creates the summary, the next
    edit it by the id the queue recorded. A summary deleted by hand is looked for, then
    written anew."""
    repo = "acme/shop" if forge == "github" else "acme/platform/api"
    pull = emulator.state.add_pull(forge, repo, 8, files=[HANDLER_V1])  # type: ignore[arg-type]
    lookups = (
        ("github.comments.list", "github.reviews.list")
        if forge == "github"
        else ("gitlab.notes.list", "gitlab.discussions.list")
    )

    def looked() -> int:
        return sum(emulator.state.count_requests(route) for route in lookups)

    first = await bot.send(pull, action="opened")
    await bot.review()
    assert inline_bodies(emulator, pull) and len(summaries(emulator, pull)) == 1
    assert looked() == 0
    await bot.push(pull, [HANDLER_V1, UTILS])
    [summary] = summaries(emulator, pull)
    assert summary_edits(emulator, pull) == 1 and "0 new" in summary["body"]
    assert summary["id"] == (await posted_record(store, first))["summary_comment_id"]
    assert looked() == 0

    # Deleted by hand: the edit finds nothing (404), the comments are read, a new one is written.
    kept = pull.comments if forge == "github" else pull.notes
    kept[:] = [item for item in kept if SUMMARY_MARKER not in str(item.get("body") or "")]
    third = await bot.push(pull, [HANDLER_V2, UTILS])
    [summary] = summaries(emulator, pull)
    assert "1 resolved" in summary["body"]
    assert summary["id"] == (await posted_record(store, third))["summary_comment_id"]
    assert emulator.state.count_requests(lookups[0]) == 1
