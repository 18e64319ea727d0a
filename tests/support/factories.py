"""Builders for test data."""

from __future__ import annotations

from typing import Any

from bot.model import ChunkPlan, Level, PolicyDecision, ReviewRequest


def make_request(**overrides: Any) -> ReviewRequest:
    fields: dict[str, Any] = {
        "forge": "github",
        "repo": "acme/payments",
        "number": 7,
        "title": "Fix rounding",
        "author": "dev1",
        "author_is_bot": False,
        "base_ref": "main",
        "head_ref": "feature/rounding",
        "base_sha": "b" * 40,
        "head_sha": "a" * 40,
        "event": "pull_request",
        "action": "opened",
        "files_changed": 2,
        "additions": 30,
        "deletions": 10,
    }
    fields.update(overrides)
    return ReviewRequest(**fields)


def decide(level: Level = Level.P1, reason: str = "ordinary pull request") -> PolicyDecision:
    return PolicyDecision(level=level, reasons=(reason,), rule="test")


def plans(*lines: int) -> list[ChunkPlan]:
    return [
        ChunkPlan(files=({"path": f"src/file_{i}.py", "lines": n},), lines=n)
        for i, n in enumerate(lines)
    ]
