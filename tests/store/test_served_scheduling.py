"""The served scheduling path on real PostgreSQL under a virtual clock.

Each test replays a small hand-made trace through `bot serve`'s pipeline (`build_pipeline`:
the planner fetching diffs from an in-memory forge, the dispatcher, the poster) and then reads
what the queue recorded: when each chunk started, when each review was posted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from bot.clock import EPOCH
from bot.model import Chunk, Job, JobState, Level
from bot.queue.store import QueueStore
from bot.review.planner import PlanningSettings
from bot.sched.mlfq import MlfqSettings
from bot.sim.metrics import RequestOutcome
from bot.sim.replay import replay_trace
from bot.sim.trace import Trace, TraceHeader, TraceRequest

pytestmark = pytest.mark.slow


def _request(
    number: int,
    arrival_s: float,
    file_lines: Sequence[int],
    service_s: float,
    *,
    base: str = "main",
) -> TraceRequest:
    return TraceRequest(
        id=f"r{number}",
        arrival_s=arrival_s,
        forge="github",
        repo="acme/api",
        number=number,
        event="pull_request",
        action="opened",
        merged=False,
        base_ref=base,
        head_ref=f"feature/{number}",
        labels=(),
        author="dev",
        author_is_bot=False,
        draft=False,
        files_changed=len(file_lines),
        additions=sum(file_lines),
        deletions=0,
        file_lines=tuple(file_lines),
        service_s=service_s,
    )


def _trace(workers: int, *requests: TraceRequest) -> Trace:
    return Trace(header=TraceHeader(workers=workers, requests=len(requests)), requests=requests)


@pytest.fixture
async def inspect(db_url: str) -> AsyncIterator[QueueStore]:
    store = QueueStore.from_url(db_url)
    yield store
    await store.close()


async def _job(store: QueueStore, number: int) -> Job:
    job = await store.find_job(forge="github", repo="acme/api", number=number)
    assert job is not None
    return job


def _seconds(chunk: Chunk) -> float:
    assert chunk.started_at is not None
    return (chunk.started_at - EPOCH).total_seconds()


async def test_a_long_reviews_continuations_run_in_order_and_finish_as_one_unit(
    db_url: str, inspect: QueueStore
) -> None:
    # Two long reviews at one level on one slot; the second has less left once both started.
    trace = _trace(
        1,
        _request(1, 0.0, [340] * 5, 80.0),
        _request(2, 0.5, [320] * 4, 60.0),
    )
    # 400-line chunks: four or more per review, at sizes the policy still calls ordinary.
    result = await replay_trace(
        trace,
        policy="mlfq",
        database_url=db_url,
        mlfq=MlfqSettings(preempt=False),
        planning=PlanningSettings(line_budget=400, backlog_line_budget=None),
    )
    assert result["completed"] == result["posted"] == 2
    jobs = {number: await _job(inspect, number) for number in (1, 2)}
    assert {job.level for job in jobs.values()} == {Level.P1}
    chunks = {number: await inspect.chunk_results(jobs[number].id) for number in (1, 2)}
    assert all(len(job_chunks) >= 4 for job_chunks in chunks.values())
    continuations = sorted(
        (
            (_seconds(chunk), chunk.id, number, chunk.seq)
            for number, job_chunks in chunks.items()
            for chunk in job_chunks
            if chunk.seq > 0
        ),
    )
    order = [(number, seq) for _, _, number, seq in continuations]
    # The job with less work left runs all its continuations, in order, before the other's:
    # no tail interleaving (per-chunk ranks started every job's last chunk first).
    first = [(2, seq) for seq in range(1, len(chunks[2]))]
    second = [(1, seq) for seq in range(1, len(chunks[1]))]
    assert order == first + second
    posted = {number: jobs[number] for number in (1, 2)}
    for number in (1, 2):
        refreshed = await inspect.get_job(posted[number].id)
        assert refreshed is not None and refreshed.state == JobState.DONE
        posted[number] = refreshed
    assert posted[2].finished_at is not None and posted[1].finished_at is not None
    assert posted[2].finished_at < posted[1].finished_at


async def test_a_short_review_arriving_while_a_refactor_runs_finishes_first(
    db_url: str, inspect: QueueStore
) -> None:
    # One slot: a 1,900-line refactor (ordinary level) starts at 0; a 20-line fix comes at 10.
    refactor = _request(1, 0.0, [100] * 19, 200.0)
    fix = _request(2, 10.0, [20], 5.0)
    outcomes: list[RequestOutcome] = []
    result = await replay_trace(
        _trace(1, refactor, fix), policy="mlfq", database_url=db_url, collect=outcomes
    )
    assert result["completed"] == 2
    by_id = {outcome.request_id: outcome for outcome in outcomes}
    assert by_id["r2"].level == by_id["r1"].level == Level.P1
    refactor_done, fix_done = by_id["r1"].finished_s, by_id["r2"].finished_s
    assert refactor_done is not None and fix_done is not None
    assert fix_done < refactor_done
    # The fix waited for at most the refactor's chunk in flight, never for the refactor.
    refactor_chunks = await inspect.chunk_results((await _job(inspect, 1)).id)
    longest_chunk_s = max(
        ((chunk.finished_at or EPOCH) - (chunk.started_at or EPOCH)).total_seconds()
        for chunk in refactor_chunks
    )
    turnaround = by_id["r2"].turnaround_s
    assert turnaround is not None and turnaround <= longest_chunk_s + 5.0
    assert turnaround < 0.5 * refactor.service_s


@pytest.mark.parametrize("ends_within_grace", [False, True])
async def test_a_p0_review_arriving_with_every_slot_busy_starts_within_the_grace(
    db_url: str, ends_within_grace: bool
) -> None:
    # Two slots, both running single-chunk reviews; a hotfix comes at 20 s. One running call
    # is expected to end 2 s after it, and does (the hotfix waits for it), or is expected to
    # run for minutes (it gives way). 90 lines: 22 s by the estimator's prior.
    lines, first_ends_s = (90, 22.0) if ends_within_grace else (300, 300.0)
    requests = [
        _request(1, 0.0, [lines], first_ends_s),
        _request(2, 0.1, [300], 300.0),
        _request(9, 20.0, [10], 6.0, base="hotfix/2026-12-01"),
    ]
    settings = MlfqSettings(reserved_slots=0, preempt_grace_s=5.0)
    outcomes: list[RequestOutcome] = []
    result = await replay_trace(
        _trace(2, *requests),
        policy="mlfq",
        database_url=db_url,
        mlfq=settings,
        collect=outcomes,
    )
    assert result["completed"] == 3
    (hotfix,) = [outcome for outcome in outcomes if outcome.level == Level.P0]
    assert hotfix.wait_s is not None and hotfix.wait_s <= settings.preempt_grace_s
    if ends_within_grace:
        assert result["preemptions"] == 0
        assert hotfix.wait_s == pytest.approx(2.0, abs=0.01)  # waited for the ending call
    else:
        assert result["preemptions"] == 1
        assert hotfix.wait_s == pytest.approx(0.0, abs=1e-6)
