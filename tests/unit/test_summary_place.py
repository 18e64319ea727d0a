"""Where the living summary is, from the queue's record of the pull request's postings."""

from __future__ import annotations

from bot.queue.findings import PriorPosting
from bot.review.summary_place import LOOK_IT_UP, NONE_YET, SummaryPlace, summary_place


def test_a_first_attempt_on_a_pull_request_nobody_posted_on_creates_the_summary() -> None:
    assert summary_place(1, []) == NONE_YET


def test_a_later_attempt_of_the_job_looks_it_up_as_the_earlier_may_have_written_it() -> None:
    assert summary_place(2, []) == LOOK_IT_UP
    assert summary_place(3, [PriorPosting(1, "done", 501)]) == LOOK_IT_UP


def test_the_newest_done_posting_says_which_comment_to_edit() -> None:
    prior = [
        PriorPosting(1, "done", 501),
        PriorPosting(4, "done", 777),
        PriorPosting(2, "done", 501),
    ]
    assert summary_place(1, prior) == SummaryPlace(known=True, comment_id=777)


def test_a_posting_that_did_not_end_done_may_have_written_one_unrecorded() -> None:
    for state in ("running", "failed", "dead", "superseded", "cancelled"):
        assert summary_place(1, [PriorPosting(1, "done", 501), PriorPosting(2, state, None)]) == (
            LOOK_IT_UP
        )


def test_a_done_posting_without_a_summary_id_leaves_it_to_be_looked_up() -> None:
    assert summary_place(1, [PriorPosting(1, "done", None)]) == LOOK_IT_UP
