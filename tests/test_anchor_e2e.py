"""Anchoring end to end: a model that errs the way models do (a line off with its quote, no
quote and a line off, a quote of nothing, a fix as replacement code), the real planner,
dispatcher and poster, the forge emulator over loopback; then what the PR shows, what
`bot queue show` says and what /metrics counts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot import cli
from bot.clock import SystemClock
from bot.diff import extract_files, parse_files
from bot.emulator import ForgeEmulator
from bot.forges.base import RetryPolicy
from bot.forges.registry import ForgeOptions, ForgeRegistry, build_forges
from bot.llm.base import LLMRequest, LLMResponse
from bot.model import FileChange, Forge, JobState, Level, PolicyDecision
from bot.obs.metrics import Metrics
from bot.pipeline import build_pipeline
from bot.queue.findings import FindingStore
from bot.queue.store import QueueStore
from bot.review.quiet_post import QuietPosting
from bot.sched.dispatcher import DispatcherSettings
from bot.sched.mlfq import MlfqSettings
from tests.pipeline_helpers import emulator_state, forge_settings, request_for
from tests.serving import wait_until

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
async def emulator() -> AsyncIterator[ForgeEmulator]:
    async with ForgeEmulator(emulator_state(SystemClock())) as running:  # type: ignore[arg-type]
        yield running


@pytest.fixture
async def forges(emulator: ForgeEmulator) -> AsyncIterator[ForgeRegistry]:
    registry = build_forges(
        forge_settings(emulator),
        options=ForgeOptions(retry=RetryPolicy(attempts=2, base_delay_s=0.01), post_interval_s=0),
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
        quiet=QuietPosting(FindingStore(store.engine)) if quiet else None,
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
