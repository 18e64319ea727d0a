"""The code a hunk sits in at the head revision: its enclosing function, class or block.

Pure: a file's text and the new-file lines a hunk changes in, line numbers out. Lines are split
on "\\n" only (one trailing "\\r" dropped), the way the diff's own line numbers count them and
tree-sitter counts rows. Languages tree-sitter knows get the innermost definition around the
change; any other file, a parse that fails or a change no definition holds gets the lines
around it (`FALLBACK_LINES` each side).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import PurePosixPath

from tree_sitter import Node, Parser
from tree_sitter_language_pack import get_parser

from bot.diff import parse_hunks, split_lines
from bot.review.prompt_context import MAX_STORED_LINES, Block, FileContext, context_line_numbers

log = logging.getLogger(__name__)

# Lines each side of a change when no definition encloses it (or its language is unknown).
FALLBACK_LINES = 20
# A definition longer than this is shown only around the change (plus its first line).
MAX_BLOCK_LINES = 200
# Files larger than this are not parsed (generated or vendored code): the fallback applies.
MAX_SOURCE_BYTES = 1_000_000

LANGUAGE_BY_SUFFIX: Mapping[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".jsx": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".java": "java",
    ".rs": "rust",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hh": "cpp",
    ".hpp": "cpp",
    ".hxx": "cpp",
    ".rb": "ruby",
    ".rake": "ruby",
}
LANGUAGE_BY_NAME: Mapping[str, str] = {"Rakefile": "ruby", "Gemfile": "ruby"}

_JS = frozenset(
    {
        "function_declaration",
        "generator_function_declaration",
        "function_expression",
        "arrow_function",
        "method_definition",
        "class_declaration",
        "class",
    }
)
_TS = _JS | {
    "abstract_class_declaration",
    "interface_declaration",
    "enum_declaration",
    "internal_module",
}
_C = frozenset({"function_definition", "struct_specifier", "union_specifier", "enum_specifier"})
# Node types that count as an enclosing block, per language.
BLOCK_TYPES: Mapping[str, frozenset[str]] = {
    "python": frozenset({"function_definition", "class_definition"}),
    "javascript": _JS,
    "typescript": _TS,
    "tsx": _TS,
    "go": frozenset(
        {"function_declaration", "method_declaration", "func_literal", "type_declaration"}
    ),
    "java": frozenset(
        {
            "method_declaration",
            "constructor_declaration",
            "class_declaration",
            "interface_declaration",
            "enum_declaration",
            "record_declaration",
        }
    ),
    "rust": frozenset(
        {"function_item", "impl_item", "trait_item", "struct_item", "enum_item", "mod_item"}
        | {"macro_definition"}
    ),
    "c": _C,
    "cpp": _C | {"class_specifier", "namespace_definition"},
    "ruby": frozenset({"method", "singleton_method", "class", "module", "do_block"}),
}
# Nodes that wrap a definition and start before it (decorators, `export`, `template <...>`).
WRAPPER_TYPES = frozenset({"decorated_definition", "export_statement", "template_declaration"})


def split_source(text: str) -> list[str]:
    """A file's lines as the diff numbers them (on "\\n" alone: bot.diff.split_lines)."""
    return split_lines(text)


def language_for(path: str) -> str | None:
    """The tree-sitter language of a path by its suffix (or name), None when not supported."""
    pure = PurePosixPath(path)
    return LANGUAGE_BY_NAME.get(pure.name) or LANGUAGE_BY_SUFFIX.get(pure.suffix.lower())


@cache
def _parser(language: str) -> Parser | None:
    try:
        return get_parser(language)  # type: ignore[arg-type]
    except LookupError as exc:
        log.warning("no tree-sitter grammar for %s: %s", language, exc)
        return None


def _last_row(node: Node) -> int:
    """The node's last row (a node ending at column 0 ends on the row before)."""
    row, column = node.end_point
    return row - 1 if column == 0 and row > node.start_point.row else row


def _enclosing(root: Node, first: int, last: int, types: frozenset[str]) -> list[Node]:
    """Definitions holding rows `first`..`last`, outermost first."""
    found: list[Node] = []
    node = root
    while True:
        inner = next(
            (
                child
                for child in node.named_children
                if child.start_point.row <= first and _last_row(child) >= last
            ),
            None,
        )
        if inner is None:
            return found
        if inner.type in types:
            found.append(inner)
        node = inner


def _around(focus: tuple[int, int], total: int, *, low: int = 1, high: int | None = None) -> range:
    top = high if high is not None else total
    return range(max(low, focus[0] - FALLBACK_LINES), min(top, focus[1] + FALLBACK_LINES) + 1)


def _fallback(focus: tuple[int, int], total: int) -> Block:
    lines = _around(focus, total)
    return Block("lines", "lines", lines.start, max(lines.start, lines.stop - 1), focus)


def _block_of(nodes: Sequence[Node], focus: tuple[int, int], total: int) -> Block:
    """The innermost definition as a Block (wrapped by its decorators/export), cut when long."""
    inner = nodes[-1]
    parent = inner.parent
    start_node = parent if parent is not None and parent.type in WRAPPER_TYPES else inner
    start, end = start_node.start_point.row + 1, _last_row(inner) + 1
    headers = tuple(sorted({node.start_point.row + 1 for node in nodes[:-1]}))
    if end - start + 1 > MAX_BLOCK_LINES:
        near = _around(focus, total, low=start, high=end)
        own = inner.start_point.row + 1
        headers = tuple(sorted({*headers, start, own} - set(near)))
        return Block("definition", inner.type, near.start, near.stop - 1, focus, headers)
    return Block("definition", inner.type, start, end, focus, headers)


def changed_spans(patch: str | None) -> list[tuple[int, int]]:
    """Each hunk's changed span in new-file lines (first, last); a deletion counts as the
    line after it. A hunk of context only counts as its whole new side."""
    spans: list[tuple[int, int]] = []
    for hunk in parse_hunks(patch):
        lines: list[int] = []
        cursor = hunk.new_start
        for line in hunk.lines:
            if line.new_line is not None:
                cursor = line.new_line
                if line.kind == "+":
                    lines.append(line.new_line)
                cursor += 1
            elif line.kind == "-":
                lines.append(max(1, cursor))
        if not lines and hunk.new_count:
            lines = [hunk.new_start, hunk.new_start + hunk.new_count - 1]
        if lines:
            spans.append((min(lines), max(lines)))
    return spans


def diff_shown_lines(patch: str | None) -> frozenset[int]:
    """New-file lines a patch shows already (its added and unchanged lines)."""
    return frozenset(
        line.new_line
        for hunk in parse_hunks(patch)
        for line in hunk.lines
        if line.new_line is not None
    )


def parse_root(source: str, language: str | None) -> Node | None:
    """The syntax tree's root, or None when the language is unknown or the file too large."""
    if language is None or language not in BLOCK_TYPES:
        return None
    data = source.encode("utf-8", errors="replace")
    if len(data) > MAX_SOURCE_BYTES:
        return None
    parser = _parser(language)
    if parser is None:
        return None
    return parser.parse(data).root_node


def enclosing_blocks(
    source: str, language: str | None, spans: Iterable[tuple[int, int]]
) -> tuple[Block, ...]:
    """The block around each changed span (first, last new-file line), in the given order.

    A span is clipped to the file; an empty file gives no blocks.
    """
    total = len(split_source(source))
    if total == 0:
        return ()
    root = parse_root(source, language)
    types = BLOCK_TYPES.get(language or "", frozenset())
    blocks: list[Block] = []
    for first, last in spans:
        low = min(max(1, first), total)
        focus = (low, min(max(low, last), total))
        nodes = _enclosing(root, focus[0] - 1, focus[1] - 1, types) if root is not None else []
        blocks.append(_block_of(nodes, focus, total) if nodes else _fallback(focus, total))
    return tuple(blocks)


def build_file_context(path: str, source: str, patch: str | None) -> FileContext | None:
    """The blocks around a chunk file's changes and their lines the diff does not show
    (the store keeps this with the chunk); None when the patch changes nothing."""
    spans = changed_spans(patch)
    if not spans:
        return None
    language = language_for(path)
    blocks = enclosing_blocks(source, language, spans)
    if not blocks:
        return None
    hidden = diff_shown_lines(patch)
    numbers = context_line_numbers(blocks, hidden=hidden)
    if len(numbers) > MAX_STORED_LINES:
        numbers = context_line_numbers(blocks, near=FALLBACK_LINES, hidden=hidden)
    lines = split_source(source)
    kept = {
        number: lines[number - 1] for number in numbers[:MAX_STORED_LINES] if number <= len(lines)
    }
    return FileContext(path=path, language=language, blocks=blocks, lines=kept)


__all__ = [
    "BLOCK_TYPES",
    "FALLBACK_LINES",
    "LANGUAGE_BY_SUFFIX",
    "MAX_BLOCK_LINES",
    "build_file_context",
    "changed_spans",
    "diff_shown_lines",
    "enclosing_blocks",
    "language_for",
    "parse_root",
    "split_source",
]
