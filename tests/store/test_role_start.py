"""A role's process that cannot start one of its parts leaves nothing running."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bot.clock import SystemClock
from bot.components import local_write_budget
from bot.config import DatabaseSettings, ForgeSettings, LLMSettings, Settings, WebSettings
from bot.errors import ConfigError, StartError
from bot.forges.registry import build_forges
from bot.policy import load_policy_book
from bot.queue.store import QueueStore
from bot.serve import run_role
from tests.support.serving import free_port


def other_tasks() -> set[asyncio.Task[object]]:
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]


@pytest.mark.parametrize(
    ("failing", "changes", "error"),
    [
        # A taken port is said in one line (bot.serve.cannot_listen), the OSError its cause.
        ("metrics_server", {}, ConfigError),
        ("llm_backend", {"llm": {"backend": "openai", "base_urls": ()}}, ConfigError),
    ],
)
async def test_a_role_part_that_does_not_start_leaves_nothing_running(
    store: QueueStore, db_url: str, failing: str, changes: dict[str, object], error: type
) -> None:
    """The web server (with the alert and command loops of its app) has started when the
    metrics port turns out taken, or when the LLM backend cannot be made: both stop again."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = free_port()
        settings = Settings(
            database=DatabaseSettings(url=db_url),
            forges=ForgeSettings(
                github_webhook_secret="s",
                gitlab_webhook_token="t",
                github_token="ghp-lifecycle",
                github_api_url="http://127.0.0.1:9",
            ),
            web=WebSettings(
                metrics_port=taken.getsockname()[1] if failing == "metrics_server" else None
            ),
            llm=LLMSettings(backend="simulated"),
        ).with_changes(**changes)
        forges = build_forges(
            settings,
            budget=local_write_budget(settings, now=SystemClock().now, sleep=asyncio.sleep),
        )
        with pytest.raises(StartError) as raised:
            async with run_role(
                "all",
                settings,
                store=store,
                forges=forges,
                policies=load_policy_book(settings.review.policy_dir),
                clock=SystemClock(),
                port=port,
            ):
                raise AssertionError("the role started with a part that did not")
    assert raised.value.part == failing
    assert isinstance(raised.value.__cause__, error)
    assert other_tasks() == set()  # the alert loop and the command worker were stopped
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # the web server let its port go
    await store.ping()  # the role does not close the caller's store
