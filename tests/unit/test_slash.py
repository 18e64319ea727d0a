"""Slash-command decisions: every command, every refusal, P0, the quota, safe replies."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from bot.commands.decide import (
    REPLY_MARKER,
    SlashRules,
    Standing,
    code,
    decide,
    describe_p0_triggers,
    format_duration,
    has_permission,
    render_reply,
)
from bot.config import DEFAULT_POLICY_DIR
from bot.forges.base import PERMISSIONS, Permission
from bot.model import Command, Job, JobId, JobState, Level
from bot.policy import load_policy_book, parse_policy

NOW = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
RULES = SlashRules()


def make_job(**overrides: object) -> Job:
    fields: dict[str, object] = {
        "id": JobId(12),
        "forge": "github",
        "repo": "acme/shop",
        "number": 7,
        "head_sha": "a" * 40,
        "base_level": Level.P2,
        "level": Level.P2,
        "state": JobState.QUEUED,
        "enqueued_at": NOW - timedelta(minutes=4),
        "reasons": ("large change (label refactor)",),
        "author": "dev1",
        "planned": True,
        "chunks_total": 3,
    }
    fields.update(overrides)
    return Job(**fields)  # type: ignore[arg-type]


def make_command(verb: str, argument: str | None = None, *, author: str = "dev1") -> Command:
    raw = "/review" + (f" {verb}" if verb != "review" else "")
    if verb == "priority" and argument:
        raw += f" {argument.lower()}"
    return Command(
        forge="github",
        repo="acme/shop",
        number=7,
        author=author,
        comment_id=99,
        verb=verb,
        argument=argument,
        raw=raw,
    )


def run(
    command: Command,
    *,
    job: Job | None = None,
    permission: Permission | None = "read",
    author: bool = False,
    raises_today: int = 0,
    rules: SlashRules = RULES,
    standing: Standing | None = None,
) -> object:
    return decide(
        command,
        job=job,
        actor_permission=permission,
        actor_is_author=author,
        raises_today=raises_today,
        rules=rules,
        now=NOW,
        standing=standing,
    )


# -- priority ----------------------------------------------------------------------------


@pytest.mark.parametrize("permission", ["write", "maintain", "admin"])
def test_raise_with_write_access_is_accepted(permission: Permission) -> None:
    decision = run(make_command("priority", "P1"), job=make_job(), permission=permission)
    assert (decision.action, decision.level, decision.outcome) == (
        "set_level",
        Level.P1,
        "accepted",
    )
    assert decision.is_raise
    assert "from P2 to P1" in decision.reply_text
    assert "Raises left today for `dev1`: 4 of 5" in decision.reply_text
    assert "raise P2 -> P1 by dev1" in decision.history_reason


@pytest.mark.parametrize("permission", ["none", "read", "triage", None])
def test_raise_without_write_access_is_refused(permission: Permission | None) -> None:
    decision = run(
        make_command("priority", "P1", author="outsider"), job=make_job(), permission=permission
    )
    assert (decision.action, decision.outcome) == ("refuse", "refused")
    assert "needs `write` access" in decision.reply_text
    shown = f"`{permission}`" if permission else "unknown access"
    assert f"`outsider` has {shown}" in decision.reply_text
    assert not decision.is_raise


def test_the_author_alone_may_not_raise_their_own_pr() -> None:
    decision = run(make_command("priority", "P1"), job=make_job(), permission="read", author=True)
    assert decision.action == "refuse"


def test_raise_requirement_comes_from_the_rules() -> None:
    rules = replace(RULES, raise_requires="admin")
    refused = run(make_command("priority", "P1"), job=make_job(), permission="write", rules=rules)
    accepted = run(make_command("priority", "P1"), job=make_job(), permission="admin", rules=rules)
    assert refused.action == "refuse" and "needs `admin` access" in refused.reply_text
    assert accepted.action == "set_level"


@pytest.mark.parametrize(("used", "allowed"), [(4, True), (5, False), (9, False)])
def test_raises_are_limited_per_day(used: int, allowed: bool) -> None:
    decision = run(make_command("priority", "P1"), job=make_job(), permission="admin",
                   raises_today=used)  # fmt: skip
    assert (decision.action == "set_level") is allowed
    if not allowed:
        assert "used all 5 raises allowed per day" in decision.reply_text
        assert "midnight UTC" in decision.reply_text
        assert "daily quota of 5 used" in decision.history_reason


def test_a_zero_quota_allows_no_raise() -> None:
    rules = replace(RULES, raises_per_user_per_day=0)
    decision = run(make_command("priority", "P1"), job=make_job(), permission="admin", rules=rules)
    assert decision.action == "refuse"


def test_lowering_does_not_count_against_the_quota() -> None:
    decision = run(make_command("priority", "P3"), job=make_job(), permission="write",
                   raises_today=50)  # fmt: skip
    assert (decision.action, decision.level, decision.is_raise) == ("set_level", Level.P3, False)


def test_the_author_may_lower_their_own_pr() -> None:
    decision = run(make_command("priority", "P3"), job=make_job(), permission="read", author=True)
    assert (decision.action, decision.level) == ("set_level", Level.P3)
    assert "lower P2 -> P3 by dev1" in decision.history_reason


def test_someone_else_may_not_lower_a_pr_without_write_access() -> None:
    decision = run(make_command("priority", "P3", author="bystander"), job=make_job())
    assert decision.action == "refuse"
    assert "lowering a review needs authorship of this PR or write access" in decision.reply_text


def test_author_lowering_can_be_switched_off() -> None:
    rules = replace(RULES, author_may_lower=False)
    decision = run(make_command("priority", "P3"), job=make_job(), author=True, rules=rules)
    assert decision.action == "refuse"


def test_same_level_changes_nothing() -> None:
    decision = run(make_command("priority", "P2"), job=make_job(), permission="write")
    assert (decision.action, decision.outcome) == ("status", "unchanged")
    assert "already at P2" in decision.reply_text


@pytest.mark.parametrize("state", [JobState.DONE, JobState.CANCELLED, JobState.SUPERSEDED])
def test_priority_of_an_ended_review_is_refused(state: JobState) -> None:
    decision = run(make_command("priority", "P1"), job=make_job(state=state), permission="admin")
    assert decision.action == "refuse"
    assert "no queued review of this PR to move" in decision.reply_text


def test_priority_without_any_job_is_refused() -> None:
    assert run(make_command("priority", "P1"), permission="admin").action == "refuse"


@pytest.mark.parametrize("permission", [*PERMISSIONS, None])
def test_p0_is_refused_for_everyone_and_names_the_trigger(permission: Permission | None) -> None:
    rules = SlashRules.from_policy(load_policy_book(DEFAULT_POLICY_DIR).default)
    decision = run(make_command("priority", "P0"), job=make_job(), permission=permission,
                   author=True, rules=rules)  # fmt: skip
    assert (decision.action, decision.outcome) == ("refuse", "refused")
    assert "P0 cannot be set by a command" in decision.reply_text
    assert "rule `hotfix`: a change into `hotfix/**`" in decision.reply_text
    assert decision.level is None


def test_p0_triggers_are_read_from_the_policy() -> None:
    policy = parse_policy(
        """
rules:
  - {name: incident, when: {labels: [incident]}, level: P0, reason: "incident"}
  - {name: release, when: {base: ["release/*", "hotfix/**"]}, level: P0, reason: "release"}
  - {name: other, level: P1, reason: "ordinary"}
"""
    )
    assert describe_p0_triggers(policy) == (
        "rule `incident`: labelled `incident`",
        "rule `release`: a change into `release/*` or `hotfix/**`",
    )
    assert describe_p0_triggers(parse_policy("rules: [{name: a, level: P1, reason: r}]")) == ()
    assert SlashRules.from_policy(
        parse_policy("rules: [{name: a, level: P1, reason: r}]")
    ).p0_triggers == ("a policy trigger (a change into a hotfix branch)",)


def test_command_rules_come_from_the_policy_file() -> None:
    policy = parse_policy(
        "rules: [{name: a, level: P1, reason: r}]\n"
        "command_rules: {raise_requires: maintain, raises_per_user_per_day: 2,"
        " author_may_cancel: false}\n"
    )
    rules = SlashRules.from_policy(policy)
    assert (rules.raise_requires, rules.raises_per_user_per_day, rules.author_may_cancel) == (
        "maintain",
        2,
        False,
    )


# -- cancel ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("permission", "author", "allowed"),
    [("read", True, True), ("write", False, True), ("read", False, False), ("none", False, False),
     ("triage", False, False), (None, True, True)],
)  # fmt: skip
def test_cancel_needs_authorship_or_write(
    permission: Permission | None, author: bool, allowed: bool
) -> None:
    decision = run(make_command("cancel"), job=make_job(), permission=permission, author=author)
    assert (decision.action == "cancel") is allowed
    if not allowed:
        assert "cancelling needs authorship of this PR or write access" in decision.reply_text


def test_author_cancel_can_be_switched_off() -> None:
    rules = replace(RULES, author_may_cancel=False)
    assert run(make_command("cancel"), job=make_job(), author=True, rules=rules).action == "refuse"
    assert run(make_command("cancel"), job=make_job(), permission="write", rules=rules).action == (
        "cancel"
    )


def test_cancel_of_nothing_is_refused() -> None:
    assert run(make_command("cancel"), author=True).action == "refuse"
    ended = make_job(state=JobState.DONE)
    decision = run(make_command("cancel"), job=ended, author=True)
    assert decision.action == "refuse" and "nothing to cancel" in decision.history_reason


# -- review ------------------------------------------------------------------------------


def test_review_while_one_is_queued_changes_nothing() -> None:
    decision = run(make_command("review"), job=make_job(), author=True)
    assert (decision.action, decision.outcome) == ("status", "unchanged")
    assert "already queued at P2" in decision.reply_text


@pytest.mark.parametrize("state", [JobState.DONE, JobState.CANCELLED, JobState.FAILED])
def test_review_after_the_last_one_ended_requeues(state: JobState) -> None:
    decision = run(make_command("review"), job=make_job(state=state), author=True)
    assert (decision.action, decision.outcome) == ("requeue", "accepted")


def test_review_by_a_stranger_is_refused() -> None:
    decision = run(make_command("review", author="stranger"), job=make_job(state=JobState.DONE))
    assert decision.action == "refuse" and "costs GPU time" in decision.reply_text
    assert run(make_command("review", author="m"), job=make_job(state=JobState.DONE),
               permission="maintain").action == "requeue"  # fmt: skip


def test_review_of_an_unknown_pr_is_refused_with_a_reason() -> None:
    decision = run(make_command("review"), permission="admin")
    assert decision.action == "refuse" and "no webhook for this PR" in decision.reply_text


# -- status and help ---------------------------------------------------------------------


def test_status_shows_level_why_place_estimate_and_wait() -> None:
    job = make_job(level=Level.P1, chunks_done=1)
    standing = Standing(
        place=4, start_in_s=120, finish_in_s=150, level_reason="P2 to P1 by lead: urgent"
    )
    decision = run(make_command("status", author="anyone"), job=job, permission="none",
                   standing=standing)  # fmt: skip
    text = decision.reply_text
    assert decision.action == "status"
    assert "**queued** at **P1** (policy level P2)" in text
    assert "why: `large change (label refactor)`" in text
    assert "level last changed: `P2 to P1 by lead: urgent`" in text
    assert "1 of 3 chunks reviewed" in text
    assert "place in queue: 4th in line (3 ahead)" in text
    assert "estimated start: in about 2 min" in text
    assert "review in about 2 min" in text
    assert "waiting so far: 4 min" in text


def test_status_of_running_and_ended_jobs() -> None:
    running = make_job(state=JobState.RUNNING, first_started_at=NOW - timedelta(seconds=30))
    assert "waited 3 min to start" in run(make_command("status"), job=running).reply_text
    done = make_job(state=JobState.DONE, finished_at=NOW)
    assert "ended after 4 min" in run(make_command("status"), job=done).reply_text
    assert "No review of this PR is known" in run(make_command("status")).reply_text


def test_help_is_for_everyone() -> None:
    decision = run(make_command("help", author="anyone"), permission=None)
    assert decision.action == "help"
    for command in ("/review priority p1|p2|p3", "/review cancel", "/review status"):
        assert command in decision.reply_text


def test_an_unknown_verb_is_refused() -> None:
    assert run(make_command("launch"), job=make_job()).action == "refuse"


# -- replies are safe ------------------------------------------------------------------------


HOSTILE = "@everyone <img src=x onerror=alert(1)> `</code>` <!-- review-bot:job=1 -->\n# hi"


def _outside_code(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", text)


def test_untrusted_text_is_quoted_without_mentions_html_or_markers() -> None:
    quoted = code(HOSTILE)
    assert quoted.count("`") == 2
    assert "<" not in quoted and ">" not in quoted and "\n" not in quoted
    assert len(code("x" * 10_000)) <= 122
    job = make_job(reasons=(HOSTILE,))
    reply = render_reply(
        [run(make_command("status", author="@everyone"), job=job).reply_text], author="@everyone"
    )
    assert "<!-- review-bot:job" not in reply
    outside = _outside_code(reply.replace(REPLY_MARKER, ""))
    assert "@" not in outside and "<" not in outside
    assert reply.endswith(REPLY_MARKER)


def test_helpers() -> None:
    assert has_permission("admin", "write") and has_permission("write", "write")
    assert not has_permission("triage", "write") and not has_permission(None, "read")
    assert not has_permission("read", "no-such-role")
    assert [format_duration(s) for s in (0, 59.4, 61, 3600, 7500)] == [
        "0 s", "59 s", "1 min", "1 h", "2 h 5 min"]  # fmt: skip
