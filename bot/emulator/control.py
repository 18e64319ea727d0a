"""Running the emulator: on a loopback port for tests and the demo, or `bot emulator`."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from bot.emulator.app import create_emulator_app
from bot.emulator.diffs import generate_file_changes
from bot.emulator.hooks import HookTarget
from bot.emulator.manage import add_pull_spec, emulator_banner, load_pull_specs
from bot.emulator.pushes import ensure_history
from bot.emulator.state import EmulatedPull, EmulatorState

logger = logging.getLogger(__name__)


class ForgeEmulator:
    """Runs the emulator app on a loopback port; use as an async context manager."""

    def __init__(
        self,
        state: EmulatorState | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        hooks: HookTarget | None = None,
    ) -> None:
        self.state = state or EmulatorState()
        self.hooks = hooks
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def github_url(self) -> str:
        return self.base_url

    @property
    def gitlab_url(self) -> str:
        return self.base_url  # python-gitlab appends /api/v4

    async def start(self) -> str:
        """Start serving; returns the base URL."""
        runner = web.AppRunner(create_emulator_app(self.state, hooks=self.hooks), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        address = runner.addresses[0]
        self.port = int(address[1])
        logger.info(
            "forge emulator listening on %s", self.base_url, extra={"action": "emulator_started"}
        )
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ForgeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def seed_examples(state: EmulatorState, *, pulls: int = 3, seed: int = 0) -> list[EmulatedPull]:
    """Seed a few PRs and MRs with generated diffs (for `bot emulator`)."""
    made = []
    for index in range(pulls):
        files = generate_file_changes(
            changed_lines=40 + 60 * index, files=2 + index, seed=seed + index
        )
        made.append(
            state.add_pull(
                "github",
                "acme/shop",
                index + 1,
                files=files,
                base_ref="hotfix/checkout" if index == 0 else "main",
            )
        )
        made.append(state.add_pull("gitlab", "acme/platform/api", index + 1, files=files))
    for pull in made:
        ensure_history(state, pull)  # so pushes from outside are children of these heads
    return made


async def serve_emulator(
    port: int,
    *,
    host: str = "127.0.0.1",
    stop: asyncio.Event | None = None,
    seed_pulls: int = 3,
    on_ready: Callable[[ForgeEmulator], object] | None = None,
    prs_file: str | None = None,
    hooks: HookTarget | None = None,
) -> None:
    """Serve a seeded emulator (plus the PRs of `prs_file`) until `stop` is set (or
    SIGINT/SIGTERM without one), sending the webhooks of changes made from outside to `hooks`;
    raises PullSpecError for a bad `prs_file`."""
    state = EmulatorState()
    seed_examples(state, pulls=seed_pulls)
    for spec in load_pull_specs(prs_file) if prs_file else ():
        add_pull_spec(state, spec)
    done = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if stop is None else ()
    for signum in signals:
        loop.add_signal_handler(signum, done.set)
    try:
        async with ForgeEmulator(state, host=host, port=port, hooks=hooks) as emulator:
            print(emulator_banner(state, emulator.base_url, hooks), flush=True)
            if on_ready is not None:
                on_ready(emulator)
            await done.wait()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def run_emulator(
    port: int,
    host: str = "127.0.0.1",
    prs_file: str | None = None,
    hooks: HookTarget | None = None,
) -> int:
    """`bot emulator --port N [--prs FILE] [--bot-url URL]`: serve until interrupted; returns
    an exit code."""
    asyncio.run(serve_emulator(port, host=host, prs_file=prs_file, hooks=hooks))
    return 0
