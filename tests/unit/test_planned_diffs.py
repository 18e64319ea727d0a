"""The diffs planning read, kept for the post: taken once, for the planned head only, and
bounded by the characters they hold."""

from __future__ import annotations

from bot.forges.base import PullChanges
from bot.model import FileChange
from bot.review.planned_diffs import PlannedDiffs, diff_chars


def changes(head: str, patch_chars: int) -> PullChanges:
    patch = "@@ -1 +1 @@\n-" + "x" * max(0, patch_chars - 16) + "\n+y"
    files = (FileChange("a.py", additions=1, deletions=1, patch=patch),)
    return PullChanges(base_sha="b" * 40, head_sha=head, start_sha="b" * 40, files=files)


def test_a_kept_diff_is_taken_once_and_only_for_its_head() -> None:
    planned = PlannedDiffs()
    kept = changes("h1", 100)
    planned.keep(7, kept)
    assert planned.take(7, head_sha="h2") is None  # another head: read it again
    assert planned.take(7, head_sha="h1") is kept
    assert planned.take(7, head_sha="h1") is None
    assert len(planned) == 0


def test_the_least_recently_kept_go_first_past_the_bound() -> None:
    size = diff_chars(changes("h", 1000))
    planned = PlannedDiffs(max_chars=2 * size)
    for job_id in (1, 2, 3):
        planned.keep(job_id, changes("h", 1000))
    assert [planned.take(job_id, head_sha="h") is not None for job_id in (1, 2, 3)] == [
        False,
        True,
        True,
    ]
    # A diff larger than the whole bound is not kept at all.
    planned.keep(4, changes("h", 3 * size))
    assert planned.take(4, head_sha="h") is None and len(planned) == 0
