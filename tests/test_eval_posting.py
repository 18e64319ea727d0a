"""Every review `bot eval` produces posts through the forge emulator without a refusal."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from bot.config import Settings
from bot.emulator import EmulatorState, ForgeEmulator
from bot.eval.command import evaluate
from bot.eval.run import EVAL_REPO
from bot.forges.base import RetryPolicy
from bot.forges.github import GitHubClient

REPO = Path(__file__).parent / "data" / "eval_repo"


async def test_the_oracle_reviews_post_without_a_refused_request() -> None:
    evaluation = await evaluate(REPO, count=40, seed=9, llm="oracle", settings=Settings())
    state = EmulatorState()
    state.github_tokens.add("eval-token")
    async with ForgeEmulator(state) as emulator, aiohttp.ClientSession() as session:
        client = GitHubClient(
            session,
            base_url=emulator.github_url,
            token="eval-token",
            retry=RetryPolicy(attempts=1, base_delay_s=0.0),
            post_interval_s=0.0,
        )
        for outcome in evaluation.outcomes:
            state.add_pull(
                "github",
                EVAL_REPO,
                outcome.mutant.id,
                files=[outcome.change],
                head_sha=outcome.review.head_sha,
                base_sha=outcome.review.base_sha,
            )
            posted = await client.post_review(EVAL_REPO, outcome.mutant.id, outcome.review)
            assert not posted.summary_only and posted.inline_rejected == 0
    review_posts = [
        request
        for request in state.requests
        if request.method == "POST" and request.path.endswith("/reviews")
    ]
    assert len(review_posts) == 40
    assert {request.status for request in review_posts} == {200}
    posted_comments = [
        (record.number, comment["path"], comment["side"], comment["line"])
        for record in state.posted(kind="review")
        for comment in record.data["comments"]
    ]
    sent = [
        (outcome.mutant.id, path, side, line)
        for outcome in evaluation.outcomes
        for path, side, line in outcome.inline
    ]
    assert sorted(posted_comments) == sorted(sent)
    # The oracle's findings are anchored, so nearly every review carries its inline comment.
    assert len(sent) >= 0.95 * len(evaluation.outcomes)
