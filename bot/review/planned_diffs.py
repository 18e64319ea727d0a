"""The pull request's diff as planning read it, kept in this process for the review's post.

A quiet post decides which findings are new, repeated or fixed against the whole pull
request's diff. Planning read that diff moments before (the review is of that head), so the
post takes it from here instead of reading the pull request and its files again: two GitHub
calls (304s) and two or more full GitLab reads per review. A post in another process, or
after this one forgot the diff, reads it from the forge as before.

Bounded by the characters of the patches it holds (the least recently kept go first).
"""

from __future__ import annotations

from collections import OrderedDict

from bot.forges.base import PullChanges

# Patch characters kept at most (a few hundred typical reviews; a 3,000-file one alone may
# not fit, and is then read again at posting).
DEFAULT_MAX_CHARS = 16_000_000


def diff_chars(changes: PullChanges) -> int:
    return sum(len(item.patch or "") + len(item.path) for item in changes.files)


class PlannedDiffs:
    """Diffs by job id, as planning fetched them."""

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.max_chars = max_chars
        self._diffs: OrderedDict[int, tuple[PullChanges, int]] = OrderedDict()
        self._chars = 0

    def keep(self, job_id: int, changes: PullChanges) -> None:
        """Remember a planned job's diff (a diff over the whole bound is not kept)."""
        self.forget(job_id)
        size = diff_chars(changes)
        if size > self.max_chars:
            return
        self._diffs[job_id] = (changes, size)
        self._chars += size
        while self._chars > self.max_chars:
            _, (_, dropped) = self._diffs.popitem(last=False)
            self._chars -= dropped

    def take(self, job_id: int, *, head_sha: str) -> PullChanges | None:
        """The job's diff when planning kept it for this head (then forgotten), else None."""
        found = self._diffs.get(job_id)
        if found is None or found[0].head_sha != head_sha:
            return None
        self.forget(job_id)
        return found[0]

    def forget(self, job_id: int) -> None:
        found = self._diffs.pop(job_id, None)
        if found is not None:
            self._chars -= found[1]

    def __len__(self) -> int:
        return len(self._diffs)


__all__ = ["DEFAULT_MAX_CHARS", "PlannedDiffs", "diff_chars"]
