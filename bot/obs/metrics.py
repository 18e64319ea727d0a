"""Prometheus metrics in a registry of their own, and `GET /metrics`.

Queue depth and oldest wait are read from the database at scrape time, so every process that
serves /metrics reports the whole queue (all dispatchers), not only what it saw itself.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from bot.clock import Clock
from bot.errors import ConfigError, StoreError
from bot.model import ANCHOR_OUTCOMES, LEVELS, Level
from bot.obs.access import bearer_token, token_matches
from bot.obs.liveness import DEFAULT_STALE_S, read_liveness
from bot.queue.monitoring import MonitoringRecords

log = logging.getLogger(__name__)

# 10, 60 and 300 s are the alert thresholds of P0, P1 and P2: a bucket edge at each.
WAIT_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
TURNAROUND_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)
LLM_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
WEBHOOK_PATHS = {"/webhooks/github": "github", "/webhooks/gitlab": "gitlab"}
_OUTCOME = re.compile(r"^[a-z_]{1,24}$")


def level_label(level: Level | int) -> str:
    """`P0`..`P3`."""
    return str(Level(int(level)))


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """The queue per level at one instant, as the gauges show it."""

    waiting: Mapping[Level, int]
    blocked: Mapping[Level, int]
    running: Mapping[Level, int]
    ready_chunks: Mapping[Level, int]
    running_chunks: Mapping[Level, int]
    oldest_wait_s: Mapping[Level, float]


def build_snapshot(
    job_rows: Iterable[Mapping[str, Any]],
    chunk_rows: Iterable[Mapping[str, Any]],
    *,
    now: datetime,
) -> QueueSnapshot:
    """Turn the two queue reads into per-level numbers (every level present, zero if idle)."""
    waiting = dict.fromkeys(LEVELS, 0)
    blocked = dict.fromkeys(LEVELS, 0)
    running = dict.fromkeys(LEVELS, 0)
    oldest = dict.fromkeys(LEVELS, 0.0)
    for row in job_rows:
        level = Level(row["level"])
        waiting[level] = int(row["waiting"])
        blocked[level] = int(row["blocked"])
        running[level] = int(row["running"])
        if row["oldest_ready_at"] is not None:
            oldest[level] = max(0.0, (now - row["oldest_ready_at"]).total_seconds())
    ready_chunks = dict.fromkeys(LEVELS, 0)
    running_chunks = dict.fromkeys(LEVELS, 0)
    for row in chunk_rows:
        level = Level(row["level"])
        ready_chunks[level] = int(row["ready"])
        running_chunks[level] = int(row["running"])
    return QueueSnapshot(
        waiting=waiting,
        blocked=blocked,
        running=running,
        ready_chunks=ready_chunks,
        running_chunks=running_chunks,
        oldest_wait_s=oldest,
    )


async def read_queue_snapshot(monitoring: MonitoringRecords, *, now: datetime) -> QueueSnapshot:
    """Read the queue per level now; raises StoreUnavailable."""
    jobs = await monitoring.queue_jobs()
    chunks = await monitoring.queue_chunks(now=now)
    return build_snapshot(
        (dict(row._mapping) for row in jobs), (dict(row._mapping) for row in chunks), now=now
    )


class Metrics:
    """Every metric the bot exports; call the `observe_*`/`count_*` methods from anywhere."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.queue_jobs = Gauge(
            "review_bot_queue_jobs",
            "Live jobs per level: waiting (ready, not started), blocked (dependencies), running",
            ["level", "state"],
            registry=r,
        )
        self.queue_chunks = Gauge(
            "review_bot_queue_chunks",
            "Chunks per level: ready to take now, running",
            ["level", "state"],
            registry=r,
        )
        self.oldest_wait = Gauge(
            "review_bot_queue_oldest_wait_seconds",
            "How long the oldest ready, not yet started job of a level has waited",
            ["level"],
            registry=r,
        )
        self.wait = Histogram(
            "review_bot_wait_seconds",
            "Queue wait from ready to the first chunk's start, per level at intake",
            ["level"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.anchored = Counter(
            "review_bot_findings_anchored_total",
            "Findings by where the bot anchored them: exact (the named line), by_quote (the "
            "quoted line), nearby (a changed line within 3), summary_only (not placed)",
            ["outcome"],
            registry=r,
        )
        self.turnaround = Histogram(
            "review_bot_turnaround_seconds",
            "Arrival to review finished, per level at intake",
            ["level"],
            buckets=TURNAROUND_BUCKETS,
            registry=r,
        )
        self.chunks = Counter(
            "review_bot_chunks", "Chunks finished per worker", ["worker"], registry=r
        )
        self.gpu_seconds = Counter(
            "review_bot_gpu_seconds", "GPU seconds spent per worker", ["worker"], registry=r
        )
        self.llm_latency = Histogram(
            "review_bot_llm_latency_seconds",
            "Latency of one LLM call",
            buckets=LLM_BUCKETS,
            registry=r,
        )
        self.llm_tokens = Counter(
            "review_bot_llm_tokens", "LLM tokens by kind (prompt, completion)", ["kind"], registry=r
        )
        self.webhooks = Counter(
            "review_bot_webhooks", "Webhook deliveries by outcome", ["forge", "outcome"], registry=r
        )
        self.post_failures = Counter(
            "review_bot_post_failures", "Reviews that failed to post", ["forge"], registry=r
        )
        self.lease_reclaims = Counter(
            "review_bot_lease_reclaims", "Chunks whose lease expired and were reclaimed", registry=r
        )
        self.recomputed_tokens = Counter(
            "review_bot_recomputed_tokens",
            "Answer tokens thrown away by calls taken back for P0 room (made again later)",
            registry=r,
        )
        self.dead_jobs = Counter(
            "review_bot_dead_jobs", "Jobs that ended dead (a chunk out of attempts)", registry=r
        )
        self.alerts = Counter(
            "review_bot_wait_alerts", "Wait alerts raised, per level", ["level"], registry=r
        )
        self.alert_posts = Counter(
            "review_bot_alert_posts",
            "Alert webhook posts by outcome (sent, failed)",
            ["outcome"],
            registry=r,
        )
        self.engine_window = Gauge(
            "review_bot_engine_window",
            "Chunks an engine (LLM server) may run at once: its adaptive window",
            ["engine"],
            registry=r,
        )
        self.engine_in_flight = Gauge(
            "review_bot_engine_in_flight",
            "Chunks running on an engine from this process",
            ["engine"],
            registry=r,
        )
        self.engine_p0_companions = Gauge(
            "review_bot_engine_p0_companions",
            "Calls that may run beside a P0 call on an engine (learned from its pace)",
            ["engine"],
            registry=r,
        )
        self.engine_tokens_per_s = Gauge(
            "review_bot_engine_tokens_per_second",
            "Completion tokens per second an engine made over its last judged interval",
            ["engine"],
            registry=r,
        )
        self.engine_prefix_hits = Gauge(
            "review_bot_engine_prefix_cache_hit_ratio",
            "Share of prompt tokens vLLM served from its prefix cache (where it reports it)",
            ["engine"],
            registry=r,
        )
        self.engine_busy = Counter(
            "review_bot_engine_busy_seconds",
            "Seconds an engine had at least one chunk in flight (rate() = utilization)",
            ["engine"],
            registry=r,
        )
        self.dispatchers_alive = Gauge(
            "review_bot_dispatchers_alive",
            "Dispatcher processes whose heartbeat is fresh (three heartbeats at most)",
            registry=r,
        )
        self.engines_alive = Gauge(
            "review_bot_engines_alive",
            "Engines (LLM servers) in rotation at some live dispatcher, each counted once",
            registry=r,
        )
        self.service_alerts = Counter(
            "review_bot_service_alerts",
            "Alerts about the service itself, per kind (no_dispatcher: work waits, none alive)",
            ["kind"],
            registry=r,
        )
        self.forge_writes_left = Gauge(
            "review_bot_forge_writes_left",
            "Content-creating requests a forge identity (GitHub installation or token, GitLab"
            " token) may still make in the window (minute, hour), by its budget",
            ["budget", "window"],
            registry=r,
        )
        self.forge_writes_waiting = Gauge(
            "review_bot_forge_writes_waiting",
            "Writes waiting for room in the budget, by budget",
            ["budget"],
            registry=r,
        )
        self.forge_paused_s = Gauge(
            "review_bot_forge_paused_seconds",
            "Seconds until the forge lets the budget write again after a Retry-After (0: none)",
            ["budget"],
            registry=r,
        )
        self.scrape_errors = Counter(
            "review_bot_metrics_scrape_errors",
            "Scrapes that could not read the queue from the database",
            registry=r,
        )
        for level in LEVELS:
            label = level_label(level)
            self.wait.labels(label)
            self.turnaround.labels(label)
            self.alerts.labels(label)
            self.oldest_wait.labels(label)
            for state in ("waiting", "blocked", "running"):
                self.queue_jobs.labels(label, state)
            for state in ("ready", "running"):
                self.queue_chunks.labels(label, state)

    def observe_wait(self, level: Level | int, seconds: float) -> None:
        self.wait.labels(level_label(level)).observe(max(0.0, seconds))

    def observe_turnaround(self, level: Level | int, seconds: float) -> None:
        self.turnaround.labels(level_label(level)).observe(max(0.0, seconds))

    def observe_chunk(self, worker: str, gpu_seconds: float) -> None:
        self.chunks.labels(worker).inc()
        self.gpu_seconds.labels(worker).inc(max(0.0, gpu_seconds))

    def observe_llm(self, latency_s: float, prompt_tokens: int, completion_tokens: int) -> None:
        self.llm_latency.observe(max(0.0, latency_s))
        self.llm_tokens.labels("prompt").inc(max(0, prompt_tokens))
        self.llm_tokens.labels("completion").inc(max(0, completion_tokens))

    def show_engine(
        self,
        engine: str,
        *,
        window: int,
        in_flight: int,
        tokens_per_s: float | None = None,
        prefix_cache_hit_rate: float | None = None,
        busy_s: float = 0.0,
        p0_companions: int | None = None,
    ) -> None:
        """Set one engine's gauges; `busy_s` is busy time since the last call (counted up)."""
        self.engine_window.labels(engine).set(window)
        self.engine_in_flight.labels(engine).set(in_flight)
        if p0_companions is not None:
            self.engine_p0_companions.labels(engine).set(p0_companions)
        if tokens_per_s is not None:
            self.engine_tokens_per_s.labels(engine).set(max(0.0, tokens_per_s))
        if prefix_cache_hit_rate is not None:
            self.engine_prefix_hits.labels(engine).set(prefix_cache_hit_rate)
        self.engine_busy.labels(engine).inc(max(0.0, busy_s))

    def count_anchoring(self, outcomes: Mapping[str, Any]) -> None:
        """Add one chunk's anchoring outcomes (outcome -> findings)."""
        for outcome, count in outcomes.items():
            if outcome in ANCHOR_OUTCOMES and int(count) > 0:
                self.anchored.labels(outcome=outcome).inc(int(count))

    def count_webhook(self, forge: str, outcome: str) -> None:
        self.webhooks.labels(forge, outcome).inc()

    def count_post_failure(self, forge: str) -> None:
        self.post_failures.labels(forge).inc()

    def count_reclaims(self, count: int) -> None:
        if count > 0:
            self.lease_reclaims.inc(count)

    def count_recomputed_tokens(self, tokens: int) -> None:
        if tokens > 0:
            self.recomputed_tokens.inc(tokens)

    def count_dead(self, count: int = 1) -> None:
        if count > 0:
            self.dead_jobs.inc(count)

    def count_alert(self, level: Level | int) -> None:
        self.alerts.labels(level_label(level)).inc()

    def count_service_alert(self, kind: str) -> None:
        self.service_alerts.labels(kind).inc()

    def count_alert_post(self, outcome: str) -> None:
        self.alert_posts.labels(outcome).inc()

    def show_queue(self, snapshot: QueueSnapshot) -> None:
        """Set the queue gauges from a snapshot."""
        for level in LEVELS:
            label = level_label(level)
            self.queue_jobs.labels(label, "waiting").set(snapshot.waiting[level])
            self.queue_jobs.labels(label, "blocked").set(snapshot.blocked[level])
            self.queue_jobs.labels(label, "running").set(snapshot.running[level])
            self.queue_chunks.labels(label, "ready").set(snapshot.ready_chunks[level])
            self.queue_chunks.labels(label, "running").set(snapshot.running_chunks[level])
            self.oldest_wait.labels(label).set(snapshot.oldest_wait_s[level])

    def show_budgets(self, rows: Iterable[Mapping[str, Any]], *, now: datetime) -> None:
        """Set the write budget gauges from the budgets' rows."""
        for row in rows:
            budget = str(row["budget_key"])
            for window, limit, used in (
                ("minute", row["per_minute"], row["minute_used"]),
                ("hour", row["per_hour"], row["hour_used"]),
            ):
                if int(limit) > 0:
                    self.forge_writes_left.labels(budget, window).set(
                        max(0, int(limit) - int(used))
                    )
            self.forge_writes_waiting.labels(budget).set(int(row["waiting"]))
            until = row["blocked_until"]
            paused = max(0.0, (until - now).total_seconds()) if until is not None else 0.0
            self.forge_paused_s.labels(budget).set(paused)

    def render(self) -> bytes:
        """The text exposition of this registry."""
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """What the /metrics handler needs."""

    metrics: Metrics
    monitoring: MonitoringRecords
    clock: Clock
    dispatcher_stale_s: float = DEFAULT_STALE_S
    token: str | None = None  # when set, scrapes must present it as a bearer token


METRICS_KEY = web.AppKey("metrics", Metrics)
METRICS_CONFIG_KEY = web.AppKey("metrics_config", MetricsConfig)


def webhook_outcome(status: int, body: bytes | None) -> str:
    """The outcome label of a webhook answer: its JSON `status`, else the HTTP status."""
    if body:
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if isinstance(answer, dict):
            value = answer.get("status")
            if isinstance(value, str) and _OUTCOME.match(value):
                return value
    return f"http_{status}"


async def _count_webhook_response(request: web.Request, response: web.StreamResponse) -> None:
    forge = WEBHOOK_PATHS.get(request.path)
    if forge is None or request.method != "POST":
        return
    body = response.body if isinstance(response, web.Response) else None
    raw = body if isinstance(body, bytes) else None
    request.app[METRICS_KEY].count_webhook(forge, webhook_outcome(response.status, raw))


async def handle_metrics(request: web.Request) -> web.Response:
    """Refresh the queue gauges from the database, then expose every metric."""
    config = request.app[METRICS_CONFIG_KEY]
    if config.token and not token_matches(
        bearer_token(request.headers.get("Authorization")), config.token
    ):
        return web.Response(
            status=401,
            text="metrics need the admin token (Authorization: Bearer ...)\n",
            headers={"WWW-Authenticate": 'Bearer realm="review-bot metrics"'},
        )
    now = config.clock.now()
    try:
        snapshot = await read_queue_snapshot(config.monitoring, now=now)
        liveness = await read_liveness(
            config.monitoring, now=now, stale_after_s=config.dispatcher_stale_s
        )
        budgets = await config.monitoring.forge_budgets(now=now)
    except StoreError as exc:
        # Serve the counters anyway; the queue and liveness gauges keep their last values.
        config.metrics.scrape_errors.inc()
        log.warning("metrics: queue not readable: %s", exc, extra={"action": "metrics_stale"})
    else:
        config.metrics.show_queue(snapshot)
        config.metrics.show_budgets((dict(row._mapping) for row in budgets), now=now)
        config.metrics.dispatchers_alive.set(liveness.dispatchers)
        config.metrics.engines_alive.set(liveness.engines)
    return web.Response(body=config.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup_metrics(
    app: web.Application,
    *,
    monitoring: MonitoringRecords,
    clock: Clock,
    metrics: Metrics | None = None,
    count_webhooks: bool = True,
    dispatcher_stale_s: float = DEFAULT_STALE_S,
    token: str | None = None,
    route: bool = True,
) -> Metrics:
    """Add `GET /metrics`, reading the queue and the dispatchers' heartbeats through `monitoring`.

    With `route=False` the metrics are kept (and webhooks counted) but served elsewhere:
    `create_metrics_app` puts them on a port of their own.
    """
    used = metrics if metrics is not None else Metrics()
    app[METRICS_KEY] = used
    app[METRICS_CONFIG_KEY] = MetricsConfig(
        metrics=used,
        monitoring=monitoring,
        clock=clock,
        dispatcher_stale_s=dispatcher_stale_s,
        token=token,
    )
    if route:
        app.router.add_get("/metrics", handle_metrics)
    if count_webhooks:
        app.on_response_prepare.append(_count_webhook_response)
    return used


def create_metrics_app(source: web.Application) -> web.Application:
    """An app serving only `GET /metrics` of `source` (for REVIEW_BOT_METRICS_PORT)."""
    app = web.Application()
    app[METRICS_KEY] = source[METRICS_KEY]
    app[METRICS_CONFIG_KEY] = source[METRICS_CONFIG_KEY]
    app.router.add_get("/metrics", handle_metrics)
    return app


async def start_metrics_site(source: web.Application, *, host: str, port: int) -> web.AppRunner:
    """Serve `source`'s /metrics on a port of its own; the caller cleans the runner up.

    Raises OSError when the port cannot be bound."""
    runner = web.AppRunner(create_metrics_app(source), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()  # the port is taken: nothing half started is left behind
        raise
    log.info("metrics at http://%s:%s/metrics", host, port, extra={"action": "serve_metrics"})
    return runner


def metrics_exposure(
    *, admin_token: str | None, require_token: bool, port: int | None
) -> tuple[bool, str | None]:
    """Whether /metrics is on the main port, and the token it needs; raises ConfigError."""
    if require_token and not admin_token:
        raise ConfigError(
            "REVIEW_BOT_METRICS_REQUIRE_TOKEN is set but REVIEW_BOT_ADMIN_TOKEN is not: "
            "there is no token to require"
        )
    return port is None, admin_token if require_token else None
