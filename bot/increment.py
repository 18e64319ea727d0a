"""What a review covers after the first: the pull request's hunks that changed since the last
reviewed head (pure).

GitHub: the compare of the last reviewed head with the new one, restricted to the pull
request's files; a hunk of the pull request's diff is kept when a line the compare changed falls
in it. GitLab: the merge request's diff version of the last reviewed head against the newest;
a hunk is kept when the old version does not show it. When history was rewritten (the last
reviewed head is no longer an ancestor) the review is a full one, and says why. Hunks keep the
pull request's own line numbers, so findings land on lines the forge accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from bot.diff import Hunk, parse_hunks
from bot.model import FileChange

Mode = Literal["full", "incremental"]
UNCHANGED = "unchanged since the last review"


@dataclass(frozen=True, slots=True)
class Increment:
    """The files a review covers, whether it is full or incremental, and why."""

    mode: Mode
    reason: str
    files: tuple[FileChange, ...]
    unchanged: tuple[str, ...] = ()
    since: str | None = None

    def details(self) -> dict[str, Any]:
        """What the job keeps of it (the summary reads it back)."""
        return {
            "mode": self.mode,
            "reason": self.reason,
            "since": self.since,
            "unchanged": [{"path": path, "reason": UNCHANGED} for path in self.unchanged],
        }


def full_review(files: Sequence[FileChange], reason: str) -> Increment:
    """Everything in the pull request, with the reason a full review was made."""
    return Increment("full", reason, tuple(files))


def render_hunk(hunk: Hunk) -> str:
    return "\n".join([hunk.header, *(f"{line.kind}{line.text}" for line in hunk.lines)])


def with_hunks(change: FileChange, hunks: Sequence[Hunk]) -> FileChange:
    """The file with only these hunks of its patch (sizes counted from them)."""
    additions = sum(line.kind == "+" for hunk in hunks for line in hunk.lines)
    deletions = sum(line.kind == "-" for hunk in hunks for line in hunk.lines)
    return replace(
        change,
        patch="\n".join(render_hunk(hunk) for hunk in hunks),
        additions=additions,
        deletions=deletions,
    )


def changed_new_lines(patch: str | None) -> frozenset[int]:
    """New-file lines a diff touches: its added lines and the places of its deletions."""
    lines: set[int] = set()
    for hunk in parse_hunks(patch):
        position = hunk.new_start
        for line in hunk.lines:
            if line.kind == "+" and line.new_line is not None:
                lines.add(line.new_line)
            elif line.kind == "-":
                lines.add(position)
            if line.new_line is not None:
                position = line.new_line + 1
    return frozenset(lines)


def _hunk_covers(hunk: Hunk, lines: Iterable[int]) -> bool:
    end = hunk.new_start + max(hunk.new_count, 1)
    return any(hunk.new_start <= line < end for line in lines)


def _description(mode_files: int, since: str) -> str:
    word = "file" if mode_files == 1 else "files"
    return f"since `{since[:12]}` ({mode_files} {word} changed since the last review)"


def narrow_by_compare(
    files: Sequence[FileChange],
    *,
    since: str,
    status: str,
    compared: Mapping[str, str | None],
) -> Increment:
    """Narrow to the compare of `since` with the head (GitHub); `status` is the compare's.

    `compared` maps the compare's paths to their patches (None: no textual diff).
    """
    if status in ("diverged", "behind"):
        return full_review(
            files, f"history was rewritten: `{since[:12]}` is no longer an ancestor of the head"
        )
    kept: list[FileChange] = []
    unchanged: list[str] = []
    for change in files:
        if change.path not in compared:
            unchanged.append(change.path)
            continue
        patch = compared[change.path]
        if patch is None or change.patch is None:
            kept.append(change)  # no lines to narrow by: the whole file is looked at
            continue
        touched = changed_new_lines(patch)
        hunks = [hunk for hunk in parse_hunks(change.patch) if _hunk_covers(hunk, touched)]
        if hunks:
            kept.append(with_hunks(change, hunks))
        else:
            unchanged.append(change.path)
    return Increment(
        "incremental", _description(len(kept), since), tuple(kept), tuple(unchanged), since
    )


def _hunk_body(hunk: Hunk) -> tuple[tuple[str, str], ...]:
    return tuple((line.kind, line.text) for line in hunk.lines)


def narrow_by_versions(
    files: Sequence[FileChange],
    *,
    since: str,
    ancestor: bool,
    previous: Mapping[str, str | None],
) -> Increment:
    """Narrow against the diff version of `since` (GitLab): hunks that version did not show.

    `previous` maps that version's paths to their patches; `ancestor` says whether `since` is
    still an ancestor of the head.
    """
    if not ancestor:
        return full_review(
            files, f"history was rewritten: `{since[:12]}` is no longer an ancestor of the head"
        )
    kept: list[FileChange] = []
    unchanged: list[str] = []
    for change in files:
        if change.path not in previous:
            kept.append(change)
            continue
        old = previous[change.path]
        if old == change.patch:
            unchanged.append(change.path)
            continue
        if change.patch is None or old is None:
            kept.append(change)
            continue
        seen = {_hunk_body(hunk) for hunk in parse_hunks(old)}
        hunks = [hunk for hunk in parse_hunks(change.patch) if _hunk_body(hunk) not in seen]
        if hunks:
            kept.append(with_hunks(change, hunks))
        else:
            unchanged.append(change.path)
    return Increment(
        "incremental", _description(len(kept), since), tuple(kept), tuple(unchanged), since
    )


def level_note(increment: Increment) -> str | None:
    """The reason the level was judged on the increment, for the job's reasons."""
    if increment.mode != "incremental":
        return None
    lines = sum(change.additions + change.deletions for change in increment.files)
    return (
        f"judged on the increment since `{(increment.since or '')[:12]}`:"
        f" {len(increment.files)} file(s), {lines} changed line(s)"
    )


__all__ = [
    "UNCHANGED",
    "Increment",
    "changed_new_lines",
    "full_review",
    "level_note",
    "narrow_by_compare",
    "narrow_by_versions",
    "with_hunks",
]
