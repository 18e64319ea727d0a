"""Check a model's review output against the output contract and the chunk's real diff lines."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.diff import SIDES, Side
from bot.model import SEVERITIES
from bot.review.anchor import ANCHOR_OUTCOMES, FileLines, anchor_finding

MAX_FINDINGS_PER_CHUNK = 20
MAX_BODY_CHARS = 2_000
MAX_SUMMARY_CHARS = 1_000
MAX_PATH_CHARS = 1_000
MAX_QUOTE_CHARS = 2_000

SEVERITY_RANK: Mapping[str, int] = {name: rank for rank, name in enumerate(SEVERITIES)}
SEVERITY_ALIASES: Mapping[str, str] = {
    "blocker": "critical",
    "high": "major",
    "error": "major",
    "medium": "minor",
    "warning": "minor",
    "warn": "minor",
    "low": "info",
    "nit": "info",
    "note": "info",
    "suggestion": "info",
}

CODE_SPAN = re.compile(r"(```.*?(?:```|\Z)|`[^`\n]*`)", re.DOTALL)
HTML_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
MENTION = re.compile(r"(?<![\w`@/])@([A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:/[A-Za-z0-9_-]+)?)")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
LINE_RANGE = re.compile(r"^\s*L?(\d+)\s*(?:-|–|\.\.)\s*L?(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class Finding:
    """One review finding and where the bot anchored it.

    `anchor` is the anchoring outcome (bot.review.anchor); a `summary_only` finding has no
    place on the diff (`line` is what the model named, 0 if nothing) and is listed in the
    summary. `start_line` opens a range ending at `line`; `suggestion` is replacement code
    for exactly the lines start_line..line; `quote` is the model's text of the line.
    """

    path: str
    line: int
    side: Side
    severity: str
    body: str
    anchor: str = "exact"
    start_line: int | None = None
    quote: str | None = None
    suggestion: str | None = None

    @property
    def placed(self) -> bool:
        return self.anchor != "summary_only"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "path": self.path,
            "line": self.line,
            "side": self.side,
            "severity": self.severity,
            "body": self.body,
        }
        if self.anchor != "exact":
            data["anchor"] = self.anchor
        for key, value in (
            ("start_line", self.start_line),
            ("quote", self.quote),
            ("suggestion", self.suggestion),
        ):
            if value is not None:
                data[key] = value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        side = data["side"]
        if side not in SIDES:
            raise ValueError(f"bad side {side!r}")
        anchor = str(data.get("anchor") or "exact")
        if anchor not in ANCHOR_OUTCOMES:
            raise ValueError(f"bad anchor {anchor!r}")
        start = data.get("start_line")
        quote = data.get("quote")
        suggestion = data.get("suggestion")
        return cls(
            path=str(data["path"]),
            line=int(data["line"]),
            side=side,
            severity=str(data["severity"]),
            body=str(data["body"]),
            anchor=anchor,
            start_line=int(start) if start is not None else None,
            quote=str(quote) if quote is not None else None,
            suggestion=str(suggestion) if suggestion is not None else None,
        )


@dataclass(frozen=True, slots=True)
class ParsedChunk:
    """Findings that survived checking (placed and summary-only), the chunk summary, what was
    dropped, how each finding was anchored, and any error."""

    findings: tuple[Finding, ...]
    summary: str
    dropped: int
    error: str | None
    drop_reasons: Mapping[str, int] = field(default_factory=dict)
    anchoring: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def placed(self) -> tuple[Finding, ...]:
        return tuple(finding for finding in self.findings if finding.placed)

    @property
    def unanchored(self) -> tuple[Finding, ...]:
        return tuple(finding for finding in self.findings if not finding.placed)


def sanitize_text(text: str, *, max_chars: int) -> str:
    """Model text made safe to post: no HTML comments or tags, no @-pings, bounded length."""
    text = CONTROL.sub("", text.replace("\r\n", "\n")).strip()
    pieces: list[str] = []
    position = 0
    for match in CODE_SPAN.finditer(text):
        pieces.append(clean_prose(text[position : match.start()]))
        pieces.append(match.group(0))  # inside code nothing renders as HTML or pings anyone
        position = match.end()
    pieces.append(clean_prose(text[position:]))
    cleaned = "".join(pieces).strip()
    if len(cleaned) > max_chars:
        cleaned = cleaned[: max_chars - 1].rstrip() + "…"
        if cleaned.count("```") % 2:
            cleaned = cleaned[: max_chars - 5].rstrip() + "\n```…"
    return cleaned


def clean_prose(text: str) -> str:
    """Outside code: drop HTML comments, escape '<' so no raw HTML renders, defuse @mentions."""
    text = HTML_COMMENT.sub("", text)
    text = text.replace("<", "&lt;")
    return MENTION.sub(lambda match: f"`@{match.group(1)}`", text)


def extract_json_object(text: str) -> Any:
    """The first JSON object in `text`, tolerating code fences and prose around it; else None."""
    decoder = json.JSONDecoder()
    position = text.find("{")
    while position != -1:
        try:
            value, _ = decoder.raw_decode(text, position)
        except ValueError:
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict):
            return value
        position = text.find("{", position + 1)
    return None


def normalize_severity(value: Any) -> str | None:
    """A contract severity, from the value or a common alias; None if unrecognizable."""
    if value is None:
        return "minor"
    if not isinstance(value, str):
        return None
    lowered = value.strip().lower()
    if lowered in SEVERITY_RANK:
        return lowered
    return SEVERITY_ALIASES.get(lowered)


def normalize_line(value: Any) -> int | None:
    """A positive line number from an int or a digit string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
        return number if number > 0 else None
    return None


def _side_of(value: Any) -> Side | str | None:
    """RIGHT/LEFT, None when not given, or the reason it is unusable."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().upper() in SIDES:
        return "RIGHT" if value.strip().upper() == "RIGHT" else "LEFT"
    return "bad_side"


def _optional_text(value: Any, *, max_chars: int) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return value[:max_chars]


def check_finding(
    item: Any,
    index: Mapping[str, FileLines],
    *,
    max_body_chars: int,
) -> Finding | str:
    """A Finding anchored on the diff (or marked summary_only), or why the item is dropped."""
    if not isinstance(item, Mapping):
        return "not_an_object"
    raw_path = item.get("path")
    if not isinstance(raw_path, str) or not raw_path.strip() or len(raw_path) > MAX_PATH_CHARS:
        return "unknown_path"
    raw_line = item.get("line")
    line = normalize_line(raw_line)
    range_start: int | None = None
    if line is None and isinstance(raw_line, str):
        # "12-14": a range written into the line.
        written = LINE_RANGE.match(raw_line)
        if written:
            range_start, line = normalize_line(written.group(1)), normalize_line(written.group(2))
    if raw_line is not None and line is None:
        return "bad_line"
    side = _side_of(item.get("side"))
    if side == "bad_side":
        return "bad_side"
    severity = normalize_severity(item.get("severity"))
    if severity is None:
        return "bad_severity"
    body_value = item.get("body", item.get("comment", item.get("message")))
    if not isinstance(body_value, str):
        return "no_body"
    body = sanitize_text(body_value, max_chars=max_body_chars)
    if not body:
        return "no_body"
    quote = _optional_text(item.get("quote"), max_chars=MAX_QUOTE_CHARS)
    start_line = normalize_line(item.get("start_line")) or range_start
    placement = anchor_finding(
        index,
        path=raw_path,
        side=side if side in SIDES else None,
        line=line,
        quote=quote,
        start_line=start_line,
    )
    suggestion = item.get("suggestion")
    return Finding(
        path=CONTROL.sub("?", placement.path),
        line=placement.line or 0,
        side=placement.side,
        severity=severity,
        body=body,
        anchor=placement.outcome,
        start_line=placement.start_line,
        quote=quote,
        suggestion=suggestion[:MAX_BODY_CHARS] if isinstance(suggestion, str) else None,
    )


def parse_review(
    text: str,
    index: Mapping[str, FileLines],
    *,
    max_findings: int = MAX_FINDINGS_PER_CHUNK,
    max_body_chars: int = MAX_BODY_CHARS,
) -> ParsedChunk:
    """Check the model's answer and anchor each finding on the chunk's diff (`index_files`);
    a finding that cannot be placed is kept for the summary, malformed ones are counted."""
    document = extract_json_object(text)
    if document is None:
        return ParsedChunk((), "", 0, "no JSON object in the answer")
    raw_findings = document.get("findings")
    if raw_findings is None and "comments" in document:
        raw_findings = document["comments"]
    if not isinstance(raw_findings, list):
        return ParsedChunk((), "", 0, 'the JSON object has no "findings" list')
    summary_value = document.get("summary", "")
    if summary_value is not None and not isinstance(summary_value, str):
        return ParsedChunk((), "", 0, '"summary" is not a string')
    summary = sanitize_text(summary_value or "", max_chars=MAX_SUMMARY_CHARS)
    reasons: Counter[str] = Counter()
    kept: dict[tuple[str, str, int, str], Finding] = {}
    for item in raw_findings:
        checked = check_finding(item, index, max_body_chars=max_body_chars)
        if isinstance(checked, str):
            reasons[checked] += 1
            continue
        key = (checked.path, checked.side, checked.line, checked.body)
        if key in kept:
            reasons["duplicate"] += 1
            continue
        kept[key] = checked
    ordered = sorted(
        kept.values(), key=lambda f: (SEVERITY_RANK[f.severity], f.path, f.line, f.side)
    )
    if len(ordered) > max_findings:
        reasons["over_cap"] += len(ordered) - max_findings
        ordered = ordered[:max_findings]
    ordered.sort(key=lambda f: (f.path, f.line, f.side))
    anchoring = Counter(finding.anchor for finding in ordered)
    return ParsedChunk(
        findings=tuple(ordered),
        summary=summary,
        dropped=sum(reasons.values()),
        error=None,
        drop_reasons=dict(sorted(reasons.items())),
        anchoring={outcome: anchoring[outcome] for outcome in ANCHOR_OUTCOMES},
    )


def build_retry_reminder(error: str) -> str:
    """The stricter reminder appended to the user turn when the first answer broke the contract."""
    return (
        f"IMPORTANT: your previous answer could not be used ({error}). Reply again with ONLY one "
        'JSON object of the form {"findings": [...], "summary": "..."} exactly as the output '
        "contract says: no prose, no code fence, no text before or after the object. Every "
        'finding needs "path", "line" (the number shown before the line), "side", "quote" '
        '(the text of that line), "severity" and "body".'
    )
