"""Engines for the configured backend, and chunks sized to the model the servers serve.

One engine per OpenAI-compatible base URL (one vLLM server: one GPU or one tensor-parallel
group), one for vLLM's in-process engine; the simulated backend keeps plain worker slots. The
chunk line budget is cut to what the served model's context holds (vLLM's /v1/models reports
`max_model_len`), so no chunk is refused for its length.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import aiohttp

from bot.config import Settings
from bot.llm.base import LLMBackend
from bot.llm.openai_compat import OpenAICompatBackend, normalize_base_url
from bot.llm.vllm_metrics import (
    EngineMetrics,
    chunk_line_budget,
    context_allowance,
    fetch_engine_metrics,
    fetch_model_info,
    prompt_tokens_estimate,
)
from bot.obs.metrics import Metrics
from bot.review.chunking import DEFAULT_LINE_BUDGET
from bot.review.prompts import build_messages
from bot.sched.engine_pool import EnginePool, EngineProbe

log = logging.getLogger(__name__)

IN_PROCESS_ENGINE = "in-process"


def engine_names(settings: Settings) -> tuple[str, ...]:
    """The engines of the configured backend; empty for the simulated one (plain slots)."""
    backend = (settings.llm.backend or "simulated").strip().lower()
    if backend == "openai":
        return tuple(dict.fromkeys(normalize_base_url(url) for url in settings.llm.base_urls))
    if backend == "vllm":
        return (IN_PROCESS_ENGINE,)
    return ()


def metrics_probe(backend: LLMBackend, *, metrics_url: str | None = None) -> EngineProbe | None:
    """Reads an engine's vLLM /metrics through the backend's HTTP session (openai only), or
    a router's from `metrics_url` when it serves them elsewhere."""
    if not isinstance(backend, OpenAICompatBackend):
        return None

    async def probe(name: str) -> EngineMetrics | None:
        return await fetch_engine_metrics(backend.get_session(), name, metrics_url=metrics_url)

    return probe


def engine_pool_for(
    settings: Settings, backend: LLMBackend, *, now: datetime, metrics: Metrics | None = None
) -> EnginePool | None:
    """The engines with windows for this backend, or None for plain worker slots."""
    names = engine_names(settings)
    if not names:
        return None
    probe = metrics_probe(backend, metrics_url=settings.llm.metrics_url)
    return EnginePool.build(names, settings.window, now=now, probe=probe, metrics=metrics)


def fixed_prompt_tokens() -> int:
    """Tokens of everything in a chunk's prompt but its diff (system prompt, framing)."""
    messages = build_messages([])
    return sum(prompt_tokens_estimate(message["content"]) for message in messages)


@dataclass(frozen=True, slots=True)
class ServedBudget:
    """How much one chunk may hold: diff lines, and prompt tokens for the pull request's text
    and code context."""

    line_budget: int
    context_tokens: int
    # Lines per chunk while work queues beyond the workers (None: `line_budget` always).
    backlog_line_budget: int | None = None


def configured_budget(settings: Settings, *, ceiling: int = DEFAULT_LINE_BUDGET) -> ServedBudget:
    """The chunk budgets the settings give before any served model is asked: `ceiling` lines,
    the configured context allowance and the backlog's lines (REVIEW_BOT_BACKLOG_CHUNK_LINES)."""
    return ServedBudget(
        ceiling, settings.review.context_tokens, settings.scheduler.backlog_chunk_lines or None
    )


async def served_budget(
    settings: Settings, *, ceiling: int = DEFAULT_LINE_BUDGET, fit_context: bool = True
) -> ServedBudget:
    """Chunk budgets for the served model's context (openai backend): the context allowance
    (REVIEW_BOT_CONTEXT_TOKENS; with `fit_context`, at most a quarter of the prompt's room)
    and the diff lines that fit beside it; else `ceiling` lines and the configured allowance.
    The backlog's budget (REVIEW_BOT_BACKLOG_CHUNK_LINES) fits the same room.

    Raises ValueError when the context cannot hold a useful chunk (a configuration error).
    """
    configured = configured_budget(settings, ceiling=ceiling)
    backlog = configured.backlog_line_budget
    if (settings.llm.backend or "").strip().lower() != "openai" or not settings.llm.base_urls:
        return configured
    async with aiohttp.ClientSession() as session:
        for url in settings.llm.base_urls:
            info = await fetch_model_info(
                session, normalize_base_url(url), settings.llm.model, api_key=settings.llm.api_key
            )
            if info is None or info.max_model_len is None:
                continue
            fixed = fixed_prompt_tokens()
            context = settings.review.context_tokens
            if fit_context:
                context = context_allowance(
                    info.max_model_len,
                    max_tokens=settings.llm.max_tokens,
                    fixed_prompt_tokens=fixed,
                    configured=context,
                )
            # The title, description and code context take at most their allowance.
            fits = chunk_line_budget(
                info.max_model_len,
                max_tokens=settings.llm.max_tokens,
                fixed_prompt_tokens=fixed + context,
                ceiling=max(ceiling, backlog or 0),
            )
            budget = min(ceiling, fits)
            backlog_budget = min(backlog, fits) if backlog else None
            log.info(
                "%s serves %s with a context of %s tokens: chunks of up to %s lines (%s while "
                "work queues) and %s tokens of pull request text and code context",
                url,
                info.id,
                info.max_model_len,
                budget,
                backlog_budget or budget,
                context,
                extra={
                    "action": "chunk_budget",
                    "line_budget": budget,
                    "backlog_line_budget": backlog_budget,
                    "context_tokens": context,
                },
            )
            return ServedBudget(budget, context, backlog_budget)
    log.warning(
        "no server said its context length: chunks of up to %s lines",
        ceiling,
        extra={"action": "chunk_budget_default"},
    )
    return configured


__all__ = [
    "IN_PROCESS_ENGINE",
    "ServedBudget",
    "engine_names",
    "engine_pool_for",
    "fixed_prompt_tokens",
    "metrics_probe",
    "served_budget",
]
