"""Inline comments from anchored findings, with what the forge needs from the review's own diff.

Pure: the review's stored chunk files say a renamed file's old path, an unchanged line's old
and new numbers, and which lines a suggestion block may replace, so posting never depends on
what a process read from the forge (a restart or a push changes that).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bot.diff import CONTROL, fence_for, file_value
from bot.forges.base import DiffLines, InlineComment, parse_diff_lines
from bot.review.anchor import FileLines, index_files, suggestion_fits
from bot.review.parse import Finding

MAX_SUGGESTION_CHARS = 4_000


@dataclass(frozen=True, slots=True)
class ReviewDiff:
    """A review's diff as its chunks stored it: lines per file, line pairs, old paths."""

    index: Mapping[str, FileLines]
    lines: Mapping[str, DiffLines]
    old_paths: Mapping[str, str]


def review_diff(files: Iterable[Mapping[str, Any] | Any]) -> ReviewDiff:
    """The diff of all of a review's chunk files (a file cut into parts is joined again)."""
    listed = list(files)
    patches: dict[str, list[str]] = defaultdict(list)
    old_paths: dict[str, str] = {}
    for file in listed:
        path = str(file_value(file, "path", ""))
        patch = file_value(file, "patch")
        if isinstance(patch, str) and patch:
            patches[path].append(patch)
        previous = file_value(file, "previous_path")
        if previous:
            old_paths[path] = str(previous)
    return ReviewDiff(
        index=index_files(listed),
        lines={path: parse_diff_lines("\n".join(parts)) for path, parts in patches.items()},
        old_paths=old_paths,
    )


def clean_suggestion(text: str) -> str:
    """Replacement code as it may be posted: no control characters, bounded."""
    return CONTROL.sub("", text.replace("\r\n", "\n")).rstrip("\n")[:MAX_SUGGESTION_CHARS]


def placed_suggestion(finding: Finding, diff: ReviewDiff) -> str | None:
    """The finding's replacement code when it can be a suggestion block: it replaces lines
    that are all on the RIGHT side of one hunk, and changes them."""
    if finding.suggestion is None:
        return None
    file = diff.index.get(finding.path)
    if file is None or not suggestion_fits(
        file, side=finding.side, line=finding.line, start_line=finding.start_line
    ):
        return None
    code = clean_suggestion(finding.suggestion)
    first = finding.start_line if finding.start_line is not None else finding.line
    current = "\n".join(file.right[number] for number in range(first, finding.line + 1))
    return code if code != current else None


def plain_suggestion(body: str, suggestion: str) -> str:
    """A body with replacement code that cannot be a suggestion block, as plain code."""
    code = clean_suggestion(suggestion)
    if not code.strip():
        return body
    fence = fence_for(code)
    return f"{body}\n\nSuggested code:\n{fence}\n{code}\n{fence}"


def inline_comment(finding: Finding, diff: ReviewDiff, *, body: str) -> InlineComment:
    """The inline comment of a placed finding, with `body` as its rendered text."""
    lines = diff.lines.get(finding.path)
    pair = (
        lines.line_pair(finding.line, finding.side)
        if lines is not None and lines.has_line(finding.line, finding.side)
        else None
    )
    suggestion = placed_suggestion(finding, diff)
    if suggestion is None and finding.suggestion is not None:
        body = plain_suggestion(body, finding.suggestion)
    return InlineComment(
        path=finding.path,
        line=finding.line,
        body=body,
        side=finding.side,
        start_line=finding.start_line,
        old_path=diff.old_paths.get(finding.path),
        line_pair=pair,
        suggestion=suggestion,
    )


__all__ = [
    "ReviewDiff",
    "inline_comment",
    "placed_suggestion",
    "review_diff",
]
