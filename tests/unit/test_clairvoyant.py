"""The clairvoyant reference (preemptive SRPT on true sizes) reports each review at its level."""

from __future__ import annotations

from bot.model import Level
from bot.sim.clairvoyant import clairvoyant_outcomes
from bot.sim.trace import TraceRequest


def request(rid: str, arrival_s: float, service_s: float) -> TraceRequest:
    return TraceRequest(
        id=rid,
        arrival_s=arrival_s,
        forge="github",
        repo="acme/shop",
        number=int(rid[1:]),
        event="pull_request",
        action="opened",
        merged=False,
        base_ref="main",
        head_ref=rid,
        labels=(),
        author="dev",
        author_is_bot=False,
        draft=False,
        files_changed=1,
        additions=10,
        deletions=0,
        file_lines=(10,),
        service_s=service_s,
    )


LEVELS = {"r1": Level.P0, "r2": Level.P1, "r3": Level.P2, "r4": None}


def test_each_outcome_keeps_its_level_and_unreviewed_requests_are_left_out() -> None:
    requests = [request(rid, 0.0, 10.0) for rid in LEVELS]
    outcomes = clairvoyant_outcomes(requests, lambda r: LEVELS[r.id], workers=1)
    assert {o.request_id: o.level for o in outcomes} == {
        "r1": Level.P0,
        "r2": Level.P1,
        "r3": Level.P2,
    }


def test_the_shortest_remaining_work_runs_first_on_one_worker() -> None:
    requests = [request("r1", 0.0, 30.0), request("r2", 5.0, 10.0)]
    outcomes = {
        o.request_id: o for o in clairvoyant_outcomes(requests, lambda r: Level.P1, workers=1)
    }
    assert outcomes["r2"].finished_s == 15.0  # preempts the longer review on arrival
    assert outcomes["r1"].finished_s == 40.0
