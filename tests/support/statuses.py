"""The status publisher as the status tests build it: a GitHub App client, two slots."""

from __future__ import annotations

from typing import Any

import aiohttp

from bot.clock import VirtualClock
from bot.emulator import ForgeEmulator
from bot.forges.github import GitHubClient
from bot.queue.store import QueueStore
from bot.sched.mlfq import MlfqSettings, ServiceEstimator
from bot.status.decide import PublishRules
from bot.status.eta import Capacity
from bot.status.publisher import StatusPublisher, StatusSettings
from tests.support.pipeline_helpers import APP_ID


def app_client(
    emulator: ForgeEmulator, session: aiohttp.ClientSession, clock: VirtualClock, key: str
) -> GitHubClient:
    return GitHubClient(session, base_url=emulator.github_url, app_id=APP_ID, private_key=key,
                        clock=clock.now, sleep=clock.sleep, post_interval_s=0.0)  # fmt: skip


def publisher(
    store: QueueStore,
    forges: dict[str, Any],
    clock: VirtualClock,
    rules: PublishRules | None = None,
) -> StatusPublisher:
    return StatusPublisher(
        store.status,
        forges,
        clock=clock,
        capacity=Capacity(slots=2, mlfq=MlfqSettings(reserved_slots=0)),
        estimator=ServiceEstimator.with_prior,
        settings=StatusSettings(neutral_at="major", rules=rules or PublishRules()),
    )
