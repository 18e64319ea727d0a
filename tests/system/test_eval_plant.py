"""Planting: mutants as diffs of the fixture code base, deterministic for a seed."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.diff import parse_hunks
from bot.eval.catalogue import CATALOGUE, python_parser
from bot.eval.plant import Mutant, SourceFile, plant_mutants, unified_patch
from bot.eval.sources import read_sources
from bot.eval.syntax import grammar_of, parser_for

REPO = Path(__file__).resolve().parents[1] / "data" / "eval_repo"


@pytest.fixture(scope="module")
def files() -> list[SourceFile]:
    return read_sources(REPO)


def new_file_lines(mutant: Mutant) -> dict[int, tuple[str, str]]:
    """new-file line -> (kind, text) of the lines the mutant's patch shows."""
    return {
        line.new_line: (line.kind, line.text)
        for hunk in parse_hunks(mutant.patch)
        for line in hunk.lines
        if line.new_line is not None
    }


def rebuild(original: str, patch: str) -> str:
    """Apply a hunks-only unified diff to the original text."""
    old = original.split("\n")
    out: list[str] = []
    position = 0
    for hunk in parse_hunks(patch):
        out.extend(old[position : hunk.old_start - 1])
        position = hunk.old_start - 1
        for line in hunk.lines:
            if line.kind in (" ", "-"):
                assert old[position] == line.text
                position += 1
            if line.kind in (" ", "+"):
                out.append(line.text)
    out.extend(old[position:])
    return "\n".join(out)


def test_the_fixture_has_a_site_for_every_pattern(files: list[SourceFile]) -> None:
    mutants = plant_mutants(files, count=20, seed=1)
    counts = Counter(mutant.pattern for mutant in mutants)
    assert counts == {pattern.name: 2 for pattern in CATALOGUE}
    # Past the sites of the rarest patterns, the others take their turns.
    assert len(plant_mutants(files, count=60, seed=1)) == 60


def test_each_mutant_is_a_diff_with_its_bug_and_a_benign_change(files: list[SourceFile]) -> None:
    by_path = {file.path: file.text for file in files}
    parser = python_parser()
    for mutant in plant_mutants(files, count=30, seed=7):
        shown = new_file_lines(mutant)
        assert shown[mutant.first_line][1] == mutant.quote, mutant
        mutated = rebuild(by_path[mutant.path], mutant.patch)
        assert mutated.split("\n")[mutant.first_line - 1] == mutant.quote
        assert not parser.parse(mutated.encode()).root_node.has_error
        assert mutant.distractor_line is not None
        kind, text = shown[mutant.distractor_line]
        assert kind == "+" and text.strip().startswith("# ")
        assert abs(mutant.distractor_line - mutant.first_line) > 1
        assert mutant.additions == sum(
            line.kind == "+" for hunk in parse_hunks(mutant.patch) for line in hunk.lines
        )


def test_planting_is_deterministic_for_a_seed(files: list[SourceFile]) -> None:
    first = plant_mutants(files, count=20, seed=5)
    assert plant_mutants(list(reversed(files)), count=20, seed=5) == first
    assert plant_mutants(files, count=20, seed=6) != first


def test_files_are_used_once_while_they_last(files: list[SourceFile]) -> None:
    # Every file but the package's __init__ has a wrong_variable site.
    mutants = plant_mutants(files, count=4, seed=2, patterns=["wrong_variable"])
    assert len({mutant.path for mutant in mutants}) == 4
    assert len(plant_mutants(files, count=8, seed=2, patterns=["wrong_variable"])) == 8


def test_rejected_mutants_are_replaced_and_bad_arguments_refused(
    files: list[SourceFile],
) -> None:
    mutants = plant_mutants(
        files, count=10, seed=1, accept=lambda path, _: not path.endswith("store.py")
    )
    assert len(mutants) == 10 and all(not m.path.endswith("store.py") for m in mutants)
    only = plant_mutants(files, count=3, seed=1, patterns=["dropped_await"])
    assert {mutant.pattern for mutant in only} == {"dropped_await"}
    with pytest.raises(ValueError, match="unknown pattern"):
        plant_mutants(files, count=3, seed=1, patterns=["typo"])
    with pytest.raises(ValueError, match="at least 1"):
        plant_mutants(files, count=0, seed=1)


def test_a_pattern_without_sites_gives_its_turn_away() -> None:
    code = SourceFile("a.py", "def f(a, b):\n    x = 1\n    y = 2\n    return a < b\n")
    mutants = plant_mutants([code], count=5, seed=1)
    # Four sites in all: `<`, a return before `y = 2`, and `a` or `b` read as the other.
    assert Counter(mutant.pattern for mutant in mutants) == {
        "off_by_one": 1,
        "early_return": 1,
        "wrong_variable": 2,
    }


def test_unified_patch_splits_on_newlines_only() -> None:
    patch, additions, deletions = unified_patch("a\fb\nc\n", "a\fb\nd\n")
    assert (additions, deletions) == (1, 1)
    assert patch.split("\n") == ["@@ -1,3 +1,3 @@", " a\fb", "-c", "+d", " "]


@settings(max_examples=15)
@given(
    seed=st.integers(min_value=0, max_value=10_000), count=st.integers(min_value=1, max_value=25)
)
def test_any_seed_plants_bugs_on_the_lines_it_names(seed: int, count: int) -> None:
    files = read_sources(REPO)
    by_path = {file.path: file.text for file in files}
    parser = python_parser()
    mutants = plant_mutants(files, count=count, seed=seed)
    assert len(mutants) == count
    for mutant in mutants:
        mutated = rebuild(by_path[mutant.path], mutant.patch)
        assert mutated == mutant.head_text
        assert mutated.split("\n")[mutant.first_line - 1] == mutant.quote
        assert not parser.parse(mutated.encode()).root_node.has_error


def test_sources_are_tracked_python_files_or_a_walk_without_environments(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "crlf.py").write_bytes(b"x = 1\r\n")
    (tmp_path / "pkg" / "latin.py").write_bytes(b"x = '\xe9'\n")
    (tmp_path / "pkg" / "empty.py").write_text("\n")
    for skipped in (".venv/lib", "node_modules/x", "pkg/__pycache__"):
        (tmp_path / skipped).mkdir(parents=True)
        (tmp_path / skipped / "b.py").write_text("y = 2\n")
    assert [file.path for file in read_sources(tmp_path)] == ["pkg/a.py"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "pkg/a.py", ".venv/lib/b.py"], check=True)
    assert [file.path for file in read_sources(tmp_path)] == [".venv/lib/b.py", "pkg/a.py"]


def test_javascript_and_typescript_mutants_rebuild_and_parse() -> None:
    files = read_sources(REPO.parent / "eval_repo_js")
    by_path = {file.path: file.text for file in files}
    mutants = plant_mutants(files, count=20, seed=2)
    assert len(mutants) == 20
    for mutant in mutants:
        mutated = rebuild(by_path[mutant.path], mutant.patch)
        assert mutated == mutant.head_text
        assert mutated.split("\n")[mutant.first_line - 1] == mutant.quote
        grammar = grammar_of(mutant.path)
        assert grammar is not None
        assert not parser_for(grammar).parse(mutated.encode()).root_node.has_error
        assert mutant.distractor_line is not None
        assert new_file_lines(mutant)[mutant.distractor_line][1].strip().startswith("// ")
