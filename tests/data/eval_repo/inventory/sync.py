"""Pull stock levels from suppliers."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Fetch = Callable[[str], Awaitable[str]]


class SyncError(Exception):
    """A supplier could not be read."""


async def fetch_levels(fetch: Fetch, supplier: str) -> dict[str, int]:
    try:
        body = await fetch(supplier)
    except OSError as exc:
        raise SyncError(f"{supplier}: {exc}") from exc
    data = json.loads(body)
    if not isinstance(data, dict):
        raise SyncError(f"{supplier}: not an object")
    return {str(sku): int(count) for sku, count in data.items()}


async def sync_all(fetch: Fetch, suppliers: list[str], timeout: float) -> dict[str, int]:
    levels: dict[str, int] = {}
    for supplier in suppliers:
        found = await asyncio.wait_for(fetch_levels(fetch, supplier), timeout)
        for sku, count in found.items():
            levels[sku] = levels.get(sku, 0) + count
    log.info("synced %d suppliers", len(suppliers))
    return levels


def load_config(path: str, default: str) -> dict[str, str]:
    config = {"supplier": default}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            key, _, value = line.partition("=")
            config[key.strip()] = value.strip()
    if "supplier" not in config:
        config["supplier"] = default
    return config


def merge(primary: dict[str, int], secondary: dict[str, int]) -> dict[str, int]:
    merged = dict(secondary)
    for sku, count in primary.items():
        if count is None:
            continue
        merged[sku] = count
    return merged
