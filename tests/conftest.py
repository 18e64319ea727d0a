"""Shared fixtures: a real PostgreSQL, a migrated template, one fresh database per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from bot import devdb
from bot.clock import VirtualClock
from bot.db import upgrade_database
from bot.queue.store import QueueSettings, QueueStore

# `make test` draws the same examples on every run, so a result says something about the code,
# not about the draw; HYPOTHESIS_PROFILE=explore draws new ones (and finds new failures). No
# deadline: on a loaded machine a 200 ms deadline fails correct code for being slow.
settings.register_profile("repeatable", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("explore", derandomize=False, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

SHARED_DIR = Path(__file__).resolve().parents[1].parent / "shared"


def shared_dir() -> Path:
    """../shared next to the repository; skips the calling test when it is absent."""
    if not SHARED_DIR.is_dir():
        pytest.skip(f"{SHARED_DIR} is absent: the shared fixtures and traces are not here")
    return SHARED_DIR


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Admin URL of a PostgreSQL server (see bot.devdb for the order of sources)."""
    with devdb.provision_server() as url:
        yield url


@pytest.fixture(scope="session")
async def template_database(pg_server: str) -> AsyncIterator[str]:
    """A database migrated to head once, copied for every test."""
    name = devdb.unique_database_name("rbt_template")
    url = await devdb.create_database(pg_server, name)
    try:
        await upgrade_database(url)
        yield name
    finally:
        await devdb.drop_database(pg_server, name)


@pytest.fixture
async def db_url(pg_server: str, template_database: str) -> AsyncIterator[str]:
    """A fresh migrated database for one test, dropped after it."""
    name = devdb.unique_database_name("rbt")
    url = await devdb.create_database(pg_server, name, template=template_database)
    try:
        yield url
    finally:
        await devdb.drop_database(pg_server, name)


@pytest.fixture
async def empty_db_url(pg_server: str) -> AsyncIterator[str]:
    """A fresh database with no schema at all."""
    async with devdb.scratch_database(pg_server, "rbt_empty") as url:
        yield url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[QueueStore]:
    queue_store = QueueStore.from_url(db_url, settings=QueueSettings(retry_backoff_s=5.0))
    try:
        yield queue_store
    finally:
        await queue_store.close()


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture(autouse=True)
def _no_live_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep tests off the network: proxies would route loopback calls elsewhere."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
