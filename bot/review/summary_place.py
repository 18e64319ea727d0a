"""Where a review's living summary is, from what the queue recorded: searching the forge's
comments for it costs a read (a page of comments per hundred) on every review.

Pure: the poster reads the pull request's earlier postings and this review's attempt, and
searches the forge only when neither says for certain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.queue.findings import PriorPosting


@dataclass(frozen=True, slots=True)
class SummaryPlace:
    """Whether the summary's place is known without asking the forge, and which comment it
    is (None: there is none yet, create it)."""

    known: bool
    comment_id: int | None = None


LOOK_IT_UP = SummaryPlace(known=False)
NONE_YET = SummaryPlace(known=True)


def summary_place(attempt: int, prior: Sequence[PriorPosting]) -> SummaryPlace:
    """Where the pull request's summary is, for a posting `attempt` of a job (1: the first)
    and the pull request's other jobs that ever claimed posting.

    Known only where every posting that could have written a summary recorded what it did:
    an earlier attempt of this job, or another job's posting that did not end done, may have
    written one before it could record it (a crash, a lost claim), so those are looked up.
    """
    if attempt != 1:
        return LOOK_IT_UP
    if not prior:
        return NONE_YET
    if any(item.state != "done" for item in prior):
        return LOOK_IT_UP
    newest = max(prior, key=lambda item: item.job_id)
    if newest.summary_comment_id is None:
        return LOOK_IT_UP  # posted without a summary (quiet reviews off), or before it
    return SummaryPlace(known=True, comment_id=newest.summary_comment_id)


__all__ = ["LOOK_IT_UP", "NONE_YET", "SummaryPlace", "summary_place"]
