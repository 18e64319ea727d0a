"""Where every live review stands (place, start, end): one function for the check run, `/review
status` and the dashboard.

The status publisher estimates with what its process knows (the dispatcher's slots and learnt
service estimator, the factors the ETA learnt of its misses) and keeps that model in
`eta_model` each pass; any other process reads it back and runs the same `standings` over the
same queue, so the three say the same place and ETA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from bot.budget.decide import BudgetLimits
from bot.budget.ledger import DEFAULT_LIMITS
from bot.budget.model import posting_waits
from bot.model import LEVELS, Level
from bot.queue.status import StatusRecords
from bot.review.chunking import DEFAULT_FIRST_BUDGET, DEFAULT_LINE_BUDGET
from bot.sched.mlfq import MlfqSettings, ServiceEstimator
from bot.status.calibrate import Calibration
from bot.status.eta import Arrivals, Capacity, Estimate, estimate_queue
from bot.status.load import ARRIVALS_WINDOW_S, LiveCalls, arrivals_of, job_load

MODEL_NAME = "status"
# A posting wait shorter than this is within the ETA's own error (a fifth of the turnaround
# or so) and is left out: an ETA moves when the forge's write budget binds, not on every
# second between two writes.
BINDING_WAIT_S = 10.0


def live_calls(row: Any) -> LiveCalls:
    """A live-jobs row as the ETA's loader takes it."""
    request_lines = None
    if row.additions is not None and row.deletions is not None:
        request_lines = int(row.additions) + int(row.deletions)
    return LiveCalls(
        job_id=int(row.id),
        level=Level(row.level),
        started=bool(row.started),
        planned=bool(row.planned),
        total_lines=int(row.total_lines or 0),
        request_lines=request_lines,
        queued_ranks=tuple(row.queued_ranks or ()),
        queued_lines=tuple(row.queued_lines or ()),
        running_lines=tuple(row.running_lines or ()),
        running_started=tuple(row.running_started or ()),
        done_lines=int(row.done_lines or 0),
        done_calls=int(row.done_calls or 0),
        done_gpu_s=float(row.done_gpu_s or 0.0),
        waits_for=tuple(int(job_id) for job_id in row.waits_for or ()),
    )


async def fetch_arrivals(
    records: StatusRecords, *, estimator: ServiceEstimator, now: datetime, capacity: Capacity
) -> Arrivals | None:
    """The stream of reviews of the last ARRIVALS_WINDOW_S, as the ETA expects more of it
    (each review cut into calls as `capacity` says the planner cuts)."""
    since = now - timedelta(seconds=ARRIVALS_WINDOW_S)
    rows = await records.recent_arrivals(since=since, now=now)
    recent = [(Level(row.level), None if row.lines is None else int(row.lines)) for row in rows]
    return arrivals_of(
        recent,
        estimator=estimator,
        line_budget=capacity.line_budget,
        first_budget=capacity.first_budget,
    )


def estimate_rows(
    rows: Sequence[Any],
    *,
    capacity: Capacity,
    estimator: ServiceEstimator,
    now: datetime,
    arrivals: Arrivals | None = None,
) -> dict[int, Estimate]:
    """Place, start and end of every live job in `rows`: the dry run's, with the work
    expected to arrive meanwhile (`arrivals`); `standings` scales them by what the ETA learnt."""
    loads = [
        job_load(
            live_calls(row),
            estimator=estimator,
            now=now,
            line_budget=capacity.line_budget,
            first_budget=capacity.first_budget,
        )
        for row in rows
    ]
    return estimate_queue(loads, capacity, arrivals)


def calibrated(estimate: Estimate, calibration: Calibration) -> Estimate:
    """An estimate with its start and end scaled by its level's factor."""
    factor = calibration.factor(estimate.level)
    return replace(
        estimate, start_in_s=estimate.start_in_s * factor, finish_in_s=estimate.finish_in_s * factor
    )


@dataclass(frozen=True, slots=True)
class EtaModel:
    """What the ETA is computed with."""

    capacity: Capacity
    estimator: ServiceEstimator = field(default_factory=ServiceEstimator.with_prior)
    calibration: Calibration = field(default_factory=Calibration)
    # Each forge's write budget: a review is on the PR when its write goes out, not when its
    # last chunk ends.
    budget: Mapping[str, BudgetLimits] = field(default_factory=lambda: dict(DEFAULT_LIMITS))


def model_to_json(model: EtaModel) -> dict[str, Any]:
    """The model as `eta_model.model` keeps it."""
    return {
        "slots": model.capacity.slots,
        "speed": model.capacity.speed,
        "line_budget": model.capacity.line_budget,
        "first_budget": model.capacity.first_budget,
        "mlfq": asdict(model.capacity.mlfq),
        "estimator": asdict(model.estimator),
        "factors": {str(level): model.calibration.factor(level) for level in LEVELS},
        "budget": {forge: asdict(limits) for forge, limits in model.budget.items()},
    }


def model_from_json(stored: Mapping[str, Any]) -> EtaModel:
    """A model back from `eta_model.model`; raises ValueError/KeyError/TypeError if malformed."""
    mlfq = dict(stored["mlfq"])
    mlfq["weights"] = tuple(mlfq["weights"])
    if "backlog_weights" in mlfq:  # a model kept before there were backlog shares has none
        mlfq["backlog_weights"] = tuple(mlfq["backlog_weights"])
    mlfq["quantum_s"] = tuple(mlfq["quantum_s"])
    # A model kept before it knew the planner's budgets reads back with the defaults.
    first_budget = stored.get("first_budget", DEFAULT_FIRST_BUDGET)
    capacity = Capacity(
        slots=int(stored["slots"]),
        mlfq=MlfqSettings(**mlfq),
        speed=float(stored["speed"]),
        line_budget=int(stored.get("line_budget", DEFAULT_LINE_BUDGET)),
        first_budget=None if first_budget is None else int(first_budget),
    )
    estimator = ServiceEstimator(
        **{key: float(value) for key, value in stored["estimator"].items()}
    )
    factors = {Level.parse(name): float(value) for name, value in stored["factors"].items()}
    budget = dict(DEFAULT_LIMITS)
    for forge, limits in (stored.get("budget") or {}).items():  # a model kept before budgets
        fields = dict(limits)
        fields["value_reserve"] = tuple(fields["value_reserve"])
        fields["level_reserve"] = tuple(fields["level_reserve"])
        budget[str(forge)] = BudgetLimits(**fields)
    return EtaModel(capacity, estimator, Calibration(factors), budget)


@dataclass(frozen=True, slots=True)
class Standings:
    """Every live review's estimate, and the queue rows it was made from."""

    rows: Sequence[Any]
    raw: Mapping[int, Estimate]  # the dry run's own (what the ETA learns from)
    estimates: Mapping[int, Estimate]  # as shown: scaled by the learnt factors


async def standings(
    records: StatusRecords, model: EtaModel, *, now: datetime, rows: Sequence[Any] | None = None
) -> Standings:
    """Place, start and end of every live review, as its status says them (`rows`: the live
    jobs when already read). A model with no write budget adds no posting wait."""
    if rows is None:
        rows = await records.live_jobs()
    arrivals = await fetch_arrivals(
        records, estimator=model.estimator, now=now, capacity=model.capacity
    )
    raw = estimate_rows(
        rows, capacity=model.capacity, estimator=model.estimator, now=now, arrivals=arrivals
    )
    shown = {job_id: calibrated(estimate, model.calibration) for job_id, estimate in raw.items()}
    if not model.budget:
        return Standings(rows, raw, shown)
    since = now - timedelta(seconds=max(limits.horizon_s for limits in model.budget.values()))
    writes = await records.recent_writes(since=since)
    spent: dict[str, list[float]] = {}
    for write in writes:
        spent.setdefault(str(write.budget_key), []).append((write.spent_at - now).total_seconds())
    # The same wait in the promise the ETA learns from: its misses are then the queue's own.
    waits = binding_waits(rows, shown, spent, budget=model.budget)
    return Standings(rows, waited(raw, waits), waited(shown, waits))


def budget_key_of(row: Any, known: Sequence[str]) -> str:
    """The write budget a live job's review is posted from, as `forge_writes` names it: its
    GitHub App installation's, else its forge's token's (the one the writes name)."""
    if row.forge == "github" and row.installation_id is not None:
        return f"github:installation:{int(row.installation_id)}"
    tokens = sorted(key for key in known if key.startswith(f"{row.forge}:token:"))
    return tokens[0] if len(tokens) == 1 else f"{row.forge}:token"


def binding_waits(
    rows: Sequence[Any],
    estimates: Mapping[int, Estimate],
    spent: Mapping[str, Sequence[float]],
    *,
    budget: Mapping[str, BudgetLimits],
) -> dict[int, float]:
    """How long each live review waits, once its last chunk ends, for its forge's write
    budget to post it (`spent`: each budget's writes of its windows, seconds from now), where
    that wait binds (BINDING_WAIT_S or more); the reviews of one budget take its slots in the
    order they end."""
    groups: dict[str, list[tuple[int, int, float]]] = {}
    forges: dict[str, str] = {}
    for row in rows:
        estimate = estimates.get(int(row.id))
        if estimate is None or str(row.forge) not in budget:
            continue
        key = budget_key_of(row, list(spent))
        forges[key] = str(row.forge)
        groups.setdefault(key, []).append(
            (estimate.job_id, int(estimate.level), estimate.finish_in_s)
        )
    waits: dict[int, float] = {}
    for key, finishes in groups.items():
        for job_id, wait in posting_waits(
            finishes, spent.get(key, ()), budget[forges[key]]
        ).items():
            if wait >= BINDING_WAIT_S:
                waits[job_id] = wait
    return waits


def waited(estimates: Mapping[int, Estimate], waits: Mapping[int, float]) -> dict[int, Estimate]:
    """Estimates whose end is moved by their posting wait."""
    return {
        job_id: replace(estimate, finish_in_s=estimate.finish_in_s + waits[job_id])
        if job_id in waits
        else estimate
        for job_id, estimate in estimates.items()
    }


async def save_model(records: StatusRecords, model: EtaModel, *, now: datetime) -> None:
    """Keep the model the publisher estimates with, for every other process."""
    await records.save_eta_model(name=MODEL_NAME, model=model_to_json(model), now=now)


async def load_model(records: StatusRecords, *, fallback: EtaModel) -> EtaModel:
    """The publisher's model, or `fallback` while none was kept (or it cannot be read)."""
    stored = await records.eta_model(name=MODEL_NAME)
    if not isinstance(stored, dict):
        return fallback
    try:
        return model_from_json(stored)
    except (KeyError, TypeError, ValueError):
        return fallback


async def read_standings(records: StatusRecords, *, now: datetime, fallback: EtaModel) -> Standings:
    """Where every live review stands, with the publisher's model (`fallback` before one)."""
    return await standings(records, await load_model(records, fallback=fallback), now=now)


__all__ = [
    "BINDING_WAIT_S",
    "EtaModel",
    "Standings",
    "binding_waits",
    "budget_key_of",
    "calibrated",
    "estimate_rows",
    "fetch_arrivals",
    "live_calls",
    "load_model",
    "model_from_json",
    "model_to_json",
    "read_standings",
    "save_model",
    "standings",
    "waited",
]
