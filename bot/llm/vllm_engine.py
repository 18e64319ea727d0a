"""vLLM's in-process async engine for a GPU host; vllm is imported only when it is chosen."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
from typing import Any

from bot.errors import BackendUnavailable, LLMError, LLMRequestRejected
from bot.llm.base import LLMRequest, LLMResponse

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'review-bot[vllm]'"


def import_vllm() -> Any:
    """The vllm module; raises BackendUnavailable when it is not installed."""
    try:
        import vllm
    except ImportError as exc:
        raise BackendUnavailable(
            f"the vllm LLM backend needs the vllm package ({INSTALL_HINT}): {exc}"
        ) from exc
    return vllm


# vLLM's own split (vllm.exceptions): client errors are the request's fault (4xx on its HTTP
# server), server errors the engine's (5xx). Matched by name so that this module, and its
# tests, need no vllm import.
_CLIENT_ERRORS = frozenset({"VLLMClientError", "VLLMValidationError", "VLLMNotFoundError"})
_SERVER_ERRORS = frozenset({"VLLMServerError", "EngineGenerateError", "EngineDeadError"})


def translate_vllm_error(error: BaseException) -> LLMError:
    """Our error for one raised by the in-process engine, with the openai backend's outcomes:
    a request the engine refuses (a prompt over the context length, a bad parameter; older
    vLLMs raise ValueError or TypeError for these) is LLMRequestRejected, so the review goes
    on without that part; anything else is a retryable LLMError."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & _CLIENT_ERRORS or (
        not names & _SERVER_ERRORS and isinstance(error, ValueError | TypeError)
    ):
        return LLMRequestRejected(f"vLLM rejected the request: {error}")
    return LLMError(f"vLLM engine failed: {type(error).__name__}: {error}", retryable=True)


class VLLMEngineBackend:
    """Runs chat requests on an in-process AsyncLLMEngine with priority scheduling."""

    def __init__(
        self,
        model: str,
        *,
        max_num_seqs: int | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        engine_options: dict[str, Any] | None = None,
        engine: Any = None,
    ) -> None:
        self.model = model
        self.options: dict[str, Any] = {
            "model": model,
            "scheduling_policy": "priority",
            "enforce_eager": enforce_eager,
            **({"max_num_seqs": max_num_seqs} if max_num_seqs else {}),
            **({"max_model_len": max_model_len} if max_model_len else {}),
            **(engine_options or {}),
        }
        self.vllm = import_vllm()
        self.engine = engine
        self.tokenizer: Any = None
        self.start_lock = asyncio.Lock()
        self.request_ids = itertools.count(1)
        self.worker = f"vllm:{model}"

    async def start(self) -> None:
        """Build the engine and its tokenizer once; raises BackendUnavailable on failure."""
        async with self.start_lock:
            if self.engine is None:
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.engine.async_llm_engine import AsyncLLMEngine

                try:
                    self.engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**self.options))
                except Exception as exc:  # any engine start-up failure means "unusable here"
                    raise BackendUnavailable(f"vLLM engine failed to start: {exc}") from exc
            if self.tokenizer is None:
                tokenizer = self.engine.get_tokenizer()
                # Older engines return the tokenizer from a coroutine.
                self.tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Generate one chat answer; the request's priority goes to vLLM's scheduler."""
        await self.start()
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        text_prompt = self.tokenizer.apply_chat_template(
            [dict(message) for message in request.messages],
            tokenize=False,
            add_generation_prompt=True,
        )
        token_ids = self.tokenizer.encode(text_prompt, add_special_tokens=False)
        params = SamplingParams(max_tokens=request.max_tokens, temperature=request.temperature)
        request_id = f"review-{request.metadata.get('chunk_id', 'x')}-{next(self.request_ids)}"
        started = time.monotonic()
        final: Any = None
        try:
            async for output in self.engine.generate(
                TokensPrompt(prompt_token_ids=token_ids),
                params,
                request_id,
                priority=int(request.priority or 0),
            ):
                final = output
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise translate_vllm_error(exc) from exc
        latency = time.monotonic() - started
        if final is None or not final.outputs:
            raise LLMError("vLLM returned no output", retryable=True)
        completion = final.outputs[0]
        return LLMResponse(
            text=completion.text,
            prompt_tokens=len(final.prompt_token_ids or token_ids),
            completion_tokens=len(completion.token_ids),
            latency_s=latency,
            gpu_seconds=latency,
            worker=self.worker,
            finish_reason=completion.finish_reason,
        )

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
