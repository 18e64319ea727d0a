"""What a chunk's prompt shows besides its diff: the pull request's title and description, and
the code around each change at the head revision, fitted to the chunk's context allowance.

Pure, and free of tree-sitter (the in-process vLLM host renders prompts without it): the blocks
are found at planning (bot/review/code_context.py) and stored with the chunk's files.

What goes first when the allowance is short, in order:
1. the block lines farther than `NEAR_LINES` from their change (each block keeps its first
   line and the lines around the change);
2. the description past its first `DESCRIPTION_HEAD_CHARS` characters;
3. the code context of whole files, the chunk's last file first;
4. the rest of the description.
The title is kept (cut to `MAX_TITLE_CHARS`) whenever the allowance holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from bot.diff import CONTROL, clean_path, fence_for, prompt_text
from bot.llm.vllm_metrics import prompt_tokens_estimate
from bot.model import Job

MAX_TITLE_CHARS = 256
# Longer descriptions are cut before any budgeting (release notes, pasted logs).
MAX_DESCRIPTION_CHARS = 4000
DESCRIPTION_HEAD_CHARS = 500
# Lines kept each side of a change when the allowance is short.
NEAR_LINES = 5
# Lines stored per chunk file at planning (the prompt's allowance is far below this).
MAX_STORED_LINES = 600

BEGIN_PULL_REQUEST = "BEGIN UNTRUSTED PULL REQUEST"
END_PULL_REQUEST = "END UNTRUSTED PULL REQUEST"
BEGIN_CONTEXT = "BEGIN UNTRUSTED CONTEXT"
END_CONTEXT = "END UNTRUSTED CONTEXT"
CUT_MARK = "[... cut]"
GAP = "..."  # lines left out between two shown ones
MARKER_PREFIXES = ("BEGIN UNTRUSTED", "END UNTRUSTED")

BlockKind = Literal["definition", "lines"]
Drop = Literal["context_trimmed", "description_cut", "context_dropped", "description_dropped"]
DROP_ORDER: tuple[Drop, ...] = (
    "context_trimmed",
    "description_cut",
    "context_dropped",
    "description_dropped",
)


@dataclass(frozen=True, slots=True)
class Block:
    """What is shown around one change: lines `start`..`end` of the new file (1-based).

    `focus` is the changed span itself; `headers` are first lines of the definitions around
    the block (the class of a method), and the block's own first line when it was cut to the
    lines near the change.
    """

    kind: BlockKind
    node_type: str
    start: int
    end: int
    focus: tuple[int, int]
    headers: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node_type": self.node_type,
            "start": self.start,
            "end": self.end,
            "focus": list(self.focus),
            "headers": list(self.headers),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Block:
        """Rebuild a stored block; raises KeyError/ValueError/TypeError on another shape."""
        kind = data["kind"]
        if kind not in ("definition", "lines"):
            raise ValueError(f"unknown block kind {kind!r}")
        focus = data["focus"]
        return cls(
            kind=kind,
            node_type=str(data["node_type"]),
            start=int(data["start"]),
            end=int(data["end"]),
            focus=(int(focus[0]), int(focus[1])),
            headers=tuple(int(line) for line in data.get("headers", ())),
        )


def context_line_numbers(
    blocks: Iterable[Block], *, near: int | None = None, hidden: Iterable[int] = ()
) -> tuple[int, ...]:
    """The new-file lines to show for these blocks, ascending: every block line (only those
    within `near` lines of its change when given) and its headers, less `hidden` (the lines
    the diff shows already)."""
    shown: set[int] = set()
    for block in blocks:
        low, high = block.start, block.end
        if near is not None:
            low = max(low, block.focus[0] - near)
            high = min(high, block.focus[1] + near)
            if block.kind == "definition":
                shown.add(block.start)
        shown.update(range(low, high + 1))
        shown.update(block.headers)
    return tuple(sorted(shown - set(hidden)))


@dataclass(frozen=True, slots=True)
class FileContext:
    """The head-revision code around one chunk file's changes, as stored with the chunk."""

    path: str
    language: str | None
    blocks: tuple[Block, ...]
    lines: Mapping[int, str]  # new-file line number -> text, the diff's own lines left out

    def numbers(self, *, near: int | None = None) -> tuple[int, ...]:
        """The stored lines to show, all or only those near the changes."""
        wanted = context_line_numbers(self.blocks, near=near)
        return tuple(number for number in wanted if number in self.lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "language": self.language,
            "blocks": [block.to_json() for block in self.blocks],
            "lines": [[number, text] for number, text in sorted(self.lines.items())],
        }

    @classmethod
    def from_json(cls, path: str, data: Mapping[str, Any]) -> FileContext:
        """Rebuild what a chunk file stores; raises KeyError/ValueError/TypeError on another
        shape."""
        language = data.get("language")
        return cls(
            path=path,
            language=str(language) if language else None,
            blocks=tuple(Block.from_json(item) for item in data["blocks"]),
            lines={int(number): str(text) for number, text in data["lines"]},
        )


def file_contexts(files: Iterable[Mapping[str, Any] | Any]) -> tuple[FileContext, ...]:
    """The stored contexts of a chunk's files (files without one, or with a foreign one, give
    none)."""
    found: list[FileContext] = []
    for file in files:
        if not isinstance(file, Mapping) or not isinstance(file.get("context"), Mapping):
            continue
        try:
            found.append(FileContext.from_json(str(file.get("path", "")), file["context"]))
        except (KeyError, ValueError, TypeError, IndexError):
            continue
    return tuple(found)


@dataclass(frozen=True, slots=True)
class SharedContext:
    """What a chunk's prompt shows before its diff, fitted to an allowance."""

    title: str
    description: str
    files: tuple[tuple[FileContext, tuple[int, ...]], ...] = ()
    dropped: tuple[Drop, ...] = ()
    tokens: int = 0
    budget: int = 0

    def render_pull_request(self) -> str:
        """The title and description, fenced; empty when there is neither."""
        if not self.title and not self.description:
            return ""
        parts = [BEGIN_PULL_REQUEST, f"Title: {self.title}"]
        if self.description:
            fence = fence_for(self.description)
            parts += ["Description:", f"{fence}text", self.description, fence]
        parts.append(END_PULL_REQUEST)
        return "\n".join(parts)

    def render_context(self) -> str:
        """The code around the changes, one fenced section per file; empty when none."""
        sections = [render_file_context(context, numbers) for context, numbers in self.files]
        sections = [section for section in sections if section]
        if not sections:
            return ""
        return "\n".join([BEGIN_CONTEXT, *sections, END_CONTEXT])


def clean_text(text: str) -> str:
    """Text for a prompt: CRLF as LF, control characters (but tab and newline) removed, and
    a line that would read as one of the prompt's own marker lines indented."""
    lines = CONTROL.sub("", text.replace("\r\n", "\n")).strip().split("\n")
    return "\n".join(
        f"  {line}" if line.lstrip().startswith(MARKER_PREFIXES) else line for line in lines
    )


def render_line(number: int, text: str) -> str:
    """One line of context: "<n>: <code>", n its line in the new file (the number the diff
    shows for an added or unchanged line; no +/- mark, as it is no diff line)."""
    return f"{number}: {prompt_text(text)}"


def render_file_context(context: FileContext, numbers: Sequence[int]) -> str:
    """A file's context lines, numbered, with a gap mark where lines are left out."""
    if not numbers:
        return ""
    rows: list[str] = []
    previous: int | None = None
    for number in numbers:
        if previous is not None and number != previous + 1:
            rows.append(GAP)
        rows.append(render_line(number, context.lines[number]))
        previous = number
    body = "\n".join(rows)
    fence = fence_for(body)
    language = context.language or "text"
    header = f"Context: {clean_path(context.path)} (head revision, around the changes below)"
    return f"{header}\n{fence}{language}\n{body}\n{fence}"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = text[:limit]
    space = head.rfind(" ")
    if space > limit // 2:
        head = head[:space]
    return f"{head.rstrip()} {CUT_MARK}"


def fit_shared_context(
    title: str,
    description: str | None,
    contexts: Sequence[FileContext],
    *,
    budget_tokens: int,
) -> SharedContext:
    """The title, description and code contexts that fit `budget_tokens` (dropped in the
    module's stated order); a budget of 0 or less shows nothing."""
    if budget_tokens <= 0:
        return SharedContext(title="", description="", budget=max(0, budget_tokens))
    clean_title = _cut(" ".join(clean_text(title).split()), MAX_TITLE_CHARS)
    full_description = _cut(clean_text(description or ""), MAX_DESCRIPTION_CHARS)
    state = SharedContext(
        title=clean_title,
        description=full_description,
        files=tuple((context, context.numbers()) for context in contexts),
        budget=budget_tokens,
    )

    def tokens(candidate: SharedContext) -> int:
        # Each part joins the prompt with a blank line, counted here so the allowance holds.
        parts = (candidate.render_pull_request(), candidate.render_context())
        text = "".join(f"{part}\n\n" for part in parts if part)
        return prompt_tokens_estimate(text) if text else 0

    def done(candidate: SharedContext) -> SharedContext:
        return replace(candidate, tokens=tokens(candidate))

    if tokens(state) <= budget_tokens:
        return done(state)
    trimmed = tuple((context, context.numbers(near=NEAR_LINES)) for context, _ in state.files)
    if trimmed != state.files:
        state = replace(state, files=trimmed, dropped=(*state.dropped, "context_trimmed"))
        if tokens(state) <= budget_tokens:
            return done(state)
    short = _cut(state.description, DESCRIPTION_HEAD_CHARS)
    if short != state.description:
        state = replace(state, description=short, dropped=(*state.dropped, "description_cut"))
        if tokens(state) <= budget_tokens:
            return done(state)
    files = list(state.files)
    while files:
        files.pop()
        state = replace(state, files=tuple(files))
        if "context_dropped" not in state.dropped:
            state = replace(state, dropped=(*state.dropped, "context_dropped"))
        if tokens(state) <= budget_tokens:
            return done(state)
    if state.description:
        state = replace(state, description="", dropped=(*state.dropped, "description_dropped"))
        if tokens(state) <= budget_tokens:
            return done(state)
    # Only the title is left and it does not fit either: show nothing.
    return SharedContext(title="", description="", dropped=state.dropped, budget=budget_tokens)


def shared_context_for(
    job: Job | None, files: Iterable[Mapping[str, Any] | Any], *, budget_tokens: int
) -> SharedContext | None:
    """A chunk's shared part from its job (title, description) and its files' stored
    contexts, fitted to `budget_tokens`; None without a job or an allowance."""
    if job is None or budget_tokens <= 0:
        return None
    title = str(job.pull_details.get("title") or job.title or "")
    description = str(job.pull_details.get("description") or "")
    return fit_shared_context(title, description, file_contexts(files), budget_tokens=budget_tokens)


__all__ = [
    "BEGIN_CONTEXT",
    "BEGIN_PULL_REQUEST",
    "DROP_ORDER",
    "END_CONTEXT",
    "END_PULL_REQUEST",
    "Block",
    "FileContext",
    "SharedContext",
    "context_line_numbers",
    "file_contexts",
    "fit_shared_context",
    "render_file_context",
    "shared_context_for",
]
