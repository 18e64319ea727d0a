"""Where a finding lands: the bot, not the model, decides the line (pure).

The model names a path, a side, a line and, ideally, quotes the line's text. Each finding is
placed by the first rule that holds:

- `exact`: the named (path, side, line) is a line of the diff and its text matches the quote
  (or no quote was given);
- `by_quote`: else the line of the same file whose text matches the quote, nearest to the
  named number (either side, the named side first on a tie);
- `nearby`: else, when no quote was given, the nearest changed line within `NEARBY_LINES`;
- `summary_only`: else the finding is not placed; the summary lists it with its file and text.

A line whose whole text is the quote outranks one that only contains it (a one-line quote of
at least `MIN_PARTIAL_QUOTE` characters may be part of a line): `x.close()` quoted names the
line `x.close()`, not the `await x.close()` it replaced, even when the named number points there.

A quote that matches no line never falls back to `nearby`: the model told us what the finding
is about, and it is not there, so a line near the number would be a line it was not about.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bot.diff import SIDES, Side, file_value, parse_hunks, prompt_text
from bot.model import ANCHOR_OUTCOMES

AnchorOutcome = Literal["exact", "by_quote", "nearby", "summary_only"]
NEARBY_LINES = 3
# A one-line quote shorter than this must equal the line; a longer one may be part of it.
MIN_PARTIAL_QUOTE = 8

# What a model copies from the numbered prompt along with the code: "12 +" or "+".
_PROMPT_PREFIX = re.compile(r"^\s*\d+ ?[+\- ]")
_DIFF_MARKER = re.compile(r"^[+\-]")


@dataclass(frozen=True, slots=True)
class HunkSpan:
    """The new-file (RIGHT) lines one hunk shows, first to last."""

    first: int
    last: int


@dataclass(frozen=True, slots=True)
class FileLines:
    """One file's commentable diff lines: number -> text per side, which are changed, hunks."""

    right: Mapping[int, str]
    left: Mapping[int, str]
    added: frozenset[int]
    removed: frozenset[int]
    right_hunks: tuple[HunkSpan, ...] = ()

    def side(self, side: Side) -> Mapping[int, str]:
        return self.right if side == "RIGHT" else self.left

    def changed(self, side: Side) -> frozenset[int]:
        return self.added if side == "RIGHT" else self.removed

    def hunk_of(self, line: int) -> HunkSpan | None:
        """The hunk whose RIGHT lines include `line`, if any."""
        return next((span for span in self.right_hunks if span.first <= line <= span.last), None)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a finding goes: a line (with an optional range start) or the summary only."""

    outcome: AnchorOutcome
    path: str
    side: Side
    line: int | None
    start_line: int | None = None

    @property
    def placed(self) -> bool:
        return self.outcome != "summary_only"


def index_files(files: Iterable[Mapping[str, Any] | Any]) -> dict[str, FileLines]:
    """The commentable lines of each file of a chunk (see bot.diff.Hunk.trusted_lines)."""
    index: dict[str, FileLines] = {}
    for file in files:
        path = str(file_value(file, "path", ""))
        patch = file_value(file, "patch")
        right: dict[int, str] = {}
        left: dict[int, str] = {}
        added: set[int] = set()
        removed: set[int] = set()
        spans: list[HunkSpan] = []
        known = index.get(path)
        if known is not None:  # a file cut into parts: the parts' hunks add up
            right.update(known.right)
            left.update(known.left)
            added.update(known.added)
            removed.update(known.removed)
            spans.extend(known.right_hunks)
        for hunk in parse_hunks(patch if isinstance(patch, str) else None):
            trusted = hunk.trusted_lines
            numbers = [line.new_line for line in trusted if line.new_line is not None]
            if numbers:
                spans.append(HunkSpan(min(numbers), max(numbers)))
            for line in trusted:
                if line.new_line is not None:
                    right[line.new_line] = line.text
                if line.old_line is not None:
                    left[line.old_line] = line.text
                if line.kind == "+" and line.new_line is not None:
                    added.add(line.new_line)
                elif line.kind == "-" and line.old_line is not None:
                    removed.add(line.old_line)
        index[path] = FileLines(right, left, frozenset(added), frozenset(removed), tuple(spans))
    return index


def normalize_path(value: str, paths: Iterable[str]) -> str | None:
    """The known path a model named, accepting git's a/ and b/ prefixes, "./" and "/"."""
    known = set(paths)
    candidate = value.strip()
    for _ in range(3):  # "./a/x" peels twice
        if candidate in known:
            return candidate
        for prefix in ("./", "a/", "b/", "/"):
            if candidate.startswith(prefix):
                candidate = candidate[len(prefix) :]
                break
        else:
            break
    return candidate if candidate in known else None


def normalize_code(text: str) -> str:
    """A line's text as the prompt shows it, spacing collapsed (indentation does not count)."""
    return " ".join(prompt_text(text).split())


Quote = tuple[tuple[str, ...], ...]


def quote_lines(quote: str) -> Quote:
    """The ways to read a quote: its non-blank lines normalized as given, and without the
    "12 +" or "+" prefix a model may copy from the numbered prompt. Empty when blank."""
    readings: list[tuple[str, ...]] = []
    for strip in (None, _PROMPT_PREFIX, _DIFF_MARKER):
        lines: list[str] = []
        for raw in quote.split("\n"):
            text = strip.sub("", raw, count=1) if strip is not None else raw
            cleaned = normalize_code(text)
            if cleaned:
                lines.append(cleaned)
        if lines and tuple(lines) not in readings:
            readings.append(tuple(lines))
    return tuple(readings)


# How well lines match a quote: not at all, as a part of one line, or as their whole text.
NO_MATCH, PART, WHOLE = 0, 1, 2


def _line_match(text: str, wanted: str, *, alone: bool) -> int:
    have = normalize_code(text)
    if have == wanted:
        return WHOLE
    # A one-line quote may be the part of the line the finding is about.
    return PART if alone and len(wanted) >= MIN_PARTIAL_QUOTE and wanted in have else NO_MATCH


def _reading_match(lines: Mapping[int, str], line: int, reading: Sequence[str]) -> int:
    first = line - len(reading) + 1
    worst = WHOLE
    for offset, wanted in enumerate(reading):
        text = lines.get(first + offset)
        found = NO_MATCH if text is None else _line_match(text, wanted, alone=len(reading) == 1)
        worst = min(worst, found)
        if worst == NO_MATCH:
            break
    return worst


def quote_match(lines: Mapping[int, str], line: int, quoted: Quote) -> int:
    """How a reading of the quote matches the lines ending at `line` (one side): NO_MATCH,
    PART (the quote is part of the one line) or WHOLE."""
    return max((_reading_match(lines, line, reading) for reading in quoted), default=NO_MATCH)


def matches_quote(lines: Mapping[int, str], line: int, quoted: Quote) -> bool:
    """Whether a reading of the quote is the text of the lines ending at `line` (one side)."""
    return quote_match(lines, line, quoted) != NO_MATCH


def _nearest(
    candidates: Iterable[tuple[Side, int]], *, line: int | None, side: Side | None
) -> tuple[Side, int] | None:
    def rank(item: tuple[Side, int]) -> tuple[int, int, int]:
        item_side, number = item
        distance = abs(number - line) if line is not None else 0
        return (distance, 0 if item_side == side else 1, number)

    ordered = sorted(candidates, key=rank)
    return ordered[0] if ordered else None


def _range_start(
    file: FileLines, side: Side, line: int, start_line: int | None, shift: int
) -> int | None:
    """The range start moved with its line, kept when every line of the range is shown."""
    if start_line is None:
        return None
    start = start_line + shift
    if start >= line or start < 1:
        return None
    shown = file.side(side)
    if any(number not in shown for number in range(start, line + 1)):
        return None
    if side == "RIGHT":
        span = file.hunk_of(line)
        if span is None or start < span.first:
            return None
    return start


def anchor_finding(
    index: Mapping[str, FileLines],
    *,
    path: str,
    side: Side | None,
    line: int | None,
    quote: str | None = None,
    start_line: int | None = None,
) -> Placement:
    """Place one finding by the rules in the module docstring (pure)."""
    resolved = normalize_path(path, index)
    fallback_side: Side = side or "RIGHT"
    if resolved is None:
        return Placement("summary_only", path, fallback_side, line)
    file = index[resolved]
    quoted = quote_lines(quote) if quote else ()
    sides: tuple[Side, ...] = (side,) if side is not None else SIDES
    # Every line the quote matches, by how well. A line whose whole text is the quote outranks
    # one that only contains it: `close()` quoted is the line `close()`, not `await x.close()`.
    matched: dict[tuple[Side, int], int] = {}
    if quoted:
        for candidate in SIDES:
            shown = file.side(candidate)
            for number in shown:
                quality = quote_match(shown, number, quoted)
                if quality != NO_MATCH:
                    matched[(candidate, number)] = quality
    best = max(matched.values(), default=NO_MATCH)
    # (a) the named line, when it shows and says what the quote says.
    if line is not None:
        for candidate in sides:
            shown = file.side(candidate)
            if line in shown and (not quoted or matched.get((candidate, line)) == best):
                start = _range_start(file, candidate, line, start_line, 0)
                return Placement("exact", resolved, candidate, line, start)
    # (b) the quoted line nearest the named number, on either side.
    if quoted:
        found = _nearest(
            (place for place, quality in matched.items() if quality == best),
            line=line,
            side=side,
        )
        if found is None:
            return Placement("summary_only", resolved, fallback_side, line)
        found_side, number = found
        shift = number - line if line is not None else 0
        start = _range_start(file, found_side, number, start_line, shift)
        if start is None:
            longest = max(len(reading) for reading in quoted)
            if longest > 1:
                start = _range_start(file, found_side, number, number - longest + 1, 0)
        return Placement("by_quote", resolved, found_side, number, start)
    # (c) no quote: the nearest changed line within NEARBY_LINES.
    if line is not None:
        found = _nearest(
            (
                (candidate, number)
                for candidate in SIDES
                for number in file.changed(candidate)
                if abs(number - line) <= NEARBY_LINES
            ),
            line=line,
            side=side,
        )
        if found is not None:
            found_side, number = found
            start = _range_start(file, found_side, number, start_line, number - line)
            return Placement("nearby", resolved, found_side, number, start)
    # (d) nowhere: the summary lists it.
    return Placement("summary_only", resolved, fallback_side, line)


def suggestion_fits(file: FileLines, *, side: Side, line: int, start_line: int | None) -> bool:
    """Whether a replacement for lines start_line..line can be a suggestion block: all of them
    RIGHT-side lines of one hunk."""
    if side != "RIGHT":
        return False
    first = start_line if start_line is not None else line
    span = file.hunk_of(line)
    if span is None or first < span.first or first > line:
        return False
    return all(number in file.right for number in range(first, line + 1))


__all__ = [
    "ANCHOR_OUTCOMES",
    "NEARBY_LINES",
    "AnchorOutcome",
    "FileLines",
    "HunkSpan",
    "Placement",
    "anchor_finding",
    "index_files",
    "matches_quote",
    "normalize_path",
    "quote_lines",
    "suggestion_fits",
]
