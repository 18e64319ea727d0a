"""Build the configured LLM backend from Settings."""

from __future__ import annotations

from collections.abc import Collection

from bot.config import LLMSettings, Settings
from bot.errors import ConfigError
from bot.llm.base import LLMBackend

BACKENDS = ("simulated", "openai", "vllm")
DEFAULT_BACKEND = "simulated"


def check_backend_choice(llm_backend: str | None, *, forges: Collection[str]) -> str:
    """The backend to review with; raises ConfigError when real forges are configured and no
    backend was chosen, so the simulated backend's canned reviews never reach a real PR unasked.
    """
    if llm_backend:
        return llm_backend
    if forges:
        raise ConfigError(
            f"REVIEW_BOT_LLM is not set while {' and '.join(sorted(forges))} credentials are: "
            "reviews would be the simulated backend's pattern matches. Set REVIEW_BOT_LLM=openai "
            "with REVIEW_BOT_LLM_URLS (your vLLM servers), or REVIEW_BOT_LLM=vllm on a GPU "
            "host, or REVIEW_BOT_LLM=simulated to post simulated reviews on purpose"
        )
    return DEFAULT_BACKEND


def check_backend_settings(llm: LLMSettings) -> str:
    """The backend `llm` names (simulated when unset); raises ConfigError when it names none
    or lacks what it needs, so `bot serve` refuses before it touches anything."""
    name = (llm.backend or DEFAULT_BACKEND).strip().lower()
    if name not in BACKENDS:
        raise ConfigError(f"REVIEW_BOT_LLM must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "openai" and not llm.base_urls:
        raise ConfigError("REVIEW_BOT_LLM=openai needs REVIEW_BOT_LLM_URLS (comma separated)")
    return name


def create_backend(settings: Settings) -> LLMBackend:
    """The backend named by settings.llm_backend (simulated when unset); raises ConfigError or
    BackendUnavailable."""
    name = check_backend_settings(settings.llm)
    if name == "simulated":
        from bot.llm.simulated import SimulatedBackend

        if settings.llm.sim_time_scale <= 0:
            return SimulatedBackend(fault_every=settings.llm.sim_fault_every)
        import asyncio

        return SimulatedBackend(
            sleep=asyncio.sleep,
            time_scale=settings.llm.sim_time_scale,
            fault_every=settings.llm.sim_fault_every,
        )
    if name == "openai":
        from bot.llm.openai_compat import OpenAICompatBackend
        from bot.llm.routing import RouterAffinity

        affinity = (
            RouterAffinity(
                session_header=settings.llm.session_header, objectives=settings.llm.objectives
            )
            if settings.llm.router
            else None
        )
        return OpenAICompatBackend(
            settings.llm.base_urls,
            model=settings.llm.model,
            api_key=settings.llm.api_key,
            timeout_s=settings.llm.timeout_s,
            pass_priority=settings.llm.pass_priority,
            stream=settings.llm.stream,
            response_format=settings.llm.response_format,
            affinity=affinity,
        )
    from bot.llm.vllm_engine import VLLMEngineBackend

    return VLLMEngineBackend(settings.llm.model)
