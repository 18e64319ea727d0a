"""Chunks follow the backlog: larger while work queues beyond the workers, short otherwise."""

from __future__ import annotations

from bot.model import Level
from bot.review.chunking import DEFAULT_LINE_BUDGET
from bot.review.planner import PlanningSettings
from bot.sched.backlog import DEFAULT_BACKLOG_FACTOR, is_backlogged


def test_more_than_two_ready_chunks_per_slot_over_all_levels_is_a_backlog() -> None:
    assert DEFAULT_BACKLOG_FACTOR == 2.0
    ready = {Level.P0: 0, Level.P1: 10, Level.P2: 5, Level.P3: 1}  # 16 over 8 slots
    assert not is_backlogged(ready, 8, DEFAULT_BACKLOG_FACTOR)
    assert is_backlogged({**ready, Level.P3: 2}, 8, DEFAULT_BACKLOG_FACTOR)
    # Counts in level order, as the scheduler's load keeps them, read the same.
    assert not is_backlogged([0, 10, 5, 1], 8, DEFAULT_BACKLOG_FACTOR)
    assert is_backlogged([0, 10, 5, 2], 8, DEFAULT_BACKLOG_FACTOR)


def test_no_slot_counts_as_one() -> None:
    assert is_backlogged({Level.P1: 3}, 0, 2.0)
    assert not is_backlogged({Level.P1: 2}, 0, 2.0)


def test_planning_cuts_larger_continuations_only_while_work_queues() -> None:
    settings = PlanningSettings()
    assert settings.line_budget == DEFAULT_LINE_BUDGET
    for level in (Level.P1, Level.P2, Level.P3):
        assert settings.for_backlog(False).line_budget_for(level) == DEFAULT_LINE_BUDGET
        assert settings.for_backlog(True).line_budget_for(level) == 800
    assert settings.for_backlog(True).first_budget == settings.first_budget  # still starts short


def test_a_hotfix_keeps_the_ordinary_chunks_while_work_queues() -> None:
    backlog = PlanningSettings().for_backlog(True)
    assert backlog.line_budget_for(Level.P0) == DEFAULT_LINE_BUDGET


def test_a_backlog_budget_never_shrinks_the_chunks() -> None:
    settings = PlanningSettings(line_budget=1000, backlog_line_budget=800)
    assert settings.for_backlog(True).line_budget_for(Level.P1) == 1000
    off = PlanningSettings(backlog_line_budget=None).for_backlog(True)
    assert off.line_budget_for(Level.P1) == DEFAULT_LINE_BUDGET


def test_one_call_per_review_policies_have_no_backlog_budget() -> None:
    for policy in ("fifo", "priority"):
        settings = PlanningSettings.for_policy(policy)
        assert settings.backlog_line_budget is None
        assert settings.for_backlog(True).line_budget_for(Level.P1) == settings.line_budget
