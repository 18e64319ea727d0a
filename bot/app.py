"""The composition root: one aiohttp application, one `setup_*` per concern."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

from aiohttp import web

from bot.clock import Clock, SystemClock
from bot.commands.worker import setup_commands
from bot.components import command_worker_settings, queue_settings
from bot.config import Settings
from bot.errors import ConfigError, StoreError, StoreUnavailable, WebhookError
from bot.forges.base import ForgeClient
from bot.intake.app import IntakeConfig, setup_intake
from bot.model import Level
from bot.obs.alerts import setup_alerts
from bot.obs.dashboard import QueuedReview, StandingsReader, setup_admin
from bot.obs.liveness import stale_after
from bot.obs.metrics import Metrics, metrics_exposure, setup_metrics
from bot.policy import PolicyBook, load_policy_book
from bot.queue.status import StatusRecords
from bot.queue.store import QueueStore
from bot.status.eta import Capacity
from bot.status.render import about, ordinal
from bot.status.standing import EtaModel, read_standings

log = logging.getLogger(__name__)

SETTINGS_KEY = web.AppKey("settings", Settings)
STORE_KEY = web.AppKey("store", QueueStore)
POLICIES_KEY = web.AppKey("policies", PolicyBook)
CLOCK_KEY = web.AppKey("clock", Clock)

RETRY_AFTER_S = 30

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def next_up_reader(records: StatusRecords, *, slots: int) -> StandingsReader:
    """The dashboard's list of waiting reviews, from the status publisher's own standings."""
    fallback = EtaModel(Capacity(slots=max(1, slots)))

    async def read(now: datetime) -> list[QueuedReview]:
        found = await read_standings(records, now=now, fallback=fallback)
        return [
            QueuedReview(
                job_id=int(row.id),
                forge=str(row.forge),
                repo=str(row.repo),
                number=int(row.number),
                level=Level(row.level),
                place=place,
                place_text=ordinal(place),
                eta_text=f"review in about {about(found.estimates[int(row.id)].finish_in_s)}",
            )
            for row in found.rows
            if (place := found.estimates[int(row.id)].place) is not None
        ]

    return read


def create_app(
    settings: Settings,
    *,
    store: QueueStore | None = None,
    policies: PolicyBook | None = None,
    clock: Clock | None = None,
    forges: Mapping[str, ForgeClient] | None = None,
    metrics: Metrics | None = None,
) -> web.Application:
    """Build the web application; raises ConfigError (missing secrets) or PolicyError."""
    check_webhook_secrets(settings)
    book = policies if policies is not None else load_policy_book(settings.review.policy_dir)
    app = web.Application(
        client_max_size=settings.web.max_body_bytes, middlewares=[error_middleware]
    )
    if store is None:
        if not settings.database.url:
            raise ConfigError("DATABASE_URL is not set")
        store = QueueStore.from_url(
            settings.database.url,
            settings=queue_settings(settings),
        )
        app.on_cleanup.append(_closer(store))
    used_clock: Clock = clock if clock is not None else SystemClock()
    app[SETTINGS_KEY] = settings
    app[STORE_KEY] = store
    app[POLICIES_KEY] = book
    app[CLOCK_KEY] = used_clock
    setup_intake(
        app,
        config=IntakeConfig(
            store=store,
            policies=book,
            clock=used_clock,
            github_secret=settings.forges.github_webhook_secret,
            gitlab_token=settings.forges.gitlab_webhook_token,
            insecure_dev=settings.web.insecure_dev,
            bot_login=settings.forges.bot_login,
            max_body_bytes=settings.web.max_body_bytes,
            dispatcher_stale_s=stale_after(settings.scheduler.heartbeat_s),
        ),
    )
    on_main_port, metrics_token = metrics_exposure(
        admin_token=settings.web.admin_token,
        require_token=settings.web.metrics_require_token,
        port=settings.web.metrics_port,
    )
    metrics = setup_metrics(
        app,
        monitoring=store.monitoring,
        clock=used_clock,
        metrics=metrics,
        dispatcher_stale_s=stale_after(settings.scheduler.heartbeat_s),
        token=metrics_token,
        route=on_main_port,
    )
    setup_admin(
        app,
        admin_token=settings.web.admin_token,
        monitoring=store.monitoring,
        clock=used_clock,
        thresholds=settings.alerts.threshold_s,
        dispatcher_stale_s=stale_after(settings.scheduler.heartbeat_s),
        trust_forwarded_proto=settings.web.trust_forwarded_proto,
        standings=next_up_reader(store.status, slots=settings.scheduler.workers),
    )
    setup_alerts(
        app,
        monitoring=store.monitoring,
        settings=settings.alerts,
        clock=used_clock,
        metrics=metrics,
        dispatcher_stale_s=stale_after(settings.scheduler.heartbeat_s),
    )
    app.router.add_get("/livez", handle_live)
    if forges:
        # Slash commands run off the webhook path, in a worker started with the app.
        setup_commands(
            app,
            store=store,
            forges=forges,
            policies=book,
            clock=used_clock,
            settings=command_worker_settings(settings),
        )
    return app


def create_worker_app(
    store: QueueStore,
    *,
    metrics: Metrics,
    clock: Clock,
    settings: Settings | None = None,
    draining: Callable[[], bool] | None = None,
) -> web.Application:
    """What a dispatcher-only process serves: `/healthz`, `/livez` and `/metrics`.

    `/healthz` is 503 while the database does not answer or, once `draining()` is true, while
    the process hands its work back before it exits.
    """
    app = web.Application(middlewares=[error_middleware])
    app[STORE_KEY] = store
    app[CLOCK_KEY] = clock
    used = settings if settings is not None else Settings()
    on_main_port, metrics_token = metrics_exposure(
        admin_token=used.web.admin_token,
        require_token=used.web.metrics_require_token,
        port=used.web.metrics_port,
    )
    setup_metrics(
        app,
        monitoring=store.monitoring,
        clock=clock,
        metrics=metrics,
        count_webhooks=False,
        dispatcher_stale_s=stale_after(used.scheduler.heartbeat_s),
        token=metrics_token,
        route=on_main_port,
    )

    async def health(request: web.Request) -> web.Response:
        if draining is not None and draining():
            return web.json_response({"status": "draining"}, status=503)
        await store.ping()  # StoreUnavailable becomes a 503 in the middleware
        return web.json_response({"status": "ok"})

    app.router.add_get("/healthz", health)
    app.router.add_get("/livez", handle_live)
    return app


async def handle_live(request: web.Request) -> web.Response:
    """GET /livez: 200 while the process's event loop answers, whatever the database does.

    A liveness probe on `/healthz` would restart every replica during a database outage,
    which each process rides out by itself (bot.outage); a wedged process fails this one.
    """
    return web.json_response({"status": "alive"})


def missing_webhook_secrets(settings: Settings) -> list[str]:
    """The webhook secrets that are unset; raises ConfigError when both are, unless in
    insecure development mode."""
    missing = [
        name
        for name, value in (
            ("GITHUB_WEBHOOK_SECRET", settings.forges.github_webhook_secret),
            ("GITLAB_WEBHOOK_TOKEN", settings.forges.gitlab_webhook_token),
        )
        if not value
    ]
    if len(missing) == 2 and not settings.web.insecure_dev:
        raise ConfigError(
            "set GITHUB_WEBHOOK_SECRET and/or GITLAB_WEBHOOK_TOKEN (or REVIEW_BOT_INSECURE_DEV=1 "
            "for local development only): refusing to accept unsigned webhooks"
        )
    return missing


def check_webhook_secrets(settings: Settings) -> None:
    """Refuse to run without webhook secrets unless in insecure development mode."""
    missing = missing_webhook_secrets(settings)
    if not missing:
        return
    if settings.web.insecure_dev:
        log.warning(
            "INSECURE DEVELOPMENT MODE: %s unset, unsigned webhooks are ACCEPTED; never run "
            "this way where the network is not yours",
            " and ".join(missing),
            extra={"action": "insecure_dev"},
        )
        return
    log.warning(
        "%s unset: that forge's webhooks are refused with 401",
        missing[0],
        extra={"action": "forge_disabled"},
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer refusals with their status, outages with 503; an unexpected error is never a 500."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except WebhookError as exc:
        log.info(
            "refused %s %s: %s (%s)",
            request.method,
            request.path,
            exc,
            exc.status,
            extra={"action": "webhook_refused"},
        )
        return web.json_response({"status": "rejected", "reason": str(exc)}, status=exc.status)
    except StoreUnavailable as exc:
        log.warning("database unavailable: %s", exc, extra={"action": "store_unavailable"})
        return _unavailable("database unavailable, retry later")
    except StoreError as exc:
        log.error("store error on %s: %s", request.path, exc, extra={"action": "store_error"})
        return _unavailable("store error, retry later")
    except Exception:
        # A bug must not make the forge drop the delivery: ask it to retry, and log loudly.
        log.exception("unexpected error on %s", request.path, extra={"action": "unexpected"})
        return _unavailable("unexpected error, logged; retry later")


def _unavailable(reason: str) -> web.Response:
    return web.json_response(
        {"status": "unavailable", "reason": reason},
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _closer(store: QueueStore) -> Callable[[web.Application], Awaitable[None]]:
    async def close_store(app: web.Application) -> None:
        await store.close()

    return close_store
