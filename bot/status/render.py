"""The words of a status: "P1 · 12th in line · review in about 40 s · why P1". Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.model import SEVERITIES
from bot.status.decide import StatusReport, findings_at_or_above

# GitHub cuts a commit status description at 140 characters; GitLab's are kept as short.
DESCRIPTION_LIMIT = 140
CONCLUSION_TITLES = {
    "skipped": "Not reviewed: a newer push is reviewed instead",
    "cancelled": "Review cancelled",
}


@dataclass(frozen=True, slots=True)
class StatusText:
    """A status in words: a title (check run), a summary (Markdown) and a short description."""

    title: str
    summary: str
    description: str


@dataclass(frozen=True, slots=True)
class StatusFacts:
    """What the words are made of, besides the report itself."""

    reasons: tuple[str, ...] = ()
    start_at: datetime | None = None
    review_url: str | None = None
    counts: Mapping[str, int] | None = None  # findings open on the head, by severity
    new_findings: int | None = None  # of which this review said first (None: not known)
    review_summary: str | None = None
    error: str | None = None
    neutral_at: str = "major"
    slots: int | None = None
    weights: Sequence[int] | None = None
    backlog_weights: Sequence[int] | None = None  # the shares while work queues
    # The pull requests whose reviews it waits for (stacked: it starts once they are posted).
    waits_for: tuple[str, ...] = ()


def ordinal(number: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 102nd."""
    if 10 <= number % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def about(seconds: float) -> str:
    """A rounded duration people read at a glance: 40 s, 3 min, 1 h 5 min."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{max(5, round(total / 5) * 5)} s"
    minutes = round(total / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def _shorten(text: str, limit: int = DESCRIPTION_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _seconds_until(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else max(0.0, (moment - now).total_seconds())


def render_status(report: StatusReport, facts: StatusFacts, *, now: datetime) -> StatusText:
    """Title, summary and description of a job's status."""
    level = str(report.level)
    why = facts.reasons[0] if facts.reasons else "the repository's policy"
    finish_in = _seconds_until(report.finish_at, now)
    eta = f"review in about {about(finish_in)}" if finish_in is not None else None
    if report.state == "queued":
        place = f"{ordinal(report.place)} in line" if report.place is not None else "in line"
        if facts.waits_for:
            place = f"waits for {', '.join(facts.waits_for)}"
        title = " · ".join(part for part in (level, place, eta) if part)
        lines = [f"**{title}**", "", f"**Why {level}:** {'; '.join(facts.reasons) or why}."]
        if facts.waits_for:
            lines.append(
                f"**Waits for:** the review of {', '.join(facts.waits_for)}, which this pull "
                "request is stacked on; it starts once that review is posted."
            )
        if report.place is not None:
            lines.append(f"**Place:** {ordinal(report.place)} of the reviews not started yet.")
        start_in = _seconds_until(facts.start_at, now)
        if start_in is not None:
            lines.append(f"**Expected start:** in about {about(start_in)}.")
        lines += ["", _method(facts, level)]
        return StatusText(title, "\n".join(lines), _shorten(f"{title} · why {level}: {why}"))
    if report.state == "in_progress":
        progress = (
            f"{report.parts_done} of {report.parts_total} parts done"
            if report.parts_total
            else "reviewing"
        )
        title = " · ".join(part for part in (level, progress, eta) if part)
        lines = [f"**{title}**", "", f"**Why {level}:** {'; '.join(facts.reasons) or why}."]
        lines += ["", _method(facts, level)]
        return StatusText(title, "\n".join(lines), _shorten(title))
    return _completed(report, facts)


def _method(facts: StatusFacts, level: str) -> str:
    engines = f"{facts.slots} worker slots" if facts.slots else "the worker slots"
    weights = _ratio(facts.weights)
    shares = f", shared by level weights {weights}" if weights else ""
    backlog = _ratio(facts.backlog_weights)
    notes = []
    if weights and backlog and backlog != weights:
        notes.append(f"{backlog} while work queues")
    if weights and 0 in (*(facts.weights or ()), *(facts.backlog_weights or ())):
        notes.append("a level at 0 waits until the others have no work")
    if notes:
        shares += f" ({'; '.join(notes)})"
    return (
        f"_Estimated from the work queued ahead at {level} and above, {engines}{shares}, and "
        "the expected length of each review from its changed lines; work that arrives later "
        "at a higher level can move it._"
    )


def _ratio(weights: Sequence[int] | None) -> str | None:
    return ":".join(str(weight) for weight in weights) if weights else None


def _completed(report: StatusReport, facts: StatusFacts) -> StatusText:
    conclusion = report.conclusion or "neutral"
    if conclusion in CONCLUSION_TITLES:
        title = CONCLUSION_TITLES[conclusion]
        detail = f"{title}." + (f"\n\n{facts.error}" if facts.error else "")
        return StatusText(title, detail, _shorten(title))
    if facts.counts is None:
        title = "Review failed" + (f": {facts.error}" if facts.error else "")
        return StatusText(_shorten(title, 200), title, _shorten(title))
    total = sum(int(value) for value in facts.counts.values())
    serious = findings_at_or_above(facts.counts, facts.neutral_at)
    open_word = "open " if facts.new_findings is not None else ""
    if total == 0:
        title = f"Reviewed: no {open_word}findings"
    else:
        tally = ", ".join(
            f"{facts.counts[name]} {name}" for name in SEVERITIES if facts.counts.get(name)
        )
        title = f"Reviewed: {total} {open_word}finding{'s' if total != 1 else ''} ({tally})"
    if facts.new_findings is not None and (facts.new_findings or total):
        title += f" · {facts.new_findings} new"
    lines = [f"**{title}**", ""]
    if serious:
        lines.append(f"{serious} at {facts.neutral_at} or above: see the review.")
    if facts.review_summary:
        lines += ["", facts.review_summary.strip()]
    if facts.review_url:
        lines += ["", f"[The review]({facts.review_url})"]
    return StatusText(_shorten(title, 200), "\n".join(lines).strip(), _shorten(title))


__all__ = ["StatusFacts", "StatusText", "about", "ordinal", "render_status"]
