"""The replay's posting through one forge identity's write budget (`--forge-budget`).

The in-memory forge posts a review the moment its last chunk is done. With a budget, each
review's writes are played through the budget model (bot/budget/model.py) with the limits
of one GitHub installation or GitLab token: the first status when the review is queued, then
at the end the review, the first summary and the final state (as `bot serve` writes them,
news left out). The review counts as posted when its review write goes out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bot.budget.decide import BudgetLimits, WriteValue
from bot.budget.ledger import DEFAULT_LIMITS
from bot.budget.model import PlannedWrite, play_budget
from bot.model import LEVELS
from bot.sim.metrics import RequestOutcome

FORGE_BUDGETS = ("github", "gitlab")


def limits_for(forge: str) -> BudgetLimits:
    """The default limits of one identity of `forge`; raises ValueError for another name."""
    if forge not in FORGE_BUDGETS:
        raise ValueError(f"unknown forge budget {forge!r}: expected one of {FORGE_BUDGETS}")
    return DEFAULT_LIMITS[forge]


def planned_writes(outcomes: Sequence[RequestOutcome]) -> list[PlannedWrite]:
    """Each reviewed request's writes: first status, review, first summary, final state."""
    writes: list[PlannedWrite] = []
    for index, outcome in enumerate(outcomes):
        level = int(outcome.level)
        target = f"status:{index}"
        writes.append(PlannedWrite(WriteValue.FIRST_STATUS, level, outcome.arrival_s, index,
                                   target=target))  # fmt: skip
        if outcome.finished_s is None:
            continue
        done = outcome.finished_s
        writes.append(PlannedWrite(WriteValue.REVIEW, level, done, index))
        writes.append(PlannedWrite(WriteValue.FIRST_SUMMARY, level, done, index))
        writes.append(PlannedWrite(WriteValue.CHECK_COMPLETED, level, done, index, target=target))
    return writes


def through_budget(
    outcomes: Sequence[RequestOutcome], limits: BudgetLimits
) -> tuple[list[RequestOutcome], dict[str, Any]]:
    """The outcomes with each review posted when the budget let its review write out, and
    what the budget did (writes per review, posting delay per level)."""
    writes = planned_writes(outcomes)
    played = play_budget(writes, limits)
    posted: dict[int, float] = {}
    for write, moment in zip(writes, played, strict=True):
        if write.value == WriteValue.REVIEW and moment is not None:
            posted[write.job_id] = moment
    delayed = [
        replace(outcome, finished_s=posted.get(index)) if outcome.finished_s is not None
        else outcome
        for index, outcome in enumerate(outcomes)
    ]  # fmt: skip
    reviewed = sum(1 for outcome in outcomes if outcome.finished_s is not None)
    spent = sum(1 for moment in played if moment is not None)
    delay: dict[str, Any] = {}
    for level in LEVELS:
        waits = [
            posted[index] - outcome.finished_s
            for index, outcome in enumerate(outcomes)
            if outcome.level == level and outcome.finished_s is not None and index in posted
        ]
        if waits:
            ordered = sorted(waits)
            delay[str(level)] = {
                "n": len(waits),
                "median_s": round(statistics.median(ordered), 1),
                "p95_s": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
            }
    last = max((moment for moment in played if moment is not None), default=0.0)
    stats = {
        "per_minute": limits.per_minute,
        "per_hour": limits.per_hour,
        "writes": spent,
        "writes_per_review": round(spent / reviewed, 2) if reviewed else 0.0,
        "coalesced_or_dropped": len(writes) - spent,
        "never_posted": reviewed - len(posted),
        "posting_delay": delay,
        "last_write_s": round(last, 1),
    }
    return delayed, stats


__all__ = ["FORGE_BUDGETS", "limits_for", "planned_writes", "through_budget"]
