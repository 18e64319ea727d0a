"""A review's cost learned from the reviews before it: engine seconds and tokens, per group.

The scheduler's estimate of a review's work (`ServiceEstimator`, one line over changed lines)
knows nothing of where a review comes from. This adds what the bot has seen: for every group a
review belongs to (all reviews, its language, its repository, its pull request) the tallies of
finished reviews, and from them a factor on the line's work and tokens per changed line.

Groups nest: all > language > repository > pull request. A group's factor is its own mean,
shrunk toward its parent's by `prior_reviews` pseudo-reviews of the parent (few samples: close
to the parent; many: its own), and the outermost parent is the line itself (factor 1). So with
no history the estimate is exactly today's, and a group's history counts more as it grows.

A pull request keeps only its last review (a later push costs like the last one, scaled by the
size of the increment: the factor applies to the new review's own line estimate). Pure: no
clock, no I/O; the store keeps the tallies (bot.queue.costs).
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field, fields, replace
from typing import Any, Literal, NamedTuple

from bot.sched.mlfq import ServiceEstimator

CostScope = Literal["all", "language", "repo", "pull"]
# Outermost first: each group's estimate is shrunk toward the one before it.
COST_SCOPES: tuple[CostScope, ...] = ("all", "language", "repo", "pull")
# Groups whose tallies are replaced by the last review instead of summed.
LAST_REVIEW_SCOPES: frozenset[CostScope] = frozenset({"pull"})
# A group's own mean counts as much as this many reviews of its parent's would.
DEFAULT_PRIOR_REVIEWS: Mapping[CostScope, float] = {
    "all": 4.0,
    "language": 4.0,
    "repo": 4.0,
    # One earlier review of the same pull request weighs as much as everything above it.
    "pull": 1.0,
}
# Tokens per changed line before any review is seen (nothing estimated tokens before): a diff
# line is about 10 prompt tokens with its numbering, and the prompt around it about as much
# again per line in a typical chunk; an answer a few tokens per line reviewed.
PRIOR_PROMPT_TOKENS_PER_LINE = 20.0
PRIOR_COMPLETION_TOKENS_PER_LINE = 3.0
# Factors are kept within this of the line: one absurd review cannot make a group free or
# endless.
MAX_LOG_FACTOR = math.log(8.0)

_LANGUAGES: Mapping[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".jsx": "javascript",
    ".mjs": "javascript",
    ".ts": "typescript",
    ".tsx": "typescript",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".kt": "kotlin",
    ".swift": "swift",
    ".rb": "ruby",
    ".php": "php",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".cs": "csharp",
    ".scala": "scala",
    ".sql": "sql",
    ".sh": "shell",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".md": "markdown",
    ".tf": "terraform",
}


def language_of(files: Iterable[tuple[str, int]]) -> str:
    """The language of most changed lines among (path, lines); "" when nothing is known."""
    lines_by_language: dict[str, int] = {}
    for path, lines in files:
        suffix = posixpath.splitext(path)[1].lower()
        language = _LANGUAGES.get(suffix, suffix.lstrip("."))
        if language:
            lines_by_language[language] = lines_by_language.get(language, 0) + max(0, lines)
    if not lines_by_language:
        return ""
    return max(sorted(lines_by_language), key=lambda name: lines_by_language[name])


def chunk_file_lines(chunk_files: Iterable[Iterable[Mapping[str, Any]]]) -> list[tuple[str, int]]:
    """(path, changed lines) of a review's files from its chunks' file entries (parts summed)."""
    lines: dict[str, int] = {}
    for files in chunk_files:
        for entry in files:
            path = str(entry.get("path", ""))
            lines[path] = lines.get(path, 0) + int(entry.get("lines", 0) or 0)
    return list(lines.items())


@dataclass(frozen=True, slots=True)
class ReviewFeatures:
    """What is known of a review before it runs."""

    forge: str
    repo: str
    number: int
    language: str
    lines: int
    files: int

    @classmethod
    def of(
        cls, *, forge: str, repo: str, number: int, files: Sequence[tuple[str, int]]
    ) -> ReviewFeatures:
        """Features of a review of these (path, changed lines) files."""
        return cls(
            forge=forge,
            repo=repo,
            number=number,
            language=language_of(files),
            lines=sum(max(0, lines) for _, lines in files),
            files=len(files),
        )

    def groups(self) -> tuple[CostKey, ...]:
        """The groups the review belongs to, outermost first."""
        repository = f"{self.forge}:{self.repo}"
        return (
            CostKey("all", ""),
            CostKey("language", self.language),
            CostKey("repo", repository),
            CostKey("pull", f"{repository}#{self.number}"),
        )


class CostKey(NamedTuple):
    """A group of reviews: its scope and its name within the scope."""

    scope: CostScope
    name: str


@dataclass(frozen=True, slots=True)
class MeasuredCost:
    """What a finished review took, summed over its chunks."""

    chunks: int
    engine_s: float
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class CostTally:
    """Sums over a group's finished reviews (the last one only, for a pull request)."""

    reviews: float = 0.0
    lines: float = 0.0
    files: float = 0.0
    chunks: float = 0.0
    engine_s: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    # Sum of log(work / the line's work) over the reviews: how much costlier than the line.
    log_factor: float = 0.0
    # Sums of prompt and completion tokens per changed line, one term per review.
    prompt_per_line: float = 0.0
    completion_per_line: float = 0.0

    def plus(self, other: CostTally) -> CostTally:
        """Both tallies summed."""
        return CostTally(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[float, ...]:
        """The sums in TALLY_FIELDS order."""
        return tuple(float(value) for value in astuple(self))


TALLY_FIELDS: tuple[str, ...] = tuple(item.name for item in fields(CostTally))


@dataclass(frozen=True, slots=True)
class CostPrediction:
    """A review's expected cost, and how much of it comes from history."""

    work_s: float  # engine seconds beyond the per-call overhead (what ranks compare)
    engine_s: float  # the whole review in `chunks` calls
    prompt_tokens: float
    completion_tokens: float
    factor: float  # work_s over the line's work: 1.0 with no history
    fallback_work_s: float  # the line's work (today's estimate)
    reviews_seen: float  # reviews of the innermost group with history


@dataclass(frozen=True, slots=True)
class CostModel:
    """Tallies by group, and how strongly each scope leans on its parent."""

    tallies: Mapping[CostKey, CostTally] = field(default_factory=dict)
    prior_reviews: Mapping[CostScope, float] = field(
        default_factory=lambda: dict(DEFAULT_PRIOR_REVIEWS)
    )

    def with_tallies(self, changes: Iterable[TallyChange]) -> CostModel:
        """The model after these changes (summed, or replacing a last-review group)."""
        tallies = dict(self.tallies)
        for change in changes:
            if change.replace:
                tallies[change.key] = change.tally
            else:
                tallies[change.key] = tallies.get(change.key, CostTally()).plus(change.tally)
        return replace(self, tallies=tallies)


@dataclass(frozen=True, slots=True)
class TallyChange:
    """What one finished review adds to (or, `replace`, sets for) one group."""

    key: CostKey
    tally: CostTally
    replace: bool = False


def _shrunk(own_sum: float, own_count: float, parent: float, prior: float) -> float:
    """A group's mean of `own_count` values summing to `own_sum`, shrunk toward `parent`."""
    if own_count <= 0:
        return parent
    return (own_sum + prior * parent) / (own_count + prior)


def predict_cost(
    model: CostModel,
    features: ReviewFeatures,
    fallback: ServiceEstimator,
    *,
    chunks: int = 1,
) -> CostPrediction:
    """Expected cost of a review in `chunks` calls: the line's work times its groups' factor."""
    log_factor = 0.0
    prompt_rate = PRIOR_PROMPT_TOKENS_PER_LINE
    completion_rate = PRIOR_COMPLETION_TOKENS_PER_LINE
    seen = 0.0
    for key in features.groups():
        tally = model.tallies.get(key)
        if tally is None or tally.reviews <= 0:
            continue
        prior = model.prior_reviews.get(key.scope, DEFAULT_PRIOR_REVIEWS[key.scope])
        log_factor = _shrunk(tally.log_factor, tally.reviews, log_factor, prior)
        prompt_rate = _shrunk(tally.prompt_per_line, tally.reviews, prompt_rate, prior)
        completion_rate = _shrunk(tally.completion_per_line, tally.reviews, completion_rate, prior)
        seen = tally.reviews
    log_factor = max(-MAX_LOG_FACTOR, min(MAX_LOG_FACTOR, log_factor))
    lines = max(0, features.lines)
    fallback_work = fallback.expected_work(lines)
    factor = math.exp(log_factor)
    work = fallback_work * factor
    calls = max(1, chunks)
    return CostPrediction(
        work_s=work,
        engine_s=calls * fallback.overhead_s + work,
        prompt_tokens=prompt_rate * lines,
        completion_tokens=completion_rate * lines,
        factor=factor,
        fallback_work_s=fallback_work,
        reviews_seen=seen,
    )


def review_tallies(
    features: ReviewFeatures, measured: MeasuredCost, fallback: ServiceEstimator
) -> tuple[TallyChange, ...]:
    """What a finished review adds to each of its groups (nothing for an empty review).

    Its factor is measured against the line as the line stands when the review ends, so a
    group's factor says how it differs from the line, not what the line has since learnt.
    """
    lines = max(0, features.lines)
    if lines <= 0 or measured.chunks <= 0:
        return ()
    work = max(0.0, measured.engine_s - measured.chunks * fallback.overhead_s)
    expected = fallback.expected_work(lines)
    # A review that took no work beyond its calls' overhead counts as the smallest factor.
    log_factor = (
        max(-MAX_LOG_FACTOR, min(MAX_LOG_FACTOR, math.log(work / expected)))
        if work > 0 and expected > 0
        else -MAX_LOG_FACTOR
    )
    tally = CostTally(
        reviews=1.0,
        lines=float(lines),
        files=float(features.files),
        chunks=float(measured.chunks),
        engine_s=measured.engine_s,
        prompt_tokens=float(measured.prompt_tokens),
        completion_tokens=float(measured.completion_tokens),
        log_factor=log_factor,
        prompt_per_line=measured.prompt_tokens / lines,
        completion_per_line=measured.completion_tokens / lines,
    )
    return tuple(
        TallyChange(key, tally, replace=key.scope in LAST_REVIEW_SCOPES)
        for key in features.groups()
    )


def learn_cost(
    model: CostModel,
    features: ReviewFeatures,
    measured: MeasuredCost,
    fallback: ServiceEstimator,
) -> CostModel:
    """The model after one more finished review."""
    return model.with_tallies(review_tallies(features, measured, fallback))


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """What planning ranks a review with: the line (today's estimate) and the learned model."""

    fallback: ServiceEstimator = field(default_factory=ServiceEstimator.with_prior)
    learned: CostModel = field(default_factory=CostModel)
    use_learned: bool = True

    def predict(self, features: ReviewFeatures, *, chunks: int = 1) -> CostPrediction:
        """The review's expected cost (the line's alone when learning is off)."""
        model = self.learned if self.use_learned else CostModel()
        return predict_cost(model, features, self.fallback, chunks=chunks)


__all__ = [
    "COST_SCOPES",
    "TALLY_FIELDS",
    "CostEstimate",
    "CostKey",
    "CostModel",
    "CostPrediction",
    "CostScope",
    "CostTally",
    "MeasuredCost",
    "ReviewFeatures",
    "TallyChange",
    "chunk_file_lines",
    "language_of",
    "learn_cost",
    "predict_cost",
    "review_tallies",
]
