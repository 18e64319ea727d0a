"""Metrics: own registries, histogram buckets, /metrics read from the database at scrape time."""

from __future__ import annotations

import pytest
from aiohttp import web

from bot.app import create_app
from bot.clock import VirtualClock
from bot.config import ForgeSettings, Settings
from bot.db import create_engine
from bot.model import Level
from bot.obs.metrics import METRICS_KEY, Metrics, setup_metrics, webhook_outcome
from bot.queue.connector import Connector
from bot.queue.monitoring import MonitoringRecords
from bot.queue.store import QueueStore
from tests.support.factories import decide, make_request, plans
from tests.support.web import ClientMaker, samples


def test_registries_are_separate_and_buckets_hold_the_thresholds() -> None:
    first, second = Metrics(), Metrics()  # a second set of the same names must not collide
    first.observe_wait(Level.P0, 9.0)
    first.observe_wait(Level.P0, 59.0)
    first.observe_wait(Level.P0, 299.0)
    first.observe_wait(Level.P0, 301.0)
    first.observe_turnaround(Level.P2, 700.0)
    values = samples(first.render().decode())
    bucket = "review_bot_wait_seconds_bucket"
    assert values[bucket, (("le", "10.0"), ("level", "P0"))] == 1
    assert values[bucket, (("le", "60.0"), ("level", "P0"))] == 2
    assert values[bucket, (("le", "300.0"), ("level", "P0"))] == 3
    assert values[bucket, (("le", "+Inf"), ("level", "P0"))] == 4
    assert values["review_bot_turnaround_seconds_count", (("level", "P2"),)] == 1
    assert (
        samples(second.render().decode())["review_bot_wait_seconds_count", (("level", "P0"),)] == 0
    )


def test_counters_from_the_calls_others_make() -> None:
    metrics = Metrics()
    metrics.observe_chunk("gpu-1", 12.5)
    metrics.observe_chunk("gpu-1", 7.5)
    metrics.observe_chunk("gpu-2", 3.0)
    metrics.observe_llm(2.0, prompt_tokens=900, completion_tokens=150)
    metrics.count_webhook("github", "queued")
    metrics.count_post_failure("gitlab")
    metrics.count_reclaims(3)
    metrics.count_reclaims(0)
    metrics.count_dead()
    values = samples(metrics.render().decode())
    assert values["review_bot_chunks_total", (("worker", "gpu-1"),)] == 2
    assert values["review_bot_gpu_seconds_total", (("worker", "gpu-1"),)] == 20.0
    assert values["review_bot_gpu_seconds_total", (("worker", "gpu-2"),)] == 3.0
    assert values["review_bot_llm_latency_seconds_count", ()] == 1
    assert values["review_bot_llm_tokens_total", (("kind", "prompt"),)] == 900
    assert values["review_bot_llm_tokens_total", (("kind", "completion"),)] == 150
    assert values["review_bot_webhooks_total", (("forge", "github"), ("outcome", "queued"))] == 1
    assert values["review_bot_post_failures_total", (("forge", "gitlab"),)] == 1
    assert values["review_bot_lease_reclaims_total", ()] == 3
    assert values["review_bot_dead_jobs_total", ()] == 1


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"status": "queued", "job_id": 3}', "queued"),
        (401, b'{"status": "rejected", "reason": "bad signature"}', "rejected"),
        (503, b"not json", "http_503"),
        (200, b'{"status": "DROP TABLE; --"}', "http_200"),
        (204, None, "http_204"),
    ],
)
def test_webhook_outcome_label(status: int, body: bytes | None, expected: str) -> None:
    assert webhook_outcome(status, body) == expected


async def test_scrape_reads_the_queue_from_the_database(
    store: QueueStore, aiohttp_client: ClientMaker, clock: VirtualClock
) -> None:
    app = web.Application()
    setup_metrics(app, monitoring=store.monitoring, clock=clock)
    client = await aiohttp_client(app)
    jobs = {}
    for number, level in ((1, Level.P0), (2, Level.P1), (3, Level.P1), (4, Level.P3)):
        result = await store.submit_request(
            make_request(number=number, head_sha=f"{number:040x}"), decide(level), now=clock.now()
        )
        assert result.job_id is not None
        jobs[number] = result.job_id
        clock.advance(10)
    await store.plan_job(jobs[2], plans(10, 20), now=clock.now())
    await store.plan_job(jobs[1], plans(5), now=clock.now())
    leased = await store.fetch_chunk(levels=[Level.P0], owner="w", now=clock.now(), lease_s=60)
    assert leased is not None
    clock.advance(5)  # now = 45 s after the first submission

    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    values = samples(await response.text())

    def gauge(name: str, **labels: str) -> float:
        return values[name, tuple(sorted(labels.items()))]

    assert gauge("review_bot_queue_jobs", level="P0", state="waiting") == 0
    assert gauge("review_bot_queue_jobs", level="P0", state="running") == 1
    assert gauge("review_bot_queue_jobs", level="P1", state="waiting") == 2
    assert gauge("review_bot_queue_jobs", level="P3", state="waiting") == 1
    assert gauge("review_bot_queue_chunks", level="P1", state="ready") == 2
    assert gauge("review_bot_queue_chunks", level="P0", state="running") == 1
    # The oldest P1 job arrived 10 s in, so at 45 s it has waited 35 s; P3 arrived at 30 s.
    assert gauge("review_bot_queue_oldest_wait_seconds", level="P1") == pytest.approx(35.0)
    assert gauge("review_bot_queue_oldest_wait_seconds", level="P3") == pytest.approx(15.0)
    assert gauge("review_bot_queue_oldest_wait_seconds", level="P0") == 0

    clock.advance(20)
    values = samples(await (await client.get("/metrics")).text())
    assert gauge("review_bot_queue_oldest_wait_seconds", level="P1") == pytest.approx(55.0)


async def test_scrape_survives_a_database_outage(aiohttp_client: ClientMaker) -> None:
    connector = Connector(create_engine("postgresql://nobody@127.0.0.1:1/none", pool_size=1))
    app = web.Application()
    metrics = setup_metrics(app, monitoring=MonitoringRecords(connector), clock=VirtualClock())
    client = await aiohttp_client(app)
    try:
        response = await client.get("/metrics")
        assert response.status == 200
        values = samples(await response.text())
        assert values["review_bot_metrics_scrape_errors_total", ()] == 1
        assert app[METRICS_KEY] is metrics
    finally:
        await connector.close()


async def test_create_app_serves_metrics_and_counts_webhooks(
    store: QueueStore, aiohttp_client: ClientMaker
) -> None:
    settings = Settings(
        forges=ForgeSettings(github_webhook_secret="s3cret", gitlab_webhook_token="t0ken")
    )
    client = await aiohttp_client(create_app(settings, store=store, clock=VirtualClock()))
    response = await client.post(
        "/webhooks/github",
        data=b"{}",
        headers={
            "X-GitHub-Event": "pull_request",
            "X-GitHub-Delivery": "d-1",
            "X-Hub-Signature-256": "sha256=" + "0" * 64,
            "Content-Type": "application/json",
        },
    )
    assert response.status == 401
    values = samples(await (await client.get("/metrics")).text())
    assert values["review_bot_webhooks_total", (("forge", "github"), ("outcome", "rejected"))] == 1
    assert values["review_bot_queue_jobs", (("level", "P0"), ("state", "waiting"))] == 0
