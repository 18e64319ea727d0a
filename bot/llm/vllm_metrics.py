"""What a vLLM server says about itself: its load from `/metrics`, its context from `/v1/models`.

Parsing is pure (Prometheus text through prometheus_client's own parser, JSON documents in);
two small fetchers read them over HTTP. Both vLLM engine generations are understood: V1's
`vllm:kv_cache_usage_perc` and prefix-cache counters, V0's `vllm:gpu_cache_usage_perc` and
`vllm:gpu_prefix_cache_hit_rate`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

# Sample names as they appear in the exposition text (counters carry `_total`).
# A router says the same of the servers behind it: vLLM production-stack's router repeats the
# vLLM names once per server (label `server`), summed here; the Gateway API inference
# extension's Endpoint Picker (llm-d) reports each pod's queue and the pool's average KV-cache
# use under names of its own.
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting", "inference_pool_per_pod_queue_size")
KV_CACHE_USAGE = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "inference_pool_average_kv_cache_utilization",
)
SERIES_PREFIXES = ("vllm:", "inference_pool_")
PREEMPTIONS = ("vllm:num_preemptions_total",)
# Early V1 releases named the counters with a gpu_ prefix (kept a while beside the new ones).
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_HIT_RATE = ("vllm:gpu_prefix_cache_hit_rate",)  # V0 reports a rate, not counters
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)

# Characters per token used to size a prompt before it is tokenized: code and diffs run
# shorter per token than prose, so this errs towards more tokens.
CHARS_PER_TOKEN = 3.0
# The code context takes at most 1/this of the prompt's room in a model's context.
CONTEXT_SHARE_OF_ROOM = 4
# Diff lines of source code average about 40 characters plus the +/- marker and the newline
# (with their share of unchanged lines: 16.2 per changed line over this repository's history).
TOKENS_PER_DIFF_LINE = 16
# The prompt numbers every line it shows ("123 +code"): 1.5 tokens more per changed line by
# the estimate over the same history, 3.2 by SmolLM2's tokenizer, which spends a token on
# each digit (bench/results/prompt_numbering.md), rounded up.
TOKENS_PER_LINE_NUMBER = 4


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What vLLM's /metrics said over an interval; None where it says nothing."""

    # Queued inside the engine: at the interval's end, or the least over its reads where the
    # dispatcher read it at every call's end (see bot.sched.engines.Engine.saw_queue).
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    new_preemptions: float | None = None  # preemptions since the previous interval


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One scrape of a vLLM server's /metrics; None where the server reports nothing."""

    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_hit_rate: float | None = None  # V0's own gauge
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None


def parse_engine_metrics(text: str) -> EngineMetrics:
    """Read the vLLM series from Prometheus exposition text; raises ValueError on bad text.

    A server with several engines (data parallel), or a router with several servers, labels
    each: gauges of load and the counters are summed over them, KV-cache usage is the fullest
    engine's.
    """
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(SERIES_PREFIXES) and math.isfinite(sample.value):
                values.setdefault(sample.name, []).append(float(sample.value))

    def total(names: Iterable[str]) -> float | None:
        for name in names:
            if name in values:
                return sum(values[name])
        return None

    def highest(names: Iterable[str]) -> float | None:
        for name in names:
            if name in values:
                return max(values[name])
        return None

    return EngineMetrics(
        requests_running=total(RUNNING),
        requests_waiting=total(WAITING),
        kv_cache_usage=highest(KV_CACHE_USAGE),
        preemptions_total=total(PREEMPTIONS),
        prefix_cache_queries_total=total(PREFIX_QUERIES),
        prefix_cache_hits_total=total(PREFIX_HITS),
        prefix_cache_hit_rate=highest(PREFIX_HIT_RATE),
        prompt_tokens_total=total(PROMPT_TOKENS),
        generation_tokens_total=total(GENERATION_TOKENS),
    )


def _delta(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    # A counter that went down means the server restarted: everything since is new.
    return after - before if after >= before else after


def engine_load(previous: EngineMetrics | None, current: EngineMetrics) -> EngineLoad:
    """The window's view of two scrapes: queue and KV cache now, preemptions in between."""
    return EngineLoad(
        requests_waiting=current.requests_waiting,
        kv_cache_usage=current.kv_cache_usage,
        new_preemptions=_delta(
            previous.preemptions_total if previous else None, current.preemptions_total
        ),
    )


def prefix_cache_hit_rate(previous: EngineMetrics | None, current: EngineMetrics) -> float | None:
    """Share of prompt tokens served from the prefix cache between two scrapes (0..1).

    V1 counts queries and hits (tokens); V0 reports the rate itself. None when unknown or
    when nothing was queried in between.
    """
    queries = _delta(
        previous.prefix_cache_queries_total if previous else 0.0,
        current.prefix_cache_queries_total,
    )
    hits = _delta(
        previous.prefix_cache_hits_total if previous else 0.0, current.prefix_cache_hits_total
    )
    if queries is not None and hits is not None:
        return min(1.0, hits / queries) if queries > 0 else None
    return current.prefix_cache_hit_rate


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A served model as /v1/models describes it."""

    id: str
    max_model_len: int | None = None


def parse_model_info(document: Mapping[str, Any], model: str) -> ModelInfo:
    """The entry of `model` in a /v1/models answer; raises ValueError when it is not served.

    A server that serves a single model under another name still answers for it (the name
    the bot sends is then only an alias the operator chose).
    """
    entries = document.get("data")
    if not isinstance(entries, list):
        raise ValueError("a /v1/models answer has a `data` list")
    models = [entry for entry in entries if isinstance(entry, Mapping) and "id" in entry]
    chosen = next((entry for entry in models if entry["id"] == model), None)
    if chosen is None and len(models) == 1:
        chosen = models[0]
    if chosen is None:
        served = ", ".join(str(entry["id"]) for entry in models) or "none"
        raise ValueError(f"model {model!r} is not served here (served: {served})")
    length = chosen.get("max_model_len")
    return ModelInfo(
        id=str(chosen["id"]),
        max_model_len=int(length) if isinstance(length, int | float) and length > 0 else None,
    )


def prompt_tokens_estimate(text: str) -> int:
    """Tokens a text will take, erring high (see CHARS_PER_TOKEN)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def chunk_line_budget(
    max_model_len: int,
    *,
    max_tokens: int,
    fixed_prompt_tokens: int,
    tokens_per_line: int = TOKENS_PER_DIFF_LINE + TOKENS_PER_LINE_NUMBER,
    ceiling: int,
    floor: int = 20,
) -> int:
    """Diff lines one chunk may hold so prompt and answer fit the model's context.

    The context holds the fixed prompt (system prompt, framing, output contract), the chunk's
    numbered diff and up to `max_tokens` of answer. Never above `ceiling` (the configured
    budget) and never under `floor`: a context too small for that is a configuration error.
    """
    room = max_model_len - max_tokens - fixed_prompt_tokens
    lines = room // max(1, tokens_per_line)
    if lines < floor:
        raise ValueError(
            f"a context of {max_model_len} tokens leaves room for {max(0, lines)} diff lines "
            f"after {fixed_prompt_tokens} prompt and {max_tokens} answer tokens; "
            f"serve the model with a longer --max-model-len or ask for fewer answer tokens"
        )
    return min(ceiling, lines)


def context_allowance(
    max_model_len: int, *, max_tokens: int, fixed_prompt_tokens: int, configured: int
) -> int:
    """Prompt tokens a chunk may give the pull request's text and code context: the configured
    allowance, but never more than a quarter of what the model's context leaves for the
    prompt, so a small context still holds a useful diff."""
    room = max_model_len - max_tokens - fixed_prompt_tokens
    return max(0, min(configured, room // CONTEXT_SHARE_OF_ROOM))


async def fetch_engine_metrics(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    timeout_s: float = 5.0,
    metrics_url: str | None = None,
) -> EngineMetrics | None:
    """Scrape `base_url`/metrics (or `metrics_url`, where a router's metrics are served
    elsewhere); None when there are none or they cannot be read."""
    url = metrics_url or base_url.rstrip("/") + "/metrics"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.debug("no /metrics from %s: %s", base_url, exc, extra={"action": "engine_metrics"})
        return None
    try:
        return parse_engine_metrics(text)
    except ValueError as exc:
        log.warning(
            "unreadable /metrics from %s: %s",
            base_url,
            exc,
            extra={"action": "engine_metrics_unreadable"},
        )
        return None


async def fetch_model_info(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    timeout_s: float = 10.0,
) -> ModelInfo | None:
    """Read `base_url`/v1/models for `model`; None when the server cannot be asked."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(
            base_url.rstrip("/") + "/v1/models",
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            if response.status != 200:
                return None
            document = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.info("no /v1/models from %s: %s", base_url, exc, extra={"action": "model_info"})
        return None
    if not isinstance(document, Mapping):
        return None
    return parse_model_info(document, model)


__all__ = [
    "EngineMetrics",
    "ModelInfo",
    "chunk_line_budget",
    "context_allowance",
    "engine_load",
    "fetch_engine_metrics",
    "fetch_model_info",
    "parse_engine_metrics",
    "parse_model_info",
    "prefix_cache_hit_rate",
    "prompt_tokens_estimate",
]
