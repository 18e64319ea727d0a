"""Diff text is split on "\\n" alone: positions of real git diffs with unusual characters."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bot.diff import commentable_positions, extract_files, parse_hunks, split_lines
from bot.forges.base import count_patch_lines, parse_diff_lines
from bot.model import FileChange
from bot.review.assemble import classify_skipped_file
from bot.review.chunking import count_changed_lines, plan_chunks, split_hunks
from bot.review.prompts import build_messages

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git binary")

ODD = "x = 1\n\x0c\ny = 2\x0bz\nw\x1cq\x1dr\x1es\nu\x85v\ne\u2028f\u2029g\nlone\rcr\nend"
ODD_AFTER = (
    "x = 10\n\x0c\ny = 2\x0bz\nw\x1cq\x1dr\x1es\nu\x85v changed\ne\u2028f\u2029g\nlone\rcr\nend\n"
    "-- a SQL comment\n++ a counter\n--- not a file header\n"
)
CRLF = "".join(f"line {n}\r\n" for n in range(1, 30))
CRLF_AFTER = CRLF.replace("line 7\r\n", "line seven\r\n").replace("line 20\r\n", "")
LONG = "\n".join(f"def f{n}(): return {n}" for n in range(40))
LONG_AFTER = LONG.replace("return 17", "return 1700")

CASES = {
    "odd characters, no newline at the end before": (ODD, ODD_AFTER),
    "CRLF line ends": (CRLF, CRLF_AFTER),
    "newline at the end removed": (LONG + "\n", LONG_AFTER),
    "form feeds between functions": (
        "\x0c\n".join(f"def g{n}():\n    pass\n" for n in range(8)),
        "\x0c\n".join(f"def g{n}():\n    {'return 1' if n == 4 else 'pass'}\n" for n in range(8)),
    ),
}


def git_diff(tmp_path: Path, before: str, after: str, name: str = "f.py") -> tuple[str, int]:
    """The patch git writes for one file (as the forges show it: from the first @@) and git's
    own count of changed lines."""
    old, new = tmp_path / "a" / name, tmp_path / "b" / name
    old.parent.mkdir(parents=True, exist_ok=True)
    new.parent.mkdir(parents=True, exist_ok=True)
    old.write_bytes(before.encode())
    new.write_bytes(after.encode())
    run = ["git", "-c", "core.autocrlf=false", "diff", "--no-index", "--no-color"]
    patch = subprocess.run(
        [*run, str(old), str(new)], capture_output=True, check=False
    ).stdout.decode()
    stat = subprocess.run(
        [*run, "--numstat", str(old), str(new)], capture_output=True, check=False
    ).stdout.decode()
    added, removed = stat.split("\t")[:2]
    return patch[patch.index("@@") :], int(added) + int(removed)


@pytest.mark.parametrize("case", sorted(CASES))
def test_positions_name_the_real_lines(tmp_path: Path, case: str) -> None:
    before, after = CASES[case]
    patch, git_changed = git_diff(tmp_path, before, after)
    old_lines, new_lines = split_lines(before), split_lines(after)
    seen = 0
    for hunk in parse_hunks(patch):
        assert hunk.trusted_lines == hunk.lines  # git's headers match their bodies
        for line in hunk.lines:
            seen += 1
            if line.new_line is not None:
                assert new_lines[line.new_line - 1] == line.text
            if line.old_line is not None:
                assert old_lines[line.old_line - 1] == line.text
    assert seen > 0
    assert count_changed_lines(patch) == git_changed
    assert sum(count_patch_lines(patch)) == git_changed
    diff_lines = parse_diff_lines(patch)
    assert max(diff_lines.added | set(diff_lines.context), default=0) <= len(new_lines)
    assert max(diff_lines.removed | set(diff_lines.context.values()), default=0) <= len(old_lines)
    for _, side, number in commentable_positions([{"path": "f.py", "patch": patch}]):
        assert number <= len(new_lines if side == "RIGHT" else old_lines)
    # The chunker's pieces rebuild the same hunks.
    assert sum(count_changed_lines(piece) for piece in split_hunks(patch)) == git_changed


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_prompt_numbers_every_line_as_the_file_has_it(tmp_path: Path, case: str) -> None:
    before, after = CASES[case]
    patch, _ = git_diff(tmp_path, before, after)
    user = build_messages([{"path": "f.py", "patch": patch}])[1]["content"]
    body = user.split("```diff\n", 1)[1].split("\n```", 1)[0].split("\n")
    shown = [line for line in body if not line.startswith("@@")]
    diff = [line for hunk in parse_hunks(patch) for line in hunk.lines]
    assert len(shown) == len(diff)
    for text, line in zip(shown, diff, strict=True):
        number = line.old_line if line.kind == "-" else line.new_line
        assert text.startswith(f"{number} {line.kind}")
    # What a model reads back is the same diff, line for line.
    recovered = extract_files(user)[0].patch
    assert [(h.old_start, h.new_start, len(h.lines)) for h in parse_hunks(recovered)] == [
        (h.old_start, h.new_start, len(h.lines)) for h in parse_hunks(patch)
    ]


def test_changed_lines_starting_with_double_marks_count(tmp_path: Path) -> None:
    before = "select 1;\n"
    after = "-- the first query\nselect 1;\n++ counter\n--- ruler\n+++ plus\n"
    patch, git_changed = git_diff(tmp_path, before, after, name="q.sql")
    assert git_changed == 4
    assert count_changed_lines(patch) == 4
    assert plan_chunks([FileChange("q.sql", 4, 0, patch)]).chunks[0].lines == 4


def test_generated_and_minified_look_at_added_lines_only(tmp_path: Path) -> None:
    conf = "# conf.py autogenerated by sphinx-quickstart\n" + "".join(
        f"option_{n} = {n}\n" for n in range(10)
    )
    patch, _ = git_diff(tmp_path, conf, conf.replace("option_2 = 2", "option_2 = 20"))
    assert "autogenerated" in patch  # shown as an unchanged line of the hunk
    assert classify_skipped_file("docs/conf.py", patch) is None
    wide = "data = [" + "1, " * 500 + "]\n"
    patch, _ = git_diff(tmp_path, wide + "x = 1\n", wide + "x = 2\n")
    assert classify_skipped_file("x.py", patch) is None
    patch, _ = git_diff(tmp_path, "x = 1\n", "x = 1\n" + wide)
    assert classify_skipped_file("x.py", patch) == "minified"
    patch, _ = git_diff(tmp_path, "a = 1\n", "# Code generated by protoc. DO NOT EDIT.\na = 1\n")
    assert classify_skipped_file("x.py", patch) == "generated"


def test_deleted_files_are_not_sent_whole(tmp_path: Path) -> None:
    patch, changed = git_diff(tmp_path, "".join(f"old {n}\n" for n in range(300)), "")
    deleted = FileChange("gone.py", 0, changed, patch, status="removed")
    kept = FileChange("kept.py", 1, 0, "@@ -0,0 +1 @@\n+x = 1")
    result = plan_chunks([deleted, kept])
    assert [(item.path, item.reason) for item in result.skipped] == [("gone.py", "deleted")]
    assert [file["path"] for chunk in result.chunks for file in chunk.files] == ["kept.py"]


def test_split_lines_splits_on_newline_alone() -> None:
    assert split_lines("a\x0cb\x0bc\x1cd\x85e\u2028f\rg\r\nh\n") == [
        "a\x0cb\x0bc\x1cd\x85e\u2028f\rg",
        "h",
    ]
    assert split_lines("") == []
    assert split_lines("\n") == [""]
    assert split_lines("a\r\n\r\nb") == ["a", "", "b"]


def test_a_renamed_file_as_git_writes_it(tmp_path: Path) -> None:
    before = "def f():\n    return 1\n\x0c\ndef g():\n    return 2\n"
    after = before.replace("return 2", "return 3")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "old_name.py").write_text(before)
    (tmp_path / "b" / "new_name.py").write_text(after)
    patch = subprocess.run(
        ["git", "diff", "--no-index", "--no-color", "-M", "a", "b"],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    ).stdout.decode()
    assert "rename from a/old_name.py" in patch  # the preamble the forges leave out
    diff_lines = parse_diff_lines(patch)
    assert diff_lines.removed == {5} and diff_lines.added == {5}
    assert diff_lines.context == {2: 2, 3: 3, 4: 4}  # the form feed line is one line
    assert count_changed_lines(patch) == 2
