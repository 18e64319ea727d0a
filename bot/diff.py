"""Unified diffs: the positions a chunk's diff contains, and the fenced form a prompt shows."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Side = Literal["RIGHT", "LEFT"]
SIDES: tuple[Side, ...] = ("RIGHT", "LEFT")

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


def split_lines(text: str) -> list[str]:
    """The lines of diff or file text, split on "\n" alone, each without one trailing "\r".

    git and the forges end a line only at "\n": str.splitlines() also splits at form feeds,
    \x0b, \x1c-\x1e, \x85, \u2028/9 and a lone "\r", which puts every later position off.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the text's final newline ends the last line, it starts none
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def unified_patch(old_lines: Sequence[str], new_lines: Sequence[str]) -> tuple[str, int, int]:
    """The hunks (3 lines of context, no "---"/"+++" file headers) of a unified diff from
    `old_lines` to `new_lines`, with the counts of added and deleted lines."""
    lines = list(difflib.unified_diff(old_lines, new_lines, lineterm="", n=3))[2:]
    additions = sum(1 for line in lines if line.startswith("+"))
    deletions = sum(1 for line in lines if line.startswith("-"))
    return "\n".join(lines), additions, deletions


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One line of a hunk: `kind` is '+', '-' or ' '; line numbers of the side(s) it exists on."""

    kind: str
    text: str
    old_line: int | None
    new_line: int | None


@dataclass(frozen=True, slots=True)
class Hunk:
    """One `@@` hunk of a file's diff."""

    header: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[DiffLine, ...]

    @property
    def trusted_lines(self) -> tuple[DiffLine, ...]:
        """The lines within the header's counts: the ones a comment may point at.

        git writes bodies that match their headers. Lines past a count mean the hunk was
        altered after git wrote it, and the forge's own diff need not have them; a body
        shorter than its header (cut off) still shows lines the forge has.
        """
        old = new = 0
        for index, line in enumerate(self.lines):
            old += line.old_line is not None
            new += line.new_line is not None
            if old > self.old_count or new > self.new_count:
                return self.lines[:index]
        return self.lines


@dataclass(frozen=True, slots=True)
class FileDiff:
    """A file of a chunk with its parsed hunks."""

    path: str
    status: str
    additions: int
    deletions: int
    patch: str | None
    hunks: tuple[Hunk, ...]


def parse_hunks(patch: str | None) -> tuple[Hunk, ...]:
    """Parse the `@@` hunks of one file's unified diff; text before the first hunk is ignored."""
    if not patch:
        return ()
    hunks: list[Hunk] = []
    header: re.Match[str] | None = None
    lines: list[DiffLine] = []
    old_line = new_line = 0

    def close() -> None:
        if header is not None:
            hunks.append(
                Hunk(
                    header=header.group(0),
                    old_start=int(header.group(1)),
                    old_count=int(header.group(2) or "1"),
                    new_start=int(header.group(3)),
                    new_count=int(header.group(4) or "1"),
                    lines=tuple(lines),
                )
            )

    for raw in split_lines(patch):
        match = HUNK_HEADER.match(raw)
        if match:
            close()
            header, lines = match, []
            old_line, new_line = int(match.group(1)), int(match.group(3))
            continue
        if header is None or raw.startswith("\\"):
            continue  # preamble (diff --git, ---, +++) or "\ No newline at end of file"
        kind, text = (raw[0], raw[1:]) if raw else (" ", "")
        if kind == "+":
            lines.append(DiffLine("+", text, None, new_line))
            new_line += 1
        elif kind == "-":
            lines.append(DiffLine("-", text, old_line, None))
            old_line += 1
        elif kind == " ":
            lines.append(DiffLine(" ", text, old_line, new_line))
            old_line += 1
            new_line += 1
        # anything else (a new "diff --git" preamble) is not part of a hunk
    close()
    return tuple(hunks)


def file_value(file: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    """Read a field from a file mapping or a FileChange-like object."""
    if isinstance(file, Mapping):
        return file.get(key, default)
    return getattr(file, key, default)


def parse_files(files: Iterable[Mapping[str, Any] | Any]) -> tuple[FileDiff, ...]:
    """Parse every file of a chunk (mappings {path, patch, additions, deletions, status})."""
    parsed: list[FileDiff] = []
    for file in files:
        patch = file_value(file, "patch")
        text = patch if isinstance(patch, str) else None
        hunks = parse_hunks(text)
        additions, deletions = count_changes(file, hunks)
        parsed.append(
            FileDiff(
                path=str(file_value(file, "path", "")),
                status=str(file_value(file, "status", "modified") or "modified"),
                additions=additions,
                deletions=deletions,
                patch=text,
                hunks=hunks,
            )
        )
    return tuple(parsed)


def count_changes(file: Mapping[str, Any] | Any, hunks: Iterable[Hunk]) -> tuple[int, int]:
    """(additions, deletions) as given, else counted from the hunks (chunker parts carry none)."""
    additions = file_value(file, "additions")
    deletions = file_value(file, "deletions")
    if additions is not None and deletions is not None:
        return int(additions), int(deletions)
    added = removed = 0
    for hunk in hunks:
        for line in hunk.lines:
            added += line.kind == "+"
            removed += line.kind == "-"
    return added, removed


def file_lines(file: Mapping[str, Any] | Any) -> int:
    """Changed lines of a chunk file: its `lines` field, else additions + deletions."""
    lines = file_value(file, "lines")
    if lines is not None:
        return int(lines)
    patch = file_value(file, "patch")
    additions, deletions = count_changes(
        file, parse_hunks(patch if isinstance(patch, str) else None)
    )
    return additions + deletions


def commentable_positions(
    files: Iterable[Mapping[str, Any] | Any],
) -> frozenset[tuple[str, Side, int]]:
    """(path, side, line) positions a review comment may point at in these files' hunks."""
    positions: set[tuple[str, Side, int]] = set()
    for file in parse_files(files):
        for hunk in file.hunks:
            for line in hunk.trusted_lines:
                if line.new_line is not None:
                    positions.add((file.path, "RIGHT", line.new_line))
                if line.old_line is not None:
                    positions.add((file.path, "LEFT", line.old_line))
    return frozenset(positions)


def changed_lines(file: FileDiff) -> tuple[tuple[Side, int, str], ...]:
    """Added lines as (RIGHT, new line, text) and deleted ones as (LEFT, old line, text)."""
    found: list[tuple[Side, int, str]] = []
    for hunk in file.hunks:
        for line in hunk.lines:
            if line.kind == "+" and line.new_line is not None:
                found.append(("RIGHT", line.new_line, line.text))
            elif line.kind == "-" and line.old_line is not None:
                found.append(("LEFT", line.old_line, line.text))
    return tuple(found)


# The fenced form a prompt shows a chunk's files in, and its inverse (for the simulated model).
FILE_HEADER = re.compile(
    r"^File: (?P<path>.+) \((?P<status>[a-z_]+), \+(?P<add>\d+)/-(?P<del>\d+)"
    r"(?:, part (?P<part>\d+) of (?P<parts>\d+))?\)$"
)
BEGIN_DIFF = "BEGIN UNTRUSTED DIFF"
END_DIFF = "END UNTRUSTED DIFF"
NO_PATCH = "(no textual diff: binary or too large; not reviewed)"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class PromptFile:
    """A file section recovered from a rendered prompt."""

    path: str
    status: str
    additions: int
    deletions: int
    patch: str | None


def clean_path(path: str) -> str:
    """A path safe for one header line: control characters and newlines replaced."""
    return CONTROL.sub("?", path.replace("\r", "?").replace("\n", "?"))


def fence_for(text: str) -> str:
    """A backtick fence longer than any backtick run in `text`, so the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


# Characters some tools take for line ends; shown as a space so a line stays one line.
LINE_BREAKS = re.compile("[\x85\u2028\u2029]")
NUMBERED_LINE = re.compile(r"^(\d+) ([+\- ])(.*)$")


def prompt_text(text: str) -> str:
    """A diff line's text as the prompt shows it: no control characters, no line breaks."""
    return CONTROL.sub("", LINE_BREAKS.sub(" ", text))


def number_hunks(hunks: Iterable[Hunk]) -> str:
    """Hunks with every line numbered: "<n> <kind><text>", where n is the new-file line of an
    added or unchanged line and the old-file line of a removed one."""
    rendered: list[str] = []
    for hunk in hunks:
        rendered.append(prompt_text(hunk.header))
        for line in hunk.lines:
            number = line.old_line if line.kind == "-" else line.new_line
            rendered.append(f"{number} {line.kind}{prompt_text(line.text)}")
    return "\n".join(rendered)


def render_file(file: Mapping[str, Any] | Any) -> str:
    """One file's section: a header line with path and size, then its fenced, numbered diff."""
    path = clean_path(str(file_value(file, "path", "")))
    status = str(file_value(file, "status", "modified") or "modified")
    status = status if re.fullmatch(r"[a-z_]+", status) else "modified"
    patch = file_value(file, "patch")
    text = patch if isinstance(patch, str) else None
    hunks = parse_hunks(text)
    additions, deletions = count_changes(file, hunks)
    part, parts = file_value(file, "part"), file_value(file, "parts")
    where = f", part {int(part)} of {int(parts)}" if part and parts else ""
    header = f"File: {path} ({status}, +{additions}/-{deletions}{where})"
    if not hunks:
        return f"{header}\n{NO_PATCH}"
    body = number_hunks(hunks)
    fence = fence_for(body)
    return f"{header}\n{fence}diff\n{body}\n{fence}"


def unnumber(lines: Iterable[str]) -> str:
    """The unified diff a numbered body shows (inverse of number_hunks, for line numbers)."""
    patch: list[str] = []
    for line in lines:
        match = NUMBERED_LINE.match(line)
        if match:
            patch.append(match.group(2) + match.group(3))
        elif line.startswith("@@"):
            patch.append(line)
    return "\n".join(patch)


def render_diff(files: Iterable[Mapping[str, Any] | Any]) -> str:
    """The chunk's files between BEGIN/END markers."""
    sections = [render_file(file) for file in files]
    return "\n".join([BEGIN_DIFF, *sections, END_DIFF])


def extract_files(user_message: str) -> tuple[PromptFile, ...]:
    """Recover the file sections rendered by build_user_message (inverse of render_diff)."""
    lines = user_message.split("\n")
    try:
        start = lines.index(BEGIN_DIFF) + 1
    except ValueError:
        return ()
    found: list[PromptFile] = []
    index = start
    while index < len(lines):
        line = lines[index]
        if line == END_DIFF:
            break
        match = FILE_HEADER.match(line)
        index += 1
        if not match:
            continue
        patch: str | None = None
        if index < len(lines) and lines[index] == NO_PATCH:
            index += 1
        elif index < len(lines) and lines[index].startswith("```"):
            fence = lines[index][: len(lines[index]) - len(lines[index].lstrip("`"))]
            index += 1
            body: list[str] = []
            while index < len(lines) and lines[index] != fence:
                body.append(lines[index])
                index += 1
            index += 1  # the closing fence
            patch = unnumber(body)
        found.append(
            PromptFile(
                path=match.group("path"),
                status=match.group("status"),
                additions=int(match.group("add")),
                deletions=int(match.group("del")),
                patch=patch,
            )
        )
    return tuple(found)
