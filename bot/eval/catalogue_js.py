"""The catalogue's site finders for JavaScript and TypeScript trees (bot/eval/catalogue.py names
the patterns). Pure functions of the source and its tree-sitter tree."""

from __future__ import annotations

import re
from collections.abc import Iterator

from tree_sitter import Node

from bot.eval.syntax import Edit, Site, line_start, single_line, starts_its_line, text_of, walk

INVERTED = {b"===": b"!==", b"!==": b"===", b"==": b"!=", b"!=": b"=="}
BOUNDS = {b"<": b"<=", b"<=": b"<", b">": b">=", b">=": b">"}
CONDITIONAL = ("if_statement", "while_statement")
FUNCTIONS = (
    "function_declaration",
    "function_expression",
    "function",
    "arrow_function",
    "method_definition",
    "generator_function_declaration",
)


def operator_of(node: Node) -> Node | None:
    """The operator token of a binary expression."""
    if node.type != "binary_expression":
        return None
    return node.child_by_field_name("operator")


def condition_of(node: Node) -> Node | None:
    """The expression inside an `if (...)`/`while (...)` condition's parentheses."""
    condition = node.child_by_field_name("condition")
    if condition is None or condition.type != "parenthesized_expression":
        return None
    inner = condition.named_children
    return inner[0] if len(inner) == 1 else None


def find_inverted_condition(root: Node, source: bytes) -> Iterator[Site]:
    """`if (a === b)` becomes `if (a !== b)`; another condition `c` becomes `!(c)`."""
    for node in walk(root):
        if node.type not in CONDITIONAL:
            continue
        condition = condition_of(node)
        if condition is None or not single_line(condition):
            continue
        operator = operator_of(condition)
        if operator is not None and text_of(operator) in INVERTED:
            edit = Edit(operator.start_byte, operator.end_byte, INVERTED[text_of(operator)])
        elif condition.type == "unary_expression" and text_of(condition).startswith(b"!"):
            argument = condition.child_by_field_name("argument")
            if argument is None:
                continue
            edit = Edit(condition.start_byte, condition.end_byte, text_of(argument))
        else:
            edit = Edit(condition.start_byte, condition.end_byte, b"!(" + text_of(condition) + b")")
        yield Site("inverted_condition", (edit,), condition.start_byte)


def find_off_by_one(root: Node, source: bytes) -> Iterator[Site]:
    """`i < n` becomes `i <= n` (and the other strictness flips)."""
    for node in walk(root):
        operator = operator_of(node)
        if operator is not None and text_of(operator) in BOUNDS:
            edit = Edit(operator.start_byte, operator.end_byte, BOUNDS[text_of(operator)])
            yield Site("off_by_one", (edit,), operator.start_byte)


def find_swapped_arguments(root: Node, source: bytes) -> Iterator[Site]:
    """`f(a, b)` becomes `f(b, a)` (two different arguments on one line)."""
    for node in walk(root):
        if node.type != "arguments" or node.named_child_count < 2:
            continue
        if node.parent is None or node.parent.type not in ("call_expression", "new_expression"):
            continue
        first, second = node.named_children[0], node.named_children[1]
        if "spread_element" in (first.type, second.type) or "comment" in (first.type, second.type):
            continue
        if first.start_point[0] != second.end_point[0] or text_of(first) == text_of(second):
            continue
        between = source[first.end_byte : second.start_byte]
        edit = Edit(first.start_byte, second.end_byte, text_of(second) + between + text_of(first))
        yield Site("swapped_arguments", (edit,), first.start_byte)


def find_dropped_await(root: Node, source: bytes) -> Iterator[Site]:
    """`await call()` becomes `call()`."""
    for node in walk(root):
        if node.type != "await_expression" or node.named_child_count != 1:
            continue
        inner = node.named_children[0]
        yield Site(
            "dropped_await", (Edit(node.start_byte, inner.start_byte, b""),), node.start_byte
        )


GUARD_EXITS = ("return_statement", "throw_statement", "continue_statement")
GUARD_WORDS = re.compile(rb"\b(null|undefined|err|error|ok|valid)\b")


def guard_exit(consequence: Node) -> bool:
    """The branch only leaves: `return ...`, `throw ...` or `continue` (braced or not)."""
    if consequence.type in GUARD_EXITS:
        return True
    if consequence.type != "statement_block":
        return False
    statements = [child for child in consequence.named_children if child.type != "comment"]
    return len(statements) == 1 and statements[0].type in GUARD_EXITS


def find_removed_none_check(root: Node, source: bytes) -> Iterator[Site]:
    """A guard `if (x == null) return ...;` (or throw) is deleted; the bug is on the line that
    then runs unguarded."""
    for node in walk(root):
        if node.type != "if_statement" or node.child_by_field_name("alternative") is not None:
            continue
        condition = condition_of(node)
        consequence = node.child_by_field_name("consequence")
        following = node.next_named_sibling
        if condition is None or consequence is None or following is None:
            continue
        if following.type == "comment" or not starts_its_line(source, node):
            continue
        if not starts_its_line(source, following) or not guard_exit(consequence):
            continue
        negated = condition.type == "unary_expression" and text_of(condition).startswith(b"!")
        if not negated and not GUARD_WORDS.search(text_of(condition)):
            continue
        start = line_start(source, node.start_byte)
        end = line_start(source, following.start_byte)
        yield Site("removed_none_check", (Edit(start, end, b""),), following.start_byte)


def parameter_names(function: Node) -> list[bytes]:
    """Plain identifier parameters of a function (TypeScript's typed ones too)."""
    parameters = function.child_by_field_name("parameters")
    names: list[bytes] = []
    if parameters is None:
        return names
    for child in parameters.named_children:
        name: Node | None = child
        if child.type in ("required_parameter", "optional_parameter"):
            name = child.child_by_field_name("pattern")
        elif child.type == "assignment_pattern":
            name = child.child_by_field_name("left")
        if name is not None and name.type == "identifier":
            names.append(text_of(name))
    return names


def is_read(identifier: Node) -> bool:
    """The identifier is read as a value, not bound by a declaration or an assignment."""
    parent = identifier.parent
    if parent is None:
        return False
    if parent.type == "variable_declarator" and parent.child_by_field_name("name") == identifier:
        return False
    if parent.type in ("assignment_expression", "augmented_assignment_expression") and (
        parent.child_by_field_name("left") == identifier
    ):
        return False
    if parent.type == "update_expression":
        return False
    return parent.type not in (
        "formal_parameters",
        "required_parameter",
        "optional_parameter",
        "catch_clause",
        "import_specifier",
        "labeled_statement",
    )


def nested_in(node: Node, body: Node) -> bool:
    """An enclosing function or class between `node` and `body`."""
    current = node.parent
    while current is not None and current != body:
        if current.type in (*FUNCTIONS, "class_declaration", "class"):
            return True
        current = current.parent
    return False


def find_wrong_variable(root: Node, source: bytes) -> Iterator[Site]:
    """A read of one parameter becomes a read of another parameter of the same function."""
    for function in walk(root):
        if function.type not in FUNCTIONS:
            continue
        names = parameter_names(function)
        body = function.child_by_field_name("body")
        if len(names) < 2 or body is None:
            continue
        for node in walk(body):
            if node.type != "identifier" or text_of(node) not in names or not is_read(node):
                continue
            if nested_in(node, body):
                continue
            other = names[(names.index(text_of(node)) + 1) % len(names)]
            yield Site(
                "wrong_variable", (Edit(node.start_byte, node.end_byte, other),), node.start_byte
            )


def find_early_return(root: Node, source: bytes) -> Iterator[Site]:
    """A `return;` is inserted before a later statement of a function, so the rest never runs."""
    for function in walk(root):
        if function.type not in FUNCTIONS:
            continue
        body = function.child_by_field_name("body")
        if body is None or body.type != "statement_block":
            continue
        statements = [child for child in body.named_children if child.type != "comment"]
        if len(statements) < 3 or statements[0].start_point[0] == body.start_point[0]:
            continue
        for statement in statements[1:-1]:
            if not starts_its_line(source, statement):
                continue
            start = line_start(source, statement.start_byte)
            indent = source[start : statement.start_byte]
            yield Site("early_return", (Edit(start, start, indent + b"return;\n"),), start)


def find_swallowed_exception(root: Node, source: bytes) -> Iterator[Site]:
    """A `catch` block that rethrows or translates the error becomes `{}`."""
    for node in walk(root):
        if node.type != "catch_clause":
            continue
        body = node.child_by_field_name("body")
        if body is None or not any(child.type == "throw_statement" for child in walk(body)):
            continue
        yield Site(
            "swallowed_exception", (Edit(body.start_byte, body.end_byte, b"{}"),), body.start_byte
        )


SQL_CALLS = frozenset({b"query", b"execute", b"raw", b"prepare", b"run", b"all", b"get"})
SQL_KEYWORD = re.compile(rb"\b(SELECT|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
PLACEHOLDER = re.compile(rb"\$\d+|\?|(?<![\w:]):(?P<named>[A-Za-z_]\w*)")


def call_name(call: Node) -> bytes:
    function = call.child_by_field_name("function")
    if function is None:
        return b""
    if function.type == "member_expression":
        member = function.child_by_field_name("property")
        return text_of(member) if member is not None else b""
    return text_of(function)


def find_string_built_sql(root: Node, source: bytes) -> Iterator[Site]:
    """A bound SQL parameter becomes a value interpolated into the query (a template string)."""
    for node in walk(root):
        if node.type != "call_expression" or call_name(node) not in SQL_CALLS:
            continue
        arguments = node.child_by_field_name("arguments")
        if arguments is None or not arguments.named_child_count:
            continue
        query = arguments.named_children[0]
        body = text_of(query)
        if query.type != "string" or not single_line(query) or not SQL_KEYWORD.search(body):
            continue
        if b"`" in body or b"${" in body or b"\\" in body:
            continue
        match = PLACEHOLDER.search(body, 1)
        if match is None or match.end() >= len(body):
            continue
        name = match.group("named")
        if name is None:
            values = arguments.named_children[1:2]
            value = values[0] if values else None
            if value is not None and value.type == "array" and value.named_child_count:
                value = value.named_children[0]
            name = text_of(value) if value is not None and value.type == "identifier" else b"value"
        offset = query.start_byte + match.start()
        edits = (
            Edit(query.start_byte, query.start_byte + 1, b"`"),
            Edit(offset, query.start_byte + match.end(), b"${" + name + b"}"),
            Edit(query.end_byte - 1, query.end_byte, b"`"),
        )
        yield Site("string_built_sql", edits, offset)
