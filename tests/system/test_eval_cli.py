"""`bot eval` end to end, as a user runs it: a subprocess on the fixture code base."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "tests" / "data" / "eval_repo"
KEYS = {"recall", "exact_line_rate", "false_findings_per_pr", "summary_only_rate", "mutants"}


def run_eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot", "eval", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def eval_json(*args: str, repo: Path = REPO) -> dict[str, Any]:
    done = run_eval("--repo", str(repo), "--json", *args)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_null_model_finds_nothing_and_the_json_has_every_key() -> None:
    report = eval_json("--mutants", "20", "--seed", "2", "--llm", "null")
    assert KEYS | {"per_pattern"} <= set(report)
    assert report["mutants"] == 20 and report["recall"] == 0.0
    assert report["exact_line_rate"] is None and report["false_findings_per_pr"] == 0.0
    assert len(report["per_pattern"]) == 10
    for group in report["per_pattern"].values():
        assert set(group) >= KEYS and group["recall"] == 0.0
    assert report["tokens_per_review"]["median"] > 0


def without_timing(report: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in report.items() if key != "seconds_per_review"}


@pytest.fixture(scope="module")
def oracle_report() -> dict[str, Any]:
    return eval_json("--mutants", "30", "--seed", "11", "--llm", "oracle")


def test_oracle_runs_are_deterministic_for_a_seed(oracle_report: dict[str, Any]) -> None:
    again = eval_json("--mutants", "30", "--seed", "11", "--llm", "oracle")
    assert without_timing(again) == without_timing(oracle_report)
    other = eval_json("--mutants", "30", "--seed", "12", "--llm", "oracle")
    assert [r["path"] for r in other["reviews"]] != [r["path"] for r in oracle_report["reviews"]]


def test_the_oracle_is_found_on_its_line_however_it_names_it(
    oracle_report: dict[str, Any],
) -> None:
    assert oracle_report["recall"] >= 0.98
    assert oracle_report["exact_line_rate"] >= 0.99
    assert oracle_report["false_findings_per_pr"] <= 0.02
    modes = oracle_report["per_oracle_mode"]
    # The seed gives every way of naming a line at least one planted bug.
    assert set(modes) == {
        "right_line",
        "off_by_lines",
        "wrong_side",
        "quote_only",
        "dot_path",
        "hunk_relative",
    }
    assert modes["right_line"]["recall"] == 1.0 and modes["right_line"]["exact_line_rate"] == 1.0


def test_the_text_report_and_bad_input() -> None:
    done = run_eval("--repo", str(REPO), "--mutants", "10", "--llm", "oracle")
    assert done.returncode == 0, done.stderr
    assert "recall" in done.stdout and "swallowed_exception" in done.stdout
    missing = run_eval("--repo", str(REPO / "nope"), "--mutants", "5")
    assert missing.returncode == 2 and "not a directory" in missing.stderr
    zero = run_eval("--repo", str(REPO), "--mutants", "0")
    assert zero.returncode == 2 and "at least 1" in zero.stderr
    empty = run_eval("--repo", str(REPO / "inventory" / "__init__.py"))
    assert empty.returncode == 2


def test_javascript_and_typescript_code_is_planted_in_and_reviewed() -> None:
    report = eval_json(
        "--mutants",
        "24",
        "--seed",
        "3",
        "--llm",
        "oracle",
        repo=ROOT / "tests" / "data" / "eval_repo_js",
    )
    assert report["mutants"] == 24
    assert {review["path"].rsplit(".", 1)[1] for review in report["reviews"]} == {"ts", "js"}
    # Nine patterns have JavaScript finders; a with-block has no JavaScript counterpart.
    assert "resource_not_closed" not in report["per_pattern"]
    assert len(report["per_pattern"]) == 9
    assert report["recall"] >= 0.98 and report["exact_line_rate"] >= 0.99


def test_language_limits_where_bugs_are_planted() -> None:
    both = ROOT / "tests" / "data"
    only_js = eval_json("--mutants", "12", "--llm", "null", "--language", "javascript", repo=both)
    assert {r["path"].rsplit(".", 1)[1] for r in only_js["reviews"]} <= {"js", "ts"}
    only_py = eval_json("--mutants", "12", "--llm", "null", "--language", "python", repo=both)
    assert {r["path"].rsplit(".", 1)[1] for r in only_py["reviews"]} == {"py"}
