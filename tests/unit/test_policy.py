"""Priority policies: the default rules one by one, repository files, broken files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bot.config import DEFAULT_POLICY_DIR
from bot.errors import PolicyError
from bot.model import Level, ReviewRequest
from bot.policy import (
    NO_RULE_REASON,
    SIZE_PENDING_REASON,
    CommandRules,
    Policy,
    compile_glob,
    evaluate,
    load_policy_book,
    parse_policy,
)
from tests.support.factories import make_request


@pytest.fixture(scope="module")
def default() -> Policy:
    return load_policy_book(DEFAULT_POLICY_DIR).default


def decide(policy: Policy, **fields: object) -> tuple[Level, str | None, bool]:
    decision = evaluate(policy, make_request(**fields))
    return decision.level, decision.rule, decision.review


@pytest.mark.parametrize(
    ("fields", "level", "rule"),
    [
        ({}, Level.P1, "ordinary"),
        ({"base_ref": "hotfix/1.2.3"}, Level.P0, "hotfix"),
        ({"base_ref": "hotfix/2026/payments"}, Level.P0, "hotfix"),
        ({"base_ref": "hotfix/x", "action": "merged", "merged": True}, Level.P0, "hotfix"),
        ({"base_ref": "hotfix/x", "files_changed": 300, "labels": ("refactor",)}, Level.P0,
         "hotfix"),
        ({"base_ref": "hotfixes"}, Level.P1, "ordinary"),
        ({"base_ref": "release/hotfix/1"}, Level.P1, "ordinary"),
        ({"head_ref": "hotfix/1"}, Level.P1, "ordinary"),  # the target decides, not the source
        ({"files_changed": 40}, Level.P2, "many-files"),
        ({"files_changed": 39}, Level.P1, "ordinary"),
        ({"additions": 1500, "deletions": 500}, Level.P2, "many-lines"),
        ({"additions": 1500, "deletions": 499}, Level.P1, "ordinary"),
        ({"labels": ("refactor",)}, Level.P2, "refactor"),
        ({"labels": ("Refactor",)}, Level.P2, "refactor"),
        ({"author": "dependabot[bot]", "author_is_bot": True}, Level.P3, "bot-author"),
        ({"author_is_bot": True, "files_changed": 80}, Level.P3, "bot-author"),
        ({"labels": ("dependencies",)}, Level.P3, "dependencies"),
        ({"labels": ("bug", "dependencies")}, Level.P3, "dependencies"),
    ],
)  # fmt: skip
def test_default_rules(default: Policy, fields: dict[str, object], level: Level, rule: str) -> None:
    assert decide(default, **fields) == (level, rule, True)


def test_drafts_are_skipped_unless_labelled(default: Policy) -> None:
    assert decide(default, draft=True) == (Level.P3, "draft", False)
    assert decide(default, draft=True, base_ref="hotfix/9") == (Level.P3, "draft", False)
    assert decide(default, draft=True, labels=("review-draft",)) == (Level.P1, "ordinary", True)
    assert decide(default, draft=True, labels=("review-draft",), base_ref="hotfix/9")[0] is (
        Level.P0
    )


def test_merged_outside_hotfix_is_not_reviewed_again(default: Policy) -> None:
    assert decide(default, action="merged", merged=True) == (Level.P3, "merged", False)


def test_reasons_are_human_readable(default: Policy) -> None:
    decision = evaluate(default, make_request(base_ref="hotfix/1.2.3"))
    assert decision.reasons == ("change into hotfix branch hotfix/1.2.3",)
    decision = evaluate(default, make_request(files_changed=57))
    assert decision.reasons == ("large change: 57 files",)
    decision = evaluate(default, make_request(author="renovate", author_is_bot=True))
    assert decision.reasons == ("opened by the automation account renovate",)


def test_unknown_size_is_pending_and_re_evaluated(default: Policy) -> None:
    request = make_request(forge="gitlab", files_changed=None, additions=None, deletions=None)
    first = evaluate(default, request)
    assert (first.level, first.rule, first.size_pending) == (Level.P1, "ordinary", True)
    assert SIZE_PENDING_REASON in first.reasons
    sized = dataclasses.replace(request, files_changed=120, additions=9000, deletions=100)
    again = evaluate(default, sized)
    assert (again.level, again.rule, again.size_pending) == (Level.P2, "many-files", False)


def test_size_is_not_pending_when_an_earlier_rule_decides(default: Policy) -> None:
    request = make_request(base_ref="hotfix/3", files_changed=None, additions=None)
    decision = evaluate(default, request)
    assert (decision.level, decision.size_pending) == (Level.P0, False)
    decision = evaluate(default, make_request(labels=("refactor",), files_changed=None))
    assert (decision.level, decision.size_pending) == (Level.P2, False)


def test_command_rules_defaults(default: Policy) -> None:
    assert default.command_rules == CommandRules(
        raise_requires="write",
        author_may_lower=True,
        author_may_cancel=True,
        raises_per_user_per_day=5,
    )


def test_each_condition_alone() -> None:
    policy = parse_policy(
        """
rules:
  - {name: head, when: {head: "release-*"}, level: P2, reason: head}
  - {name: bot, when: {bot_author: true}, level: P3, reason: bot}
  - {name: action, when: {action: [labeled, unlabeled]}, level: P2, reason: "label {labels}"}
  - {name: without, when: {without_labels: [safe], labels: [risky]}, level: P0, reason: risky}
  - {name: lines, when: {lines_min: 1000, files_min: 2}, level: P3, reason: both sizes}
  - {name: merged, when: {merged: true}, review: false, reason: merged}
  - {name: draft, when: {draft: true}, level: P2, reason: draft}
"""
    )

    def rule(**fields: object) -> str | None:
        return evaluate(policy, make_request(**fields)).rule

    assert rule(head_ref="release-1") == "head"
    assert rule(head_ref="release-1/x") is None  # * stays within one segment
    assert rule(author_is_bot=True) == "bot"
    assert rule(action="labeled") == "action"
    assert evaluate(policy, make_request(action="labeled", labels=("a", "b"))).reasons == (
        "label a, b",
    )
    assert rule(labels=("risky",)) == "without"
    assert rule(labels=("risky", "safe")) is None
    assert rule(files_changed=2, additions=900, deletions=100) == "lines"
    assert rule(files_changed=1, additions=900, deletions=100) is None
    assert rule(files_changed=2, additions=900, deletions=99) is None
    assert rule(merged=True) == "merged"
    assert rule(draft=True) == "draft"
    fallback = evaluate(policy, make_request())
    assert (fallback.level, fallback.rule, fallback.reasons) == (Level.P1, None, (NO_RULE_REASON,))


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("hotfix/**", ["hotfix/1", "hotfix/a/b/c"], ["hotfix", "hotfixes/1", "x/hotfix/1"]),
        ("**/hotfix", ["hotfix", "a/hotfix", "a/b/hotfix"], ["hotfix/a"]),
        ("release-*", ["release-1", "release-"], ["release-1/x", "xrelease-1"]),
        ("v?.x", ["v1.x"], ["v10.x", "v/.x"]),
        ("rel[0-9]", ["rel3"], ["relx"]),
        ("rel[!0-9]", ["relx"], ["rel3"]),
        ("a.b", ["a.b"], ["axb"]),
    ],
)
def test_globs(pattern: str, matches: list[str], misses: list[str]) -> None:
    compiled = compile_glob(pattern)
    assert all(compiled.fullmatch(name) for name in matches)
    assert not any(compiled.fullmatch(name) for name in misses)


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("rules: [", 1, "bad YAML"),
        ("rules:\n  - name: a\n    level: P1\n   reason: x\n", 4, "bad YAML"),
        ("", 1, "empty"),
        ("rules: []\n", 1, "non-empty list"),
        ("version: 2\nrules: [{name: a, level: P1, reason: x}]\n", 1, "unsupported version"),
        ("rulez:\n  - {name: a}\n", 1, "unknown key 'rulez'"),
        ("rules:\n  - name: a\n    level: P1\n    reason: x\n    colour: red\n", 5,
         "unknown key 'colour'"),
        ("rules:\n  - name: a\n    level: P5\n    reason: x\n", 3, "bad level 'P5'"),
        ("rules:\n  - name: a\n    level: 1\n    reason: x\n", 3, "must be a string"),
        ("rules:\n  - name: a\n    level: '1'\n    reason: x\n", 3, "write it as P1"),
        ("rules:\n  - name: a\n    reason: x\n", 2, "needs `level`"),
        ("rules:\n  - name: a\n    level: P1\n", 2, "needs `reason`"),
        ("rules:\n  - name: a\n    level: P1\n    reason: x\n    when:\n      base: 'hot[fix'\n",
         6, "bad glob 'hot[fix'"),
        ("rules:\n  - name: a\n    level: P1\n    reason: x\n    when: {base: '***'}\n", 5,
         "bad glob"),
        ("rules:\n  - name: a\n    level: P1\n    reason: x\n    when:\n      files: 3\n", 6,
         "unknown key 'files'"),
        ("rules:\n  - name: a\n    level: P1\n    reason: x\n    when: {files_min: -1}\n", 5,
         "must not be negative"),
        ("rules:\n  - name: a\n    level: P1\n    reason: x\n    when: {draft: maybe}\n", 5,
         "true or false"),
        ("rules:\n  - name: a\n    level: P1\n    reason: x\n    when: {labels: [no]}\n", 5,
         "must be a string"),
        ("rules:\n  - name: a\n    level: P1\n    reason: '{nope}'\n", 4,
         "unknown placeholder {nope}"),
        ("rules:\n  - name: a\n    level: P1\n    reason: 'x {'\n", 4, "bad reason template"),
        ("rules:\n  - {name: a, level: P1, reason: x}\n  - {name: a, level: P2, reason: y}\n",
         3, "used twice"),
        ("rules:\n  - name: a\n    name: b\n    level: P1\n    reason: x\n", 3, "appears twice"),
        ("rules: [{name: a, level: P1, reason: x}]\ncommand_rules:\n  raise_requires: god\n", 3,
         "raise_requires must be one of"),
        ("rules: [{name: a, level: P1, reason: x}]\ncommand_rules:\n  quota: 3\n", 3,
         "unknown key 'quota'"),
    ],
)  # fmt: skip
def test_broken_policies_name_file_line_and_problem(text: str, line: int, fragment: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, source="policies/acme__web.yaml")
    message = str(caught.value)
    assert message.startswith(f"policies/acme__web.yaml:{line}: "), message
    assert fragment in message
    assert caught.value.line == line


def test_command_rules_are_parsed() -> None:
    policy = parse_policy(
        "rules: [{name: a, level: P1, reason: x}]\n"
        "command_rules: {raise_requires: maintain, author_may_lower: false,"
        " raises_per_user_per_day: 2}\n"
    )
    assert policy.command_rules == CommandRules(
        raise_requires="maintain", author_may_lower=False, raises_per_user_per_day=2
    )


def test_repository_policy_files(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text(
        (DEFAULT_POLICY_DIR / "default.yaml").read_text(encoding="utf-8")
    )
    (tmp_path / "Acme__Payments.yaml").write_text(
        "rules:\n  - {name: everything-urgent-ish, level: P2, reason: payments team}\n"
    )
    (tmp_path / "group__sub__project.yml").write_text(
        "rules:\n  - {name: sub, level: P3, reason: nested group}\n"
    )
    book = load_policy_book(tmp_path)
    request: ReviewRequest = make_request(repo="acme/payments")
    assert evaluate(book.policy_for(request.repo), request).rule == "everything-urgent-ish"
    assert book.policy_for("group/sub/project").rules[0].name == "sub"
    assert book.policy_for("acme/other").source.endswith("default.yaml")


def test_a_broken_repository_policy_stops_loading(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text("rules: [{name: a, level: P1, reason: x}]\n")
    (tmp_path / "acme__web.yaml").write_text("rules:\n  - {name: a, level: PX, reason: x}\n")
    with pytest.raises(PolicyError) as caught:
        load_policy_book(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'acme__web.yaml'}:2: ")


def test_a_policy_directory_without_default_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"default\.yaml not found"):
        load_policy_book(tmp_path)


def test_a_badly_named_repository_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text("rules: [{name: a, level: P1, reason: x}]\n")
    (tmp_path / "payments.yaml").write_text("rules: [{name: a, level: P1, reason: x}]\n")
    with pytest.raises(PolicyError, match=r"<owner>__<name>\.yaml"):
        load_policy_book(tmp_path)
