"""Syntax trees for `bot eval`: the languages it plants bugs in, and byte-level helpers its
pattern finders share (pure functions of source bytes and tree-sitter nodes)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tree_sitter import Node, Parser
from tree_sitter_language_pack import get_parser

# File suffix -> tree-sitter grammar; the grammars ship in tree-sitter-language-pack's wheel.
GRAMMARS = {
    ".py": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".tsx": "tsx",
}
# Grammar -> the family whose pattern finders apply (TypeScript's trees extend JavaScript's).
FAMILIES = {
    "python": "python",
    "javascript": "javascript",
    "typescript": "javascript",
    "tsx": "javascript",
}
LINE_COMMENT = {"python": b"#", "javascript": b"//"}


def grammar_of(path: str) -> str | None:
    """The grammar for a file by its suffix, or None for a language not planted in."""
    dot = path.rfind(".")
    return GRAMMARS.get(path[dot:].lower()) if dot != -1 else None


def parser_for(grammar: str) -> Parser:
    """A tree-sitter parser for one of GRAMMARS' grammars."""
    if grammar == "python":
        return get_parser("python")
    if grammar == "javascript":
        return get_parser("javascript")
    if grammar == "typescript":
        return get_parser("typescript")
    if grammar == "tsx":
        return get_parser("tsx")
    raise ValueError(f"no grammar {grammar!r}")


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace source bytes [start, end) with `text`."""

    start: int
    end: int
    text: bytes


@dataclass(frozen=True, slots=True)
class Site:
    """One place a pattern can plant its bug: the edits and the byte the bug is about."""

    pattern: str
    edits: tuple[Edit, ...]
    focus: int  # a byte of the original source on the planted line


def walk(node: Node) -> Iterator[Node]:
    """Every node under `node`, depth first, in source order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def text_of(node: Node) -> bytes:
    return node.text or b""


def single_line(node: Node) -> bool:
    return node.start_point[0] == node.end_point[0]


def line_start(source: bytes, offset: int) -> int:
    """The byte offset where the line holding `offset` begins."""
    return source.rfind(b"\n", 0, offset) + 1


def line_end(source: bytes, offset: int) -> int:
    """The byte offset of the newline ending the line holding `offset` (or the end)."""
    end = source.find(b"\n", offset)
    return len(source) if end == -1 else end


def indentation(source: bytes, offset: int) -> bytes:
    """The leading blanks of the line holding `offset`."""
    start = line_start(source, offset)
    line = source[start : line_end(source, offset)]
    return line[: len(line) - len(line.lstrip(b" \t"))]


def starts_its_line(source: bytes, node: Node) -> bool:
    """The node is the first thing on its line."""
    return not source[line_start(source, node.start_byte) : node.start_byte].strip()
