"""Riding out faults, decision by decision: what counts as an outage, how long to back off,
which settings are refused, and a dispatcher that keeps going while the database is away."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from aiohttp import web

from bot.clock import SystemClock, VirtualClock
from bot.config import SchedulerSettings, check_scheduler_settings, load_settings
from bot.db import is_database_unavailable, plain_url, translate_database_error
from bot.errors import ConfigError, LLMError, LLMRequestRejected, StoreUnavailable
from bot.llm.base import LLMRequest
from bot.llm.openai_compat import OpenAICompatBackend
from bot.llm.simulated import SimulatedBackend
from bot.llm.vllm_engine import translate_vllm_error
from bot.model import JobState
from bot.outage import OutageWatch, backoff_delay
from bot.pipeline import build_pipeline
from bot.queue.store import QueueSettings, QueueStore
from bot.sched.dispatcher import Dispatcher, DispatcherSettings
from bot.sched.mlfq import MlfqSettings
from tests.support.factories import decide, make_request
from tests.support.memory_forge import FORGES, FORTY_LINE_CHUNKS, add_change


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


async def _terminate_backends(admin_url: str, database_url: str) -> int:
    """Do to every session of the database what a fast shutdown does (SQLSTATE 57P01)."""
    name = database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(plain_url(admin_url))
    try:
        rows = await admin.fetch(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
    finally:
        await admin.close()
    return len(rows)


# --- classification -----------------------------------------------------------------------


async def test_a_terminated_session_is_an_outage_and_a_bad_statement_is_not(
    pg_server: str, db_url: str
) -> None:
    victim = await asyncpg.connect(plain_url(db_url))
    try:
        assert await _terminate_backends(pg_server, db_url) >= 1
        with pytest.raises(Exception) as terminated:
            await victim.fetch("SELECT 1")
        assert is_database_unavailable(terminated.value)
    finally:
        await victim.close()
    healthy = await asyncpg.connect(plain_url(db_url))
    try:
        with pytest.raises(asyncpg.PostgresError) as bad:
            await healthy.fetch("SELEC 1")
        assert not is_database_unavailable(bad.value)
        assert not isinstance(translate_database_error(bad.value), StoreUnavailable)
    finally:
        await healthy.close()


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.AdminShutdownError(
            "terminating connection due to administrator command"
        ),
        asyncpg.exceptions.ConnectionDoesNotExistError(
            "connection was closed in the middle of operation"
        ),
        asyncpg.exceptions.InterfaceError("connection is closed"),
        ConnectionRefusedError(111, "Connection refused"),
    ],
    ids=lambda error: type(error).__name__ + ": " + str(error)[:30],
)
def test_the_ways_a_restarting_server_fails_are_outages(error: Exception) -> None:
    assert is_database_unavailable(error)
    assert isinstance(translate_database_error(error), StoreUnavailable)


def test_a_failing_statement_stays_a_plain_store_error() -> None:
    error = asyncpg.exceptions.UniqueViolationError("duplicate key value")
    assert not is_database_unavailable(error)
    assert type(translate_database_error(error, what="write failed")).__name__ == "StoreError"


async def test_a_server_that_is_not_there_answers_store_unavailable() -> None:
    store = QueueStore.from_url(f"postgresql://nobody@127.0.0.1:{_closed_port()}/none")
    try:
        with pytest.raises(StoreUnavailable):
            await store.ping()
    finally:
        await store.close()


async def test_pooled_connections_killed_by_a_restart_are_replaced_unseen(
    pg_server: str, store: QueueStore
) -> None:
    # Fill the pool with live connections, then end them all as a restart would.
    await asyncio.gather(*(store.ping() for _ in range(4)))
    assert await _terminate_backends(pg_server, str(store.engine.url)) >= 1
    # Checked on checkout: the next operations get fresh connections, not "connection is closed".
    for _ in range(4):
        await store.ping()
    assert await store.list_jobs() == []


# --- backoff --------------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap_within_its_jitter_band() -> None:
    low = [backoff_delay(n, base_s=1.0, cap_s=30.0, jitter=0.0) for n in range(1, 8)]
    high = [backoff_delay(n, base_s=1.0, cap_s=30.0, jitter=1.0) for n in range(1, 8)]
    assert high == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert low == [value / 2 for value in high]
    assert backoff_delay(3, base_s=1.0, cap_s=30.0, jitter=0.5) == 3.0
    assert backoff_delay(0, base_s=1.0, cap_s=30.0, jitter=0.5) == 0.0
    assert backoff_delay(10_000, base_s=1.0, cap_s=30.0, jitter=1.0) == 30.0


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticks = iter([100.0, 112.5, 200.0])
    watch = OutageWatch(
        "dispatcher d1", base_s=2.0, jitter=lambda: 1.0, monotonic=lambda: next(ticks)
    )
    caplog.set_level(logging.INFO, logger="bot.outage")
    delays = [watch.lost(StoreUnavailable("database unavailable: refused")) for _ in range(4)]
    assert delays == [2.0, 4.0, 8.0, 16.0]
    assert not watch.available
    watch.recovered()
    watch.recovered()
    actions = [record.action for record in caplog.records]  # type: ignore[attr-defined]
    assert actions == ["database_lost", "database_back"]
    assert "back after 12.5 s (4 failed tries)" in caplog.records[1].getMessage()
    assert watch.available
    assert watch.lost(StoreUnavailable("again")) == 2.0  # a new outage starts from the base


# --- settings -------------------------------------------------------------------------------


def test_a_heartbeat_not_well_under_the_lease_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"at most a third of the lease \(here 3.33333 s\)"):
        load_settings({"REVIEW_BOT_LEASE_S": "10", "REVIEW_BOT_HEARTBEAT_S": "5"})
    with pytest.raises(ConfigError, match="HEARTBEAT_S=30 is too long for REVIEW_BOT_LEASE_S=60"):
        check_scheduler_settings(SchedulerSettings(lease_s=60.0, heartbeat_s=30.0))
    with pytest.raises(ConfigError, match="REVIEW_BOT_LEASE_S must be positive"):
        load_settings({"REVIEW_BOT_LEASE_S": "0"})
    with pytest.raises(ConfigError, match="REVIEW_BOT_RETRY_BACKOFF_S must be positive"):
        load_settings({"REVIEW_BOT_RETRY_BACKOFF_S": "-1"})


def test_an_unset_heartbeat_follows_a_short_lease() -> None:
    short = load_settings({"REVIEW_BOT_LEASE_S": "9"})
    assert short.scheduler.heartbeat_s == 3.0
    default = load_settings({})
    assert (default.scheduler.lease_s, default.scheduler.heartbeat_s) == (300.0, 30.0)
    assert load_settings({"REVIEW_BOT_RETRY_BACKOFF_S": "0.5"}).database.outage_backoff_s == 0.5


# --- a dispatcher while the database is away ------------------------------------------------


def _dispatcher(store: QueueStore, *, poll_s: float) -> Dispatcher:
    backend = SimulatedBackend(
        overhead_s=1.0, seconds_per_line=0.0, sleep=asyncio.sleep, time_scale=0.001
    )
    return build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        planning=FORTY_LINE_CHUNKS,
        dispatcher=DispatcherSettings(
            owner="d1",
            slots=2,
            poll_s=poll_s,
            lease_s=60.0,
            heartbeat_s=20.0,
            outage_backoff_s=0.02,
            mlfq=MlfqSettings(reserved_slots=0),
        ),
    ).dispatcher


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.02)  # the dispatcher's own tasks bring it about


async def test_a_dispatcher_keeps_running_while_its_database_cannot_be_reached(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"postgresql://nobody@127.0.0.1:{_closed_port()}/none"
    store = QueueStore.from_url(url)
    dispatcher = _dispatcher(store, poll_s=0.05)
    caplog.set_level(logging.INFO, logger="bot.outage")
    runner = asyncio.create_task(dispatcher.run(database_url=url))
    try:
        await asyncio.sleep(0.5)  # many failed passes, each followed by a backoff
        assert not runner.done()
        lost = [r for r in caplog.records if getattr(r, "action", "") == "database_lost"]
        assert len(lost) == 1
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=5.0)
        await store.close()


async def test_a_dispatcher_carries_on_after_every_session_is_terminated(
    pg_server: str, db_url: str
) -> None:
    store = QueueStore.from_url(db_url)
    dispatcher = _dispatcher(store, poll_s=60.0)
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))

    async def done(job_id: int) -> bool:
        job = await store.get_job(job_id)
        return job is not None and job.state == JobState.DONE

    try:
        add_change(1, 90, head_sha="1" * 40)
        first = await store.submit_request(
            make_request(number=1, head_sha="1" * 40, additions=80),
            decide(),
            now=SystemClock().now(),
        )
        assert first.job_id is not None
        await _until(lambda: done(first.job_id), timeout_s=10.0)  # type: ignore[arg-type]
        # A fast shutdown ends every session, the LISTEN connection included.
        assert await _terminate_backends(pg_server, db_url) >= 1
        await asyncio.sleep(0.2)
        add_change(2, 90, head_sha="2" * 40)
        second = await store.submit_request(
            make_request(number=2, head_sha="2" * 40, additions=80),
            decide(),
            now=SystemClock().now(),
        )
        assert second.job_id is not None
        # Idle in a 60 s poll: only a NOTIFY heard on a new LISTEN connection wakes it in time.
        await _until(lambda: done(second.job_id), timeout_s=10.0)  # type: ignore[arg-type]
        assert not runner.done()
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await store.close()


# --- no slot leaks --------------------------------------------------------------------------


async def test_a_backend_raising_something_unexpected_frees_the_slot_and_counts_the_attempt(
    db_url: str,
) -> None:
    store = QueueStore.from_url(db_url, settings=QueueSettings(retry_backoff_s=0.05))
    backend = SimulatedBackend(
        overhead_s=1.0, seconds_per_line=0.0, sleep=asyncio.sleep, time_scale=0.001, fault_every=3
    )  # the first call for every third chunk raises RuntimeError
    dispatcher = build_pipeline(
        store,
        forges=FORGES,
        policies=None,
        backend=backend,
        clock=SystemClock(),
        planning=FORTY_LINE_CHUNKS,
        dispatcher=DispatcherSettings(
            owner="d1", slots=2, poll_s=0.05, lease_s=60.0, mlfq=MlfqSettings(reserved_slots=0)
        ),
    ).dispatcher
    runner = asyncio.create_task(dispatcher.run(database_url=db_url))
    job_ids = []
    try:
        for number in range(1, 7):
            add_change(number, 90, head_sha=f"{number:040d}")
            result = await store.submit_request(
                make_request(number=number, head_sha=f"{number:040d}", additions=80),
                decide(),
                now=SystemClock().now(),
            )
            assert result.job_id is not None
            job_ids.append(result.job_id)

        async def all_done() -> bool:
            jobs = [await store.get_job(job_id) for job_id in job_ids]
            return all(job is not None and job.state == JobState.DONE for job in jobs)

        await _until(all_done, timeout_s=20.0)
        assert dispatcher.held == {} and dispatcher.free_slots == 2
        chunks = [chunk for job_id in job_ids for chunk in await store.chunk_results(job_id)]
        retried = [chunk for chunk in chunks if chunk.attempts > 1]
        assert sorted(chunk.id for chunk in retried) == [c.id for c in chunks if c.id % 3 == 0]
        assert all(chunk.attempts == 2 for chunk in retried)
        assert backend.faulted == {chunk.id for chunk in retried}
        errors = await _chunk_errors(store, [chunk.id for chunk in retried])
        assert all(
            error.startswith("RuntimeError: simulated backend fault (chunk") for error in errors
        )
    finally:
        dispatcher.stop()
        await asyncio.wait_for(runner, timeout=10.0)
        await store.close()


async def _chunk_errors(store: QueueStore, chunk_ids: list[int]) -> list[str]:
    from sqlalchemy import text

    async with store.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT last_error FROM review_chunks WHERE id = ANY(:ids) ORDER BY id"),
            {"ids": chunk_ids},
        )
        return [str(row.last_error) for row in rows]


@pytest.mark.parametrize(
    ("error", "rejected"),
    [
        (
            ValueError("The decoder prompt (length 5000) is longer than the maximum model length"),
            True,
        ),
        (TypeError("priority must be an int"), True),
        (RuntimeError("engine step failed"), False),
        (KeyError("request id"), False),
    ],
)
def test_vllm_errors_map_to_the_openai_backends_outcomes(error: Exception, rejected: bool) -> None:
    translated = translate_vllm_error(error)
    assert isinstance(translated, LLMRequestRejected) is rejected
    assert translated.retryable is not rejected


async def test_a_timed_out_llm_request_is_abandoned_before_it_is_retried() -> None:
    """vLLM aborts a request whose client went away: a timed-out call must hang up, not linger
    on the server while its retry runs beside it."""
    events: list[str] = []

    async def slow_completion(request: web.Request) -> web.Response:
        events.append("started")
        try:
            await asyncio.Event().wait()  # generating, until the client hangs up
        except asyncio.CancelledError:
            events.append("client gone")  # handler_cancellation: the connection was lost
            raise
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow_completion)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    backend = OpenAICompatBackend(
        [f"http://127.0.0.1:{port}"],
        model="m",
        timeout_s=0.2,
        max_retries=1,
        sleep=VirtualClock().sleep,  # the backoff between tries: no real wait
    )
    try:
        with pytest.raises(LLMError, match="timed out"):
            await backend.complete(LLMRequest(messages=[{"role": "user", "content": "x"}]))
        await _until_true(lambda: events.count("client gone") == 2, timeout_s=2.0)
    finally:
        await backend.close()
        await runner.cleanup()
    assert events == ["started", "client gone", "started", "client gone"]


async def _until_true(check: Callable[[], bool], timeout_s: float) -> None:
    async def wrapped() -> bool:
        return check()

    await _until(wrapped, timeout_s)
