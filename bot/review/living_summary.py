"""Render the one summary comment a pull request keeps, edited in place after each review (pure).

It says what the newest review covered and why (full or since the last reviewed head), the
level and why, how the findings stand (open, new, resolved, said before), which files were
skipped and why, and which commits were reviewed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.diff import split_lines
from bot.forges.base import SUMMARY_MARKER
from bot.increment import UNCHANGED
from bot.review.assemble import NOT_ANCHORED_HEADING, SKIP_REASON_TEXT, SkippedFile, code
from bot.review.parse import SEVERITY_RANK
from bot.wording import for_forge

MAX_LISTED = 30  # findings listed per section; the rest are counted
SEVERITY_LABEL = {"critical": "Critical", "major": "Major", "minor": "Minor", "info": "Note"}


@dataclass(frozen=True, slots=True)
class ListedFinding:
    """A finding as the summary lists it."""

    path: str
    line: int
    severity: str
    body: str
    note: str = ""  # e.g. "summary only: below the inline floor"


@dataclass(frozen=True, slots=True)
class ReviewedCommit:
    """One review of the pull request: its head and whether it was full or incremental."""

    head_sha: str
    mode: str  # "full" or "incremental"


@dataclass(frozen=True, slots=True)
class SummaryFacts:
    """Everything the living summary says."""

    head_sha: str
    mode: str  # "full" or "incremental"
    mode_reason: str
    level: str
    level_reasons: Sequence[str]
    new: Sequence[ListedFinding] = ()
    resolved: Sequence[ListedFinding] = ()
    open_findings: Sequence[ListedFinding] = ()
    repeated: int = 0
    skipped: Sequence[SkippedFile] = ()
    commits: Sequence[ReviewedCommit] = ()
    notes: Sequence[str] = ()  # partial review, dropped comments, settings problems
    part_summaries: Sequence[str] = field(default_factory=tuple)
    job_id: int | None = None
    # Findings of this review no diff line matched, or the forge refused: file and text.
    not_anchored: Sequence[ListedFinding] = ()
    forge: str = "github"  # the bot's own words follow it (GitLab: merge request)


def _first_line(text: str) -> str:
    stripped = text.strip()
    return split_lines(stripped)[0] if stripped else ""


def _one_line(text: str) -> str:
    return " ".join(split_lines(text.strip()))


def _listed(items: Sequence[ListedFinding]) -> list[str]:
    ordered = sorted(items, key=lambda f: (SEVERITY_RANK.get(f.severity, 9), f.path, f.line))
    lines = []
    for item in ordered[:MAX_LISTED]:
        label = SEVERITY_LABEL.get(item.severity, item.severity.title())
        note = f" _({item.note})_" if item.note else ""
        where = f"{code(item.path)} line {item.line}"
        lines.append(f"- **{label}** {where}: {_first_line(item.body)}{note}")
    if len(ordered) > MAX_LISTED:
        lines.append(f"- and {len(ordered) - MAX_LISTED} more")
    return lines


def render_living_summary(facts: SummaryFacts) -> str:
    """The summary comment's markdown, hidden marker first."""
    reason = for_forge(facts.mode_reason, facts.forge)
    covered = f"incremental, {reason}" if facts.mode == "incremental" else f"full review: {reason}"
    tally = (
        f"{len(facts.open_findings)} open · {len(facts.new)} new · {len(facts.resolved)} resolved"
    )
    if facts.repeated:
        tally += f" · {facts.repeated} found again and not repeated"
    lines = [
        SUMMARY_MARKER,
        "### review-bot summary",
        "",
        f"**Latest review:** commit `{facts.head_sha[:12]}`, {covered}.",
        f"**Level:** {facts.level}: {'; '.join(facts.level_reasons) or 'no reason recorded'}.",
        f"**Findings:** {tally}.",
    ]
    if facts.notes:
        lines += ["", *(f"> {for_forge(note, facts.forge)}" for note in facts.notes)]
    if facts.part_summaries:
        lines += ["", *(f"- {text}" for text in facts.part_summaries)]
    if facts.new:
        lines += ["", "#### New in this review", *_listed(facts.new)]
    if facts.resolved:
        lines += ["", "#### Resolved (the code is gone)", *_listed(facts.resolved)]
    if facts.not_anchored:
        lines += ["", NOT_ANCHORED_HEADING]
        for found in sorted(
            facts.not_anchored, key=lambda f: (SEVERITY_RANK.get(f.severity, 9), f.path)
        )[:MAX_LISTED]:
            label = SEVERITY_LABEL.get(found.severity, found.severity.title())
            where = f" (named line {found.line})" if found.line else ""
            note = f" _({found.note})_" if found.note else ""
            lines.append(f"- **{label}** {code(found.path)}{where}: {_one_line(found.body)}{note}")
        if len(facts.not_anchored) > MAX_LISTED:
            lines.append(f"- and {len(facts.not_anchored) - MAX_LISTED} more")
    still_open = [item for item in facts.open_findings if item not in set(facts.new)]
    if still_open:
        lines += ["", "#### Still open from earlier reviews", *_listed(still_open)]
    # Files the increment left alone are many and say little one by one: counted, not listed.
    unchanged = [item for item in facts.skipped if item.reason == UNCHANGED]
    skipped = [item for item in facts.skipped if item.reason != UNCHANGED]
    if skipped or unchanged:
        lines += ["", "#### Skipped"]
        for item in skipped[:MAX_LISTED]:
            reason = for_forge(SKIP_REASON_TEXT.get(item.reason, item.reason), facts.forge)
            lines.append(f"- {code(item.path)}: {reason}")
        if len(skipped) > MAX_LISTED:
            lines.append(f"- and {len(skipped) - MAX_LISTED} more")
        if unchanged:
            word = "file" if len(unchanged) == 1 else "files"
            lines.append(f"- {len(unchanged)} {word} {UNCHANGED}")
    if facts.commits:
        shown = facts.commits[-MAX_LISTED:]
        reviewed = ", ".join(f"`{c.head_sha[:12]}` ({c.mode})" for c in shown)
        earlier = len(facts.commits) - len(shown)
        more = f" (and {earlier} earlier)" if earlier else ""
        lines += ["", f"**Commits reviewed:** {reviewed}{more}."]
    footer = "<sub>review-bot keeps this one comment up to date after each review"
    footer += f" (job {facts.job_id}).</sub>" if facts.job_id is not None else ".</sub>"
    lines += ["", footer]
    return "\n".join(lines)


__all__ = [
    "ListedFinding",
    "ReviewedCommit",
    "SummaryFacts",
    "render_living_summary",
]
