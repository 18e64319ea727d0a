"""Decide what a review says on the pull request: only what is new, loud enough and within cap.

Pure: the review's fingerprinted findings, what earlier reviews of the same pull request
recorded, and the pull request's current diff go in; what to post inline, what to mention in
the summary only, what was said before and what is resolved come out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.config import DEFAULTS
from bot.model import SEVERITIES
from bot.queue.findings import StoredFinding
from bot.review.fingerprint import FingerprintedFinding, loose_key, normalize_code, side_lines
from bot.review.parse import SEVERITY_RANK


@dataclass(frozen=True, slots=True)
class QuietSettings:
    """How loud a review may be: the lowest severity posted inline and a cap per review."""

    min_inline_severity: str = DEFAULTS.review.min_inline_severity
    inline_cap: int = DEFAULTS.review.inline_cap

    def __post_init__(self) -> None:
        if self.min_inline_severity not in SEVERITY_RANK:
            raise ValueError(
                f"min_inline_severity must be one of {', '.join(SEVERITIES)},"
                f" got {self.min_inline_severity!r}"
            )
        if self.inline_cap < 0:
            raise ValueError("inline_cap must be 0 or more")


@dataclass(frozen=True, slots=True)
class QuietDecision:
    """What this review posts and how the pull request's findings stand after it."""

    inline: tuple[FingerprintedFinding, ...]  # new, posted as inline comments
    summary_only: tuple[FingerprintedFinding, ...]  # new, below the floor or over the cap
    repeated: tuple[FingerprintedFinding, ...]  # found again, said before: not posted
    resolved: tuple[StoredFinding, ...]  # were open, their code is gone
    still_open: tuple[StoredFinding, ...]  # were open, their code is still there
    over_cap: int = 0

    @property
    def new(self) -> tuple[FingerprintedFinding, ...]:
        return (*self.inline, *self.summary_only)

    @property
    def open_count(self) -> int:
        return len(self.still_open) + len(self.new)

    @property
    def open_counts(self) -> dict[str, int]:
        """Findings open on the reviewed head after this review, by severity: what its status
        concludes from (the increment alone would forget what earlier pushes left open)."""
        severities = [item.severity for item in self.still_open]
        severities += [item.finding.severity for item in self.new]
        return {name: severities.count(name) for name in SEVERITY_RANK if name in severities}

    @property
    def posts_anything(self) -> bool:
        return bool(self.inline)


def code_still_there(stored: StoredFinding, patches: Mapping[str, str | None]) -> bool:
    """Whether a stored finding's anchored line still shows in the pull request's diff."""
    if stored.path not in patches:
        return False  # the file left the pull request (reverted or renamed away)
    patch = patches[stored.path]
    if stored.anchor_text is None:
        return patch is not None
    shown = side_lines(patch, stored.side).values()
    return any(normalize_code(text) == stored.anchor_text for text in shown)


def decide_quiet_review(
    findings: Sequence[FingerprintedFinding],
    stored: Sequence[StoredFinding],
    current_patches: Mapping[str, str | None],
    *,
    settings: QuietSettings | None = None,
    job_id: int | None = None,
) -> QuietDecision:
    """Split a review's findings into new and already said; judge stored ones open or resolved.

    A finding whose fingerprint is recorded and open is never posted again. One recorded as
    resolved whose code came back is new again. `current_patches` is the pull request's diff
    now (path -> patch): a stored open finding whose anchored line no longer shows is resolved.
    What `job_id` itself recorded (a retry after a crash) is decided again as it was the first
    time; the forge's markers keep the retry from posting twice.
    """
    settings = settings or QuietSettings()
    stored = [item for item in stored if job_id is None or item.first_job_id != job_id]
    by_fingerprint = {item.fingerprint: item for item in stored}
    # An edit next to a finding changes its neighbours, not the finding: match on the line too.
    by_line = {_loose_key(item): item for item in stored if item.state == "open"}
    floor = SEVERITY_RANK[settings.min_inline_severity]
    found_now: set[str] = set()
    repeated: list[FingerprintedFinding] = []
    candidates: list[FingerprintedFinding] = []
    for item in findings:
        known = by_fingerprint.get(item.fingerprint)
        if known is None or known.state != "open":
            known = by_line.get(item.loose_key)
        if known is not None and known.state == "open":
            repeated.append(item)
            found_now.add(known.fingerprint)
        else:
            candidates.append(item)
    loud = [item for item in candidates if SEVERITY_RANK[item.finding.severity] <= floor]
    quiet = [item for item in candidates if SEVERITY_RANK[item.finding.severity] > floor]
    # The cap keeps the most severe; ties keep diff order.
    ranked = sorted(loud, key=lambda item: SEVERITY_RANK[item.finding.severity])
    kept = {item.fingerprint for item in ranked[: settings.inline_cap]}
    inline = tuple(item for item in loud if item.fingerprint in kept)
    over_cap = tuple(item for item in loud if item.fingerprint not in kept)
    resolved: list[StoredFinding] = []
    still_open: list[StoredFinding] = []
    for known in stored:
        if known.state != "open":
            continue
        if known.fingerprint in found_now or code_still_there(known, current_patches):
            still_open.append(known)
        else:
            resolved.append(known)
    return QuietDecision(
        inline=inline,
        summary_only=(*over_cap, *quiet),
        repeated=tuple(repeated),
        resolved=tuple(resolved),
        still_open=tuple(still_open),
        over_cap=len(over_cap),
    )


def _loose_key(item: StoredFinding) -> str:
    """A stored finding's fingerprint without its neighbours (see fingerprint.loose_key)."""
    return loose_key(
        path=item.path, anchor_text=item.anchor_text, category=item.severity, message=item.body
    )


__all__ = [
    "QuietDecision",
    "QuietSettings",
    "code_still_there",
    "decide_quiet_review",
]
