"""Reading the bot's aiohttp apps from a test: the aiohttp_client fixture, /metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

# What pytest-aiohttp's `aiohttp_client` fixture is: app in, a started test client out.
ClientMaker = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


def samples(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a text exposition, by name and sorted labels."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found
