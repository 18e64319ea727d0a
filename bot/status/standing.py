"""Where every live review stands (place, start, end): one function for the check run, `/review
status` and the dashboard.

The status publisher estimates with what its process knows (the dispatcher's slots and learnt
service estimator, the factors the ETA learnt of its misses) and keeps that model in
`eta_model` each pass; any other process reads it back and runs the same `standings` over the
same queue, so the three say the same place and ETA.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from bot.model import LEVELS, Level
from bot.queue.connector import Connector
from bot.queue.sql import status as sql
from bot.sched.mlfq import MlfqSettings, ServiceEstimator
from bot.status.calibrate import Calibration
from bot.status.eta import Arrivals, Capacity, Estimate, estimate_queue
from bot.status.load import ARRIVALS_WINDOW_S, LiveCalls, arrivals_of, job_load

MODEL_NAME = "status"


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
    )


async def fetch_live_rows(connector: Connector) -> list[Any]:
    """Every live job with its calls and its last written status."""
    return await connector.fetch_all(sql.SELECT_LIVE_JOBS)


async def fetch_arrivals(
    connector: Connector, *, estimator: ServiceEstimator, now: datetime
) -> Arrivals | None:
    """The stream of reviews of the last ARRIVALS_WINDOW_S, as the ETA expects more of it."""
    params = {"since": now - timedelta(seconds=ARRIVALS_WINDOW_S), "now": now}
    rows = await connector.fetch_all(sql.SELECT_RECENT_ARRIVALS, params)
    recent = [(Level(row.level), None if row.lines is None else int(row.lines)) for row in rows]
    return arrivals_of(recent, estimator=estimator)


def estimate_rows(
    rows: Sequence[Any],
    *,
    capacity: Capacity,
    estimator: ServiceEstimator,
    now: datetime,
    arrivals: Arrivals | None = None,
    calibration: Calibration | None = None,
) -> dict[int, Estimate]:
    """Place, start and end of every live job in `rows`: the dry run's (with the work expected
    to arrive meanwhile, `arrivals`), scaled by what the ETA learnt of its misses per level
    (`calibration`) when given."""
    loads = [job_load(live_calls(row), estimator=estimator, now=now) for row in rows]
    estimates = estimate_queue(loads, capacity, arrivals)
    if calibration is None:
        return estimates
    return {job_id: calibrated(estimate, calibration) for job_id, estimate in estimates.items()}


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


def model_to_json(model: EtaModel) -> dict[str, Any]:
    """The model as `eta_model.model` keeps it."""
    return {
        "slots": model.capacity.slots,
        "speed": model.capacity.speed,
        "mlfq": asdict(model.capacity.mlfq),
        "estimator": asdict(model.estimator),
        "factors": {str(level): model.calibration.factor(level) for level in LEVELS},
    }


def model_from_json(stored: Mapping[str, Any]) -> EtaModel:
    """A model back from `eta_model.model`; raises ValueError/KeyError/TypeError if malformed."""
    mlfq = dict(stored["mlfq"])
    mlfq["weights"] = tuple(mlfq["weights"])
    mlfq["quantum_s"] = tuple(mlfq["quantum_s"])
    capacity = Capacity(
        slots=int(stored["slots"]), mlfq=MlfqSettings(**mlfq), speed=float(stored["speed"])
    )
    estimator = ServiceEstimator(
        **{key: float(value) for key, value in stored["estimator"].items()}
    )
    factors = {Level.parse(name): float(value) for name, value in stored["factors"].items()}
    return EtaModel(capacity, estimator, Calibration(factors))


@dataclass(frozen=True, slots=True)
class Standings:
    """Every live review's estimate, and the queue rows it was made from."""

    rows: Sequence[Any]
    raw: Mapping[int, Estimate]  # the dry run's own (what the ETA learns from)
    estimates: Mapping[int, Estimate]  # as shown: scaled by the learnt factors


async def standings(connector: Connector, model: EtaModel, *, now: datetime) -> Standings:
    """Place, start and end of every live review, as its status says them."""
    rows = await fetch_live_rows(connector)
    arrivals = await fetch_arrivals(connector, estimator=model.estimator, now=now)
    raw = estimate_rows(
        rows, capacity=model.capacity, estimator=model.estimator, now=now, arrivals=arrivals
    )
    shown = {job_id: calibrated(estimate, model.calibration) for job_id, estimate in raw.items()}
    return Standings(rows, raw, shown)


async def save_model(connector: Connector, model: EtaModel, *, now: datetime) -> None:
    """Keep the model the publisher estimates with, for every other process."""
    await connector.write(
        sql.UPSERT_ETA_MODEL,
        {"name": MODEL_NAME, "model": json.dumps(model_to_json(model)), "now": now},
    )


async def load_model(connector: Connector, *, fallback: EtaModel) -> EtaModel:
    """The publisher's model, or `fallback` while none was kept (or it cannot be read)."""
    stored = await connector.fetch_value(sql.SELECT_ETA_MODEL, {"name": MODEL_NAME})
    if not isinstance(stored, dict):
        return fallback
    try:
        return model_from_json(stored)
    except (KeyError, TypeError, ValueError):
        return fallback


async def read_standings(connector: Connector, *, now: datetime, fallback: EtaModel) -> Standings:
    """Where every live review stands, with the publisher's model (`fallback` before one)."""
    return await standings(connector, await load_model(connector, fallback=fallback), now=now)


__all__ = [
    "EtaModel",
    "Standings",
    "calibrated",
    "estimate_rows",
    "fetch_arrivals",
    "fetch_live_rows",
    "live_calls",
    "load_model",
    "model_from_json",
    "model_to_json",
    "read_standings",
    "save_model",
    "standings",
]
