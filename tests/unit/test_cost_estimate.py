"""The learned cost estimate (bot.sched.cost): today's line with no history, a group's own cost
with much of it, shrinkage in between; a pull request's last review; tokens per changed line."""

from __future__ import annotations

import math

import pytest

from bot.sched.cost import (
    PRIOR_COMPLETION_TOKENS_PER_LINE,
    PRIOR_PROMPT_TOKENS_PER_LINE,
    CostEstimate,
    CostKey,
    CostModel,
    MeasuredCost,
    ReviewFeatures,
    chunk_file_lines,
    language_of,
    learn_cost,
    predict_cost,
    review_tallies,
)
from bot.sched.mlfq import ServiceEstimator

LINE = ServiceEstimator.with_prior(base_s=10.0, per_line_s=0.1)


def review(repo: str = "acme/api", number: int = 1, lines: int = 100) -> ReviewFeatures:
    return ReviewFeatures.of(
        forge="github",
        repo=repo,
        number=number,
        files=[("src/a.py", lines // 2), ("src/b.py", lines - lines // 2)],
    )


def cost_of(features: ReviewFeatures, factor: float, *, chunks: int = 1) -> MeasuredCost:
    """A review that took `factor` times the line's work, 30 prompt and 4 answer tokens a line."""
    work = LINE.expected_work(features.lines) * factor
    return MeasuredCost(
        chunks=chunks,
        engine_s=chunks * LINE.overhead_s + work,
        prompt_tokens=30 * features.lines,
        completion_tokens=4 * features.lines,
    )


def test_no_history_is_todays_estimate() -> None:
    features = review(lines=240)
    prediction = predict_cost(CostModel(), features, LINE, chunks=3)
    assert prediction.factor == 1.0
    assert prediction.work_s == LINE.expected_work(240)
    assert prediction.engine_s == 3 * LINE.overhead_s + LINE.expected_work(240)
    assert prediction.prompt_tokens == PRIOR_PROMPT_TOKENS_PER_LINE * 240
    assert prediction.completion_tokens == PRIOR_COMPLETION_TOKENS_PER_LINE * 240
    assert prediction.reviews_seen == 0


def test_a_repository_with_history_converges_to_its_own_cost() -> None:
    model = CostModel()
    for number in range(400):
        features = review(repo="acme/slow", number=number, lines=50 + number % 200)
        model = learn_cost(model, features, cost_of(features, 2.0), LINE)
    new = review(repo="acme/slow", number=9999, lines=120)
    prediction = predict_cost(model, new, LINE)
    assert prediction.factor == pytest.approx(2.0, rel=0.01)
    assert prediction.work_s == pytest.approx(2.0 * LINE.expected_work(120), rel=0.01)
    assert prediction.prompt_tokens == pytest.approx(30 * 120, rel=0.01)
    assert prediction.completion_tokens == pytest.approx(4 * 120, rel=0.01)


def test_few_samples_are_shrunk_toward_the_fallback() -> None:
    """One review twice as costly moves the estimate a little; more move it further, never past."""
    factors = []
    model = CostModel()
    for number in range(1, 9):
        features = review(repo="acme/new", number=number)
        model = learn_cost(model, features, cost_of(features, 2.0), LINE)
        factors.append(predict_cost(model, review(repo="acme/new", number=1000), LINE).factor)
    assert 1.0 < factors[0] < factors[1] < factors[3] < factors[7] < 2.0
    # One review in all, its language and its repository: each is shrunk toward the one
    # before by four pseudo-reviews (all: 1/5 of the way, language: (1 + 4/5)/5, repo: ...).
    assert math.log(factors[0]) == pytest.approx(math.log(2.0) * 61 / 125)


def test_a_repository_leans_on_the_reviews_of_all_while_its_own_are_few() -> None:
    model = CostModel()
    for number in range(200):
        features = review(repo="acme/api", number=number)
        model = learn_cost(model, features, cost_of(features, 1.5), LINE)
    features = review(repo="acme/web", number=1)
    model = learn_cost(model, features, cost_of(features, 0.5), LINE)
    web = predict_cost(model, review(repo="acme/web", number=2), LINE).factor
    api = predict_cost(model, review(repo="acme/api", number=999), LINE).factor
    # acme/web's one cheap review pulls it below the rest, but it stays near what all cost.
    assert 1.0 < web < api
    assert api == pytest.approx(1.5, rel=0.05)


def test_an_incremental_review_costs_like_the_pull_requests_last_one_scaled() -> None:
    model = CostModel()
    for number in range(100):
        features = review(number=number)
        model = learn_cost(model, features, cost_of(features, 1.0), LINE)
    first = review(number=500, lines=400)
    model = learn_cost(model, first, cost_of(first, 3.0), LINE)
    later = predict_cost(model, review(number=500, lines=40), LINE)
    other = predict_cost(model, review(number=501, lines=40), LINE)
    assert other.factor == pytest.approx(1.0, rel=0.05)
    # Half way to the last review's factor (one review of the pull request weighs as one of all).
    assert later.factor == pytest.approx(math.sqrt(3.0), rel=0.05)
    assert later.work_s == pytest.approx(later.factor * LINE.expected_work(40))
    # Only the last review of a pull request counts.
    second = review(number=500, lines=40)
    model = learn_cost(model, second, cost_of(second, 1.0), LINE)
    assert predict_cost(model, review(number=500, lines=40), LINE).factor == pytest.approx(
        1.0, rel=0.05
    )


def test_a_review_without_lines_or_calls_teaches_nothing() -> None:
    empty = ReviewFeatures.of(forge="github", repo="acme/api", number=1, files=[])
    assert review_tallies(empty, MeasuredCost(1, 5.0, 10, 10), LINE) == ()
    assert review_tallies(review(), MeasuredCost(0, 0.0, 0, 0), LINE) == ()


def test_factors_are_bounded() -> None:
    features = review()
    model = CostModel()
    for number in range(50):
        features = review(number=number)
        model = learn_cost(model, features, MeasuredCost(1, 1e6, 1, 1), LINE)
    factor = predict_cost(model, review(number=99), LINE).factor
    assert 7.9 < factor <= 8.0


def test_the_estimate_uses_the_model_only_when_told() -> None:
    model = CostModel()
    for number in range(50):
        features = review(number=number)
        model = learn_cost(model, features, cost_of(features, 2.0), LINE)
    on = CostEstimate(fallback=LINE, learned=model)
    off = CostEstimate(fallback=LINE, learned=model, use_learned=False)
    assert on.predict(review(number=99)).factor > 1.5
    assert off.predict(review(number=99)).factor == 1.0


def test_groups_and_language() -> None:
    features = ReviewFeatures.of(
        forge="gitlab",
        repo="acme/web",
        number=12,
        files=[("web/app.ts", 30), ("web/app.test.ts", 20), ("README.md", 60)],
    )
    assert features.language == "markdown"
    assert features.lines == 110 and features.files == 3
    assert features.groups() == (
        CostKey("all", ""),
        CostKey("language", "markdown"),
        CostKey("repo", "gitlab:acme/web"),
        CostKey("pull", "gitlab:acme/web#12"),
    )
    assert language_of([("Makefile", 10)]) == ""
    assert language_of([("a.py", 5), ("b.go", 5)]) == "go"  # a tie goes by name
    assert chunk_file_lines(
        [
            [{"path": "a.py", "lines": 400, "part": 1}],
            [{"path": "a.py", "lines": 100}, {"path": "b.py", "lines": 3}],
        ]
    ) == [("a.py", 500), ("b.py", 3)]
