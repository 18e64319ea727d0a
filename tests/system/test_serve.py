"""`bot serve --role all` as a real process: a signed webhook in, a review posted, SIGTERM out."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from bot.emulator import (
    EmulatorState,
    ForgeEmulator,
    build_github_pull_request_event,
    generate_file_changes,
    send_webhook,
)
from bot.forges.base import SUMMARY_MARKER
from tests.support.serving import REPO_ROOT, free_port, start_serve, wait_until
from tests.support.webhook_fixtures import load_payload

SECRET = "serve-test-secret"

pytestmark = pytest.mark.slow


async def test_serve_all_reviews_a_pull_request_and_stops_cleanly(db_url: str) -> None:
    fixture = load_payload("github/pull_request.opened.json").payload
    state = EmulatorState()
    async with ForgeEmulator(state) as emulator:
        pull = state.add_pull(
            "github",
            "acme/shop",
            42,
            files=generate_file_changes(changed_lines=120, files=3, seed=7),
            base_ref="main",
        )
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "GITHUB_WEBHOOK_SECRET": SECRET,
            "GITLAB_WEBHOOK_TOKEN": SECRET,
            "GITHUB_TOKEN": "ghp-serve-test",
            "GITHUB_API_URL": emulator.github_url,
            "GITLAB_URL": emulator.gitlab_url,
            "GITLAB_TOKEN": "glpat-serve-test",
            "REVIEW_BOT_LLM": "simulated",
            "REVIEW_BOT_WORKERS": "2",
            "PYTHONPATH": str(REPO_ROOT),
        }
        process = await start_serve("all", port=port, env=env)
        try:

            async def healthy() -> bool:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    assert process.returncode is None, "bot serve exited early"
                    return False
                writer.close()
                await writer.wait_closed()
                return True

            await wait_until(healthy, timeout_s=60, what="bot serve to listen")
            payload = build_github_pull_request_event(
                fixture,
                action="opened",
                repo="acme/shop",
                number=42,
                base_ref="main",
                head_sha=pull.newest.head_sha,
                base_sha=pull.newest.base_sha,
                changed_files=3,
                additions=100,
                deletions=20,
            )
            answer = await send_webhook(
                f"http://127.0.0.1:{port}/webhooks/github",
                "github",
                "pull_request",
                payload,
                SECRET,
            )
            assert answer.status == 202, answer

            def summaries() -> list[str]:
                # Quiet reviews (the default) keep one summary comment per pull request.
                posted = state.posted(forge="github", kind="issue_comment", number=42)
                return [item.body or "" for item in posted if SUMMARY_MARKER in (item.body or "")]

            async def reviewed() -> bool:
                return bool(summaries())

            await wait_until(reviewed, timeout_s=60, what="the review to be posted")
            assert len(summaries()) == 1
            samples: dict[str, float] = {}

            async def job_recorded() -> bool:
                # The review is visible on the forge a moment before the job is recorded done.
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{port}/metrics") as response,
                ):
                    assert response.status == 200
                    scraped = await response.text()
                samples.clear()
                samples.update(
                    (line.split(" ")[0], float(line.split(" ")[1]))
                    for line in scraped.splitlines()
                    if line and not line.startswith("#")
                )
                return samples.get('review_bot_turnaround_seconds_count{level="P1"}') == 1

            await wait_until(job_recorded, timeout_s=30, what="the turnaround metric")
            assert samples['review_bot_wait_seconds_count{level="P1"}'] == 1
            assert samples['review_bot_webhooks_total{forge="github",outcome="queued"}'] == 1
            assert (
                sum(v for k, v in samples.items() if k.startswith("review_bot_chunks_total")) >= 1
            )
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
        log = stderr.decode()
        assert process.returncode == 0, log
        assert "stopping" in log


async def test_serve_refuses_to_start_without_webhook_secrets(db_url: str) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"GITHUB_WEBHOOK_SECRET", "GITLAB_WEBHOOK_TOKEN", "REVIEW_BOT_INSECURE_DEV"}
    }
    env.update(DATABASE_URL=db_url, PYTHONPATH=str(REPO_ROOT))
    process = await start_serve("all", port=free_port(), env=env)
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 2
    assert "GITHUB_WEBHOOK_SECRET" in stderr.decode()


async def test_serve_with_a_forge_refuses_to_start_without_an_llm_choice(db_url: str) -> None:
    """GitHub credentials, no REVIEW_BOT_LLM: nothing starts, and the message says what to set."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("REVIEW_BOT_")}
    env.update(
        DATABASE_URL=db_url,
        PYTHONPATH=str(REPO_ROOT),
        GITHUB_WEBHOOK_SECRET=SECRET,
        GITLAB_WEBHOOK_TOKEN=SECRET,
        GITHUB_TOKEN="ghp-serve-test",
        GITHUB_API_URL="http://127.0.0.1:9",
    )
    port = free_port()
    process = await start_serve("all", port=port, env=env)
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 2
    message = stderr.decode()
    assert "REVIEW_BOT_LLM is not set while github credentials are" in message
    assert "REVIEW_BOT_LLM=openai" in message and "REVIEW_BOT_LLM=simulated" in message
