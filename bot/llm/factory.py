"""Build the configured LLM backend from Settings."""

from __future__ import annotations

from bot.config import Settings
from bot.errors import ConfigError
from bot.llm.base import LLMBackend

BACKENDS = ("simulated", "openai", "vllm")


def create_backend(settings: Settings) -> LLMBackend:
    """The backend named by settings.llm_backend; raises ConfigError or BackendUnavailable."""
    name = settings.llm_backend.strip().lower()
    if name == "simulated":
        from bot.llm.simulated import SimulatedBackend

        return SimulatedBackend()
    if name == "openai":
        from bot.llm.openai_compat import OpenAICompatBackend

        if not settings.llm_base_urls:
            raise ConfigError("REVIEW_BOT_LLM=openai needs REVIEW_BOT_LLM_URLS (comma separated)")
        return OpenAICompatBackend(
            settings.llm_base_urls,
            model=settings.llm_model,
            api_key=settings.llm_api_key,
            timeout_s=settings.llm_timeout_s,
            pass_priority=settings.llm_pass_priority,
            response_format=settings.llm_response_format,  # type: ignore[arg-type]
        )
    if name == "vllm":
        from bot.llm.vllm_engine import VLLMEngineBackend

        return VLLMEngineBackend(settings.llm_model)
    raise ConfigError(f"REVIEW_BOT_LLM must be one of {', '.join(BACKENDS)}, got {name!r}")
