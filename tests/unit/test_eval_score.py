"""Scoring reviews of planted bugs, and the scripted models' answers."""

from __future__ import annotations

import json
from collections import Counter

from bot.eval.oracle import (
    MODE_WEIGHTS,
    NullBackend,
    OracleBackend,
    choose_mode,
    hunk_position,
    oracle_finding,
)
from bot.eval.plant import Mutant
from bot.eval.score import build_report, context_pairs, render_report, score_review
from bot.llm.base import LLMRequest

PATCH = "\n".join(
    [
        "@@ -10,4 +10,5 @@ def f(a, b):",
        "     x = 1",
        "+    # note",
        "     y = 2",
        "-    if a < b:",
        "+    if a <= b:",
        "         go()",
    ]
)
MUTANT = Mutant(
    id=3,
    pattern="off_by_one",
    path="pkg/mod.py",
    patch=PATCH,
    additions=2,
    deletions=1,
    first_line=13,
    last_line=13,
    quote="    if a <= b:",
    finding="Off-by-one.",
    distractor_line=11,
)


def score(inline: list[tuple[str, str, int]], summary_only: int = 0) -> dict[str, object]:
    return score_review(
        mutant_id=1,
        pattern="p",
        path="a.py",
        first_line=10,
        last_line=10,
        inline=inline,
        summary_only=summary_only,
    ).to_dict()


def test_a_finding_counts_on_the_planted_path_and_side_within_one_line() -> None:
    exact = score([("a.py", "RIGHT", 10)])
    assert exact["found"] is True and exact["exact"] is True and exact["false_findings"] == 0
    near = score([("a.py", "RIGHT", 11)])
    assert near["found"] is True and near["exact"] is False and near["false_findings"] == 0
    for missed in (("a.py", "RIGHT", 12), ("a.py", "LEFT", 10), ("b.py", "RIGHT", 10)):
        result = score([missed])
        assert result["found"] is False and result["false_findings"] == 1, missed
    # An unchanged line named on its old side is the same line of code.
    left = score_review(
        mutant_id=1,
        pattern="p",
        path="a.py",
        first_line=10,
        last_line=10,
        inline=[("a.py", "LEFT", 8), ("a.py", "LEFT", 9)],
        context={8: 10},
    ).to_dict()
    assert left["found"] is True and left["exact"] is True and left["false_findings"] == 1
    assert context_pairs(PATCH) == {10: 10, 11: 12, 13: 14}
    both = score([("a.py", "RIGHT", 9), ("a.py", "RIGHT", 10), ("a.py", "RIGHT", 30)])
    assert both["exact"] is True and both["false_findings"] == 1 and both["inline"] == 3


def test_the_report_has_overall_and_per_pattern_figures() -> None:
    scores = [
        score_review(
            mutant_id=i,
            pattern="a" if i < 4 else "b",
            path="x.py",
            first_line=5,
            last_line=5,
            inline=inline,
            summary_only=summary,
            prompt_tokens=100 * i,
            completion_tokens=10,
        )
        for i, (inline, summary) in enumerate(
            [
                ([("x.py", "RIGHT", 5)], 0),
                ([("x.py", "RIGHT", 6)], 0),
                ([], 1),
                ([("x.py", "RIGHT", 5), ("x.py", "RIGHT", 40)], 0),
                ([], 0),
            ]
        )
    ]
    report = build_report(scores, context={"seed": 4})
    assert {"recall", "exact_line_rate", "false_findings_per_pr", "summary_only_rate"} <= set(
        report
    )
    assert report["mutants"] == 5 and report["seed"] == 4
    assert report["recall"] == 0.6
    assert report["exact_line_rate"] == round(2 / 3, 4)
    assert report["false_findings_per_pr"] == 0.2
    assert report["summary_only_rate"] == 0.2  # 1 of 5 findings
    assert report["per_pattern"]["a"]["recall"] == 0.75
    assert report["per_pattern"]["b"] == {
        "mutants": 1,
        "recall": 0.0,
        "exact_line_rate": None,
        "false_findings_per_pr": 0.0,
        "summary_only_rate": 0.0,
        "summary_only": 0,
    }
    assert report["tokens_per_review"] == {"median": 210.0, "p95": 390.0}
    assert [item["found"] for item in report["reviews"]] == [True, True, False, True, False]
    text = render_report(report)
    assert "all" in text and "0.600" in text and "0.667" in text


def test_the_oracle_names_the_line_each_way_models_err() -> None:
    import random

    def finding(mode: str) -> dict[str, object]:
        return oracle_finding(MUTANT, mode, random.Random(1))  # type: ignore[arg-type]

    assert hunk_position(PATCH, 13) == 5
    assert finding("hunk_relative")["line"] == 5
    assert finding("wrong_side")["side"] == "LEFT" and finding("wrong_side")["line"] == 13
    assert "line" not in finding("quote_only") and finding("quote_only")["quote"] == "if a <= b:"
    assert finding("dot_path")["path"] == "./pkg/mod.py"
    off = finding("off_by_lines")["line"]
    assert isinstance(off, int) and 1 <= abs(off - 13) <= 5
    assert finding("right_line")["line"] == 13
    modes = Counter(choose_mode(7, mutant_id) for mutant_id in range(2000))
    assert set(modes) == set(MODE_WEIGHTS)
    assert all(abs(modes[m] / 2000 - w) < 0.04 for m, w in MODE_WEIGHTS.items())
    assert [choose_mode(7, i) for i in range(50)] == [choose_mode(7, i) for i in range(50)]


async def test_the_oracle_answers_only_for_its_mutant_and_null_never() -> None:
    oracle = OracleBackend([MUTANT], seed=1)
    shown = LLMRequest(
        messages=[{"role": "user", "content": f"File: {MUTANT.path}\n{PATCH}"}],
        metadata={"job_id": 3},
    )
    answer = json.loads((await oracle.complete(shown)).text)
    assert len(answer["findings"]) == 1 and answer["findings"][0]["body"] == "Off-by-one."
    other = LLMRequest(messages=[{"role": "user", "content": "x"}], metadata={"job_id": 3})
    assert json.loads((await oracle.complete(other)).text)["findings"] == []
    unknown = LLMRequest(messages=shown.messages, metadata={"job_id": 4})
    assert json.loads((await oracle.complete(unknown)).text)["findings"] == []
    null = NullBackend()
    assert json.loads((await null.complete(shown)).text)["findings"] == []
