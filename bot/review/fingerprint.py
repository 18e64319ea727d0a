"""Stable fingerprints of findings, so a finding said once on a pull request is not said again.

A fingerprint hashes what identifies a finding to a reader, not where the diff happens to put
it: the file, the text of the anchored line with its neighbours (whitespace-normalized, so a
re-indent or a shift by a few lines keeps it), the category and the message (case, spacing,
numbers and quoting normalized, so "line 12" and "line 14" read the same). Pure functions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.diff import Side, file_value, parse_hunks
from bot.review.parse import Finding

# How many lines on each side of the anchored line belong to its identity.
NEIGHBOURS = 1
FINGERPRINT_VERSION = "1"

_NUMBER = re.compile(r"\d+")
_QUOTES = re.compile(r"[`'\"“”‘’]")
_PUNCTUATION = re.compile(r"[^\w\s#]")


def normalize_code(text: str) -> str:
    """A code line with its spacing collapsed (indentation and trailing blanks do not count)."""
    return " ".join(text.split())


def normalize_message(text: str) -> str:
    """A finding's message with case, quotes, punctuation, spacing and numbers normalized."""
    lowered = _QUOTES.sub("", text.lower())
    lowered = _NUMBER.sub("#", lowered)
    lowered = _PUNCTUATION.sub(" ", lowered)
    return " ".join(lowered.split())


def category_of(finding: Finding) -> str:
    """The finding's category; the output contract's severity is the category it carries."""
    return finding.severity


@dataclass(frozen=True, slots=True)
class Anchor:
    """The text of a finding's line and its neighbours on the same side of the diff."""

    line: str
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    @property
    def context(self) -> tuple[str, ...]:
        return (*self.before, self.line, *self.after)


def side_lines(patch: str | None, side: Side) -> dict[int, str]:
    """Line number -> text of every line a patch shows on one side (RIGHT new, LEFT old)."""
    lines: dict[int, str] = {}
    for hunk in parse_hunks(patch):
        for line in hunk.lines:
            number = line.new_line if side == "RIGHT" else line.old_line
            if number is not None:
                lines[number] = line.text
    return lines


def anchor_of(
    patches: Mapping[str, str | None], finding: Finding, *, neighbours: int = NEIGHBOURS
) -> Anchor | None:
    """The anchored line's text and its neighbours from the file's patch; None if not shown."""
    lines = side_lines(patches.get(finding.path), finding.side)
    text = lines.get(finding.line)
    if text is None:
        return None
    before = tuple(
        normalize_code(lines[number])
        for number in range(finding.line - neighbours, finding.line)
        if number in lines
    )
    after = tuple(
        normalize_code(lines[number])
        for number in range(finding.line + 1, finding.line + neighbours + 1)
        if number in lines
    )
    return Anchor(normalize_code(text), before, after)


def fingerprint(
    *, path: str, anchor: Anchor | None, category: str, message: str, line: int = 0
) -> str:
    """The stable hash of one finding (hex); without an anchor the line number stands in."""
    anchored = "\n".join(anchor.context) if anchor is not None else f"#line {line}"
    material = "\x1f".join(
        (FINGERPRINT_VERSION, path, anchored, category, normalize_message(message))
    )
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def loose_key(*, path: str, anchor_text: str | None, category: str, message: str) -> str:
    """The fingerprint without the neighbours: matches a finding whose adjacent lines changed."""
    material = "\x1f".join(
        (FINGERPRINT_VERSION, path, anchor_text or "", category, normalize_message(message))
    )
    return hashlib.sha256(material.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class FingerprintedFinding:
    """A finding with its fingerprint and the anchored line's normalized text."""

    finding: Finding
    fingerprint: str
    anchor_text: str | None

    @property
    def path(self) -> str:
        return self.finding.path

    @property
    def loose_key(self) -> str:
        return loose_key(
            path=self.finding.path,
            anchor_text=self.anchor_text,
            category=category_of(self.finding),
            message=self.finding.body,
        )


def patches_of(files: Iterable[Mapping[str, Any] | Any]) -> dict[str, str | None]:
    """path -> patch of chunk files; a file split over several parts joins its hunks."""
    patches: dict[str, str | None] = {}
    for item in files:
        path = str(file_value(item, "path", ""))
        patch = file_value(item, "patch")
        text = patch if isinstance(patch, str) else None
        known = patches.get(path)
        patches[path] = f"{known}\n{text}" if known and text else (known or text)
    return patches


def fingerprint_findings(
    findings: Sequence[Finding], patches: Mapping[str, str | None]
) -> tuple[FingerprintedFinding, ...]:
    """Fingerprint each finding against the patches it was made on; duplicates keep the first."""
    seen: set[str] = set()
    result: list[FingerprintedFinding] = []
    for finding in findings:
        anchor = anchor_of(patches, finding)
        digest = fingerprint(
            path=finding.path,
            anchor=anchor,
            category=category_of(finding),
            message=finding.body,
            line=finding.line,
        )
        if digest in seen:
            continue
        seen.add(digest)
        result.append(FingerprintedFinding(finding, digest, anchor.line if anchor else None))
    return tuple(result)


__all__ = [
    "Anchor",
    "FingerprintedFinding",
    "anchor_of",
    "category_of",
    "fingerprint",
    "fingerprint_findings",
    "loose_key",
    "normalize_code",
    "normalize_message",
    "patches_of",
    "side_lines",
]
