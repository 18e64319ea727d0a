"""Who can read /metrics and the admin cookie: a port of its own, the admin token, HTTPS."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from bot.app import create_app, create_worker_app
from bot.clock import VirtualClock
from bot.config import ForgeSettings, Settings, WebSettings, load_settings
from bot.errors import ConfigError
from bot.obs.access import came_over_https
from bot.obs.dashboard import COOKIE_NAME
from bot.obs.metrics import Metrics, create_metrics_app
from bot.queue.store import QueueStore
from tests.support.serving import REPO_ROOT, free_port, start_serve
from tests.support.web import ClientMaker

BASE = Settings(
    forges=ForgeSettings(github_webhook_secret="s", gitlab_webhook_token="t"),
    web=WebSettings(admin_token="admin-secret"),
)
BEARER = {"Authorization": "Bearer admin-secret"}


async def test_metrics_behind_the_admin_token(
    store: QueueStore, aiohttp_client: ClientMaker
) -> None:
    settings = BASE.with_changes(web={"metrics_require_token": True})
    client = await aiohttp_client(create_app(settings, store=store, clock=VirtualClock()))
    refused = await client.get("/metrics")
    assert refused.status == 401
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401
    allowed = await client.get("/metrics", headers=BEARER)
    assert allowed.status == 200 and "review_bot_queue_jobs" in await allowed.text()
    open_by_default = await aiohttp_client(create_app(BASE, store=store, clock=VirtualClock()))
    assert (await open_by_default.get("/metrics")).status == 200


async def test_requiring_a_token_without_one_refuses_to_start(store: QueueStore) -> None:
    settings = BASE.with_changes(web={"admin_token": None, "metrics_require_token": True})
    with pytest.raises(ConfigError, match="REVIEW_BOT_ADMIN_TOKEN"):
        create_app(settings, store=store, clock=VirtualClock())
    with pytest.raises(ConfigError, match="REVIEW_BOT_ADMIN_TOKEN"):
        create_worker_app(store, metrics=Metrics(), clock=VirtualClock(), settings=settings)


async def test_metrics_on_a_port_of_their_own(
    store: QueueStore, aiohttp_client: ClientMaker
) -> None:
    app = create_app(
        BASE.with_changes(web={"metrics_port": 9464}), store=store, clock=VirtualClock()
    )
    main = await aiohttp_client(app)
    assert (await main.get("/metrics")).status == 404
    assert (await main.get("/healthz")).status == 200
    scrape = await aiohttp_client(create_metrics_app(app))
    # Webhooks answered on the main port are counted in what the metrics port serves.
    posted = await main.post("/webhooks/github", data=b"{}", headers={"X-GitHub-Event": "ping"})
    assert posted.status == 401, await posted.text()
    text = await (await scrape.get("/metrics")).text()
    counted = [line for line in text.splitlines() if line.startswith("review_bot_webhooks_total")]
    assert counted == ['review_bot_webhooks_total{forge="github",outcome="rejected"} 1.0'], text
    worker = create_worker_app(
        store,
        metrics=Metrics(),
        clock=VirtualClock(),
        settings=BASE.with_changes(web={"metrics_port": 1}),
    )
    worker_client = await aiohttp_client(worker)
    assert (await worker_client.get("/metrics")).status == 404


def test_settings_read_the_metrics_and_proxy_variables() -> None:
    settings = load_settings(
        {
            "REVIEW_BOT_METRICS_PORT": "9464",
            "REVIEW_BOT_METRICS_REQUIRE_TOKEN": "1",
            "REVIEW_BOT_TRUST_FORWARDED_PROTO": "true",
        }
    )
    assert (settings.web.metrics_port, settings.web.metrics_require_token) == (9464, True)
    assert settings.web.trust_forwarded_proto
    assert load_settings({}).web.metrics_port is None
    with pytest.raises(ConfigError, match="REVIEW_BOT_METRICS_PORT"):
        load_settings({"REVIEW_BOT_METRICS_PORT": "70000"})


def test_https_is_direct_tls_or_a_trusted_proxy() -> None:
    assert came_over_https(direct_tls=True, forwarded_proto=None, trust_forwarded_proto=False)
    assert came_over_https(
        direct_tls=False, forwarded_proto="https, http", trust_forwarded_proto=True
    )
    assert not came_over_https(
        direct_tls=False, forwarded_proto="https", trust_forwarded_proto=False
    )
    assert not came_over_https(direct_tls=False, forwarded_proto="http", trust_forwarded_proto=True)
    assert not came_over_https(direct_tls=False, forwarded_proto=None, trust_forwarded_proto=True)


@pytest.mark.parametrize(("trust", "secure"), [(True, True), (False, False)])
async def test_admin_cookie_is_secure_behind_a_trusted_https_proxy(
    store: QueueStore, aiohttp_client: ClientMaker, trust: bool, secure: bool
) -> None:
    settings = BASE.with_changes(web={"trust_forwarded_proto": trust})
    client = await aiohttp_client(create_app(settings, store=store, clock=VirtualClock()))
    response = await client.get(
        "/admin?token=admin-secret",
        headers={"X-Forwarded-Proto": "https"},
        allow_redirects=False,
    )
    assert response.status == 303
    cookie = response.cookies[COOKIE_NAME]
    assert bool(cookie["secure"]) is secure
    assert cookie["httponly"] and cookie["samesite"] == "Strict"


@pytest.mark.slow
async def test_serve_puts_metrics_on_their_own_port(db_url: str) -> None:
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "GITHUB_WEBHOOK_SECRET": "s",
        "GITLAB_WEBHOOK_TOKEN": "t",
        "REVIEW_BOT_METRICS_PORT": str(metrics_port),
        "PYTHONPATH": str(REPO_ROOT),
    }
    process = await start_serve("web", port=port, env=env)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):  # a real process starting: poll its port
                try:
                    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as answer:
                        scraped = (answer.status, await answer.text())
                        break
                except aiohttp.ClientConnectionError:
                    assert process.returncode is None, "bot serve exited early"
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("the metrics port never answered")
            async with session.get(f"http://127.0.0.1:{port}/metrics") as answer:
                on_main = answer.status
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert scraped[0] == 200 and "review_bot_dispatchers_alive" in scraped[1]
    assert on_main == 404
    assert process.returncode == 0, stderr.decode()[-2000:]


async def test_liveness_and_readiness_per_role(
    store: QueueStore, aiohttp_client: ClientMaker
) -> None:
    web_role = await aiohttp_client(create_app(BASE, store=store, clock=VirtualClock()))
    assert (await web_role.get("/livez")).status == 200
    assert (await web_role.get("/healthz")).status == 200
    draining = False
    dispatcher_role = await aiohttp_client(
        create_worker_app(store, metrics=Metrics(), clock=VirtualClock(), draining=lambda: draining)
    )
    assert (await dispatcher_role.get("/healthz")).status == 200
    draining = True  # SIGTERM came: not ready, still alive while it hands its work back
    refused = await dispatcher_role.get("/healthz")
    assert refused.status == 503 and (await refused.json())["status"] == "draining"
    assert (await dispatcher_role.get("/livez")).status == 200
    await store.close()  # the database gone: not ready, and alive all the same
    assert (await dispatcher_role.get("/livez")).status == 200
