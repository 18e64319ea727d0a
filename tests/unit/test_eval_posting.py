"""`bot eval` reviews as the bot serves them: the prompt a served review sends, and every review
posted through the forge emulator without a refusal."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from bot.config import Settings
from bot.emulator import EmulatorState, ForgeEmulator
from bot.eval.command import evaluate, plant_in_repo
from bot.eval.oracle import OracleBackend, user_text
from bot.eval.plant import Mutant
from bot.eval.run import DESCRIPTION, EVAL_REPO, review_mutants
from bot.forges.base import RetryPolicy
from bot.forges.github import GitHubClient
from bot.llm.base import LLMRequest, LLMResponse
from bot.review.prompt_context import BEGIN_CONTEXT, BEGIN_PULL_REQUEST

REPO = Path(__file__).resolve().parents[1] / "data" / "eval_repo"


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


class RecordingOracle(OracleBackend):
    """The oracle, keeping each prompt it was sent."""

    def __init__(self, mutants: list[Mutant], *, seed: int) -> None:
        super().__init__(mutants, seed=seed)
        self.prompts: dict[int, str] = {}

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.prompts[int(request.metadata["job_id"])] = user_text(request)
        return await super().complete(request)


async def test_the_model_sees_what_a_served_review_shows() -> None:
    mutants = plant_in_repo(REPO, count=10, seed=4)
    oracle = RecordingOracle(mutants, seed=4)
    outcomes = await review_mutants(mutants, oracle)
    assert len(outcomes) == len(oracle.prompts) == 10
    for mutant in mutants:
        prompt = oracle.prompts[mutant.id]
        # The title and description, and the planted line numbered as the diff shows it.
        assert BEGIN_PULL_REQUEST in prompt and DESCRIPTION in prompt
        assert f"\n{mutant.first_line} +" in prompt or f"\n{mutant.first_line}  " in prompt
    # The code around the changes, read from the file at the head, where the diff does not
    # already show it all.
    assert sum(BEGIN_CONTEXT in prompt for prompt in oracle.prompts.values()) >= 5
