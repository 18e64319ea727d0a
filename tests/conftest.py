"""Shared fixtures: a real PostgreSQL, a migrated template, one fresh database per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from bot import devdb
from bot.clock import VirtualClock
from bot.db import upgrade_database
from bot.emulator import EmulatorState, ForgeEmulator
from bot.queue.store import QueueSettings, QueueStore
from tests.support.pipeline_helpers import APP_ID, GITHUB_TOKEN, GITLAB_TOKEN, make_app_key
from tests.support.vllm_cpu import prepare_environment

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


# Under pytest-xdist every worker is its own session: it migrates its own template and names
# every database it makes after itself (gw0, gw1, ...; "main" without workers), with its pid
# and a random suffix, and drops only those, so workers never copy, hold or drop another's.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.fixture(scope="session")
async def template_database(pg_server: str) -> AsyncIterator[str]:
    """A database migrated to head once per worker, copied for every test of that worker."""
    name = devdb.unique_database_name(f"rbt_template_{WORKER}")
    url = await devdb.create_database(pg_server, name)
    try:
        await upgrade_database(url)
        yield name
    finally:
        await devdb.drop_database(pg_server, name)


@pytest.fixture
async def db_url(pg_server: str, template_database: str) -> AsyncIterator[str]:
    """A fresh migrated database for one test, dropped after it."""
    name = devdb.unique_database_name(f"rbt_{WORKER}")
    url = await devdb.create_database(pg_server, name, template=template_database)
    try:
        yield url
    finally:
        await devdb.drop_database(pg_server, name)


@pytest.fixture
async def empty_db_url(pg_server: str) -> AsyncIterator[str]:
    """A fresh database with no schema at all."""
    async with devdb.scratch_database(pg_server, f"rbt_empty_{WORKER}") as url:
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


@pytest.fixture(scope="session")
def app_key() -> tuple[str, str]:
    """A GitHub App's private key (PEM) and the public half the emulator checks its JWTs with."""
    return make_app_key()


@dataclass(frozen=True)
class EmulatorSetup:
    """How the `emulator` fixture sets up the forges; `@pytest.mark.emulator(**fields)` on a
    module or a test changes it."""

    # An empty set accepts any token, as the emulator does without a list.
    github_tokens: frozenset[str] | set[str] | tuple[str, ...] = (GITHUB_TOKEN,)
    gitlab_tokens: frozenset[str] | set[str] | tuple[str, ...] = (GITLAB_TOKEN,)
    # False: the emulator reads the wall clock (the bot under test runs on it too).
    virtual_clock: bool = True
    # The GitHub App APP_ID, with the public half of `app_key`.
    github_app: bool = False
    # Anything else the state needs before the server starts (limits, pulls).
    prepare: Callable[[EmulatorState], None] | None = None


@pytest.fixture
async def emulator(
    request: pytest.FixtureRequest, clock: VirtualClock
) -> AsyncIterator[ForgeEmulator]:
    """The GitHub and GitLab emulator over loopback, on the test's clock, knowing the pipeline
    helpers' tokens, unless an `emulator` mark says otherwise (EmulatorSetup)."""
    marker = request.node.get_closest_marker("emulator")
    setup = EmulatorSetup(*marker.args, **marker.kwargs) if marker else EmulatorSetup()
    state = EmulatorState(clock=clock.now) if setup.virtual_clock else EmulatorState()
    state.github_tokens.update(setup.github_tokens)
    state.gitlab_tokens.update(setup.gitlab_tokens)
    if setup.github_app:
        state.register_app(APP_ID, request.getfixturevalue("app_key")[1])
    if setup.prepare is not None:
        setup.prepare(state)
    async with ForgeEmulator(state) as running:
        yield running


@pytest.fixture(scope="session")
def vllm_paths() -> dict[str, str]:
    """The CPU vLLM's environment (scripts/vllm_cpu.sh setup, cached), for tests marked vllm."""
    return prepare_environment()


# The CPU vLLM's first set-up installs an environment (scripts/vllm_cpu.sh, up to 3,000 s) and
# its server may take 1,000 s to start: its tests keep their own bounds, not the default.
VLLM_TIMEOUT_S = 4500


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The CPU vLLM tests share one worker, so one server starts and one set-up runs.

    Grouped tests (the vLLM tests, the fault drills) run first: each group is one long line of
    work on one worker, and started last it would be the run's tail while the others idle.
    """
    for item in items:
        if item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.xdist_group("vllm"))
            item.add_marker(pytest.mark.timeout(VLLM_TIMEOUT_S))
    # A stable sort: modules stay whole, so module fixtures are set up once.
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


@pytest.fixture(autouse=True)
def _no_live_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep tests off the network: proxies would route loopback calls elsewhere."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
