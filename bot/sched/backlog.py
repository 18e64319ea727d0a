"""Whether work queues beyond the workers: planning then cuts larger chunks (pure).

Every chunk past a review's first pays a call's overhead (a prefill and a request), so a
review cut into fewer, larger chunks costs less GPU time. That pays while chunks wait for
workers; while workers are free, short chunks win: each frees its worker sooner, a review
spreads over idle workers, and the scheduler learns sooner what a review really costs
(docs/benchmarks.md, "Chunk size").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bot.model import Level

# More ready chunks than this many per worker slot is a backlog.
DEFAULT_BACKLOG_FACTOR = 2.0


def is_backlogged(ready: Mapping[Level, int] | Sequence[int], slots: int, factor: float) -> bool:
    """True when more chunks are ready, over all levels, than `factor` per worker slot
    (`ready`: counts by level, or in level order)."""
    total = sum(ready.values()) if isinstance(ready, Mapping) else sum(ready)
    return total > factor * max(1, slots)


__all__ = ["DEFAULT_BACKLOG_FACTOR", "is_backlogged"]
