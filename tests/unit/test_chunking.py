"""Chunking: files in order, grouped to a line budget, huge files split by hunks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.diff import parse_hunks
from bot.model import FileChange
from bot.review.chunking import (
    count_changed_lines,
    halve_chunk,
    plan_chunks,
    split_hunks,
)


def _patch(hunks: list[tuple[int, int]]) -> str:
    """A patch with one hunk per (start, changed lines): alternating additions and removals."""
    parts = []
    for start, changed in hunks:
        body = [" context"]
        for i in range(changed):
            body.append(f"+added {i}" if i % 2 == 0 else f"-removed {i}")
        removed = sum(1 for line in body if line.startswith("-"))
        added = sum(1 for line in body if line.startswith("+"))
        parts.append(f"@@ -{start},{removed + 1} +{start},{added + 1} @@ def f():")
        parts.extend(body)
    return "\n".join(parts)


def _counted(file_lines: list[int]) -> list[FileChange]:
    """Files known only by their changed lines (no patch), as a trace gives them."""
    return [FileChange(f"f{index}.py", additions=lines) for index, lines in enumerate(file_lines)]


def _counts(entry: dict[str, object]) -> dict[str, object]:
    return {key: entry[key] for key in ("index", "lines", "part", "parts") if key in entry}


def test_small_review_is_one_chunk() -> None:
    result = plan_chunks(_counted([10, 20, 30]), line_budget=100)
    assert len(result.chunks) == 1
    assert result.chunks[0].lines == 60
    assert [entry["index"] for entry in result.chunks[0].files] == [0, 1, 2]


def test_files_are_grouped_in_order_to_the_budget() -> None:
    result = plan_chunks(_counted([60, 50, 40, 30, 90]), line_budget=100)
    assert [chunk.lines for chunk in result.chunks] == [60, 90, 30, 90]
    order = [entry["index"] for chunk in result.chunks for entry in chunk.files]
    assert order == [0, 1, 2, 3, 4]


def test_huge_file_from_counts_splits_evenly() -> None:
    result = plan_chunks(_counted([250]), line_budget=100)
    assert [chunk.lines for chunk in result.chunks] == [84, 83, 83]
    assert [chunk.files[0]["part"] for chunk in result.chunks] == [1, 2, 3]
    assert all(chunk.files[0]["parts"] == 3 for chunk in result.chunks)


def test_a_bad_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="line_budget"):
        plan_chunks(_counted([3]), line_budget=0)


def test_huge_file_splits_by_hunks() -> None:
    patch = _patch([(1, 40), (100, 40), (200, 40)])
    files = [FileChange("big.py", additions=60, deletions=60, patch=patch)]
    result = plan_chunks(files, line_budget=80)
    assert [chunk.lines for chunk in result.chunks] == [80, 40]
    first = result.chunks[0].files[0]
    assert first["path"] == "big.py" and first["part"] == 1 and first["parts"] == 2
    assert split_hunks(first["patch"])[0].startswith("@@ -1,")
    assert result.chunks[1].files[0]["patch"].startswith("@@ -200,")


def test_a_hunk_over_the_budget_is_cut_with_correct_headers() -> None:
    patch = "\n".join(["@@ -10,3 +10,5 @@", " keep", "+a", "+b", "-c", "+d", " tail"])
    files = [FileChange("one.py", additions=3, deletions=1, patch=patch)]
    result = plan_chunks(files, line_budget=2)
    pieces = [chunk.files[0]["patch"] for chunk in result.chunks]
    assert pieces[0].splitlines()[0] == "@@ -10,1 +10,3 @@"
    assert pieces[1].splitlines()[0] == "@@ -11,2 +13,2 @@"
    assert sum(count_changed_lines(piece) for piece in pieces) == 4


def test_skipped_files_are_left_out_and_reported() -> None:
    files = [
        FileChange("poetry.lock", additions=500, patch=_patch([(1, 10)])),
        FileChange("app.py", additions=5, deletions=5, patch=_patch([(1, 10)])),
        FileChange("logo.png", patch=None),
    ]

    def skip(path: str, patch: str | None) -> str | None:
        if path.endswith(".lock"):
            return "lock file"
        return "binary" if patch is None else None

    result = plan_chunks(files, line_budget=100, skip=skip)
    assert [entry["path"] for chunk in result.chunks for entry in chunk.files] == ["app.py"]
    assert [(s.path, s.reason) for s in result.skipped] == [
        ("poetry.lock", "lock file"),
        ("logo.png", "binary"),
    ]


def test_skip_predicate_may_answer_true() -> None:
    result = plan_chunks(
        [FileChange("gen.py", additions=1, patch="@@ -1 +1 @@\n+x")], skip=lambda p, _: True
    )
    assert result.chunks == () and result.skipped[0].reason == "skipped"


def test_the_assemble_classifier_plugs_in() -> None:
    assemble = pytest.importorskip("bot.review.assemble")
    files = [
        FileChange("package-lock.json", additions=900, patch=_patch([(1, 4)])),
        FileChange("src/app.py", additions=2, deletions=2, patch=_patch([(1, 4)])),
    ]
    result = plan_chunks(files, skip=assemble.classify_skipped_file)
    assert [s.path for s in result.skipped] == ["package-lock.json"]
    assert result.total_lines == 4


@given(
    st.lists(st.integers(min_value=0, max_value=900), min_size=1, max_size=60),
    st.integers(min_value=1, max_value=500),
    st.one_of(st.none(), st.integers(min_value=1, max_value=200)),
)
def test_chunking_keeps_every_line_once_and_respects_the_budget(
    file_lines: list[int], budget: int, first_budget: int | None
) -> None:
    result = plan_chunks(_counted(file_lines), line_budget=budget, first_budget=first_budget)
    assert result.total_lines == sum(file_lines)
    assert all(chunk.lines <= budget for chunk in result.chunks)
    small_first = first_budget is not None and first_budget < budget < sum(file_lines)
    if small_first:
        assert result.chunks[0].lines <= first_budget
    per_file: dict[int, int] = {}
    parts: dict[int, list[tuple[int, int]]] = {}
    previous = -1
    for chunk in result.chunks:
        assert chunk.lines == sum(entry["lines"] for entry in chunk.files)
        for entry in chunk.files:
            assert entry["index"] >= previous
            previous = entry["index"]
            per_file[entry["index"]] = per_file.get(entry["index"], 0) + entry["lines"]
            if "part" in entry:
                parts.setdefault(entry["index"], []).append((entry["part"], entry["parts"]))
    assert per_file == dict(enumerate(file_lines))
    for numbers in parts.values():
        assert numbers == [(n, len(numbers)) for n in range(1, len(numbers) + 1)]
    # greedy packing: two neighbours never fit together in one chunk
    for position, (left, right) in enumerate(zip(result.chunks, result.chunks[1:], strict=False)):
        limit = first_budget if small_first and position == 0 else budget
        assert left.lines + right.files[0]["lines"] > limit


def test_a_multi_chunk_review_starts_with_a_small_chunk() -> None:
    result = plan_chunks(_counted([300, 250]), line_budget=400, first_budget=100)
    assert [chunk.lines for chunk in result.chunks] == [100, 200, 250]
    assert _counts(result.chunks[0].files[0]) == {"index": 0, "lines": 100, "part": 1, "parts": 2}
    assert _counts(result.chunks[1].files[0]) == {"index": 0, "lines": 200, "part": 2, "parts": 2}
    # a review that fits one chunk stays one call
    assert len(plan_chunks(_counted([150, 200]), line_budget=400, first_budget=100).chunks) == 1
    whole = plan_chunks(_counted([300, 250]), line_budget=400, first_budget=None)
    assert [chunk.lines for chunk in whole.chunks] == [300, 250]


def test_the_small_first_chunk_cuts_a_patch_by_hunks() -> None:
    patch = _patch([(1, 60), (100, 60), (200, 60)])
    files = [FileChange("big.py", additions=90, deletions=90, patch=patch)]
    result = plan_chunks(files, line_budget=150, first_budget=60)
    assert [chunk.lines for chunk in result.chunks] == [60, 120]
    entries = [entry for chunk in result.chunks for entry in chunk.files]
    assert [(entry["part"], entry["parts"]) for entry in entries] == [(1, 3), (2, 3), (3, 3)]
    starts = [entry["patch"].splitlines()[0].split(" ")[1] for entry in entries]
    assert starts == ["-1,31", "-100,31", "-200,31"]
    assert sum(count_changed_lines(entry["patch"]) for entry in entries) == 180


@given(
    st.lists(st.tuples(st.integers(1, 500), st.integers(1, 120)), min_size=1, max_size=8),
    st.integers(min_value=5, max_value=200),
)
def test_patch_split_keeps_all_changed_lines(hunks: list[tuple[int, int]], budget: int) -> None:
    patch = _patch(hunks)
    total = count_changed_lines(patch)
    result = plan_chunks([FileChange("f.py", patch=patch)], line_budget=budget)
    assert result.total_lines == total
    assert all(chunk.lines <= budget for chunk in result.chunks)
    pieces = [entry["patch"] for chunk in result.chunks for entry in chunk.files]
    assert sum(count_changed_lines(piece) for piece in pieces) == total
    assert all(piece.startswith("@@") for piece in pieces)


# --- halving a chunk the model refused whole ------------------------------------------------


def _entries(patches: list[str]) -> list[dict[str, object]]:
    return [
        {"index": i, "path": f"f{i}.py", "lines": count_changed_lines(p), "patch": p}
        for i, p in enumerate(patches)
    ]


@given(st.lists(st.integers(1, 40), min_size=2, max_size=8))
def test_halving_files_keeps_every_file_once_in_order_and_both_halves_non_empty(
    sizes: list[int],
) -> None:
    files = _entries([_patch([(1, size)]) for size in sizes])
    halves = halve_chunk(files)
    assert halves is not None
    first, second = halves
    assert first and second and [*first, *second] == files
    # The cut is the first one that reaches half the lines: no earlier cut would.
    total = sum(sizes)
    assert sum(sizes[: len(first)]) * 2 >= total or len(second) == 1
    assert len(first) == 1 or sum(sizes[: len(first) - 1]) * 2 < total


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 30)), min_size=1, max_size=5))
def test_halving_one_file_splits_its_changed_lines_with_correct_headers(
    hunks: list[tuple[int, int]],
) -> None:
    starts, position = [], 1
    for gap, changed in hunks:  # hunks in order, apart
        position += gap + changed * 2
        starts.append((position, changed))
    patch = _patch(starts)
    changed = count_changed_lines(patch)
    halves = halve_chunk(_entries([patch]))
    if changed < 2:
        assert halves is None
        return
    assert halves is not None
    [first], [second] = halves
    head, tail = str(first["patch"]), str(second["patch"])
    assert count_changed_lines(head) + count_changed_lines(tail) == changed
    assert (
        count_changed_lines(head) == first["lines"] and count_changed_lines(tail) == second["lines"]
    )
    assert 0 < count_changed_lines(head) <= -(-changed // 2)
    # Together the halves hold the whole's lines, each with the numbers it has in the file.
    lines = [line for part in (head, tail) for h in parse_hunks(part) for line in h.lines]
    assert lines == [line for h in parse_hunks(patch) for line in h.lines]


def test_a_lone_changed_line_cannot_be_halved() -> None:
    assert halve_chunk(_entries([_patch([(1, 1)])])) is None
    assert halve_chunk([]) is None
