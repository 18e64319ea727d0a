"""The dispatcher's learned cost model kept with the store: read at start and every
maintenance pass (other processes' reviews), added to as this process's reviews finish."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from bot.queue.store import CostRow, QueueStore
from bot.sched.cost import (
    COST_SCOPES,
    TALLY_FIELDS,
    CostKey,
    CostModel,
    CostTally,
    MeasuredCost,
    ReviewFeatures,
    TallyChange,
    chunk_file_lines,
    review_tallies,
)
from bot.sched.mlfq import ServiceEstimator

# A pull request's last review is remembered this long after it finished.
PULL_MEMORY = timedelta(days=30)
# How many of the last reviews the estimate's error is kept for.
ERRORS_KEPT = 2000


def model_from_rows(rows: Iterable[CostRow], base: CostModel | None = None) -> CostModel:
    """A model of the stored sums (rows of an unknown scope are left out)."""
    tallies: dict[CostKey, CostTally] = {}
    for row in rows:
        scope = next((known for known in COST_SCOPES if known == row.scope), None)
        if scope is None:
            continue
        tallies[CostKey(scope, row.name)] = CostTally(
            *(float(row.sums.get(name, 0.0)) for name in TALLY_FIELDS)
        )
    return CostModel(tallies=tallies, prior_reviews=(base or CostModel()).prior_reviews)


def rows_of(changes: Sequence[TallyChange]) -> tuple[list[CostRow], list[CostRow]]:
    """(rows to add, rows to set) for the store."""
    added: list[CostRow] = []
    replaced: list[CostRow] = []
    for change in changes:
        sums = dict(zip(TALLY_FIELDS, change.tally.as_tuple(), strict=True))
        (replaced if change.replace else added).append(
            CostRow(scope=change.key.scope, name=change.key.name, sums=sums)
        )
    return added, replaced


class CostBook:
    """The learned cost model of one process, in step with the store's sums."""

    def __init__(self, store: QueueStore, model: CostModel | None = None) -> None:
        self.store = store
        self.model = model or CostModel()
        self.learned = 0  # reviews this process learnt from
        # |predicted - measured| / measured engine seconds of the last reviews finished here.
        self.errors: deque[float] = deque(maxlen=ERRORS_KEPT)

    def median_error(self) -> float | None:
        """Median absolute percentage error of the last reviews' estimates (None: none yet)."""
        return statistics.median(self.errors) if self.errors else None

    async def load(self, now: datetime) -> CostModel:
        """Read every process's sums; returns the model now in use."""
        rows = await self.store.cost_rows(since=now - PULL_MEMORY)
        self.model = model_from_rows(rows, self.model)
        return self.model

    async def learn(
        self,
        job_id: int,
        now: datetime,
        fallback: ServiceEstimator,
        *,
        predicted_work_s: float | None = None,
        learn: bool = True,
    ) -> bool:
        """Add a finished job's measured cost to its groups (unless `learn` is off) and count
        the error of its `predicted_work_s`; False when it ran no chunk."""
        cost = await self.store.job_cost(job_id)
        if cost is None or cost.chunks <= 0:
            return False
        if predicted_work_s is not None and cost.engine_s > 0:
            predicted = cost.chunks * fallback.overhead_s + predicted_work_s
            self.errors.append(abs(predicted - cost.engine_s) / cost.engine_s)
        if not learn:
            return False
        features = ReviewFeatures.of(
            forge=cost.forge,
            repo=cost.repo,
            number=cost.number,
            files=chunk_file_lines(cost.chunk_files),
        )
        measured = MeasuredCost(
            chunks=cost.chunks,
            engine_s=cost.engine_s,
            prompt_tokens=cost.prompt_tokens,
            completion_tokens=cost.completion_tokens,
        )
        changes = review_tallies(features, measured, fallback)
        if not changes:
            return False
        added, replaced = rows_of(changes)
        await self.store.add_costs(added, replaced, now=now)
        self.model = self.model.with_tallies(changes)
        self.learned += 1
        return True

    async def forget_old(self, now: datetime) -> int:
        """Drop pull requests' last reviews older than PULL_MEMORY; returns how many."""
        return await self.store.forget_old_pull_costs(before=now - PULL_MEMORY)
