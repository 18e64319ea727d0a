"""/admin: nothing without the token, the page's charts, and a real headless Chromium render."""

from __future__ import annotations

import asyncio
import re
import shutil
import struct
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bot.app import create_app
from bot.clock import EPOCH, VirtualClock
from bot.config import AlertSettings, ForgeSettings, Settings, WebSettings
from bot.db import create_engine
from bot.model import Level
from bot.obs.alerts import AlertMonitor
from bot.obs.dashboard import (
    COOKIE_NAME,
    DashboardView,
    EngineWork,
    WaitPoint,
    bearer_token,
    render_dashboard,
    setup_admin,
    wait_histogram,
    wait_series,
)
from bot.obs.metrics import read_queue_snapshot
from bot.queue.connector import Connector
from bot.queue.monitoring import MonitoringRecords
from bot.queue.store import QueueStore
from tests.support.factories import decide, make_request, plans
from tests.support.obs_helpers import replayed_database
from tests.support.web import ClientMaker

TOKEN = "admin-token-for-tests-0123456789"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
    "--disable-extensions",
    "--hide-scrollbars",
    "--window-size=1280,900",
)


# --- pure ----------------------------------------------------------------------------------


def test_wait_series_and_histogram() -> None:
    since = EPOCH
    points = [
        WaitPoint(Level.P0, EPOCH + timedelta(minutes=1), 2.0),
        WaitPoint(Level.P0, EPOCH + timedelta(minutes=2), 4.0),
        WaitPoint(Level.P1, EPOCH + timedelta(minutes=59), 90.0),
        WaitPoint(Level.P1, EPOCH + timedelta(minutes=59), 4000.0),
    ]
    series = wait_series(points, since=since, until=EPOCH + timedelta(hours=1), buckets=4)
    assert series[Level.P0] == [3.0, None, None, None]
    assert series[Level.P1] == [None, None, None, 2045.0]
    assert series[Level.P3] == [None] * 4
    histogram = wait_histogram(points, edges=(10.0, 60.0, 300.0))
    assert histogram[Level.P0] == [2, 0, 0, 0]
    assert histogram[Level.P1] == [0, 0, 1, 1]


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


# --- over HTTP -----------------------------------------------------------------------------


def _admin_app(store: QueueStore, clock: VirtualClock, token: str | None) -> web.Application:
    app = web.Application()
    setup_admin(app, admin_token=token, monitoring=store.monitoring, clock=clock)
    return app


async def test_no_admin_token_configured_means_no_admin(
    store: QueueStore, aiohttp_client: ClientMaker, clock: VirtualClock
) -> None:
    client = await aiohttp_client(_admin_app(store, clock, None))
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": f"Bearer {TOKEN}"}):
        response = await client.get("/admin", headers=headers)
        assert response.status == 404
        assert "review-bot queue" not in await response.text()
    assert (await client.get("/admin?token=")).status == 404


async def test_admin_refuses_without_the_token(
    store: QueueStore, aiohttp_client: ClientMaker, clock: VirtualClock
) -> None:
    client = await aiohttp_client(_admin_app(store, clock, TOKEN))
    refusals = [
        await client.get("/admin"),
        await client.get("/admin", headers={"Authorization": "Bearer wrong"}),
        await client.get("/admin", headers={"Authorization": f"Basic {TOKEN}"}),
        await client.get("/admin?token=wrong"),
        await client.get("/admin", cookies={COOKIE_NAME: TOKEN}),  # the token is not a cookie
    ]
    for response in refusals:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        body = await response.text()
        assert "<svg" not in body and "review-bot queue" not in body


async def test_admin_with_bearer_and_with_token_cookie(
    store: QueueStore, aiohttp_client: ClientMaker, clock: VirtualClock
) -> None:
    client = await aiohttp_client(_admin_app(store, clock, TOKEN))
    response = await client.get("/admin", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 200
    assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert response.headers["Cache-Control"] == "no-store"
    page = await response.text()
    assert page.count('<svg class="chart"') == 3

    traded = await client.get("/admin?token=" + TOKEN + "&hours=6", allow_redirects=False)
    assert traded.status == 303
    assert traded.headers["Location"] == "/admin?hours=6"
    set_cookie = traded.headers["Set-Cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    assert TOKEN not in set_cookie
    followed = await client.get("/admin?hours=6")  # the client's jar now holds the cookie
    assert followed.status == 200
    assert "last 6 h" in await followed.text()


async def test_create_app_mounts_admin(store: QueueStore, aiohttp_client: ClientMaker) -> None:
    settings = Settings(
        forges=ForgeSettings(github_webhook_secret="s", gitlab_webhook_token="t"),
        web=WebSettings(admin_token=TOKEN),
    )
    client = await aiohttp_client(create_app(settings, store=store, clock=VirtualClock()))
    assert (await client.get("/admin")).status == 401
    authorized = await client.get("/admin", headers={"Authorization": f"Bearer {TOKEN}"})
    assert authorized.status == 200


async def test_the_dashboard_lists_waiting_reviews_with_their_status_place_and_eta(
    store: QueueStore, aiohttp_client: ClientMaker
) -> None:
    """Next up: the reviews not started yet, by place, with the ETA their statuses give (the
    status publisher's standings, read back with its model, or the slots configured before)."""
    clock = VirtualClock()
    settings = Settings(
        forges=ForgeSettings(github_webhook_secret="s", gitlab_webhook_token="t"),
        web=WebSettings(admin_token=TOKEN),
    )
    for number in range(1, 12):
        submitted = await store.submit_request(
            make_request(number=number), decide(), now=clock.now()
        )
        assert submitted.job_id is not None
        await store.plan_job(submitted.job_id, plans(40), now=clock.now())
    client = await aiohttp_client(create_app(settings, store=store, clock=clock))
    page = await (await client.get("/admin", headers={"Authorization": f"Bearer {TOKEN}"})).text()
    table = page.split('id="next-up"')[1].split("</table>")[0]
    rows = re.findall(r"<tr><td>(\w+)</td><td>(P\d)</td><td>([^<]+)</td><td>([^<]+)</td>", table)
    # Eight slots: eleven reviews of one call each, the first eight start at once.
    assert [place for place, *_ in rows] == [
        "1st", "2nd", "3rd", "4th", "5th", "6th", "7th", "8th", "9th", "10th", "11th"
    ]  # fmt: skip
    assert all(eta.startswith("review in about ") for *_, eta in rows)
    assert rows[-1][3] != rows[0][3]  # the last three wait for the first wave


async def test_hostile_text_on_the_page_is_escaped(
    store: QueueStore, aiohttp_client: ClientMaker
) -> None:
    """What PR authors and engine operators choose reaches the page as text, never as markup."""
    clock = VirtualClock()
    settings = Settings(
        forges=ForgeSettings(github_webhook_secret="s", gitlab_webhook_token="t"),
        web=WebSettings(admin_token=TOKEN),
    )
    hostile = make_request(
        repo="acme/<script>alert(1)</script>", title='<script>alert("title")</script>'
    )
    submitted = await store.submit_request(hostile, decide(), now=clock.now())
    assert submitted.job_id is not None
    await store.plan_job(submitted.job_id, plans(40), now=clock.now())
    client = await aiohttp_client(create_app(settings, store=store, clock=clock))
    page = await (await client.get("/admin", headers={"Authorization": f"Bearer {TOKEN}"})).text()
    assert "acme/&lt;script&gt;alert(1)&lt;/script&gt;#7" in page
    assert "<script" not in page

    now = clock.now()
    view = DashboardView(
        now=now,
        since=now - timedelta(hours=1),
        queue=await read_queue_snapshot(store.monitoring, now=now),
        waits=[],
        alerts=[{"fired_at": now, "level": "P1", "repo": "<img src=x onerror=alert(2)>",
                 "number": 7, "waited_s": 90.0, "state": '"><script>x</script>'}],
        engines=[EngineWork('http://gpu"><script>y</script>', chunks=1, busy_s=1.0, tokens=5)],
    )  # fmt: skip
    rendered = render_dashboard(view)
    assert "<script" not in rendered and "<img" not in rendered
    assert "&lt;img src=x onerror=alert(2)&gt;#7" in rendered
    assert 'data-engine="http://gpu&#34;&gt;&lt;script&gt;y&lt;/script&gt;"' in rendered


# --- headless Chromium ---------------------------------------------------------------------


@pytest.fixture
async def dashboard_url(pg_server: str, template_database: str) -> AsyncIterator[str]:
    """A replayed database with one alert, served over loopback by a real TCP server."""
    async with replayed_database(pg_server, template_database) as (url, _):
        clock = VirtualClock(EPOCH + timedelta(minutes=40))
        store = QueueStore.from_url(url, pool_size=2)
        connector = Connector(create_engine(url, pool_size=2))
        try:
            waiting = await store.submit_request(
                make_request(repo="acme/hotfix-repo", number=77, head_sha="e" * 40),
                decide(Level.P0),
                now=clock.now(),
            )
            assert waiting.job_id is not None
            clock.advance(25)
            monitor = AlertMonitor(
                monitoring=MonitoringRecords(connector), settings=AlertSettings()
            )
            assert len(await monitor.check(now=clock.now())) == 1
            app = web.Application()
            setup_admin(
                app, admin_token=TOKEN, monitoring=MonitoringRecords(connector), clock=clock
            )
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            try:
                yield str(server.make_url("/admin"))
            finally:
                await server.close()
        finally:
            await connector.close()
            await store.close()


async def _chromium(*arguments: str, profile: Path) -> bytes:
    assert CHROMIUM is not None
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        *arguments,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
    return stdout


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _distinct_colors(path: Path) -> set[tuple[int, int, int]]:
    try:
        from matplotlib import image
    except ImportError:
        return set()
    pixels: Any = image.imread(str(path))
    rgb = (pixels[:, :, :3] * 255).round().astype(int).reshape(-1, 3)
    return {tuple(int(v) for v in row) for row in rgb[:: max(1, len(rgb) // 200_000)]}


@pytest.mark.slow
async def test_dashboard_renders_in_headless_chromium(dashboard_url: str, tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip(
            "chromium is not installed (apt-get install -y chromium chromium-driver); "
            "the page test needs Debian's headless Chromium"
        )
    entry = f"{dashboard_url}?token={TOKEN}"  # traded for the HttpOnly cookie on redirect
    screenshot = tmp_path / "admin.png"
    await _chromium(f"--screenshot={screenshot}", entry, profile=tmp_path / "profile-shot")
    data = screenshot.read_bytes()
    assert _png_size(data) == (1280, 900)
    assert len(data) > 20_000, "a blank page compresses to almost nothing"
    colors = _distinct_colors(screenshot)
    if colors:
        assert (255, 127, 14) in colors, "the P1 series colour is missing from the screenshot"
        assert len(colors) > 50

    dom = (await _chromium("--dump-dom", entry, profile=tmp_path / "profile-dom")).decode()
    for chart in ("queue", "waits", "distribution"):
        assert f'data-chart="{chart}"' in dom
    assert len(re.findall(r'<rect class="bar"', dom)) >= 3 * 4 + 8 * 4
    assert re.search(r'<polyline class="series" data-level="P1" points="[0-9., ]{20,}"', dom)
    alerts_table = dom[dom.index('id="alerts"') :]
    assert "acme/hotfix-repo#77" in alerts_table and "no alerts" not in alerts_table
    assert "review-bot queue" in dom
