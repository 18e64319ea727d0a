"""What reviews said on each pull request: fingerprints, open or resolved, and reviewed heads."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

from sqlalchemy import TextClause

from bot.diff import Side
from bot.queue.connector import Connector
from bot.queue.records import NO_FENCE, Fence
from bot.queue.sql import findings as sql

FindingState = Literal["open", "resolved"]


@dataclass(frozen=True, slots=True)
class StoredFinding:
    """A finding an earlier review of this pull request recorded."""

    fingerprint: str
    path: str
    line: int
    side: Side
    severity: str
    body: str
    anchor_text: str | None
    state: FindingState
    inline: bool = True
    forge_ref: str | None = None  # the GitLab discussion that carries it
    first_job_id: int | None = None


@dataclass(frozen=True, slots=True)
class PullRef:
    """One pull/merge request."""

    forge: str
    repo: str
    number: int

    @property
    def params(self) -> dict[str, Any]:
        return {"forge": self.forge, "repo": self.repo, "number": self.number}


@dataclass(frozen=True, slots=True)
class FindingToRecord:
    """A finding a review said, as the store keeps it."""

    fingerprint: str
    path: str
    line: int
    side: Side
    severity: str
    body: str
    anchor_text: str | None
    inline: bool
    forge_ref: str | None = None


@dataclass(frozen=True, slots=True)
class ReviewedHead:
    """A posted review of the pull request: its job, head and what it covered."""

    job_id: int
    head_sha: str
    finished_at: datetime | None
    increment: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class PriorPosting:
    """Another job of the pull request that claimed posting: how it ended (its state) and the
    summary comment it recorded, if it posted one."""

    job_id: int
    state: str
    summary_comment_id: int | None


class FindingStore:
    """Findings per pull request over the queue's database; the connector only runs the SQL."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector

    async def _rows(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        """Every row one statement returns (none for a write without RETURNING), in autocommit."""
        async with self.connector.single_statement() as conn:
            result = await conn.execute(statement, params)
            return list(result.all()) if result.returns_rows else []

    async def findings_of(self, pull: PullRef) -> list[StoredFinding]:
        """Everything recorded on the pull request, open and resolved."""
        rows = await self._rows(sql.SELECT_FINDINGS_OF_PULL, pull.params)
        return [
            StoredFinding(
                fingerprint=row.fingerprint,
                path=row.path,
                line=row.line,
                side=cast(Side, row.side),
                severity=row.severity,
                body=row.body,
                anchor_text=row.anchor_text,
                state=cast(FindingState, row.state),
                inline=row.inline,
                forge_ref=row.forge_ref,
                first_job_id=row.first_job_id,
            )
            for row in rows
        ]

    async def record(
        self,
        pull: PullRef,
        findings: Sequence[FindingToRecord],
        *,
        job_id: int,
        now: datetime,
        fence: Fence | None = None,
    ) -> None:
        """Record findings as open (idempotent: a retry of the same review changes nothing);
        with a `fence`, only while that posting attempt holds the job's claim."""
        if not findings:
            return
        payload = json.dumps(
            [
                {
                    "fingerprint": item.fingerprint,
                    "path": item.path,
                    "line": item.line,
                    "side": item.side,
                    "severity": item.severity,
                    "body": item.body,
                    "anchor_text": item.anchor_text,
                    "inline": item.inline,
                    "forge_ref": item.forge_ref,
                }
                for item in findings
            ]
        )
        await self._rows(
            sql.UPSERT_FINDINGS,
            {
                **pull.params,
                "findings": payload,
                "job_id": job_id,
                "now": now,
                **(fence.params if fence is not None else NO_FENCE),
            },
        )

    async def resolve(
        self,
        pull: PullRef,
        fingerprints: Iterable[str],
        *,
        job_id: int,
        now: datetime,
        fence: Fence | None = None,
    ) -> list[str]:
        """Mark open findings resolved; returns the ones this call resolved (none when the
        posting attempt `fence` no longer holds the job's claim)."""
        wanted = sorted(set(fingerprints))
        if not wanted:
            return []
        rows = await self._rows(
            sql.RESOLVE_FINDINGS,
            {
                **pull.params,
                "fingerprints": wanted,
                "job_id": job_id,
                "now": now,
                **(fence.params if fence is not None else NO_FENCE),
            },
        )
        return [row.fingerprint for row in rows]

    async def reviewed_heads(self, pull: PullRef) -> list[ReviewedHead]:
        """The pull request's posted reviews, oldest first."""
        rows = await self._rows(sql.SELECT_REVIEWED_HEADS, pull.params)
        return [ReviewedHead(row.id, row.head_sha, row.finished_at, row.increment) for row in rows]

    async def prior_postings(self, pull: PullRef, *, job_id: int) -> list[PriorPosting]:
        """The pull request's other jobs that ever claimed posting, oldest first."""
        rows = await self._rows(sql.SELECT_PRIOR_POSTINGS, {**pull.params, "job_id": job_id})
        return [
            PriorPosting(
                int(row.id),
                str(row.state),
                int(row.summary_comment_id) if row.summary_comment_id is not None else None,
            )
            for row in rows
        ]

    async def review_underway(self, pull: PullRef, *, job_id: int) -> int | None:
        """An older review of the same pull request still underway (its id), or None."""
        rows = await self._rows(sql.SELECT_REVIEW_UNDERWAY, {**pull.params, "job_id": job_id})
        return int(rows[0].id) if rows else None

    async def plan_later(self, job_id: int, *, retry_at: datetime) -> None:
        """Release an unplanned job's planning claim until `retry_at`, counting no attempt."""
        await self._rows(sql.PLAN_LATER, {"job_id": job_id, "retry_at": retry_at})

    async def last_reviewed(self, pull: PullRef, *, job_id: int) -> ReviewedHead | None:
        """The newest posted review of the pull request other than `job_id`'s."""
        rows = await self._rows(sql.SELECT_LAST_REVIEWED, {**pull.params, "job_id": job_id})
        if not rows:
            return None
        row = rows[0]
        return ReviewedHead(row.id, row.head_sha, row.finished_at, row.increment)


__all__ = ["FindingStore", "FindingToRecord", "PriorPosting", "PullRef", "ReviewedHead"]
