"""The bugs `bot eval` plants: classic patterns, each with finders of its sites in syntax trees
(Python here; JavaScript and TypeScript in bot/eval/catalogue_js.py).

A site is a set of byte edits to one file that plants one bug, plus the byte whose line the bug
is about (the line a reviewer should comment on). Finders are pure functions of the source and
its tree-sitter tree; they only propose edits that keep the file parseable in shape (the planter
re-parses the result and drops any that do not).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tree_sitter import Node, Parser

from bot.eval import catalogue_js as js
from bot.eval.syntax import (
    Edit,
    Site,
    indentation,
    line_end,
    line_start,
    parser_for,
    single_line,
    starts_its_line,
    text_of,
    walk,
)

Finder = Callable[[Node, bytes], Iterator[Site]]


@dataclass(frozen=True, slots=True)
class Pattern:
    """A bug pattern: its name, what a reviewer would say about it, and its site finder for
    each language family it has one for."""

    name: str
    finding: str
    finders: Mapping[str, Finder]


def python_parser() -> Parser:
    """A tree-sitter parser for Python."""
    return parser_for("python")


def operator_of(node: Node) -> Node | None:
    """The operator token of a two-operand comparison (`a < b`), else None."""
    if node.type != "comparison_operator" or node.named_child_count != 2:
        return None
    tokens = [child for child in node.children if not child.is_named]
    return tokens[0] if len(tokens) == 1 else None


# -- inverted condition ----------------------------------------------------------------------

INVERTED = {
    b"==": b"!=",
    b"!=": b"==",
    b"is": b"is not",
    b"is not": b"is",
    b"in": b"not in",
    b"not in": b"in",
}
CONDITIONAL = ("if_statement", "elif_clause", "while_statement")


def find_inverted_condition(root: Node, source: bytes) -> Iterator[Site]:
    """`if a == b:` becomes `if a != b:`; another condition `c` becomes `not (c)`."""
    for node in walk(root):
        if node.type not in CONDITIONAL:
            continue
        condition = node.child_by_field_name("condition")
        if condition is None or not single_line(condition):
            continue
        operator = operator_of(condition)
        if operator is not None and text_of(operator) in INVERTED:
            edit = Edit(operator.start_byte, operator.end_byte, INVERTED[text_of(operator)])
        elif condition.type == "not_operator":
            argument = condition.child_by_field_name("argument")
            if argument is None:
                continue
            edit = Edit(condition.start_byte, condition.end_byte, text_of(argument))
        else:
            edit = Edit(
                condition.start_byte, condition.end_byte, b"not (" + text_of(condition) + b")"
            )
        yield Site("inverted_condition", (edit,), condition.start_byte)


# -- off-by-one bound ------------------------------------------------------------------------

BOUNDS = {b"<": b"<=", b"<=": b"<", b">": b">=", b">=": b">"}


def find_off_by_one(root: Node, source: bytes) -> Iterator[Site]:
    """`i < n` becomes `i <= n` (and the other strictness flips); `range(n)` becomes
    `range(n + 1)`."""
    for node in walk(root):
        operator = operator_of(node)
        if operator is not None and text_of(operator) in BOUNDS:
            edit = Edit(operator.start_byte, operator.end_byte, BOUNDS[text_of(operator)])
            yield Site("off_by_one", (edit,), operator.start_byte)
            continue
        if node.type != "call" or not single_line(node):
            continue
        function = node.child_by_field_name("function")
        arguments = node.child_by_field_name("arguments")
        if function is None or arguments is None or text_of(function) != b"range":
            continue
        if arguments.named_child_count != 1:
            continue
        bound = arguments.named_children[0]
        if bound.type in ("keyword_argument", "list_splat", "dictionary_splat"):
            continue
        edit = Edit(bound.end_byte, bound.end_byte, b" + 1")
        yield Site("off_by_one", (edit,), bound.start_byte)


# -- swapped arguments -----------------------------------------------------------------------

NOT_POSITIONAL = ("keyword_argument", "list_splat", "dictionary_splat", "comment")


def find_swapped_arguments(root: Node, source: bytes) -> Iterator[Site]:
    """`f(a, b)` becomes `f(b, a)` (two different positional arguments on one line)."""
    for node in walk(root):
        if node.type != "argument_list" or node.named_child_count < 2:
            continue
        first, second = node.named_children[0], node.named_children[1]
        if first.type in NOT_POSITIONAL or second.type in NOT_POSITIONAL:
            continue
        if first.start_point[0] != second.end_point[0] or text_of(first) == text_of(second):
            continue
        if node.parent is not None and node.parent.type != "call":
            continue
        between = source[first.end_byte : second.start_byte]
        edit = Edit(first.start_byte, second.end_byte, text_of(second) + between + text_of(first))
        yield Site("swapped_arguments", (edit,), first.start_byte)


# -- dropped await ---------------------------------------------------------------------------


def find_dropped_await(root: Node, source: bytes) -> Iterator[Site]:
    """`await call()` becomes `call()`."""
    for node in walk(root):
        if node.type != "await" or node.named_child_count != 1:
            continue
        inner = node.named_children[0]
        yield Site(
            "dropped_await", (Edit(node.start_byte, inner.start_byte, b""),), node.start_byte
        )


# -- removed None or error check -------------------------------------------------------------

GUARD_EXITS = ("return_statement", "raise_statement", "continue_statement")
ERROR_NAME = re.compile(rb"\b(err|error|errors|exc|failed|ok|valid)\b", re.IGNORECASE)


def is_guard_condition(condition: Node) -> bool:
    """`x is None`, `x == None`, `not x`, or a condition about an error or validity."""
    operator = operator_of(condition)
    if operator is not None and text_of(operator) in (b"is", b"=="):
        return text_of(condition.named_children[1]) == b"None"
    if condition.type == "not_operator":
        return True
    return bool(ERROR_NAME.search(text_of(condition)))


def find_removed_none_check(root: Node, source: bytes) -> Iterator[Site]:
    """A guard `if x is None: return ...` (or raise) is deleted; the bug is on the line that
    then runs unguarded."""
    for node in walk(root):
        if node.type != "if_statement" or node.child_by_field_name("alternative") is not None:
            continue
        condition = node.child_by_field_name("condition")
        consequence = node.child_by_field_name("consequence")
        following = node.next_named_sibling
        if condition is None or consequence is None or following is None:
            continue
        if following.type == "comment" or not starts_its_line(source, node):
            continue
        if not starts_its_line(source, following):
            continue
        statements = [child for child in consequence.named_children if child.type != "comment"]
        if len(statements) != 1 or statements[0].type not in GUARD_EXITS:
            continue
        if not is_guard_condition(condition):
            continue
        start = line_start(source, node.start_byte)
        end = line_start(source, following.start_byte)
        yield Site("removed_none_check", (Edit(start, end, b""),), following.start_byte)


# -- wrong variable --------------------------------------------------------------------------

SKIPPED_PARAMETERS = frozenset({b"self", b"cls", b"_"})


def parameter_names(function: Node) -> list[bytes]:
    """The plain parameter names of a function definition (no *args, **kwargs, self, cls)."""
    parameters = function.child_by_field_name("parameters")
    names: list[bytes] = []
    if parameters is None:
        return names
    for child in parameters.named_children:
        if child.type == "identifier":
            name: Node | None = child
        elif child.type in ("typed_parameter", "default_parameter", "typed_default_parameter"):
            name = child.child_by_field_name("name")
            if name is None and child.named_child_count:
                name = child.named_children[0]
        else:
            name = None
        if (
            name is not None
            and name.type == "identifier"
            and text_of(name) not in SKIPPED_PARAMETERS
        ):
            names.append(text_of(name))
    return names


def is_read(identifier: Node) -> bool:
    """The identifier is read as a value (not a name being bound, an attribute or a keyword)."""
    parent = identifier.parent
    if parent is None:
        return False
    if parent.type == "attribute" and parent.child_by_field_name("attribute") == identifier:
        return False
    if parent.type == "keyword_argument" and parent.child_by_field_name("name") == identifier:
        return False
    if parent.type in ("assignment", "augmented_assignment") and (
        parent.child_by_field_name("left") == identifier
    ):
        return False
    return parent.type not in (
        "as_pattern_target",
        "parameters",
        "default_parameter",
        "typed_parameter",
        "typed_default_parameter",
        "for_statement",
        "global_statement",
        "nonlocal_statement",
        "pattern_list",
        "dotted_name",
    )


def find_wrong_variable(root: Node, source: bytes) -> Iterator[Site]:
    """A read of one parameter becomes a read of another parameter of the same function."""
    for function in walk(root):
        if function.type != "function_definition":
            continue
        names = parameter_names(function)
        body = function.child_by_field_name("body")
        if len(names) < 2 or body is None:
            continue
        for node in walk(body):
            if node.type in ("function_definition", "lambda", "class_definition"):
                continue
            if node.type != "identifier" or text_of(node) not in names or not is_read(node):
                continue
            if any(ancestor_is_nested(node, body)):
                continue
            other = names[(names.index(text_of(node)) + 1) % len(names)]
            edit = Edit(node.start_byte, node.end_byte, other)
            yield Site("wrong_variable", (edit,), node.start_byte)


def ancestor_is_nested(node: Node, body: Node) -> Iterator[bool]:
    """True for each enclosing function, lambda or class between `node` and `body`."""
    current = node.parent
    while current is not None and current != body:
        yield current.type in ("function_definition", "lambda", "class_definition")
        current = current.parent


# -- early return ----------------------------------------------------------------------------


def find_early_return(root: Node, source: bytes) -> Iterator[Site]:
    """A `return` is inserted before a later statement of a function, so the rest never runs."""
    for function in walk(root):
        if function.type != "function_definition":
            continue
        body = function.child_by_field_name("body")
        if body is None:
            continue
        statements = [child for child in body.named_children if child.type != "comment"]
        if len(statements) < 3 or statements[0].start_point[0] == function.start_point[0]:
            continue
        for statement in statements[1:-1]:
            if not starts_its_line(source, statement):
                continue
            start = line_start(source, statement.start_byte)
            text = indentation(source, statement.start_byte) + b"return\n"
            yield Site("early_return", (Edit(start, start, text),), start)


# -- swallowed exception ---------------------------------------------------------------------


def find_swallowed_exception(root: Node, source: bytes) -> Iterator[Site]:
    """An `except` block that re-raises or translates the error becomes `pass`."""
    for node in walk(root):
        if node.type != "except_clause":
            continue
        block = next((child for child in node.named_children if child.type == "block"), None)
        if block is None or block.start_point[0] == node.start_point[0]:
            continue
        if not any(child.type == "raise_statement" for child in walk(block)):
            continue
        edit = Edit(block.start_byte, block.end_byte, b"pass")
        yield Site("swallowed_exception", (edit,), block.start_byte)


# -- resource not closed ---------------------------------------------------------------------

MAX_WITH_BODY_LINES = 12


def find_resource_not_closed(root: Node, source: bytes) -> Iterator[Site]:
    """`with open(p) as f:` and its block become `f = open(p)` and the block dedented: the
    resource is never closed."""
    for node in walk(root):
        if node.type != "with_statement" or not starts_its_line(source, node):
            continue
        clause = next((child for child in node.named_children if child.type == "with_clause"), None)
        body = node.child_by_field_name("body")
        if clause is None or body is None or clause.named_child_count != 1:
            continue
        item = clause.named_children[0].named_children
        if len(item) != 1 or item[0].type != "as_pattern":
            continue
        value = item[0].named_children[0] if item[0].named_child_count else None
        target = item[0].child_by_field_name("alias") or next(
            (child for child in item[0].named_children if child.type == "as_pattern_target"), None
        )
        if value is None or target is None or value.type != "call" or not single_line(clause):
            continue
        if text_of(target).strip().count(b" ") or not single_line(value):
            continue
        first_row, last_row = body.start_point[0], body.end_point[0]
        if first_row == node.start_point[0] or last_row - first_row >= MAX_WITH_BODY_LINES:
            continue
        if any(child.type == "string" and not single_line(child) for child in walk(body)):
            continue
        outer = indentation(source, node.start_byte)
        inner = indentation(source, body.start_byte)
        if not inner.startswith(outer) or len(inner) <= len(outer):
            continue
        extra = len(inner) - len(outer)
        block_start = line_start(source, body.start_byte)
        block_end = line_end(source, body.end_byte)
        lines = source[block_start:block_end].split(b"\n")
        dedented = [
            line[extra:] if line[:extra].strip() == b"" else line.lstrip() for line in lines
        ]
        header = text_of(target).strip() + b" = " + text_of(value)
        replacement = header + b"\n" + b"\n".join(dedented)
        edit = Edit(node.start_byte, block_end, replacement)
        yield Site("resource_not_closed", (edit,), node.start_byte)


# -- string-built SQL ------------------------------------------------------------------------

SQL_CALLS = frozenset(
    {
        b"execute",
        b"executemany",
        b"text",
        b"fetch",
        b"fetchrow",
        b"fetchval",
        b"exec_driver_sql",
        b"raw",
        b"query",
    }
)
SQL_KEYWORD = re.compile(rb"\b(SELECT|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
PLACEHOLDER = re.compile(rb"%\((?P<pyformat>\w+)\)s|(?<![\w:]):(?P<named>[A-Za-z_]\w*)|%s|\?|\$\d+")
PLAIN_QUOTES = (b'"', b"'", b'"""', b"'''")


def call_name(call: Node) -> bytes:
    function = call.child_by_field_name("function")
    if function is None:
        return b""
    if function.type == "attribute":
        attribute = function.child_by_field_name("attribute")
        return text_of(attribute) if attribute is not None else b""
    return text_of(function)


def find_string_built_sql(root: Node, source: bytes) -> Iterator[Site]:
    """A bound SQL parameter becomes text formatted into the query (an f-string)."""
    for node in walk(root):
        if node.type != "call" or call_name(node) not in SQL_CALLS:
            continue
        arguments = node.child_by_field_name("arguments")
        if arguments is None or not arguments.named_child_count:
            continue
        query = arguments.named_children[0]
        if query.type != "string" or not query.named_child_count:
            continue
        start = query.named_children[0]
        if start.type != "string_start" or text_of(start) not in PLAIN_QUOTES:
            continue
        body = text_of(query)
        if b"{" in body or b"}" in body or not SQL_KEYWORD.search(body):
            continue
        match = PLACEHOLDER.search(body, len(text_of(start)))
        if match is None:
            continue
        name = match.group("pyformat") or match.group("named")
        if name is None:
            extra = arguments.named_children[1:2]
            value = extra[0] if extra else None
            if value is not None and value.type == "tuple" and value.named_child_count:
                value = value.named_children[0]
            name = text_of(value) if value is not None and value.type == "identifier" else b"value"
        offset = query.start_byte + match.start()
        edits = (
            Edit(query.start_byte, query.start_byte, b"f"),
            Edit(offset, query.start_byte + match.end(), b"{" + name + b"}"),
        )
        yield Site("string_built_sql", edits, offset)


CATALOGUE: tuple[Pattern, ...] = (
    Pattern(
        "inverted_condition",
        "This condition is inverted: the branch now runs exactly when it should not.",
        {"python": find_inverted_condition, "javascript": js.find_inverted_condition},
    ),
    Pattern(
        "off_by_one",
        "Off-by-one: this bound now includes (or excludes) one element too many.",
        {"python": find_off_by_one, "javascript": js.find_off_by_one},
    ),
    Pattern(
        "swapped_arguments",
        "The first two arguments are swapped; the callee expects them the other way round.",
        {"python": find_swapped_arguments, "javascript": js.find_swapped_arguments},
    ),
    Pattern(
        "dropped_await",
        "The coroutine is not awaited here, so it never runs and its result is a coroutine.",
        {"python": find_dropped_await, "javascript": js.find_dropped_await},
    ),
    Pattern(
        "removed_none_check",
        "The guard before this line was removed: a None or failed value now reaches it.",
        {"python": find_removed_none_check, "javascript": js.find_removed_none_check},
    ),
    Pattern(
        "wrong_variable",
        "This reads the wrong variable: another parameter is used where this one was meant.",
        {"python": find_wrong_variable, "javascript": js.find_wrong_variable},
    ),
    Pattern(
        "early_return",
        "This early return skips the rest of the function.",
        {"python": find_early_return, "javascript": js.find_early_return},
    ),
    Pattern(
        "swallowed_exception",
        "The exception is swallowed: the error is neither raised nor handled.",
        {"python": find_swallowed_exception, "javascript": js.find_swallowed_exception},
    ),
    Pattern(
        "resource_not_closed",
        "The resource is opened without a with block and never closed.",
        {"python": find_resource_not_closed},
    ),
    Pattern(
        "string_built_sql",
        "SQL is built by formatting a value into the query: SQL injection; bind it instead.",
        {"python": find_string_built_sql, "javascript": js.find_string_built_sql},
    ),
)
PATTERNS: dict[str, Pattern] = {pattern.name: pattern for pattern in CATALOGUE}


def find_sites(
    root: Node, source: bytes, patterns: Sequence[str] | None = None, *, family: str = "python"
) -> dict[str, list[Site]]:
    """Every site of every pattern (or of the named ones) in one parsed file of a language
    family, in source order (none for a pattern without a finder for that family)."""
    chosen = CATALOGUE if patterns is None else tuple(PATTERNS[name] for name in patterns)
    found: dict[str, list[Site]] = {}
    for pattern in chosen:
        finder = pattern.finders.get(family)
        found[pattern.name] = list(finder(root, source)) if finder is not None else []
    return found
