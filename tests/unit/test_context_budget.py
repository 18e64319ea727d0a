"""A chunk's budget on a served model: diff lines and code context fit its context together."""

from __future__ import annotations

import pytest
from aiohttp import web

from bot.config import LLMSettings, Settings
from bot.engine_setup import fixed_prompt_tokens, served_budget
from bot.llm.vllm_metrics import (
    TOKENS_PER_DIFF_LINE,
    TOKENS_PER_LINE_NUMBER,
    context_allowance,
)

LINE = TOKENS_PER_DIFF_LINE + TOKENS_PER_LINE_NUMBER


def test_the_context_takes_at_most_a_quarter_of_the_prompt_room() -> None:
    assert (
        context_allowance(32768, max_tokens=1024, fixed_prompt_tokens=800, configured=1536) == 1536
    )
    assert context_allowance(4096, max_tokens=1024, fixed_prompt_tokens=800, configured=1536) == 568
    assert context_allowance(4096, max_tokens=1024, fixed_prompt_tokens=800, configured=0) == 0
    assert context_allowance(1500, max_tokens=1024, fixed_prompt_tokens=800, configured=1536) == 0


@pytest.mark.parametrize("max_model_len", [4096, 8192, 32768])
async def test_a_served_model_gets_lines_and_context_that_fit_its_context_together(
    aiohttp_server: object, max_model_len: int
) -> None:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": max_model_len}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    server = await aiohttp_server(app)  # type: ignore[operator]
    settings = Settings(
        llm=LLMSettings(backend="openai", base_urls=(str(server.make_url("/v1")),), model="m")
    )
    budget = await served_budget(settings)
    fixed = fixed_prompt_tokens()
    used = fixed + budget.context_tokens + budget.line_budget * LINE + settings.llm.max_tokens
    assert used <= max_model_len
    assert 0 < budget.context_tokens <= settings.review.context_tokens
    # The context costs a small model at most a quarter of the diff lines it would hold.
    without = (max_model_len - settings.llm.max_tokens - fixed) // LINE
    assert budget.line_budget >= min(400, 3 * without // 4)
    # The backlog's larger chunks fit the same room: 800 lines where they do, else as many as
    # fit, never fewer than the ordinary chunks.
    backlog = budget.backlog_line_budget
    assert backlog is not None and budget.line_budget <= backlog <= 800
    assert fixed + budget.context_tokens + backlog * LINE + settings.llm.max_tokens <= max_model_len
    assert backlog == 800 or (backlog + 1) * LINE > (
        max_model_len - settings.llm.max_tokens - fixed - budget.context_tokens
    )
    # A caller that gives every chunk the whole configured allowance gets fewer lines (or
    # as many, when the model's context is long), never a prompt over the context.
    lines = (await served_budget(settings, fit_context=False)).line_budget
    assert lines <= budget.line_budget
    assert (
        fixed + settings.review.context_tokens + lines * LINE + settings.llm.max_tokens
        <= max_model_len
    )
