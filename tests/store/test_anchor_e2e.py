"""Anchoring end to end: a model that errs the way models do (a line off with its quote, no
quote and a line off, a quote of nothing, a fix as replacement code), the real planner,
dispatcher and poster, the forge emulator over loopback; then what the PR shows, what
`bot queue show` says and what /metrics counts."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot import cli
from bot.clock import SystemClock, VirtualClock
from bot.components import local_write_budget
from bot.diff import extract_files, parse_files
from bot.emulator import ForgeEmulator, generate_file_changes
from bot.forges.base import RetryPolicy, ReviewToPost
from bot.forges.registry import ForgeOptions, ForgeRegistry, build_forges
from bot.llm.base import LLMRequest, LLMResponse
from bot.model import FileChange, Forge, JobState, Level, PolicyDecision
from bot.obs.metrics import Metrics
from bot.pipeline import build_pipeline
from bot.queue.store import QueueStore
from bot.review.anchor import index_files
from bot.review.comments import inline_comment, review_diff
from bot.review.parse import parse_review
from bot.review.quiet_post import QuietPosting
from bot.sched.dispatcher import DispatcherSettings
from bot.sched.mlfq import MlfqSettings
from tests.support.pipeline_helpers import forge_settings, request_for
from tests.support.serving import wait_until

pytestmark = pytest.mark.emulator(virtual_clock=False)

# As `git diff -U0` writes it: no unchanged lines around, so a line named next to a changed
# one is not itself in the diff.
PATCH = (
    "@@ -22 +22,2 @@ def step_5(value):\n"
    "-    return value + 5\n"
    "+    total = value + 5\n"
    "+    return total / 0\n"
    "@@ -38 +39 @@ def step_9(value):\n"
    "-    return value + 9\n"
    "+    return eval(str(value))"
)
DIVISION, EVALUATE = 23, 39


class ErringModel:
    """Answers about the added lines of the prompt, with the errors real models make."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.calls += 1
        (file,) = parse_files(
            {"path": f.path, "patch": f.patch}
            for f in extract_files(request.messages[-1]["content"])
        )
        added = {
            line.text.strip(): line.new_line
            for hunk in file.hunks
            for line in hunk.lines
            if line.kind == "+"
        }
        division, evaluate = added["return total / 0"], added["return eval(str(value))"]
        findings = [
            {  # right line, right quote, and the fix for exactly that line
                "path": file.path,
                "line": division,
                "side": "RIGHT",
                "quote": "return total / 0",
                "severity": "critical",
                "body": "Division by zero.",
                "suggestion": "    return total / 1",
            },
            {  # counted from the hunk start: two lines off, but quoted
                "path": "./" + file.path,
                "line": evaluate - 2,
                "side": "RIGHT",
                "quote": "return eval(str(value))",
                "severity": "major",
                "body": "eval of input.",
            },
            {  # no quote, one line off
                "path": file.path,
                "line": division + 1,
                "side": "RIGHT",
                "severity": "minor",
                "body": "Name the intermediate.",
            },
            {  # a quote of a line that is not there
                "path": file.path,
                "line": division,
                "side": "RIGHT",
                "quote": "os.remove(path)",
                "severity": "minor",
                "body": "Files are removed without a check.",
            },
        ]
        text = json.dumps({"findings": findings, "summary": "Checked."})
        return LLMResponse(
            text=text,
            prompt_tokens=100,
            completion_tokens=50,
            latency_s=0.01,
            gpu_seconds=0.01,
            worker="erring",
            finish_reason="stop",
        )

    async def close(self) -> None:
        return None


@pytest.fixture
async def forges(emulator: ForgeEmulator) -> AsyncIterator[ForgeRegistry]:
    settings = forge_settings(emulator)
    registry = build_forges(
        settings,
        options=ForgeOptions(retry=RetryPolicy(attempts=2, base_delay_s=0.01)),
        budget=local_write_budget(
            settings, now=SystemClock().now, sleep=asyncio.sleep, post_interval_s=0
        ),
    )
    async with registry:
        yield registry


def inline_comments(emulator: ForgeEmulator, forge: Forge) -> list[tuple[str, int, str, str]]:
    """(path, line, side, body) of every inline comment the PR got, sorted."""
    if forge == "github":
        (review,) = emulator.state.posted(kind="review", number=31)
        return sorted((c["path"], c["line"], c["side"], c["body"]) for c in review.data["comments"])
    found = []
    for record in emulator.state.posted(kind="discussion", number=31):
        position = record.data["position"]
        side = "RIGHT" if position.get("new_line") is not None else "LEFT"
        line = position.get("new_line") or position.get("old_line")
        found.append((str(position["new_path"]), int(line), side, record.body or ""))
    return sorted(found)


@pytest.mark.parametrize(
    ("forge", "quiet"), [("github", False), ("github", True), ("gitlab", True)]
)
async def test_findings_land_where_they_belong_and_the_outcomes_are_counted(
    forge: Forge,
    quiet: bool,
    store: QueueStore,
    db_url: str,
    emulator: ForgeEmulator,
    forges: ForgeRegistry,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    pull = emulator.state.add_pull(
        forge, "acme/shop", 31, files=[FileChange("calc.py", 3, 2, PATCH)]
    )
    metrics = Metrics()
    decision = PolicyDecision(level=Level.P2, reasons=("test",))
    submitted = await store.submit_request(request_for(pull), decision, now=SystemClock().now())
    job_id = submitted.job_id
    assert job_id is not None
    pipeline = build_pipeline(
        store,
        forges=forges,
        policies=None,
        backend=ErringModel(),
        clock=SystemClock(),
        metrics=metrics,
        quiet=QuietPosting(store.findings) if quiet else None,
        dispatcher=DispatcherSettings(
            owner="anchor-test", policy="mlfq", slots=1, poll_s=0.1, mlfq=MlfqSettings()
        ),
    )
    runner = asyncio.create_task(pipeline.dispatcher.run(database_url=db_url))

    async def done() -> bool:
        job = await store.get_job(job_id)
        return job is not None and job.state == JobState.DONE

    try:
        await wait_until(done, timeout_s=30, what="the review is posted")
    finally:
        pipeline.dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10)

    division, evaluate = DIVISION, EVALUATE
    placed = inline_comments(emulator, forge)
    assert [(path, line, side) for path, line, side, _ in placed] == [
        ("calc.py", division, "RIGHT"),  # the nearby one: named one line below
        ("calc.py", division, "RIGHT"),
        ("calc.py", evaluate, "RIGHT"),  # moved two lines by its quote
    ]
    bodies = [body for *_, body in placed]
    block = "```suggestion" if forge == "github" else "```suggestion:-0+0"
    assert any(
        f"Division by zero.\n\n{block}\n    return total / 1\n```" in body for body in bodies
    )
    assert any("Name the intermediate." in body for body in bodies[:2])
    assert "eval of input." in bodies[2]
    # The quote of nothing is in the summary, with its file and text, and nowhere inline.
    summaries = [item.body or "" for item in emulator.state.posted(number=31)]
    assert any(
        "Not anchored" in body
        and "`calc.py`" in body
        and "Files are removed without a check." in body
        for body in summaries
    )
    assert all("Files are removed" not in body for body in bodies)

    monkeypatch.setenv("DATABASE_URL", db_url)
    status = await asyncio.to_thread(cli.main, ["queue", "show", str(job_id), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert status == 0
    assert document["anchoring"] == {"exact": 1, "by_quote": 1, "nearby": 1, "summary_only": 1}
    status = await asyncio.to_thread(cli.main, ["queue", "show", str(job_id)])
    assert "anchoring  1 exact, 1 by quote, 1 nearby, 1 summary only" in capsys.readouterr().out
    exported = metrics.render().decode()
    for outcome in ("exact", "by_quote", "nearby", "summary_only"):
        assert f'review_bot_findings_anchored_total{{outcome="{outcome}"}} 1.0' in exported


def erring_answer(rng: random.Random, files: list[FileChange]) -> str:
    """Findings as a careless model writes them: any line, any side, quotes right or wrong,
    ranges that may run off their hunk, paths with prefixes, fixes."""
    findings = []
    for _ in range(12):
        file = rng.choice(files)
        shown = [
            (line.new_line if line.kind != "-" else line.old_line, line.text)
            for hunk in parse_files([{"path": file.path, "patch": file.patch}])[0].hunks
            for line in hunk.lines
        ]
        number, text = rng.choice(shown)
        line = max(1, (number or 1) + rng.choice([0, 0, 1, -1, 2, -3, 5, 40]))
        item: dict[str, object] = {
            "path": rng.choice(["", "./", "a/", "b/"]) + file.path,
            "line": line,
            "side": rng.choice(["RIGHT", "LEFT", None]),
            "severity": rng.choice(["critical", "major", "minor", "info"]),
            "body": f"finding {rng.random():.6f}",
        }
        roll = rng.random()
        if roll < 0.5:
            item["quote"] = text
        elif roll < 0.6:
            item["quote"] = "no such line at all"
        if rng.random() < 0.4:
            item["start_line"] = max(1, line - rng.randint(1, 6))
        if rng.random() < 0.4:
            item["suggestion"] = "    fixed = True\n    return fixed"
        findings.append(item)
    return json.dumps({"findings": findings, "summary": "s"})


@pytest.mark.parametrize("forge", ["github", "gitlab"])
async def test_no_anchored_comment_is_ever_refused(
    forge: Forge, emulator: ForgeEmulator, clock: VirtualClock
) -> None:
    # 30 reviews write over GitLab's 300 a minute: the clients' budget waits for the next
    # minute on a virtual clock, and the emulator's window is off (neither is what this test
    # is about; it took a minute of real waiting).
    emulator.state.set_content_limits("gitlab", per_minute=0, per_hour=0)
    settings = forge_settings(emulator)
    forges = build_forges(
        settings,
        clock=clock.now,
        sleep=clock.sleep,
        options=ForgeOptions(retry=RetryPolicy(attempts=2, base_delay_s=0.01)),
        budget=local_write_budget(settings, now=clock.now, sleep=clock.sleep, post_interval_s=0),
    )
    async with forges:
        await _post_thirty_erring_reviews(forge, emulator, forges)


async def _post_thirty_erring_reviews(
    forge: Forge, emulator: ForgeEmulator, forges: ForgeRegistry
) -> None:
    rng = random.Random(2024)
    client = forges[forge]
    posted_inline = 0
    for number in range(100, 130):
        files = generate_file_changes(changed_lines=rng.randint(5, 60), files=2, seed=number)
        pull = emulator.state.add_pull(forge, "acme/shop", number, files=files)
        chunk_files = [{"path": f.path, "patch": f.patch, "status": f.status} for f in files]
        parsed = parse_review(erring_answer(rng, files), index_files(chunk_files))
        diff = review_diff(chunk_files)
        review = ReviewToPost(
            job_id=number,
            body="summary",
            comments=tuple(
                inline_comment(finding, diff, body=finding.body) for finding in parsed.placed
            ),
            head_sha=pull.newest.head_sha,
            base_sha=pull.newest.base_sha,
            start_sha=pull.newest.start_sha,
        )
        posted = await client.post_review("acme/shop", number, review)
        assert (posted.inline_rejected, posted.summary_only) == (0, False), number
        posted_inline += posted.inline_posted
    assert posted_inline > 100  # the model's errors were mostly anchored, not all dropped
    assert emulator.state.count_requests("github.reviews.create", status=422) == 0
    assert emulator.state.count_requests("gitlab.discussions.create", status=400) == 0
