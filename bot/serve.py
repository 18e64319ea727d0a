"""`bot serve`: the composition of web intake, dispatcher and background loops in one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from bot.app import create_app, create_worker_app, missing_webhook_secrets
from bot.budget.ledger import PostgresWriteBudget
from bot.clock import Clock, SystemClock
from bot.components import (
    budget_settings,
    dispatcher_settings,
    planning_settings,
    posting_settings,
    queue_settings,
    quiet_posting,
    session_timeouts,
    status_settings,
)
from bot.config import Settings, check_scheduler_settings
from bot.db import upgrade_database, wait_for_database
from bot.engine_setup import ServedBudget, engine_pool_for, served_budget
from bot.errors import ConfigError, StoreError
from bot.forges.registry import ForgeRegistry, build_forges, configured_forges
from bot.lifecycle import Context, Process, closing, finish_loop, running
from bot.llm.base import LLMBackend
from bot.llm.factory import check_backend_choice, check_backend_settings, create_backend
from bot.obs.metrics import Metrics, start_metrics_site
from bot.pipeline import Pipeline, build_pipeline
from bot.policy import PolicyBook, load_policy_book
from bot.queue.store import QueueStore
from bot.review.plan_and_post import ReviewPipeline
from bot.sched.dispatcher import Dispatcher, DispatcherSettings
from bot.status.publisher import StatusPublisher

log = logging.getLogger(__name__)

Role = Literal["web", "dispatcher", "all"]


def status_publisher(
    settings: Settings, store: QueueStore, forges: ForgeRegistry, pipeline: Pipeline
) -> StatusPublisher:
    """The check run / commit status publisher, estimating with this dispatcher's slots and
    its planner's chunk sizes."""
    dispatcher = pipeline.dispatcher
    return StatusPublisher(
        store.status,
        forges,
        clock=dispatcher.clock,
        capacity=pipeline.eta_capacity(),
        estimator=lambda: dispatcher.estimator,
        settings=status_settings(settings),
        # The ETA includes the wait for the write budget the forge clients spend from.
        budget=budget_settings(settings).limits,
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


def cannot_listen(host: str, port: int, error: OSError) -> ConfigError:
    """A port that cannot be bound (taken, privileged, no such address), said in one line."""
    reason = os.strerror(error.errno) if error.errno else str(error)
    return ConfigError(f"cannot listen on {host}:{port}: {reason}")


def check_port_free(host: str, port: int) -> None:
    """Raise ConfigError when host:port cannot be bound now, so a taken port stops the start
    before the database is migrated; the server's own bind follows (and says the same)."""
    try:
        socket.create_server((host, port)).close()
    except OSError as exc:
        raise cannot_listen(host, port, exc) from None


@dataclass(frozen=True, slots=True)
class RunningRole:
    """A role's process once started: its web application and address, its dispatcher."""

    process: Process
    app: web.Application
    url: str
    dispatcher: Dispatcher | None


class RoleParts:
    """The contexts of one role's process (bot.lifecycle), in the order they start.

    They stop in reverse: the dispatcher stops taking work and drains, recovery ends, the
    posting claims are given up, the status publisher stops, the web server (with the alert
    and command loops of its app) closes, the forges' clients close.
    """

    def __init__(
        self,
        role: Role,
        settings: Settings,
        *,
        store: QueueStore,
        forges: ForgeRegistry,
        policies: PolicyBook,
        clock: Clock,
        host: str,
        port: int,
        backend: LLMBackend | None,
        dispatching: DispatcherSettings | None,
        budget: ServedBudget | None,
        metrics: Metrics | None,
    ) -> None:
        self.role = role
        self.settings = settings
        self.store = store
        self.forges = forges
        self.policies = policies
        self.clock = clock
        self.host = host
        self.port = port
        self.backend = backend
        self.dispatching = dispatching or dispatcher_settings(settings, owner=worker_name())
        self.budget = budget
        self.metrics = metrics
        self.app: web.Application | None = None
        self.url = ""
        self.pipeline: Pipeline | None = None

    def contexts(self) -> list[Context]:
        """What the role runs: the web server always (a dispatcher alone answers health
        checks and scrapes), the dispatcher and its loops in dispatcher roles."""
        contexts: list[Context] = [closing("forges", self.forges.close), self.web_server]
        if self.settings.web.metrics_port is not None:
            contexts.append(self.metrics_server)
        if self.role in ("dispatcher", "all"):
            contexts += [self.llm_backend, self.review_pipeline]
            if self.settings.status.enabled and self.forges:
                contexts.append(self.status_publisher)
            contexts += [self.posting_claims, self.recovery, self.dispatcher]
        return contexts

    def _pipeline(self) -> Pipeline:
        if self.pipeline is None:
            raise RuntimeError("the review pipeline is not built yet")
        return self.pipeline

    async def web_server(self, process: Process) -> AsyncIterator[None]:
        """Webhooks, dashboard, health and metrics on host:port."""
        if self.role in ("web", "all"):
            app = create_app(
                self.settings,
                store=self.store,
                policies=self.policies,
                clock=self.clock,
                forges=self.forges,
                metrics=self.metrics,
            )
        else:
            app = create_worker_app(
                self.store,
                metrics=self.metrics or Metrics(),
                clock=self.clock,
                settings=self.settings,
                draining=process.stopping.is_set,
            )
        runner = web.AppRunner(app, access_log=None)
        try:
            await runner.setup()  # starts the app's own cleanup_ctx loops (alerts, commands)
            await web.TCPSite(runner, self.host, self.port, backlog=1024).start()
        except OSError as exc:
            await runner.cleanup()
            raise cannot_listen(self.host, self.port, exc) from exc
        except BaseException:
            await runner.cleanup()
            raise
        self.app = app
        self.url = f"http://{self.host}:{runner.addresses[0][1]}"
        if self.role in ("web", "all"):
            log.info(
                "webhooks at %s/webhooks/{github,gitlab}", self.url, extra={"action": "serve_web"}
            )
        yield
        await runner.cleanup()

    async def metrics_server(self, process: Process) -> AsyncIterator[None]:
        """/metrics on a port of its own (REVIEW_BOT_METRICS_PORT)."""
        if self.app is None or self.settings.web.metrics_port is None:
            raise RuntimeError("the metrics server needs the web server and a port")
        port = self.settings.web.metrics_port
        try:
            runner = await start_metrics_site(self.app, host=self.host, port=port)
        except OSError as exc:
            raise cannot_listen(self.host, port, exc) from exc
        yield
        await runner.cleanup()

    async def llm_backend(self, process: Process) -> AsyncIterator[None]:
        """The LLM backend the settings name, unless one was given; closed either way."""
        if self.backend is None:
            self.backend = create_backend(self.settings)
        backend = self.backend
        yield
        await backend.close()

    async def review_pipeline(self, process: Process) -> AsyncIterator[None]:
        """The dispatcher and its forge side, through the factory `bot simulate` uses too.

        Chunks are sized to the served model (`served_budget`) unless a budget was given.
        """
        budget = self.budget
        if budget is None:
            try:
                budget = await served_budget(self.settings)
            except ValueError as exc:
                raise ConfigError(f"REVIEW_BOT_LLM_URLS: {exc}") from exc
        if self.backend is None:
            raise RuntimeError("the review pipeline needs the LLM backend")
        settings = self.settings
        self.pipeline = build_pipeline(
            self.store,
            forges=self.forges,
            policies=self.policies,
            backend=self.backend,
            clock=self.clock,
            dispatcher=self.dispatching,
            planning=planning_settings(
                settings,
                line_budget=budget.line_budget,
                context_tokens=budget.context_tokens,
                backlog_line_budget=budget.backlog_line_budget,
            ),
            posting=posting_settings(settings),
            metrics=self.metrics,
            quiet=quiet_posting(settings, self.store),
            # One window of chunks per LLM server (plain slots for the simulated backend).
            engines=engine_pool_for(
                settings, self.backend, now=self.clock.now(), metrics=self.metrics
            ),
            answer_tokens=settings.llm.max_tokens,
        )
        yield

    async def status_publisher(self, process: Process) -> AsyncIterator[None]:
        """Check runs and commit statuses; it stops after the drain, so the statuses of
        what finished during the grace are written."""
        stop = asyncio.Event()
        publisher = status_publisher(self.settings, self.store, self.forges, self._pipeline())
        task = process.start_loop(
            publisher.run(stop, database_url=self.settings.database.url), name="status-publisher"
        )
        yield
        stop.set()
        await finish_loop(task)

    async def posting_claims(self, process: Process) -> AsyncIterator[None]:
        """Renew the posting claims while reviews are posted; once the dispatcher has drained
        (a review posted during the grace keeps its claim), give up the planning and posting
        claims still held."""
        reviews = self._pipeline().reviews
        stop = asyncio.Event()
        task = process.start_loop(
            reviews.run_heartbeat(self.clock, interval_s=self.dispatching.heartbeat_s, stop=stop),
            name="posting-heartbeat",
        )
        yield
        stop.set()
        await finish_loop(task)
        await release_claims(reviews)

    async def recovery(self, process: Process) -> AsyncIterator[None]:
        """Post what a dead process left unposted. It stops taking over at once when the
        process is stopping, and follows the lease: it looks for expired claims as often as
        the heartbeat renews live ones."""
        task = process.start_loop(
            self._pipeline().reviews.run_recovery(
                self.clock,
                interval_s=self.dispatching.heartbeat_s,
                stop=process.stopping,
                outage_backoff_s=self.settings.database.outage_backoff_s,
            ),
            name="recovery",
        )
        yield
        await finish_loop(task)

    async def dispatcher(self, process: Process) -> AsyncIterator[None]:
        """The dispatch loop; on the way out it stops taking work and drains (running chunks
        finish within REVIEW_BOT_SHUTDOWN_GRACE_S, the rest are handed back)."""
        dispatcher = self._pipeline().dispatcher
        task = process.start_loop(
            dispatcher.run(database_url=self.settings.database.url), name="dispatcher"
        )
        log.info(
            "dispatcher %s with %d slots on the %s backend%s",
            dispatcher.settings.owner,
            dispatcher.total_slots,
            self.settings.llm.backend,
            ""
            if dispatcher.engines is None
            else f" ({len(dispatcher.engines.engines)} engines with adaptive windows)",
            extra={"action": "serve_dispatcher"},
        )
        yield
        dispatcher.stop()
        await finish_loop(task)


@contextlib.asynccontextmanager
async def run_role(
    role: Role,
    settings: Settings,
    *,
    store: QueueStore,
    forges: ForgeRegistry,
    policies: PolicyBook,
    clock: Clock,
    host: str = "127.0.0.1",
    port: int = 0,
    backend: LLMBackend | None = None,
    dispatching: DispatcherSettings | None = None,
    budget: ServedBudget | None = None,
    metrics: Metrics | None = None,
    stopping: asyncio.Event | None = None,
    first: Sequence[Context] = (),
) -> AsyncIterator[RunningRole]:
    """Run a role's process (web, dispatcher or all) as `bot serve` runs it, the demo and the
    benchmarks too; stop it on the way out (see RoleParts).

    `first` are the caller's own contexts, started before the role's and stopped after them.
    The role closes `forges` and the backend (given, or made from the settings), not `store`.
    The dispatcher's lease heartbeat, recovery and posting claims beat every
    `dispatching.heartbeat_s`. Raises StartError when a part does not start.
    """
    parts = RoleParts(
        role,
        settings,
        store=store,
        forges=forges,
        policies=policies,
        clock=clock,
        host=host,
        port=port,
        backend=backend,
        dispatching=dispatching,
        budget=budget,
        metrics=metrics,
    )
    async with running([*first, *parts.contexts()], stopping=stopping) as process:
        if parts.app is None:
            raise RuntimeError("the web server did not start")
        yield RunningRole(
            process,
            parts.app,
            parts.url,
            None if parts.pipeline is None else parts.pipeline.dispatcher,
        )


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


async def serve(
    settings: Settings, *, role: Role, host: str, port: int, migrate: bool = True
) -> None:
    """Run until SIGTERM/SIGINT; on the way out, stop taking work and hand back what is held."""
    if not settings.database.url:
        raise ConfigError("DATABASE_URL is not set")
    url = settings.database.url
    # Fail fast, before anything is started or written: broken policies, settings that cannot
    # work, half-configured forges and LLM backends, a database that cannot be used.
    check_scheduler_settings(settings.scheduler)
    policies = load_policy_book(settings.review.policy_dir)
    if role in ("web", "all"):
        missing_webhook_secrets(settings)
    if role in ("dispatcher", "all"):
        settings = settings.with_changes(llm={"backend": _chosen_backend(settings)})
        check_backend_settings(settings.llm)
    for listen_port in (port, settings.web.metrics_port):
        if listen_port:
            check_port_free(host, listen_port)
    await wait_for_database(
        url,
        wait_s=settings.database.start_wait_s,
        backoff_s=settings.database.outage_backoff_s,
    )
    if migrate:
        await upgrade_database(url)
    store = open_store(settings)
    clock = SystemClock()
    # One write budget per installation/token, shared with every other process.
    forges = build_forges(
        settings,
        budget=PostgresWriteBudget(
            store.connector, now=clock.now, settings=budget_settings(settings)
        ),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)
    async with run_role(
        role,
        settings,
        store=store,
        forges=forges,
        policies=policies,
        clock=clock,
        host=host,
        port=port,
        metrics=Metrics(),
        stopping=stop,
        first=[closing("database", store.close)],
    ) as running_role:
        await running_role.process.wait()
        log.info("stopping", extra={"action": "serve_stop"})
