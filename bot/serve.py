"""`bot serve`: the composition of web intake, dispatcher and background loops in one process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import Literal

from aiohttp import web

from bot.app import create_app, create_worker_app
from bot.budget.ledger import PostgresWriteBudget
from bot.clock import Clock, SystemClock
from bot.components import queue_settings, session_timeouts
from bot.config import Settings, check_scheduler_settings
from bot.db import is_database_unavailable, upgrade_database
from bot.engine_setup import engine_pool_for, served_budget
from bot.errors import ConfigError, StoreError
from bot.forges.registry import ForgeRegistry, budget_settings, build_forges, configured_forges
from bot.llm.base import LLMBackend
from bot.llm.factory import check_backend_choice, create_backend
from bot.obs.metrics import Metrics, start_metrics_site
from bot.outage import OutageWatch
from bot.pipeline import build_pipeline
from bot.policy import PolicyBook, load_policy_book
from bot.queue.store import QueueStore
from bot.review.forge_side import ReviewPipeline
from bot.review.planner import PlanningSettings
from bot.review.poster import PostingSettings
from bot.review.quiet_post import quiet_posting
from bot.sched.dispatcher import Dispatcher, DispatcherSettings
from bot.status.decide import PublishRules
from bot.status.eta import Capacity
from bot.status.publisher import StatusPublisher, StatusSettings

log = logging.getLogger(__name__)

Role = Literal["web", "dispatcher", "all"]


def status_publisher(
    settings: Settings, store: QueueStore, forges: ForgeRegistry, dispatcher: Dispatcher
) -> StatusPublisher:
    """The check run / commit status publisher, estimating with this dispatcher's slots."""
    return StatusPublisher(
        store.engine,
        forges,
        clock=dispatcher.clock,
        capacity=Capacity(slots=dispatcher.total_slots, mlfq=dispatcher.settings.mlfq),
        estimator=lambda: dispatcher.estimator,
        settings=StatusSettings(
            neutral_at=settings.status.neutral_at,
            interval_s=settings.status.interval_s,
            rules=PublishRules(updates_per_hour=settings.status.updates_per_hour),
            # Held across passes: a publisher that stops passing (dead, paused) is taken over
            # after a lease, and its writes are fenced from then on.
            lease_s=max(settings.scheduler.lease_s, 3 * settings.status.interval_s),
        ),
    )


def open_store(settings: Settings, *, pool_size: int | None = None) -> QueueStore:
    """The queue store as `bot serve` opens it."""
    if not settings.database.url:
        raise ConfigError("DATABASE_URL is not set")
    return QueueStore.from_url(
        settings.database.url,
        pool_size=pool_size or max(10, settings.scheduler.workers + 4),
        settings=queue_settings(settings),
        timeouts=session_timeouts(settings),
    )


def start_dispatcher(
    settings: Settings,
    store: QueueStore,
    *,
    forges: ForgeRegistry,
    policies: PolicyBook,
    backend: LLMBackend,
    clock: Clock,
    stop: asyncio.Event,
    dispatching: DispatcherSettings,
    line_budget: int,
    metrics: Metrics | None = None,
    context_tokens: int | None = None,
) -> tuple[Dispatcher, list[asyncio.Task[None]]]:
    """The dispatcher role's pipeline and its loops, as `bot serve` runs them (the demo too).

    Chunks hold up to `line_budget` diff lines and `context_tokens` of pull request text and
    code context (None: the configured REVIEW_BOT_CONTEXT_TOKENS); `served_budget` sizes both.

    Returns the dispatcher and its tasks: the dispatch loop, recovery of expired claims,
    the heartbeat and, where forges are configured, the status publisher. They end on `stop`
    (the dispatch loop on `dispatcher.stop()`).
    """
    lease_s = settings.scheduler.lease_s
    pipeline = build_pipeline(
        store,
        forges=forges,
        policies=policies,
        backend=backend,
        clock=clock,
        dispatcher=dispatching,
        planning=PlanningSettings(
            lease_s=lease_s,
            line_budget=line_budget,
            context_tokens=settings.review.context_tokens
            if context_tokens is None
            else context_tokens,
        ),
        posting=PostingSettings(lease_s=lease_s),
        metrics=metrics,
        quiet=quiet_posting(settings, store),
        # One window of chunks per LLM server (plain slots for the simulated backend).
        engines=engine_pool_for(settings, backend, now=clock.now(), metrics=metrics),
        answer_tokens=settings.llm.max_tokens,
    )
    dispatcher = pipeline.dispatcher
    heartbeat_s = settings.scheduler.heartbeat_s
    # Posting claims are renewed until the dispatcher has drained: a review being posted
    # during the grace keeps its claim; what is left is given up after.
    drained = asyncio.Event()

    async def dispatch() -> None:
        try:
            await dispatcher.run(database_url=settings.database.url)
        finally:
            drained.set()
            await release_claims(pipeline.reviews)

    tasks = [
        asyncio.create_task(dispatch()),
        # Taking over a dead process's reviews follows the lease: the recovery pass looks for
        # expired claims as often as the heartbeat renews live ones.
        asyncio.create_task(
            pipeline.reviews.run_recovery(
                clock,
                interval_s=heartbeat_s,
                stop=stop,
                outage_backoff_s=settings.database.outage_backoff_s,
            )
        ),
        asyncio.create_task(
            pipeline.reviews.run_heartbeat(clock, interval_s=heartbeat_s, stop=drained)
        ),
    ]
    if settings.status.enabled and forges:
        tasks.append(
            asyncio.create_task(
                status_publisher(settings, store, forges, dispatcher).run(
                    stop, database_url=settings.database.url
                )
            )
        )
    return dispatcher, tasks


async def release_claims(reviews: ReviewPipeline) -> None:
    """Give up the planning and posting claims a stopping process still holds; if the
    database is away, they run out instead."""
    try:
        released = await reviews.release_claims()
    except StoreError as exc:
        log.warning(
            "claims not given up (they run out instead): %s",
            exc,
            extra={"action": "release_failed"},
        )
        return
    if released:
        log.info(
            "gave up %d planning and posting claims",
            released,
            extra={"action": "claims_released", "released": released},
        )


def worker_name() -> str:
    """A lease owner unique to this process, readable in reports (host and pid)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _chosen_backend(settings: Settings) -> str:
    """The LLM backend a dispatcher reviews with; raises ConfigError when real forges are
    configured and REVIEW_BOT_LLM is not."""
    forges = configured_forges(settings)
    chosen = check_backend_choice(settings.llm.backend, forges=forges)
    if chosen == "simulated" and forges:
        log.warning(
            "REVIEW_BOT_LLM=simulated: reviews posted on %s are the simulated backend's "
            "pattern matches, not a model's",
            " and ".join(forges),
            extra={"action": "serve_simulated_llm"},
        )
    return chosen


async def migrate_when_reachable(url: str, *, backoff_s: float) -> None:
    """Migrate to head, waiting out a database that is not up yet (started together)."""
    outage = OutageWatch("start-up", base_s=backoff_s)
    while True:
        try:
            await upgrade_database(url)
        except Exception as exc:
            if not is_database_unavailable(exc):
                raise
            await asyncio.sleep(outage.lost(exc))
            continue
        outage.recovered()
        return


async def serve(
    settings: Settings, *, role: Role, host: str, port: int, migrate: bool = True
) -> None:
    """Run until SIGTERM/SIGINT; on the way out, stop taking work and hand back what is held."""
    if not settings.database.url:
        raise ConfigError("DATABASE_URL is not set")
    url = settings.database.url
    # Fail fast, before anything is started: broken policies, settings that cannot work and
    # half-configured forges.
    check_scheduler_settings(settings.scheduler)
    policies = load_policy_book(settings.review.policy_dir)
    if role in ("dispatcher", "all"):
        settings = settings.with_changes(llm={"backend": _chosen_backend(settings)})
    if migrate:
        await migrate_when_reachable(url, backoff_s=settings.database.outage_backoff_s)
    store = open_store(settings)
    clock = SystemClock()
    # One write budget per installation/token, shared with every other process.
    forges = build_forges(
        settings,
        budget=PostgresWriteBudget(store.engine, now=clock.now, settings=budget_settings(settings)),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)

    metrics = Metrics()
    runner: web.AppRunner | None = None
    metrics_runner: web.AppRunner | None = None
    backend: LLMBackend | None = None
    dispatcher: Dispatcher | None = None
    background: list[asyncio.Task[None]] = []
    try:
        if role in ("web", "all"):
            app = create_app(
                settings,
                store=store,
                policies=policies,
                clock=clock,
                forges=forges,
                metrics=metrics,
            )
        else:  # a dispatcher alone still answers health checks and scrapes
            app = create_worker_app(
                store, metrics=metrics, clock=clock, settings=settings, draining=stop.is_set
            )
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port, backlog=1024).start()
        if settings.web.metrics_port is not None:
            metrics_runner = await start_metrics_site(
                app, host=host, port=settings.web.metrics_port
            )
        if role in ("web", "all"):
            log.info(
                "webhooks at http://%s:%s/webhooks/{github,gitlab}",
                host,
                port,
                extra={"action": "serve_web"},
            )
        if role in ("dispatcher", "all"):
            backend = create_backend(settings)
            try:
                budget = await served_budget(settings)
            except ValueError as exc:
                raise ConfigError(f"REVIEW_BOT_LLM_URLS: {exc}") from exc
            dispatcher, tasks = start_dispatcher(
                settings,
                store,
                forges=forges,
                policies=policies,
                backend=backend,
                clock=clock,
                stop=stop,
                dispatching=DispatcherSettings.from_scheduler(
                    settings.scheduler,
                    owner=worker_name(),
                    outage_backoff_s=settings.database.outage_backoff_s,
                ),
                line_budget=budget.line_budget,
                context_tokens=budget.context_tokens,
                metrics=metrics,
            )
            background += tasks
            log.info(
                "dispatcher %s with %d slots on the %s backend%s",
                dispatcher.settings.owner,
                dispatcher.total_slots,
                settings.llm.backend,
                ""
                if dispatcher.engines is None
                else f" ({len(dispatcher.engines.engines)} engines with adaptive windows)",
                extra={"action": "serve_dispatcher"},
            )
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([stopped, *background], return_when=asyncio.FIRST_COMPLETED)
        for task in background:
            failure = task.exception() if task.done() else None
            if failure is not None:
                raise failure
        log.info("stopping", extra={"action": "serve_stop"})
    finally:
        stop.set()
        if dispatcher is not None:
            dispatcher.stop()
        results = await asyncio.gather(*background, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("background task failed: %r", result, extra={"action": "serve_error"})
        if runner is not None:
            await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await forges.close()
        if backend is not None:
            await backend.close()
        await store.close()
