"""Forge clients built once from Settings, keyed by forge name, closed together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import aiohttp

from bot.budget.ledger import WriteBudget
from bot.config import Settings
from bot.errors import ConfigError
from bot.forges.base import Clock, ForgeClient, RetryPolicy, Sleep, utc_now
from bot.forges.github import GitHubClient
from bot.forges.gitlab import GitLabClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ForgeOptions:
    """Client knobs the settings do not carry (tests and the demo tune them)."""

    retry: RetryPolicy | None = None
    timeout_s: float = 30.0
    requester: str = "review-bot"


class ForgeRegistry(Mapping[str, ForgeClient]):
    """The configured forge clients by name ("github", "gitlab"); owns their HTTP session."""

    def __init__(
        self,
        clients: Mapping[str, ForgeClient],
        *,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._clients = dict(clients)
        self._session = session

    def __getitem__(self, name: str) -> ForgeClient:
        return self._clients[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)

    async def close(self) -> None:
        """Close the session the registry opened."""
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def __aenter__(self) -> ForgeRegistry:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def github_configured(settings: Settings) -> bool:
    """A token, or an App id with its private key."""
    return bool(
        settings.forges.github_token
        or (settings.forges.github_app_id and settings.forges.github_private_key)
    )


def configured_forges(settings: Settings) -> tuple[str, ...]:
    """The forges the settings hold credentials for."""
    return tuple(
        name
        for name, configured in (
            ("github", github_configured(settings)),
            ("gitlab", bool(settings.forges.gitlab_token)),
        )
        if configured
    )


def build_forges(
    settings: Settings,
    *,
    budget: WriteBudget,
    session: aiohttp.ClientSession | None = None,
    clock: Clock = utc_now,
    sleep: Sleep = asyncio.sleep,
    options: ForgeOptions | None = None,
) -> ForgeRegistry:
    """Clients for every forge the settings configure; raises ConfigError on half an App.

    GitHub: GITHUB_TOKEN, or GITHUB_APP_ID + GITHUB_PRIVATE_KEY (installation tokens per
    repository), at GITHUB_API_URL. GitLab: GITLAB_TOKEN at GITLAB_URL. A forge without
    credentials is left out; its jobs fail with a message naming what to set. Call inside a
    running event loop (the GitHub client's aiohttp session needs one). Every client spends
    from `budget`: bot serve's, in PostgreSQL and shared by every process, or one this
    process keeps alone (bot.components.local_write_budget). Its limits are the settings',
    mapped in bot.components, which this package may not import: so the caller builds it.
    """
    options = options or ForgeOptions()
    if bool(settings.forges.github_app_id) != bool(settings.forges.github_private_key) and not (
        settings.forges.github_token
    ):
        raise ConfigError("a GitHub App needs both GITHUB_APP_ID and GITHUB_PRIVATE_KEY")
    clients: dict[str, ForgeClient] = {}
    own_session: aiohttp.ClientSession | None = None
    if github_configured(settings):
        if session is None:
            own_session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=options.timeout_s)
            )
        clients["github"] = GitHubClient(
            session or own_session,  # type: ignore[arg-type]
            base_url=settings.forges.github_api_url,
            token=settings.forges.github_token,
            app_id=None if settings.forges.github_token else settings.forges.github_app_id,
            private_key=None
            if settings.forges.github_token
            else settings.forges.github_private_key,
            requester=options.requester,
            clock=clock,
            sleep=sleep,
            retry=options.retry,
            budget=budget,
        )
    if settings.forges.gitlab_token:
        clients["gitlab"] = GitLabClient(
            url=settings.forges.gitlab_url,
            token=settings.forges.gitlab_token,
            clock=clock,
            sleep=sleep,
            retry=options.retry,
            timeout_s=options.timeout_s,
            budget=budget,
        )
    if not clients:
        log.warning(
            "no forge credentials: set GITHUB_TOKEN (or GITHUB_APP_ID and GITHUB_PRIVATE_KEY) "
            "and/or GITLAB_TOKEN; reviews cannot be fetched or posted",
            extra={"action": "forges_missing"},
        )
    return ForgeRegistry(clients, session=own_session)


__all__ = [
    "ForgeOptions",
    "ForgeRegistry",
    "build_forges",
    "configured_forges",
    "github_configured",
]
