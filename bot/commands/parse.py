"""Slash-command parsing for PR/MR comments: plain strings in, parsed commands and errors out."""

from __future__ import annotations

import re
from dataclasses import dataclass

BOT_MARKER = "<!-- review-bot:"
MAX_COMMANDS = 5
# GitHub caps a comment at 65,536 characters; anything past that is not a human's command.
MAX_SCANNED_CHARS = 65_536
MAX_COMMAND_LINE_CHARS = 200
PRIORITY_ARGUMENTS = ("p1", "p2", "p3")
VERBS = ("review", "priority", "cancel", "status", "help")

# ASCII only: under re.IGNORECASE alone, U+017F (long s) would match "s" and U+212A (Kelvin)
# "k"; [ \t] instead of \s so no-break and other Unicode spaces cannot split a command.
_COMMAND_LINE = re.compile(
    r"[ \t]*/review(?:[ \t]+(?P<rest>[^ \t\r\n][^\r\n]*?))?[ \t]*", re.ASCII | re.I
)
_SEPARATOR = re.compile(r"[ \t]+")
_WORD = re.compile(r"[a-z0-9]+", re.ASCII | re.I)
_FENCE = re.compile(r"[ \t]{0,3}(```|~~~)")

HELP_TEXT = (
    "Commands (one per line): `/review` (review what changed since the last review), "
    "`/review full`, `/review priority p1|p2|p3`, `/review cancel`, `/review status`, "
    "`/review help`."
)


@dataclass(frozen=True, slots=True)
class ParsedCommand:
    """One recognised command line."""

    verb: str
    argument: str | None
    raw: str
    line: int


@dataclass(frozen=True, slots=True)
class ParseResult:
    """Commands found in a comment and the errors to reply with."""

    commands: tuple[ParsedCommand, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.commands and not self.errors


def is_bot_comment(body: str, *, author: str, bot_login: str) -> bool:
    """Tell whether a comment was written by the bot itself (login or hidden marker)."""
    login = bot_login.lower()
    name = author.lower()
    return name in (login, f"{login}[bot]") or BOT_MARKER in body


def parse_commands(body: str, *, author: str = "", bot_login: str = "review-bot") -> ParseResult:
    """Parse `/review ...` lines of a comment; never raises, never reads the bot's own comments."""
    if is_bot_comment(body, author=author, bot_login=bot_login):
        return ParseResult()
    commands: list[ParsedCommand] = []
    errors: list[str] = []
    skipped = 0
    in_fence = False
    for number, line in enumerate(body[:MAX_SCANNED_CHARS].split("\n"), start=1):
        # Commands quoted inside a fenced code block are examples, not requests.
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or len(line) > MAX_COMMAND_LINE_CHARS:
            continue
        match = _COMMAND_LINE.fullmatch(line.rstrip("\r"))
        if match is None:
            continue
        if len(commands) >= MAX_COMMANDS:
            skipped += 1
            continue
        raw = line.strip(" \t\r")
        parsed = _parse_arguments(match.group("rest"), raw=raw, line=number)
        if isinstance(parsed, str):
            errors.append(parsed)
        else:
            commands.append(parsed)
    if skipped:
        errors.append(
            f"Only the first {MAX_COMMANDS} commands of a comment are read; "
            f"{skipped} more were ignored."
        )
    return ParseResult(commands=tuple(commands), errors=tuple(errors))


def _parse_arguments(rest: str | None, *, raw: str, line: int) -> ParsedCommand | str:
    """Turn the text after `/review` into a command, or an error message for the reply."""
    if rest is None:
        return ParsedCommand(verb="review", argument=None, raw=raw, line=line)
    words = _SEPARATOR.split(rest)
    if not all(_WORD.fullmatch(word) for word in words):
        return f"Line {line}: `{_quote(raw)}` is not a command I know. {HELP_TEXT}"
    lowered = [word.lower() for word in words]
    verb = lowered[0]
    if verb in ("cancel", "status", "help") and len(lowered) == 1:
        return ParsedCommand(verb=verb, argument=None, raw=raw, line=line)
    if verb == "full" and len(lowered) == 1:  # a review of the whole PR, not the increment
        return ParsedCommand(verb="review", argument="full", raw=raw, line=line)
    if verb == "priority":
        if len(lowered) == 2 and lowered[1] in PRIORITY_ARGUMENTS:
            return ParsedCommand(verb="priority", argument=lowered[1].upper(), raw=raw, line=line)
        if len(lowered) == 2 and lowered[1] == "p0":
            return (
                f"Line {line}: P0 cannot be set by a command; it comes only from policy "
                "triggers (a change into a hotfix branch)."
            )
        return f"Line {line}: `/review priority` takes one of p1, p2, p3. {HELP_TEXT}"
    return f"Line {line}: `{_quote(raw)}` is not a command I know. {HELP_TEXT}"


def _quote(text: str) -> str:
    """Make user text safe to echo inside inline code: no backticks, bounded length."""
    cleaned = text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
    cleaned = cleaned.replace("`", "'")
    return cleaned if len(cleaned) <= 80 else cleaned[:77] + "..."
