"""Quiet decisions, pure: what is new, what was said, what is resolved, and the summary text."""

from __future__ import annotations

import pytest

from bot.commands.parse import parse_commands
from bot.increment import UNCHANGED, level_note, narrow_by_compare, narrow_by_versions
from bot.model import FileChange
from bot.queue.findings import StoredFinding
from bot.review.assemble import SkippedFile
from bot.review.fingerprint import FingerprintedFinding, fingerprint_findings
from bot.review.living_summary import (
    SUMMARY_MARKER,
    ListedFinding,
    ReviewedCommit,
    SummaryFacts,
    render_living_summary,
)
from bot.review.parse import Finding
from bot.review.quiet_plan import QuietSettings, decide_quiet_review

PATCH = "\n".join(
    [
        "@@ -1,2 +1,6 @@",
        " def handle(event):",
        "+    print(event)",
        "+    # TODO remove",
        '+    token = "hunter2"',
        "+    eval(event)",
        " ",
    ]
)
PATCHES = {"app/h.py": PATCH}


def found(line: int, severity: str, body: str) -> Finding:
    return Finding(path="app/h.py", line=line, side="RIGHT", severity=severity, body=body)


FINDINGS = (
    found(2, "info", "Debug output left in."),
    found(3, "minor", "A TODO is left."),
    found(4, "critical", "A credential is hard-coded."),
    found(5, "critical", "eval is unsafe."),
)


def review() -> tuple[FingerprintedFinding, ...]:
    return fingerprint_findings(FINDINGS, PATCHES)


def stored(item: FingerprintedFinding, *, state: str = "open", job: int = 1) -> StoredFinding:
    finding = item.finding
    return StoredFinding(
        fingerprint=item.fingerprint,
        path=finding.path,
        line=finding.line,
        side=finding.side,
        severity=finding.severity,
        body=finding.body,
        anchor_text=item.anchor_text,
        state=state,  # type: ignore[arg-type]
        first_job_id=job,
    )


def bodies(items: tuple[FingerprintedFinding, ...]) -> list[str]:
    return [item.finding.body for item in items]


def test_a_first_review_posts_everything_inline() -> None:
    decision = decide_quiet_review(review(), [], PATCHES)
    assert len(decision.inline) == 4 and decision.repeated == () and decision.resolved == ()
    assert decision.open_count == 4 and decision.posts_anything


def test_what_was_said_and_is_still_open_is_not_said_again() -> None:
    earlier = [stored(item) for item in review()[:2]]
    decision = decide_quiet_review(review(), earlier, PATCHES)
    assert bodies(decision.inline) == ["A credential is hard-coded.", "eval is unsafe."]
    assert bodies(decision.repeated) == ["Debug output left in.", "A TODO is left."]
    assert decision.open_count == 4


def test_a_finding_whose_neighbour_changed_is_still_the_same_finding() -> None:
    earlier = [stored(item) for item in review()]
    without_todo = PATCH.replace("+    # TODO remove\n", "").replace("+1,6", "+1,5")
    now = fingerprint_findings(
        (
            found(2, "info", "Debug output left in."),
            found(3, "critical", "A credential is hard-coded."),
        ),
        {"app/h.py": without_todo},
    )
    assert now[0].fingerprint != review()[0].fingerprint  # its neighbours changed
    decision = decide_quiet_review(now, earlier, {"app/h.py": without_todo})
    assert decision.inline == () and len(decision.repeated) == 2
    assert sorted(item.body for item in decision.resolved) == ["A TODO is left."]
    assert [item.body for item in decision.still_open] == [
        "Debug output left in.",
        "A credential is hard-coded.",
        "eval is unsafe.",
    ]


def test_findings_in_a_file_that_left_the_pull_request_are_resolved() -> None:
    earlier = [stored(item) for item in review()]
    decision = decide_quiet_review((), earlier, {"app/other.py": "@@ -1 +1 @@\n-a\n+b"})
    assert len(decision.resolved) == 4 and decision.open_count == 0


def test_a_resolved_finding_whose_code_came_back_is_new_again() -> None:
    earlier = [stored(review()[1], state="resolved")]
    decision = decide_quiet_review(review(), earlier, PATCHES)
    assert "A TODO is left." in bodies(decision.inline)


def test_the_severity_floor_and_the_cap_move_findings_to_the_summary() -> None:
    settings = QuietSettings(min_inline_severity="minor", inline_cap=2)
    decision = decide_quiet_review(review(), [], PATCHES, settings=settings)
    # critical twice and minor once pass the floor; the cap keeps the two most severe.
    assert bodies(decision.inline) == ["A credential is hard-coded.", "eval is unsafe."]
    assert bodies(decision.summary_only) == ["A TODO is left.", "Debug output left in."]
    assert decision.over_cap == 1


def test_a_retry_of_the_same_job_decides_as_the_first_try() -> None:
    recorded_by_this_job = [stored(item, job=7) for item in review()]
    decision = decide_quiet_review(review(), recorded_by_this_job, PATCHES, job_id=7)
    assert len(decision.inline) == 4 and decision.repeated == ()


def test_settings_refuse_an_unknown_severity_and_a_negative_cap() -> None:
    with pytest.raises(ValueError, match="min_inline_severity"):
        QuietSettings(min_inline_severity="loud")
    with pytest.raises(ValueError, match="inline_cap"):
        QuietSettings(inline_cap=-1)


def test_the_living_summary_says_what_was_covered_how_findings_stand_and_why() -> None:
    new = ListedFinding("app/h.py", 5, "critical", "eval is unsafe.")
    quiet = ListedFinding("app/h.py", 2, "info", "Debug output.", "summary only: below minor")
    old = ListedFinding("app/h.py", 4, "critical", "A credential is hard-coded.")
    gone = ListedFinding("app/h.py", 3, "minor", "A TODO is left.")
    text = render_living_summary(
        SummaryFacts(
            head_sha="abcdef1234567890",
            mode="incremental",
            mode_reason="since `1234567890ab` (1 file changed)",
            level="P1",
            level_reasons=["a three-line change (rule small)"],
            new=[new, quiet],
            resolved=[gone],
            open_findings=[new, quiet, old],
            repeated=1,
            skipped=[
                SkippedFile("package-lock.json", "lock_file"),
                *(SkippedFile(f"app/m{i}.py", UNCHANGED) for i in range(40)),
            ],
            commits=[
                ReviewedCommit("1234567890abcdef", "full"),
                ReviewedCommit("abcdef12", "incremental"),
            ],
            job_id=9,
        )
    )
    assert text.startswith(SUMMARY_MARKER)
    assert "commit `abcdef123456`, incremental, since `1234567890ab` (1 file changed)" in text
    assert "**Level:** P1: a three-line change (rule small)." in text
    assert "3 open · 2 new · 1 resolved · 1 found again and not repeated" in text
    resolved_part = text.split("#### Resolved")[1].split("####")[0]
    assert "A TODO is left." in resolved_part
    assert "_(summary only: below minor)_" in text
    still_open = text.split("#### Still open from earlier reviews")[1].split("####")[0]
    assert "A credential" in still_open and "eval" not in still_open
    assert "`package-lock.json`: lock file" in text
    assert "- 40 files unchanged since the last review" in text and "app/m7.py" not in text
    assert "`1234567890ab` (full), `abcdef12` (incremental)" in text


TWO_HUNKS = "\n".join(
    [
        "@@ -1,2 +1,3 @@",
        " a = 1",
        "+b = 2",
        " c = 3",
        "@@ -40,2 +41,3 @@",
        " x = 1",
        "+y = 2",
        " z = 3",
    ]
)
PR_FILES = [
    FileChange("app/a.py", 2, 0, TWO_HUNKS),
    FileChange("app/b.py", 1, 0, "@@ -1 +1,2 @@\n q = 1\n+r = 2"),
]


def test_a_compare_keeps_only_the_pull_requests_hunks_it_touched() -> None:
    # The compare changed line 42 of app/a.py (the second hunk) and a file outside the PR.
    increment = narrow_by_compare(
        PR_FILES,
        since="1" * 40,
        status="ahead",
        compared={"app/a.py": "@@ -41,2 +41,2 @@\n x = 1\n-y = 1\n+y = 2", "docs/x.md": None},
    )
    assert increment.mode == "incremental"
    [narrowed] = increment.files
    assert narrowed.path == "app/a.py" and narrowed.additions == 1
    assert (
        narrowed.patch is not None and "+y = 2" in narrowed.patch and "b = 2" not in narrowed.patch
    )
    assert increment.unchanged == ("app/b.py",)
    assert "1 file changed since the last review" in increment.reason


def test_rewritten_history_means_a_full_review_that_says_why() -> None:
    for increment in (
        narrow_by_compare(PR_FILES, since="a" * 40, status="diverged", compared={}),
        narrow_by_versions(PR_FILES, since="a" * 40, ancestor=False, previous={}),
    ):
        assert increment.mode == "full" and increment.files == tuple(PR_FILES)
        assert "history was rewritten" in increment.reason and "aaaaaaaaaaaa" in increment.reason
        assert level_note(increment) is None


def test_a_diff_version_keeps_the_hunks_the_old_version_did_not_show() -> None:
    old_a = TWO_HUNKS.replace("+y = 2", "+y = 9")
    increment = narrow_by_versions(
        PR_FILES,
        since="b" * 40,
        ancestor=True,
        previous={"app/a.py": old_a, "app/b.py": PR_FILES[1].patch},
    )
    [narrowed] = increment.files
    assert narrowed.patch == "\n".join(TWO_HUNKS.splitlines()[4:])
    assert increment.unchanged == ("app/b.py",)
    note = level_note(increment)
    assert note is not None and "1 file(s), 1 changed line(s)" in note


def test_review_full_is_a_review_command_with_its_argument() -> None:
    [command] = parse_commands("/review full").commands
    assert (command.verb, command.argument) == ("review", "full")
    [plain] = parse_commands("/review").commands
    assert (plain.verb, plain.argument) == ("review", None)
    assert parse_commands("/review fully").errors
