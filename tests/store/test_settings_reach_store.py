"""Settings read from the environment reach the store `bot serve` opens (real PostgreSQL)."""

from __future__ import annotations

import pytest

from bot.clock import VirtualClock
from bot.components import (
    command_worker_settings,
    dispatcher_settings,
    planning_settings,
    posting_settings,
    status_settings,
)
from bot.config import Settings, load_settings
from bot.engine_setup import served_budget
from bot.errors import ConfigError
from bot.model import LEVELS, JobState, Level
from bot.queue.store import QueueStore
from bot.review.planner import PlanningSettings
from bot.sched.dispatcher import DispatcherSettings
from bot.serve import open_store, status_publisher
from tests.support.factories import decide, make_request, plans
from tests.support.memory_forge import FORGES, simulated_pipeline


async def test_max_attempts_and_chunk_backoff_reach_the_store(db_url: str) -> None:
    settings = load_settings(
        {
            "DATABASE_URL": db_url,
            "REVIEW_BOT_MAX_ATTEMPTS": "5",
            "REVIEW_BOT_CHUNK_RETRY_BACKOFF_S": "2",
        }
    )
    store = open_store(settings, pool_size=2)
    clock = VirtualClock()
    try:
        result = await store.submit_request(make_request(), decide(Level.P1), now=clock.now())
        assert result.job_id is not None
        await store.plan_job(result.job_id, plans(5), now=clock.now())
        for attempt in range(1, 6):
            leased = await store.fetch_chunk(levels=LEVELS, owner="w", now=clock.now(), lease_s=60)
            assert leased is not None and leased.chunk.attempts == attempt
            outcome = await store.fail_chunk(
                leased.chunk.id, owner="w", now=clock.now(), error=f"boom {attempt}"
            )
            # The default (3) would end the job at the third failure.
            assert outcome.job_dead == (attempt == 5)
            if attempt < 5:
                # Backing off 2 s, 4 s, 8 s... (the default would wait 10 s, 20 s...).
                wait_s = 2 * 2 ** (attempt - 1)
                clock.advance(wait_s - 0.5)
                early = await store.fetch_chunk(
                    levels=LEVELS, owner="w", now=clock.now(), lease_s=60
                )
                assert early is None
                clock.advance(1)
        job = await store.get_job(result.job_id)
        assert job is not None and job.state == JobState.DEAD and job.last_error == "boom 5"
    finally:
        await store.close()


def _settings(environment: dict[str, str]) -> Settings:
    return load_settings({"DATABASE_URL": "postgresql://bot@db/reviewbot", **environment})


def test_learned_costs_reach_the_dispatcher_settings() -> None:
    def dispatching(environment: dict[str, str]) -> DispatcherSettings:
        return dispatcher_settings(_settings(environment), owner="d")

    assert not dispatching({}).learned_costs
    assert dispatching({"REVIEW_BOT_LEARNED_COSTS": "true"}).learned_costs


def test_both_sets_of_level_weights_reach_the_dispatcher() -> None:
    def shares(environment: dict[str, str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        mlfq = dispatcher_settings(_settings(environment), owner="d").mlfq
        return mlfq.weights, mlfq.backlog_weights

    assert shares({}) == ((8, 6, 2, 1), (8, 16, 0, 1))
    assert shares({"REVIEW_BOT_WEIGHTS": "9,3,2,1", "REVIEW_BOT_BACKLOG_WEIGHTS": "9,3,2,1"}) == (
        (9, 3, 2, 1),
        (9, 3, 2, 1),
    )
    with pytest.raises(ConfigError, match="REVIEW_BOT_BACKLOG_WEIGHTS"):
        _settings({"REVIEW_BOT_BACKLOG_WEIGHTS": "8,16,2"})
    with pytest.raises(ConfigError, match=r"REVIEW_BOT_WEIGHTS.*P0's positive"):
        _settings({"REVIEW_BOT_WEIGHTS": "0,6,2,1"})
    with pytest.raises(ConfigError, match="REVIEW_BOT_BACKLOG_WEIGHTS"):
        _settings({"REVIEW_BOT_BACKLOG_WEIGHTS": "8,16,-2,1"})


async def test_the_backlog_chunk_size_reaches_planning_and_the_dispatcher() -> None:
    assert dispatcher_settings(_settings({}), owner="d").backlog_chunks
    assert (await served_budget(_settings({}))).backlog_line_budget == 800
    off = _settings({"REVIEW_BOT_BACKLOG_CHUNK_LINES": "0"})
    assert not dispatcher_settings(off, owner="d").backlog_chunks
    budget = await served_budget(off)
    assert budget.backlog_line_budget is None
    planning = planning_settings(
        off,
        line_budget=budget.line_budget,
        context_tokens=budget.context_tokens,
        backlog_line_budget=budget.backlog_line_budget,
    )
    assert planning.for_backlog(True).line_budget_for(Level.P1) == 400


def test_every_role_maps_the_settings_to_its_components_alike() -> None:
    """bot serve, the demo and the benchmarks build their components' settings in one place
    (bot.components): the database outage's backoff reaches every dispatcher (the demo's and
    the benchmarks' used to keep the default), and the one lease reaches every claim."""
    settings = _settings(
        {
            "REVIEW_BOT_RETRY_BACKOFF_S": "4",
            "REVIEW_BOT_LEASE_S": "45",
            "REVIEW_BOT_STATUS_INTERVAL_S": "20",
            "REVIEW_BOT_WORKERS": "6",
        }
    )
    dispatching = dispatcher_settings(settings, owner="demo")
    assert dispatching.outage_backoff_s == 4.0
    assert dispatching.lease_s == 45.0
    planning = planning_settings(settings, line_budget=300, context_tokens=2048)
    assert (planning.lease_s, planning.line_budget, planning.context_tokens) == (45.0, 300, 2048)
    assert posting_settings(settings).lease_s == 45.0
    # The publisher's lease covers three of its passes; command claims last two minutes at most.
    assert status_settings(settings).lease_s == 60.0
    commands = command_worker_settings(settings)
    assert commands.lease_s == 45.0
    # /review status estimates with the configured slots until the publisher keeps a model.
    assert (commands.workers, commands.outage_backoff_s) == (6, 4.0)
    assert command_worker_settings(_settings({"REVIEW_BOT_LEASE_S": "900"})).lease_s == 120.0


async def test_the_status_eta_cuts_unplanned_reviews_at_the_planners_budget(db_url: str) -> None:
    """The publisher's ETA plays a review not planned yet as the served planner will cut it
    (a small-context model: chunks of 108 lines), not at the default 400."""
    settings = _settings({})
    store = QueueStore.from_url(db_url)
    pipeline = simulated_pipeline(
        store,
        dispatcher=DispatcherSettings(owner="d1", slots=2),
        planning=PlanningSettings(line_budget=108, first_budget=100),
    )
    try:
        capacity = status_publisher(settings, store, FORGES, pipeline).capacity
        assert (capacity.line_budget, capacity.first_budget) == (108, 100)
        assert capacity.slots == 2
    finally:
        await store.close()
