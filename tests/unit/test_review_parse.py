"""Diff positions and model-output checking: contract, lines in the diff, caps, sanitizing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.diff import changed_lines, commentable_positions, parse_files, parse_hunks
from bot.review.anchor import index_files
from bot.review.parse import (
    MAX_BODY_CHARS,
    build_retry_reminder,
    extract_json_object,
    parse_review,
    sanitize_text,
)

PATCH = """diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -3,4 +3,5 @@ import os
 def main():
-    run()
+    check()
+    run(safe=True)
     return 0
\\ No newline at end of file
@@ -20 +21,2 @@
-old = 1
+new = 1
+more = 2"""
FILES = [{"path": "app.py", "patch": PATCH}]
POSITIONS = commentable_positions(FILES)
INDEX = index_files(FILES)


def answer(findings: list[object], summary: str = "ok") -> str:
    return json.dumps({"findings": findings, "summary": summary})


def finding(**overrides: object) -> dict[str, object]:
    item: dict[str, object] = {
        "path": "app.py",
        "line": 5,
        "side": "RIGHT",
        "severity": "major",
        "body": "Check the result.",
    }
    item.update(overrides)
    return item


def test_hunk_line_numbers() -> None:
    hunks = parse_hunks(PATCH)
    assert [(h.old_start, h.old_count, h.new_start, h.new_count) for h in hunks] == [
        (3, 4, 3, 5),
        (20, 1, 21, 2),
    ]
    assert changed_lines(parse_files(FILES)[0]) == (
        ("LEFT", 4, "    run()"),
        ("RIGHT", 4, "    check()"),
        ("RIGHT", 5, "    run(safe=True)"),
        ("LEFT", 20, "old = 1"),
        ("RIGHT", 21, "new = 1"),
        ("RIGHT", 22, "more = 2"),
    )


def test_positions_include_context_on_both_sides() -> None:
    assert ("app.py", "RIGHT", 3) in POSITIONS and ("app.py", "LEFT", 3) in POSITIONS
    assert ("app.py", "RIGHT", 6) in POSITIONS and ("app.py", "LEFT", 5) in POSITIONS
    assert ("app.py", "LEFT", 4) in POSITIONS and ("app.py", "RIGHT", 4) in POSITIONS
    assert ("app.py", "RIGHT", 7) not in POSITIONS
    assert ("app.py", "LEFT", 21) not in POSITIONS
    assert commentable_positions([{"path": "bin", "patch": None}]) == frozenset()


def test_valid_answer_is_kept() -> None:
    parsed = parse_review(answer([finding()], "Looks careful."), INDEX)
    assert parsed.ok and parsed.dropped == 0
    assert [(f.path, f.line, f.side, f.severity) for f in parsed.findings] == [
        ("app.py", 5, "RIGHT", "major")
    ]
    assert parsed.summary == "Looks careful."


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("I think the change is fine.", "no JSON object"),
        ('{"summary": "fine"}', 'no "findings" list'),
        ('{"findings": "none", "summary": ""}', 'no "findings" list'),
        ('{"findings": [], "summary": 3}', "not a string"),
        ('[{"path": "app.py"}]', 'no "findings" list'),
        ('{"findings": [{"path": "app.py", "line": 5', "no JSON object"),
        ("", "no JSON object"),
    ],
)
def test_nonsense_is_rejected(text: str, error: str) -> None:
    parsed = parse_review(text, INDEX)
    assert not parsed.ok
    assert error in (parsed.error or "")
    assert parsed.findings == ()


def test_code_fences_and_leading_prose_are_tolerated() -> None:
    text = "Here is my review:\n```json\n" + answer([finding()]) + "\n```\nHope it helps {smile}"
    parsed = parse_review(text, INDEX)
    assert parsed.ok and len(parsed.findings) == 1


def test_first_json_object_wins_even_after_a_bad_brace() -> None:
    text = "Use {braces} carefully. " + answer([finding(line=4)])
    assert extract_json_object(text) == json.loads(answer([finding(line=4)]))


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (finding(path=""), "unknown_path"),
        (finding(path=7), "unknown_path"),
        (finding(line="five"), "bad_line"),
        (finding(line=0), "bad_line"),
        (finding(line=True), "bad_line"),
        (finding(side="MIDDLE"), "bad_side"),
        (finding(severity="catastrophic"), "bad_severity"),
        (finding(body="   "), "no_body"),
        (finding(body=None), "no_body"),
        ("just a string", "not_an_object"),
    ],
)
def test_bad_findings_are_dropped_and_counted(item: object, reason: str) -> None:
    parsed = parse_review(answer([item, finding()]), INDEX)
    assert parsed.ok
    assert len(parsed.findings) == 1
    assert parsed.dropped == 1
    assert parsed.drop_reasons == {reason: 1}


@pytest.mark.parametrize(
    "item",
    [
        finding(line=99),
        finding(path="other.py"),
        finding(side="LEFT", line=40),
        finding(line=5, quote="this text is on no line"),
    ],
)
def test_findings_off_the_diff_are_kept_for_the_summary(item: dict[str, object]) -> None:
    parsed = parse_review(answer([item]), INDEX)
    assert parsed.ok and parsed.dropped == 0
    assert parsed.placed == () and len(parsed.unanchored) == 1
    assert parsed.unanchored[0].body == "Check the result."
    assert parsed.anchoring["summary_only"] == 1


def test_tolerant_field_forms() -> None:
    items = [
        finding(path="b/app.py", line="22", side="right", severity="Warning"),
        finding(line=20, severity=None, side=None),
        finding(line=4.0, side="LEFT", severity="nit"),
    ]
    parsed = parse_review(answer(items), INDEX)
    assert parsed.dropped == 0
    assert [(f.line, f.side, f.severity) for f in parsed.findings] == [
        (4, "LEFT", "info"),
        (20, "LEFT", "minor"),
        (22, "RIGHT", "minor"),
    ]


def test_duplicates_are_dropped() -> None:
    parsed = parse_review(answer([finding(), finding()]), INDEX)
    assert len(parsed.findings) == 1 and parsed.drop_reasons == {"duplicate": 1}


def test_cap_keeps_the_most_severe() -> None:
    items = [finding(line=3, body=f"nit {n}", severity="info") for n in range(25)]
    items.append(finding(line=22, severity="critical", body="Data loss."))
    parsed = parse_review(answer(items), INDEX, max_findings=20)
    assert len(parsed.findings) == 20
    assert parsed.drop_reasons == {"over_cap": 6}
    assert any(f.severity == "critical" for f in parsed.findings)


def test_long_bodies_are_cut() -> None:
    parsed = parse_review(answer([finding(body="x" * 5000)]), INDEX)
    assert len(parsed.findings[0].body) == MAX_BODY_CHARS
    assert parsed.findings[0].body.endswith("…")


def test_mentions_and_html_are_defused() -> None:
    body = (
        "Ask @octocat and @org/team. <!-- review-bot:job=1 --> <img src=x onerror=alert(1)>"
        " Mail me@example.com. In code `@decorator` and <b> stay:\n```\n<div>@x</div>\n```"
    )
    cleaned = sanitize_text(body, max_chars=2000)
    assert "review-bot:job" not in cleaned
    assert "<img" not in cleaned and "&lt;img" in cleaned
    assert "`@octocat`" in cleaned and "`@org/team`" in cleaned
    assert "me@example.com" in cleaned
    assert "`@decorator`" in cleaned and "<div>@x</div>" in cleaned
    parsed = parse_review(answer([finding(body=body)], summary="cc @admin"), INDEX)
    assert parsed.summary == "cc `@admin`"


@given(st.text(max_size=300))
def test_sanitized_prose_never_pings_or_renders_html(text: str) -> None:
    cleaned = sanitize_text(text.replace("`", ""), max_chars=400)
    assert "<" not in cleaned
    assert "<!--" not in cleaned
    assert len(cleaned) <= 400
    for index, char in enumerate(cleaned):
        following = cleaned[index + 1 : index + 2]
        if char == "@" and following.isascii() and following.isalnum():
            previous = cleaned[index - 1] if index else ""
            assert previous == "`" or previous.isalnum() or previous in "_@/"


@given(st.text(max_size=200))
def test_parse_never_raises(text: str) -> None:
    parsed = parse_review(text, INDEX)
    assert parsed.ok or parsed.error


def test_retry_reminder_names_the_problem() -> None:
    reminder = build_retry_reminder("no JSON object in the answer")
    assert "no JSON object in the answer" in reminder
    assert '"findings"' in reminder


def test_a_range_written_into_the_line_is_read_as_one() -> None:
    parsed = parse_review(answer([finding(line="4-5", quote=None)]), INDEX)
    (placed,) = parsed.placed
    assert (placed.start_line, placed.line, placed.anchor) == (4, 5, "exact")
