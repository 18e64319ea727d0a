"""Run the bot's event loop: uvloop where it is installed (Linux, macOS), asyncio otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on the fastest loop available."""
    try:
        import uvloop
    except ImportError:  # Windows, or a minimal install
        return asyncio.run(main)
    return uvloop.run(main)
