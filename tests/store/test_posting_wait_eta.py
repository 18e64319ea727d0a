"""The ETA a review's status, `/review status` and the dashboard give (one `standings`)
includes the wait for its forge's write budget once that binds: on real PostgreSQL, with the
writes the budget counted in `forge_writes`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.clock import VirtualClock
from bot.model import Level
from bot.queue.sql import budget as budget_sql
from bot.queue.store import QueueStore
from bot.status.eta import Capacity
from bot.status.standing import BINDING_WAIT_S, EtaModel, standings
from tests.support.factories import decide, make_request, plans


async def test_an_installation_whose_minute_is_spent_moves_its_reviews_eta_and_no_other(
    store: QueueStore, clock: VirtualClock
) -> None:
    now = clock.now()
    jobs = {}
    for number, installation in ((1, 7), (2, 8)):
        request = make_request(
            number=number, head_sha=f"{number:040d}", installation_id=installation
        )
        submitted = await store.submit_request(request, decide(), now=now)
        assert submitted.job_id is not None
        await store.plan_job(submitted.job_id, plans(40), now=now)
        jobs[installation] = submitted.job_id
    model = EtaModel(Capacity(slots=2))
    before = (await standings(store.status, model, now=now)).estimates
    # Installation 7 spent its minute's 80 writes in the last 20 s.
    for index in range(80):
        await store.connector.write(
            budget_sql.RECORD_WRITE,
            {
                "key": "github:installation:7",
                "now": now - timedelta(seconds=20 - index * 0.25),
                "asked_at": now - timedelta(seconds=21),
                "value": 0,
                "level": 1,
                "action": "review",
                "job_id": None,
            },
        )
    after = await standings(store.status, model, now=now)
    moved = after.estimates[jobs[7]].finish_in_s - before[jobs[7]].finish_in_s
    # Its review ends in well under 40 s, then waits for the minute's first write to age out.
    assert before[jobs[7]].finish_in_s < 40.0
    assert moved >= BINDING_WAIT_S and before[jobs[7]].finish_in_s + moved >= 40.0
    assert after.estimates[jobs[8]] == before[jobs[8]]
    # The promise the ETA learns from carries the same wait.
    assert after.raw[jobs[7]].finish_in_s - before[jobs[7]].finish_in_s >= BINDING_WAIT_S


async def test_a_stacked_hotfix_is_promised_after_the_review_it_waits_for(
    store: QueueStore, clock: VirtualClock
) -> None:
    """A hotfix that waits for another pull request's review starts when that review ends, not
    at once on a free slot: its ETA says so (the stacked P0s of the public morning were told
    about 20 s and took over 100)."""
    now = clock.now()
    base = await store.submit_request(make_request(number=1, head_sha="a" * 40), decide(), now=now)
    assert base.job_id is not None
    await store.plan_job(base.job_id, plans(400, 400, 400), now=now)
    hotfix = await store.submit_request(
        make_request(number=2, head_sha="b" * 40),
        decide(Level.P0),
        now=now,
        depends_on=[base.job_id],
    )
    assert hotfix.job_id is not None
    await store.plan_job(hotfix.job_id, plans(20), now=now)
    model = EtaModel(Capacity(slots=8))
    estimates = (await standings(store.status, model, now=now)).estimates
    first, stacked = estimates[base.job_id], estimates[hotfix.job_id]
    assert stacked.start_in_s == pytest.approx(first.finish_in_s)
    assert stacked.finish_in_s > first.finish_in_s
