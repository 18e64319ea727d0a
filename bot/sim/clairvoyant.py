"""The clairvoyant reference: a trace served by preemptive shortest-remaining-time first.

It reads each request's true `service_s` (which the scheduler never sees), preempts at any
instant for free and pays no per-call overhead, so no real scheduler beats its mean turnaround
by much: it is the yardstick for the served scheduler's mean. It is no bound on per-level tails:
it starves long reviews to favour short ones, whatever their level.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from bot.model import Level
from bot.policy import PolicyBook, evaluate
from bot.sim.metrics import RequestOutcome, summarize
from bot.sim.trace import Trace, TraceRequest, to_review_request

LevelOf = Callable[[TraceRequest], Level | None]


def policy_levels(book: PolicyBook) -> LevelOf:
    """The level the policy gives each trace request at intake (None: not reviewed)."""

    def level_of(request: TraceRequest) -> Level | None:
        review_request = to_review_request(request)
        if review_request is None:
            return None
        decision = evaluate(book.policy_for(review_request.repo), review_request)
        return decision.level if decision.review else None

    return level_of


def clairvoyant_outcomes(
    requests: Sequence[TraceRequest], level_of: LevelOf, *, workers: int
) -> list[RequestOutcome]:
    """Preemptive SRPT on `workers` servers, one server per request at a time (pure)."""
    reviewed = [r for r in requests if level_of(r) is not None]
    remaining = {r.id: r.service_s for r in reviewed}
    arrival = {r.id: r.arrival_s for r in reviewed}
    waiting_on = {r.id: {d for d in r.depends_on if d in remaining} for r in reviewed}
    dependents: dict[str, list[str]] = {}
    for request in reviewed:
        for dependency in waiting_on[request.id]:
            dependents.setdefault(dependency, []).append(request.id)
    ready_at: dict[str, float] = {}
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    arrived: set[str] = set()
    by_arrival = sorted(reviewed, key=lambda r: r.arrival_s)
    position = 0
    active: set[str] = set()
    now = 0.0
    while position < len(by_arrival) or active:
        while position < len(by_arrival) and by_arrival[position].arrival_s <= now + 1e-12:
            request = by_arrival[position]
            position += 1
            arrived.add(request.id)
            if all(d in finished for d in waiting_on[request.id]):
                ready_at[request.id] = request.arrival_s
                active.add(request.id)
        running = sorted(active, key=lambda rid: (remaining[rid], arrival[rid]))[:workers]
        next_arrival = by_arrival[position].arrival_s if position < len(by_arrival) else math.inf
        if not running:
            now = next_arrival
            continue
        step = min(min(remaining[rid] for rid in running), next_arrival - now)
        for rid in running:
            started.setdefault(rid, now)
            remaining[rid] -= step
        now += step
        for rid in running:
            if remaining[rid] > 1e-9:
                continue
            active.discard(rid)
            finished[rid] = now
            for dependent in dependents.get(rid, []):
                if dependent in ready_at or dependent not in arrived:
                    continue
                if all(d in finished for d in waiting_on[dependent]):
                    ready_at[dependent] = now
                    active.add(dependent)
    return [
        RequestOutcome(
            request_id=r.id,
            level=_level_or_p1(level_of(r)),
            arrival_s=r.arrival_s,
            ready_s=ready_at.get(r.id, r.arrival_s),
            started_s=started.get(r.id),
            finished_s=finished.get(r.id),
            service_s=r.service_s,
        )
        for r in reviewed
    ]


def _level_or_p1(level: Level | None) -> Level:
    # Level.P0 is 0, so `level or Level.P1` would report every hotfix as P1.
    return Level.P1 if level is None else level


def clairvoyant(trace: Trace, level_of: LevelOf, *, workers: int | None = None) -> dict[str, Any]:
    """The clairvoyant reference's summary, in the shape `bot simulate --json` writes."""
    slots = workers or trace.header.workers
    outcomes = clairvoyant_outcomes(trace.requests, level_of, workers=slots)
    return summarize(
        outcomes,
        policy="clairvoyant",
        requests=len(outcomes),
        gpu_s=sum(outcome.service_s for outcome in outcomes),
        workers=slots,
    )


__all__ = ["clairvoyant", "clairvoyant_outcomes", "policy_levels"]
