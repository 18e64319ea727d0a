"""Score reviews of planted bugs: was the bug found, on its exact line, and what else was said.

Pure functions of the planted site and what the review would post.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.diff import parse_hunks
from bot.stats import percentile

# A finding counts as the planted bug when it is on the planted path, on the new file's side,
# within the planted lines widened by this many lines.
TOLERANCE = 1


@dataclass(frozen=True, slots=True)
class MutantScore:
    """How the review of one planted bug went."""

    id: int
    pattern: str
    path: str
    first_line: int
    last_line: int
    found: bool
    exact: bool
    false_findings: int
    summary_only: int
    inline: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    mode: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pattern": self.pattern,
            "path": self.path,
            "lines": [self.first_line, self.last_line],
            "found": self.found,
            "exact": self.exact,
            "false_findings": self.false_findings,
            "summary_only": self.summary_only,
            "inline": self.inline,
            "tokens": self.prompt_tokens + self.completion_tokens,
            **({"oracle_mode": self.mode} if self.mode is not None else {}),
        }


def context_pairs(patch: str) -> dict[int, int]:
    """Old-file line -> new-file line of each unchanged (context) line of a patch."""
    return {
        line.old_line: line.new_line
        for hunk in parse_hunks(patch)
        for line in hunk.lines
        if line.kind == " " and line.old_line is not None and line.new_line is not None
    }


def score_review(
    *,
    mutant_id: int,
    pattern: str,
    path: str,
    first_line: int,
    last_line: int,
    inline: Iterable[tuple[str, str, int]],
    context: Mapping[int, int] | None = None,
    summary_only: int = 0,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    seconds: float = 0.0,
    mode: str | None = None,
) -> MutantScore:
    """Score one review's inline comments (path, side, line) against the planted lines.

    `context` maps the old-file numbers of the patch's unchanged lines to their new-file
    numbers: a comment on the LEFT side of an unchanged line is on the same line of code as
    one on its RIGHT side (GitHub shows both on that line)."""
    comments = list(inline)
    unchanged = context or {}

    def new_line(comment_path: str, side: str, line: int) -> int | None:
        if comment_path != path:
            return None
        if side == "RIGHT":
            return line
        return unchanged.get(line)

    placed = [new_line(*comment) for comment in comments]
    hits = [
        line
        for line in placed
        if line is not None and first_line - TOLERANCE <= line <= last_line + TOLERANCE
    ]
    return MutantScore(
        id=mutant_id,
        pattern=pattern,
        path=path,
        first_line=first_line,
        last_line=last_line,
        found=bool(hits),
        exact=any(first_line <= line <= last_line for line in hits),
        false_findings=len(comments) - len(hits),
        summary_only=summary_only,
        inline=len(comments),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        seconds=seconds,
        mode=mode,
    )


def ratio(part: float, whole: float) -> float | None:
    """part / whole rounded to 4 places; None when there is no whole to divide by."""
    return round(part / whole, 4) if whole else None


def summarize_scores(scores: Sequence[MutantScore]) -> dict[str, Any]:
    """recall, exact-line rate among the found, false findings per PR, the share of findings
    moved to the summary, for a group of reviews."""
    found = [score for score in scores if score.found]
    findings = sum(score.inline + score.summary_only for score in scores)
    summary_only = sum(score.summary_only for score in scores)
    return {
        "mutants": len(scores),
        "recall": ratio(len(found), len(scores)),
        "exact_line_rate": ratio(sum(score.exact for score in found), len(found)),
        "false_findings_per_pr": ratio(sum(score.false_findings for score in scores), len(scores)),
        "summary_only_rate": ratio(summary_only, findings) if findings else 0.0,
        "summary_only": summary_only,
    }


def build_report(
    scores: Sequence[MutantScore], *, context: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The whole report: overall figures, per pattern (and per oracle mode), costs, each review.
    Everything but `seconds_per_review` is a function of the reviews alone."""
    groups: dict[str, list[MutantScore]] = {}
    for score in scores:
        groups.setdefault(score.pattern, []).append(score)
    modes: dict[str, list[MutantScore]] = {}
    for score in scores:
        if score.mode is not None:
            modes.setdefault(score.mode, []).append(score)
    tokens = [float(score.prompt_tokens + score.completion_tokens) for score in scores]
    seconds = [score.seconds for score in scores]
    report: dict[str, Any] = {
        **dict(context or {}),
        **summarize_scores(scores),
        "per_pattern": {name: summarize_scores(group) for name, group in sorted(groups.items())},
        "tokens_per_review": {
            "median": statistics.median(tokens) if tokens else 0,
            "p95": round(percentile(tokens, 0.95), 1),
        },
        "seconds_per_review": {
            "median": round(statistics.median(seconds), 4) if seconds else 0.0,
            "p95": round(percentile(seconds, 0.95), 4),
        },
        "reviews": [score.to_dict() for score in scores],
    }
    if modes:
        report["per_oracle_mode"] = {
            name: summarize_scores(group) for name, group in sorted(modes.items())
        }
    return report


def render_report(report: Mapping[str, Any]) -> str:
    """The report as a plain-text table."""

    def rate(value: Any) -> str:
        return "-" if value is None else f"{float(value):.3f}"

    lines = [
        f"bot eval: {report.get('mutants', 0)} planted bugs in {report.get('repo', '?')} "
        f"(seed {report.get('seed', '?')}, model {report.get('llm', '?')})",
        "",
        f"{'pattern':<22} {'bugs':>5} {'recall':>7} {'exact':>7} {'false/PR':>9} {'summary':>8}",
    ]
    rows = [*report.get("per_pattern", {}).items(), ("all", report)]
    for name, group in rows:
        if name == "all":
            lines.append("-" * 62)
        lines.append(
            f"{name:<22} {group['mutants']:>5} {rate(group['recall']):>7} "
            f"{rate(group['exact_line_rate']):>7} {rate(group['false_findings_per_pr']):>9} "
            f"{rate(group['summary_only_rate']):>8}"
        )
    tokens = report.get("tokens_per_review", {})
    seconds = report.get("seconds_per_review", {})
    lines += [
        "",
        f"tokens per review: median {tokens.get('median', 0):.0f}, "
        f"p95 {tokens.get('p95', 0):.0f}; seconds per review: "
        f"median {seconds.get('median', 0):.3f}, p95 {seconds.get('p95', 0):.3f}",
    ]
    modes = report.get("per_oracle_mode")
    if modes:
        lines += ["", "oracle answers by the way they name the line:"]
        for name, group in modes.items():
            lines.append(
                f"  {name:<14} {group['mutants']:>4} found {rate(group['recall'])} "
                f"exact {rate(group['exact_line_rate'])}"
            )
    return "\n".join(lines)
