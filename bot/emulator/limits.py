"""The forges' limits on content-creating requests, and conditional GETs, as the emulator keeps
them: GitHub answers 403 with Retry-After past 80 content-creating requests a minute or 500
an hour per installation or token; GitLab 429 past its note creation limit (300 a minute per
user). Unchanged GitHub reads answer 304 to a matching If-None-Match."""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

# Requests that create or change content (GitHub counts them against the secondary limit).
CONTENT_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
# Routes sent with a writing method that create no content on the forge: credentials, and
# GraphQL queries (the bot sends no mutation; only mutations create content).
NOT_CONTENT_ROUTES = frozenset({"github.access_token", "github.graphql", "gitlab.graphql"})


@dataclass(frozen=True, slots=True)
class ContentLimits:
    """Content-creating requests allowed per identity; 0 turns a window off.

    `time_scale` compresses the minute and the hour (tests and benchmarks in compressed time).
    """

    per_minute: int = 80
    per_hour: int = 500
    time_scale: float = 1.0

    def windows(self) -> tuple[tuple[timedelta, int], ...]:
        return tuple(
            (timedelta(seconds=seconds * self.time_scale), limit)
            for seconds, limit in ((60.0, self.per_minute), (3600.0, self.per_hour))
            if limit > 0
        )


GITHUB_CONTENT_LIMITS = ContentLimits(per_minute=80, per_hour=500)
GITLAB_CONTENT_LIMITS = ContentLimits(per_minute=300, per_hour=0)


@dataclass(slots=True)
class ContentLedger:
    """When each identity's accepted content-creating requests came, and what was refused."""

    writes: dict[str, list[datetime]] = field(default_factory=dict)
    refused: int = 0

    def admit(self, identity: str, now: datetime, limits: ContentLimits) -> float | None:
        """Count a write of `identity` at `now`; None if allowed, else seconds to wait.

        A write counts in a window while it is less than the window's length old.
        """
        times = self.writes.setdefault(identity, [])
        wait = 0.0
        for length, limit in limits.windows():
            start = bisect.bisect_right(times, now - length)
            inside = len(times) - start
            if inside >= limit:
                oldest = times[len(times) - limit]
                wait = max(wait, (oldest + length - now).total_seconds())
        if wait > 0:
            self.refused += 1
            return wait
        bisect.insort(times, now)
        return None


def entity_tag(body: Any) -> str:
    """A strong ETag for a JSON answer: the same content, the same tag."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    return f'"{digest[:40]}"'


def matches(if_none_match: str | None, tag: str) -> bool:
    """Whether an If-None-Match header names `tag` (or any, `*`); weak tags compare equal."""
    if not if_none_match:
        return False
    wanted = {item.strip().removeprefix("W/") for item in if_none_match.split(",")}
    return "*" in wanted or tag in wanted


__all__ = [
    "CONTENT_METHODS",
    "GITHUB_CONTENT_LIMITS",
    "GITLAB_CONTENT_LIMITS",
    "NOT_CONTENT_ROUTES",
    "ContentLedger",
    "ContentLimits",
    "entity_tag",
    "matches",
]
