"""Fingerprints of findings: stable where a reader sees the same finding, distinct otherwise."""

from __future__ import annotations

from bot.review.fingerprint import (
    anchor_of,
    fingerprint,
    fingerprint_findings,
    normalize_message,
    patches_of,
)
from bot.review.parse import Finding

PATCH = "\n".join(
    [
        "@@ -1,3 +1,5 @@",
        " def handle(event):",
        "-    return None",
        "+    print(event)",
        '+    token = "hunter2"',
        "+    return event",
        " ",
    ]
)
# The same code two lines further down the file and re-indented.
SHIFTED = "\n".join(
    [
        "@@ -3,3 +3,5 @@",
        " def handle(event):",
        "-    return None",
        "+        print(event)",
        '+        token = "hunter2"',
        "+        return event",
        " ",
    ]
)
TOKEN = "A credential looks hard-coded; read it from configuration or a secret store."


def finding(path: str, line: int, body: str = TOKEN, severity: str = "critical") -> Finding:
    return Finding(path=path, line=line, side="RIGHT", severity=severity, body=body)


def digest(patch: str, line: int, *, path: str = "app/h.py", body: str = TOKEN) -> str:
    [item] = fingerprint_findings([finding(path, line, body)], {path: patch})
    return item.fingerprint


def test_the_same_finding_shifted_and_reindented_keeps_its_fingerprint() -> None:
    assert digest(PATCH, 3) == digest(SHIFTED, 5)


def test_message_case_spacing_quotes_and_numbers_do_not_count() -> None:
    assert normalize_message("Line 12: `token`  is   HARD-coded.") == normalize_message(
        "line 14: 'token' is hard coded"
    )
    assert digest(PATCH, 3, body="Line 3 leaks `token`.") == digest(
        PATCH, 3, body="line 9 leaks 'token'"
    )


def test_another_line_path_message_or_category_is_another_finding() -> None:
    base = digest(PATCH, 3)
    assert digest(PATCH, 2) != base  # the print line
    assert digest(PATCH, 3, path="app/other.py") != base
    assert digest(PATCH, 3, body="Debug output left in.") != base
    anchor = anchor_of({"app/h.py": PATCH}, finding("app/h.py", 3))
    assert fingerprint(path="app/h.py", anchor=anchor, category="critical", message=TOKEN) == base
    assert fingerprint(path="app/h.py", anchor=anchor, category="minor", message=TOKEN) != base


def test_the_anchor_is_the_line_with_its_neighbours_on_its_side() -> None:
    anchor = anchor_of({"app/h.py": PATCH}, finding("app/h.py", 3))
    assert anchor is not None
    assert anchor.context == ("print(event)", 'token = "hunter2"', "return event")
    assert anchor_of({"app/h.py": PATCH}, finding("app/h.py", 40)) is None


def test_duplicates_in_one_review_are_kept_once_and_parts_of_a_file_join() -> None:
    parts = patches_of(
        [
            {"path": "app/h.py", "patch": PATCH},
            {"path": "app/h.py", "patch": "@@ -40,1 +42,2 @@\n x = 1\n+y = 2"},
        ]
    )
    items = fingerprint_findings(
        [finding("app/h.py", 3), finding("app/h.py", 3), finding("app/h.py", 43, "y?")], parts
    )
    assert len(items) == 2
    assert items[1].anchor_text == "y = 2"
