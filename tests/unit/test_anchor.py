"""Anchoring findings on the diff: exact, by quote, nearby, or the summary; never elsewhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.diff import parse_hunks
from bot.forges.base import InlineComment
from bot.forges.gitlab import gitlab_body
from bot.review.anchor import (
    NEARBY_LINES,
    anchor_finding,
    index_files,
    normalize_code,
    normalize_path,
    suggestion_fits,
)

PATCH = """@@ -10,6 +10,7 @@ def handler(event):
     value = event["value"]
-    return value
+    checked = validate(value)
+    log(checked)
+    return checked
     # the end
     pass
     pass
@@ -40,3 +41,3 @@ class Store:
     def save(self):
-        self.db.commit()
+        self.db.commit(flush=True)
     def load(self):"""
INDEX = index_files([{"path": "src/handler.py", "patch": PATCH}])


def place(**kwargs: object) -> tuple[str, str, int | None]:
    args: dict[str, object] = {"path": "src/handler.py", "side": "RIGHT", "line": None}
    args.update(kwargs)
    placement = anchor_finding(INDEX, **args)  # type: ignore[arg-type]
    return placement.outcome, placement.side, placement.line


def test_named_line_in_the_diff_is_exact() -> None:
    assert place(line=11) == ("exact", "RIGHT", 11)
    assert place(line=11, quote="checked = validate(value)") == ("exact", "RIGHT", 11)
    assert place(line=11, side="LEFT", quote="return value") == ("exact", "LEFT", 11)
    assert place(line=10, side=None) == ("exact", "RIGHT", 10)


def test_a_quote_moves_the_finding_to_its_line() -> None:
    # Off by two: the quote names line 13.
    assert place(line=11, quote="return checked") == ("by_quote", "RIGHT", 13)
    # Wrong side: the quoted line is an added one.
    assert place(line=42, side="LEFT", quote="self.db.commit(flush=True)") == (
        "by_quote",
        "RIGHT",
        42,
    )
    # A quote with no line at all, copied with the prompt's number and mark.
    assert place(quote="42 +        self.db.commit(flush=True)") == ("by_quote", "RIGHT", 42)
    assert place(quote="+    log(checked)") == ("by_quote", "RIGHT", 12)


def test_a_quote_found_twice_takes_the_nearest() -> None:
    patch = "@@ -1,5 +1,5 @@\n-x = 1\n+x = 2\n a\n b\n-x = 1\n+x = 3"
    index = index_files([{"path": "a.py", "patch": patch}])
    near_end = anchor_finding(index, path="a.py", side="LEFT", line=6, quote="x = 1")
    near_start = anchor_finding(index, path="a.py", side="LEFT", line=1, quote="x = 1")
    assert (near_end.line, near_start.line) == (4, 1)


def test_a_line_that_is_the_quote_outranks_one_that_contains_it() -> None:
    # A dropped await: the quote is the whole new line and a part of the removed one.
    patch = (
        "@@ -5,4 +5,5 @@\n"
        "     start()\n"
        "-    await client.close()\n"
        "+    prepare()\n"
        "+    client.close()\n"
        "     client.close_all()\n"
        "     done()"
    )
    index = index_files([{"path": "a.py", "patch": patch}])

    def where(**kwargs: object) -> tuple[str, str, int | None]:
        found = anchor_finding(index, path="a.py", **kwargs)  # type: ignore[arg-type]
        return found.outcome, found.side, found.line

    # Named on the wrong side, where the removed line contains the quote.
    assert where(side="LEFT", line=6, quote="client.close()") == ("by_quote", "RIGHT", 7)
    # Counted from the hunk's start: the removed line (old 6) is nearer than the new one (7).
    assert where(side="RIGHT", line=2, quote="client.close()") == ("by_quote", "RIGHT", 7)
    # No line at all.
    assert where(side=None, line=None, quote="client.close()") == ("by_quote", "RIGHT", 7)
    # A quote that is only ever part of a line still finds it.
    assert where(side="RIGHT", line=9, quote="client.close_all") == ("by_quote", "RIGHT", 8)
    assert where(side="LEFT", line=6, quote="await client.close") == ("exact", "LEFT", 6)


def test_without_a_quote_the_nearest_changed_line_within_three() -> None:
    # Hunk two shows new lines 41-43; 42 is the one added.
    assert place(line=42 + NEARBY_LINES) == ("nearby", "RIGHT", 42)
    assert place(line=42 + NEARBY_LINES + 1) == ("summary_only", "RIGHT", 46)
    assert place(line=7) == ("summary_only", "RIGHT", 7)
    # Changed lines on both sides at the same distance: the named side wins.
    assert place(line=9, side="LEFT") == ("nearby", "LEFT", 11)
    assert place(line=9, side="RIGHT") == ("nearby", "RIGHT", 11)


def test_a_quote_that_matches_nothing_never_falls_back_to_a_nearby_line() -> None:
    assert place(line=12, quote="delete_everything()") == ("summary_only", "RIGHT", 12)


def test_unknown_path_is_summary_only_and_paths_are_normalized() -> None:
    assert anchor_finding(INDEX, path="nope.py", side="RIGHT", line=11).outcome == "summary_only"
    for given_path in (
        "./src/handler.py",
        "a/src/handler.py",
        "b/src/handler.py",
        "/src/handler.py",
    ):
        assert anchor_finding(INDEX, path=given_path, side="RIGHT", line=11).path == (
            "src/handler.py"
        )
    assert normalize_path("b/x.py", ["b/x.py", "x.py"]) == "b/x.py"


def test_ranges_stay_inside_what_the_diff_shows() -> None:
    exact = anchor_finding(INDEX, path="src/handler.py", side="RIGHT", line=13, start_line=11)
    assert (exact.start_line, exact.line) == (11, 13)
    # Moved by its quote, the range moves with it.
    moved = anchor_finding(
        INDEX, path="src/handler.py", side="RIGHT", line=12, start_line=10, quote="return checked"
    )
    assert (moved.start_line, moved.line) == (11, 13)
    # A range reaching into the gap between hunks is dropped, the line kept.
    wide = anchor_finding(INDEX, path="src/handler.py", side="RIGHT", line=42, start_line=30)
    assert (wide.start_line, wide.line) == (None, 42)


def test_suggestions_fit_only_right_lines_of_one_hunk() -> None:
    file = INDEX["src/handler.py"]
    assert suggestion_fits(file, side="RIGHT", line=13, start_line=11)
    assert suggestion_fits(file, side="RIGHT", line=42, start_line=None)
    assert not suggestion_fits(file, side="LEFT", line=11, start_line=None)
    assert not suggestion_fits(file, side="RIGHT", line=42, start_line=15)
    assert not suggestion_fits(file, side="RIGHT", line=20, start_line=None)


def test_lines_past_a_header_count_take_no_comment() -> None:
    # The header promises one new line; the body shows three.
    patch = "@@ -1,1 +1,1 @@\n-a\n+b\n+c\n+d"
    index = index_files([{"path": "x", "patch": patch}])
    assert anchor_finding(index, path="x", side="RIGHT", line=1).outcome == "exact"
    assert anchor_finding(index, path="x", side="RIGHT", line=3).line == 1  # nearby, not 3
    assert anchor_finding(index, path="x", side="RIGHT", line=3, quote="d").outcome == (
        "summary_only"
    )


# -- properties --------------------------------------------------------------------------------

CODE = st.text(alphabet="abcdefgh =()_.:\t\x0c\x85\u2028\r", min_size=0, max_size=12)


@st.composite
def diffs(draw: st.DrawFn) -> str:
    """A well-formed single-file diff with 1-3 hunks of random lines."""
    hunks = []
    old = new = draw(st.integers(1, 30))
    for _ in range(draw(st.integers(1, 3))):
        kinds = draw(st.lists(st.sampled_from(" +-"), min_size=1, max_size=12))
        body = [kind + draw(CODE).replace("\n", "") for kind in kinds]
        old_count = sum(kind != "+" for kind in kinds)
        new_count = sum(kind != "-" for kind in kinds)
        hunks.append(f"@@ -{old},{old_count} +{new},{new_count} @@\n" + "\n".join(body))
        gap = draw(st.integers(1, 20))
        old, new = old + old_count + gap, new + new_count + gap
    return "\n".join(hunks)


def shown(patch: str) -> dict[tuple[str, int], str]:
    lines: dict[tuple[str, int], str] = {}
    for hunk in parse_hunks(patch):
        for line in hunk.lines:
            if line.new_line is not None:
                lines[("RIGHT", line.new_line)] = line.text
            if line.old_line is not None:
                lines[("LEFT", line.old_line)] = line.text
    return lines


@given(
    patch=diffs(),
    line=st.integers(1, 120) | st.none(),
    side=st.sampled_from(["RIGHT", "LEFT"]) | st.none(),
    quote=CODE | st.none(),
    start=st.integers(1, 120) | st.none(),
)
def test_a_placed_finding_is_on_a_line_the_diff_shows_and_that_it_was_about(
    patch: str, line: int | None, side: str | None, quote: str | None, start: int | None
) -> None:
    index = index_files([{"path": "f.py", "patch": patch}])
    placement = anchor_finding(
        index,
        path="f.py",
        side=side,
        line=line,
        quote=quote,
        start_line=start,  # type: ignore[arg-type]
    )
    lines = shown(patch)
    if not placement.placed:
        return
    assert placement.line is not None
    assert (placement.side, placement.line) in lines
    text = lines[(placement.side, placement.line)]
    wanted = normalize_code(quote or "")
    if wanted:
        # About the quoted line: the quote is the line, or a long enough part of it.
        assert wanted == normalize_code(text) or wanted in normalize_code(text)
    elif placement.outcome == "nearby":
        assert line is not None and abs(placement.line - line) <= NEARBY_LINES
    else:
        assert placement.outcome == "exact" and placement.line == line
    if placement.start_line is not None:
        assert placement.start_line < placement.line
        for number in range(placement.start_line, placement.line + 1):
            assert (placement.side, number) in lines


@given(patch=diffs(), line=st.integers(1, 120), start=st.integers(1, 120) | st.none())
def test_a_suggestion_never_spans_lines_outside_its_hunk(
    patch: str, line: int, start: int | None
) -> None:
    file = index_files([{"path": "f.py", "patch": patch}])["f.py"]
    if not suggestion_fits(file, side="RIGHT", line=line, start_line=start):
        return
    first = start if start is not None else line
    hunks = [
        {item.new_line for item in hunk.lines if item.new_line is not None}
        for hunk in parse_hunks(patch)
    ]
    assert any(set(range(first, line + 1)) <= numbers for numbers in hunks)


@pytest.mark.parametrize("side", ["RIGHT", "LEFT"])
def test_every_shown_line_quoted_exactly_is_found(side: str) -> None:
    for (line_side, number), text in shown(PATCH).items():
        if line_side != side or not text.strip():
            continue
        placement = anchor_finding(
            INDEX,
            path="src/handler.py",
            side=side,
            line=number,
            quote=text,  # type: ignore[arg-type]
        )
        assert placement.outcome == "exact" and placement.line == number


def test_a_quote_of_several_lines_anchors_their_range() -> None:
    quote = "checked = validate(value)\nlog(checked)\nreturn checked"
    placement = anchor_finding(INDEX, path="src/handler.py", side="RIGHT", line=30, quote=quote)
    assert (placement.outcome, placement.start_line, placement.line) == ("by_quote", 11, 13)
    # Lines that do not follow each other in the diff are not that quote.
    broken = "checked = validate(value)\nreturn checked"
    placement = anchor_finding(INDEX, path="src/handler.py", side="RIGHT", line=13, quote=broken)
    assert placement.outcome == "summary_only"


def test_gitlab_suggestions_count_the_lines_above_the_commented_one() -> None:
    comment = InlineComment("a.py", 13, "Fix.", start_line=11, suggestion="x = 1\ny = 2\n")
    assert gitlab_body(comment) == "Fix.\n\n```suggestion:-2+0\nx = 1\ny = 2\n```"
    fenced = InlineComment("a.py", 13, "Fix.", suggestion="s = '```'")
    assert gitlab_body(fenced) == "Fix.\n\n````suggestion:-0+0\ns = '```'\n````"
