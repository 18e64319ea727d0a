"""What finished reviews cost, per group: read and added to by every dispatcher."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.queue.base import StorePart
from bot.queue.connector import to_json
from bot.queue.schema import REVIEW_COST_SUMS
from bot.queue.sql import costs as costs_sql


@dataclass(frozen=True, slots=True)
class CostRow:
    """One group's sums (review_costs), by column name."""

    scope: str
    name: str
    sums: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobCost:
    """What a job's finished chunks covered and took."""

    forge: str
    repo: str
    number: int
    chunks: int
    engine_s: float
    prompt_tokens: int
    completion_tokens: int
    chunk_files: tuple[tuple[Mapping[str, Any], ...], ...]


def _rows_json(rows: Sequence[CostRow]) -> str:
    return to_json(
        [
            {
                "scope": row.scope,
                "name": row.name,
                **{name: float(row.sums.get(name, 0.0)) for name in REVIEW_COST_SUMS},
            }
            for row in rows
        ]
    )


class ReviewCosts(StorePart):
    """The learned cost estimate's tallies, and the measured cost of a finished job."""

    async def job_cost(self, job_id: int) -> JobCost | None:
        """A job's finished chunks summed (None: no such job)."""
        rows = await self.connector.fetch_all(costs_sql.SELECT_JOB_COST, {"job_id": job_id})
        if not rows:
            return None
        row = rows[0]
        return JobCost(
            forge=row.forge,
            repo=row.repo,
            number=int(row.number),
            chunks=int(row.chunks),
            engine_s=float(row.engine_s),
            prompt_tokens=int(row.prompt_tokens),
            completion_tokens=int(row.completion_tokens),
            chunk_files=tuple(tuple(files or ()) for files in row.files),
        )

    async def add_costs(
        self, added: Sequence[CostRow], replaced: Sequence[CostRow], *, now: datetime
    ) -> None:
        """Add `added` to their groups' sums and set `replaced` groups, in one transaction."""
        async with self.connector.transaction() as conn:
            if added:
                await conn.execute(costs_sql.ADD_COSTS, {"rows": _rows_json(added), "now": now})
            if replaced:
                await conn.execute(costs_sql.SET_COSTS, {"rows": _rows_json(replaced), "now": now})

    async def cost_rows(self, *, since: datetime) -> list[CostRow]:
        """Every group's sums (pull request groups only if updated since `since`)."""
        rows = await self.connector.fetch_all(costs_sql.SELECT_COSTS, {"since": since})
        return [
            CostRow(
                scope=row.scope,
                name=row.name,
                sums={name: float(getattr(row, name)) for name in REVIEW_COST_SUMS},
            )
            for row in rows
        ]

    async def forget_old_pull_costs(self, *, before: datetime) -> int:
        """Delete pull request groups not updated since `before`; returns how many."""
        async with self.connector.transaction() as conn:
            result = await conn.execute(costs_sql.DELETE_OLD_PULL_COSTS, {"before": before})
        return int(getattr(result, "rowcount", 0) or 0)
