"""Slash-command parsing: each command, malformed and hostile comments."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.commands.parse import (
    MAX_COMMANDS,
    MAX_SCANNED_CHARS,
    VERBS,
    is_bot_comment,
    parse_commands,
)


def verbs(body: str) -> list[tuple[str, str | None]]:
    return [(c.verb, c.argument) for c in parse_commands(body, author="dev1").commands]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("/review", [("review", None)]),
        ("/REVIEW", [("review", None)]),
        ("  /review  ", [("review", None)]),
        ("/review priority p2", [("priority", "P2")]),
        ("/Review Priority P3", [("priority", "P3")]),
        ("/review\tpriority\tp1", [("priority", "P1")]),
        ("/review cancel", [("cancel", None)]),
        ("/review status", [("status", None)]),
        ("/review help", [("help", None)]),
        ("please look\r\n/review status\r\nthanks", [("status", None)]),
        ("/review\n/review status", [("review", None), ("status", None)]),
    ],
)
def test_each_command_is_recognised(body: str, expected: list[tuple[str, str | None]]) -> None:
    assert verbs(body) == expected


@pytest.mark.parametrize(
    "body",
    [
        "",
        "LGTM",
        "please /review this",  # not at the start of a line
        "> /review",  # a quote of someone else's command
        "`/review`",
        "/reviewer",
        "/reviews status",
        "//review",
        "\\/review",
        "```\n/review\n```",  # an example inside a code block
        "~~~\n/review cancel\n~~~",
        "／review",  # fullwidth solidus
        "/rеview",  # Cyrillic е
        "/reviеw status",  # Cyrillic е
        "/re\u200bview",  # zero-width space
        "\u200b/review",
        "/review\u200b",
        "/review\u00a0status",  # no-break space as the separator
        "/review\u2003",  # em space
        "text\u2028/review",  # a Unicode line separator is not a new line in a comment
    ],
)
def test_look_alikes_and_non_commands_are_not_commands(body: str) -> None:
    result = parse_commands(body, author="dev1")
    assert result.commands == ()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("/review priority p0", "P0 cannot be set by a command"),
        ("/review priority", "takes one of p1, p2, p3"),
        ("/review priority p4", "takes one of p1, p2, p3"),
        ("/review priority p1 p2", "takes one of p1, p2, p3"),
        ("/review launch", "not a command I know"),
        ("/review ſtatus", "not a command I know"),  # long s would case-fold to s
        ("/review statu\u0455", "not a command I know"),  # Cyrillic dze
        ("/review priority р1", "not a command I know"),  # Cyrillic er
        ("/review cancel now", "not a command I know"),
        ("/review status\u200b", "not a command I know"),
    ],
)
def test_bad_arguments_produce_an_error_not_a_command(body: str, fragment: str) -> None:
    result = parse_commands(body, author="dev1")
    assert result.commands == ()
    assert len(result.errors) == 1
    assert fragment in result.errors[0]


def test_error_message_does_not_echo_backticks_or_unbounded_text() -> None:
    result = parse_commands("/review `@everyone` " + "x" * 250, author="dev1")
    assert result.errors == ()  # longer than a command line can be
    result = parse_commands("/review `@everyone`", author="dev1")
    assert "`@everyone`" not in result.errors[0]


def test_commands_per_comment_are_capped() -> None:
    body = "\n".join(["/review status"] * (MAX_COMMANDS + 7))
    result = parse_commands(body, author="dev1")
    assert len(result.commands) == MAX_COMMANDS
    assert result.errors == (
        f"Only the first {MAX_COMMANDS} commands of a comment are read; 7 more were ignored.",
    )


def test_huge_comment_is_scanned_only_to_the_limit() -> None:
    body = "x\n" * MAX_SCANNED_CHARS + "/review cancel"
    assert parse_commands(body, author="dev1").commands == ()
    assert verbs("/review cancel\n" + "y" * 5_000_000) == [("cancel", None)]


def test_line_numbers_are_reported() -> None:
    result = parse_commands("hello\n\n/review status", author="dev1")
    assert result.commands[0].line == 3
    assert result.commands[0].raw == "/review status"


@pytest.mark.parametrize(
    ("author", "body"),
    [
        ("review-bot", "/review"),
        ("Review-Bot", "/review"),
        ("review-bot[bot]", "/review cancel"),
        ("dev1", "<!-- review-bot:job=4 -->\nSummary\n/review status"),
    ],
)
def test_the_bots_own_comments_are_never_parsed(author: str, body: str) -> None:
    assert is_bot_comment(body, author=author, bot_login="review-bot")
    assert parse_commands(body, author=author, bot_login="review-bot").empty


def test_configured_login_is_used() -> None:
    assert parse_commands("/review", author="review-bot", bot_login="acme-reviewer").commands
    assert parse_commands("/review", author="acme-reviewer", bot_login="acme-reviewer").empty


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2_000))
def test_any_text_parses_without_crashing(body: str) -> None:
    result = parse_commands(body, author="dev1")
    assert len(result.commands) <= MAX_COMMANDS
    for command in result.commands:
        assert command.verb in VERBS
        assert command.raw.isascii()
        assert command.argument in (None, "P1", "P2", "P3")


_look_alike = st.sampled_from(["／", "∕", "⁄", "е", "і", "ѕ", "ν", "\u200b", "\u200d", "\ufeff"])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["/review", "/review status", "/review cancel", "/review priority p2"]),
       st.data())  # fmt: skip
def test_a_look_alike_anywhere_in_a_command_unmakes_it(command: str, data: st.DataObject) -> None:
    position = data.draw(st.integers(min_value=0, max_value=len(command) - 1))
    replace = data.draw(st.booleans())
    character = data.draw(_look_alike)
    tail = position + 1 if replace else position
    hostile = command[:position] + character + command[tail:]
    assert parse_commands(hostile, author="dev1").commands == ()
