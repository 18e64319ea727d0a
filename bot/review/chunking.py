"""Split a review into chunks, one LLM call each: files in order, grouped to a line budget."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.diff import HUNK_HEADER, file_lines, parse_hunks, split_lines
from bot.model import ChunkPlan, FileChange

# Each chunk past the first costs a call's overhead, yet a shorter chunk frees its worker
# sooner and tells the scheduler sooner what a review really costs. 600 and 800 lines lowered
# the mean turnaround on most replayed mornings but raised P1's P95 on most of them (seed 7:
# 70 -> 77 -> 93 s) and the mean where costs are hard to guess from lines or the load is light
# (docs/benchmarks.md, "Chunk size").
DEFAULT_LINE_BUDGET = 400
# A review that needs more than one chunk starts with a chunk of at most this many lines: its
# wait ends when the first call starts, so under a burst it starts after a short call and goes
# on in full-size chunks, at the price of one more call overhead.
DEFAULT_FIRST_BUDGET = 100

# Returns a reason (or True) when the review leaves the file out, None/False to review it.
SkipPredicate = Callable[[str, str | None], object]


@dataclass(frozen=True, slots=True)
class SkippedFile:
    """A file the review leaves out, and why (shown in the review summary)."""

    path: str
    reason: str
    lines: int = 0


@dataclass(frozen=True, slots=True)
class ChunkingResult:
    """The chunks of one review plus the files it skipped."""

    chunks: tuple[ChunkPlan, ...]
    skipped: tuple[SkippedFile, ...] = ()

    @property
    def total_lines(self) -> int:
        return sum(chunk.lines for chunk in self.chunks)


@dataclass(frozen=True, slots=True)
class _Piece:
    """A reviewable unit before packing: a whole file or a part of one."""

    entry: dict[str, Any]
    lines: int


def split_hunks(patch: str) -> list[str]:
    """Split a unified diff (GitHub/GitLab `patch` text) into hunks, each starting at `@@`."""
    hunks: list[list[str]] = []
    preamble: list[str] = []
    for line in split_lines(patch):
        if line.startswith("@@"):
            hunks.append([line])
        elif hunks:
            hunks[-1].append(line)
        else:
            preamble.append(line)
    if not hunks:
        return [patch] if patch else []
    if preamble:
        hunks[0] = preamble + hunks[0]
    return ["\n".join(hunk) for hunk in hunks]


def count_changed_lines(patch: str) -> int:
    """Count added and removed lines of a unified diff's hunks (a changed line whose text
    starts with "-- " or "++ " counts; the "---"/"+++" file headers before a hunk do not)."""
    return sum(1 for hunk in parse_hunks(patch) for line in hunk.lines if line.kind in ("+", "-"))


def _split_large_hunk(hunk: str, budget: int) -> list[str]:
    """Cut one hunk into parts of at most `budget` changed lines, each with a correct header."""
    lines = split_lines(hunk)
    header_index = next((i for i, line in enumerate(lines) if line.startswith("@@")), None)
    if header_index is None:
        return [hunk]
    match = HUNK_HEADER.match(lines[header_index])
    if match is None:
        return [hunk]
    preamble = lines[:header_index]
    old_line = int(match.group(1))
    new_line = int(match.group(3))
    section = match.group(5)
    body = lines[header_index + 1 :]
    parts: list[str] = []
    current: list[str] = []
    changed = 0
    old_start, new_start = old_line, new_line
    old_count = new_count = 0

    def close_part() -> None:
        header = f"@@ -{old_start},{old_count} +{new_start},{new_count} @@{section}"
        prefix = preamble if not parts else []
        parts.append("\n".join([*prefix, header, *current]))

    for line in body:
        kind = line[:1]
        if kind in ("+", "-") and changed >= budget:
            close_part()
            current = []
            changed = 0
            old_start, new_start = old_line, new_line
            old_count = new_count = 0
        current.append(line)
        if kind == "+":
            new_line += 1
            new_count += 1
            changed += 1
        elif kind == "-":
            old_line += 1
            old_count += 1
            changed += 1
        elif kind != "\\":
            old_line += 1
            new_line += 1
            old_count += 1
            new_count += 1
    if current or not parts:
        close_part()
    return parts


def _split_patch(patch: str, budget: int) -> list[tuple[str, int]]:
    """Group a file's hunks into parts of at most `budget` changed lines (big hunks are cut)."""
    units: list[tuple[str, int]] = []
    for hunk in split_hunks(patch):
        changed = count_changed_lines(hunk)
        if changed > budget:
            units.extend(
                (part, count_changed_lines(part)) for part in _split_large_hunk(hunk, budget)
            )
        else:
            units.append((hunk, changed))
    total = sum(lines for _, lines in units)
    target = total / max(1, math.ceil(total / budget))
    parts: list[tuple[list[str], int]] = []
    for text, lines in units:
        if parts and (parts[-1][1] + lines <= budget) and parts[-1][1] < target:
            parts[-1][0].append(text)
            parts[-1] = (parts[-1][0], parts[-1][1] + lines)
        else:
            parts.append(([text], lines))
    return [("\n".join(texts), lines) for texts, lines in parts]


def _even_split(lines: int, budget: int) -> list[int]:
    """Split a count into the fewest nearly equal parts of at most `budget`."""
    count = max(1, math.ceil(lines / budget))
    base, extra = divmod(lines, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def _pack(
    pieces: Sequence[_Piece], budget: int, first_budget: int | None = None
) -> tuple[ChunkPlan, ...]:
    """Group pieces in order into chunks of at most `budget` lines (a larger piece stands alone).

    The first chunk holds at most `first_budget` lines when given (its pieces are cut to fit).
    """
    chunks: list[ChunkPlan] = []
    current: list[Mapping[str, Any]] = []
    current_lines = 0
    for piece in pieces:
        limit = budget if chunks or first_budget is None else first_budget
        if current and current_lines + piece.lines > limit:
            chunks.append(ChunkPlan(files=tuple(current), lines=current_lines))
            current, current_lines = [], 0
        current.append(piece.entry)
        current_lines += piece.lines
    if current:
        chunks.append(ChunkPlan(files=tuple(current), lines=current_lines))
    return tuple(chunks)


def _cut_piece(piece: _Piece, head_lines: int) -> tuple[_Piece, _Piece]:
    """Cut a piece into a head of at most `head_lines` changed lines and the rest."""
    entry = piece.entry
    patch = entry.get("patch")
    if patch:
        parts = _split_patch(patch, head_lines)
        head_text, head = parts[0]
        tail_text = "\n".join(text for text, _ in parts[1:])
        tail = piece.lines - head
        head_entry = {**entry, "lines": head, "patch": head_text}
        tail_entry = {**entry, "lines": tail, "patch": tail_text}
    else:
        head = head_lines
        tail = piece.lines - head
        head_entry = {**entry, "lines": head}
        tail_entry = {**entry, "lines": tail}
    return _Piece(head_entry, head), _Piece(tail_entry, tail)


def _renumber_parts(pieces: Sequence[_Piece]) -> list[_Piece]:
    """Number the parts of each file again (1..n) after a cut; a whole file has no part keys."""
    counts: dict[Any, int] = {}
    for piece in pieces:
        counts[piece.entry["index"]] = counts.get(piece.entry["index"], 0) + 1
    seen: dict[Any, int] = {}
    result: list[_Piece] = []
    for piece in pieces:
        index = piece.entry["index"]
        entry = {k: v for k, v in piece.entry.items() if k not in ("part", "parts")}
        if counts[index] > 1:
            seen[index] = seen.get(index, 0) + 1
            entry.update(part=seen[index], parts=counts[index])
        result.append(_Piece(entry, piece.lines))
    return result


def _with_first_chunk(
    pieces: Sequence[_Piece], *, line_budget: int, first_budget: int | None
) -> tuple[ChunkPlan, ...]:
    """Pack pieces; a review over `line_budget` lines gets a first chunk of `first_budget`."""
    total = sum(piece.lines for piece in pieces)
    if first_budget is None or first_budget >= line_budget or total <= line_budget:
        return _pack(pieces, line_budget)
    items = list(pieces)
    if items and items[0].lines > first_budget:
        head, tail = _cut_piece(items[0], first_budget)
        if head.lines > 0 and tail.lines > 0:
            items[0:1] = [head, tail]
            items = _renumber_parts(items)
    return _pack(items, line_budget, first_budget)


def halve_chunk(
    files: Sequence[Mapping[str, Any] | Any],
) -> tuple[list[Mapping[str, Any] | Any], list[Mapping[str, Any] | Any]] | None:
    """Two halves of a chunk, by changed lines, for a model that refused it whole (its prompt
    over the model's context): its files in two groups, or a lone file's hunks (a big hunk
    cut, each part with a correct header); None when no cut leaves both halves a change."""
    if len(files) > 1:
        sizes = [file_lines(file) for file in files]
        total, running, cut = sum(sizes), 0, len(files) - 1
        for index, size in enumerate(sizes[:-1], start=1):
            running += size
            if running * 2 >= total:
                cut = index
                break
        return list(files[:cut]), list(files[cut:])
    if len(files) != 1 or not isinstance(files[0], Mapping):
        return None
    entry = dict(files[0])
    patch = entry.get("patch")
    changed = count_changed_lines(patch) if isinstance(patch, str) else 0
    if changed < 2:
        return None
    head, tail = _cut_piece(_Piece(entry, changed), math.ceil(changed / 2))
    if head.lines <= 0 or tail.lines <= 0:
        return None
    return [head.entry], [tail.entry]


def _skip_reason(skip: SkipPredicate | None, change: FileChange) -> str | None:
    if skip is None:
        return None
    verdict = skip(change.path, change.patch)
    if not verdict:
        return None
    return verdict if isinstance(verdict, str) else "skipped"


def plan_chunks(
    files: Sequence[FileChange],
    *,
    line_budget: int = DEFAULT_LINE_BUDGET,
    skip: SkipPredicate | None = None,
    first_budget: int | None = DEFAULT_FIRST_BUDGET,
) -> ChunkingResult:
    """Chunk a review's changed files; `skip(path, patch)` names files to leave out.

    A review over `line_budget` lines starts with a chunk of at most `first_budget` lines.
    """
    if line_budget < 1:
        raise ValueError(f"line_budget must be at least 1, got {line_budget}")
    pieces: list[_Piece] = []
    skipped: list[SkippedFile] = []
    for index, change in enumerate(files):
        # A deleted file's old text is not worth a call: the summary says it was deleted.
        reason = "deleted" if change.status == "removed" else _skip_reason(skip, change)
        if reason is not None:
            skipped.append(SkippedFile(change.path, reason, change.changed_lines))
            continue
        base: dict[str, Any] = {"index": index, "path": change.path, "status": change.status}
        if change.previous_path is not None:
            base["previous_path"] = change.previous_path
        lines = count_changed_lines(change.patch) if change.patch else change.changed_lines
        if change.patch and lines > line_budget:
            parts = _split_patch(change.patch, line_budget)
            for number, (text, part_lines) in enumerate(parts, start=1):
                entry = {**base, "lines": part_lines, "patch": text}
                entry.update(part=number, parts=len(parts))
                pieces.append(_Piece(entry, part_lines))
        elif change.patch is None and lines > line_budget:
            counts = _even_split(lines, line_budget)
            for number, part_lines in enumerate(counts, start=1):
                entry = {**base, "lines": part_lines, "part": number, "parts": len(counts)}
                pieces.append(_Piece(entry, part_lines))
        else:
            pieces.append(_Piece({**base, "lines": lines, "patch": change.patch}, lines))
    chunks = _with_first_chunk(pieces, line_budget=line_budget, first_budget=first_budget)
    return ChunkingResult(chunks=chunks, skipped=tuple(skipped))
