"""For tests that run real servers: a free port, polling their effects, `bot serve` itself."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_until(
    predicate: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
) -> None:
    """Poll `predicate` until it holds; fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)  # real processes on the other side: poll their effects


async def start_serve(
    role: str,
    *,
    port: int,
    env: Mapping[str, str],
    stdout: int | IO[Any] | None = asyncio.subprocess.DEVNULL,
    stderr: int | IO[Any] | None = asyncio.subprocess.PIPE,
) -> asyncio.subprocess.Process:
    """`python -m bot serve --role ROLE` on 127.0.0.1:`port`, from the repository root."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "serve",
        "--role",
        role,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        env=dict(env),
        cwd=REPO_ROOT,
        stdout=stdout,
        stderr=stderr,
    )
