"""What the store hands back, and the one mapping of its rows onto the models."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from sqlalchemy.engine import Row

from bot.model import Chunk, ChunkId, ChunkState, Job, JobId, JobState, Level


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """What `submit_request` did."""

    job_id: JobId | None
    created: bool
    duplicate_delivery: bool = False
    superseded: tuple[JobId, ...] = ()
    level: Level | None = None
    level_changed: bool = False
    state: JobState | None = None


@dataclass(frozen=True, slots=True)
class EngineRunning:
    """Chunks running on one engine across every process, and how many of them are P0."""

    running: int
    p0: int = 0


@dataclass(frozen=True, slots=True)
class LevelLoad:
    """Running and ready chunks per level, across every process sharing the database."""

    running: Mapping[Level, int]
    ready: Mapping[Level, int]
    # Rank bands (see level_load): ready first chunks, ready short work, long work running.
    ready_new_work: Mapping[Level, int] = field(default_factory=dict)
    ready_short_work: Mapping[Level, int] = field(default_factory=dict)
    running_long_work: int = 0

    @property
    def total_running(self) -> int:
        return sum(self.running.values())


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What finishing or failing a chunk did to its job."""

    job_id: JobId
    job_complete: bool = False
    job_dead: bool = False
    retried: bool = False
    level: Level | None = None
    base_level: Level | None = None
    level_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One line of a job's append-only history."""

    job_id: JobId
    at: datetime
    kind: str
    from_value: str | None
    to_value: str | None
    reason: str
    actor: str
    detail: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """A lease as its holder knows it: the holder and the attempt it took it as.

    Every write that follows from the lease lands only while both still match (a fencing
    token): a process that resumes after its lease was taken over writes nothing.
    """

    claim: Literal["planning", "posting"]
    owner: str
    attempt: int

    @property
    def params(self) -> dict[str, Any]:
        """The fence as the SQL statements that check it take it."""
        return {"fence_kind": self.claim, "fence_owner": self.owner, "fence_attempt": self.attempt}


NO_FENCE: Mapping[str, Any] = {"fence_kind": None, "fence_owner": None, "fence_attempt": None}


@dataclass(frozen=True, slots=True)
class Leased:
    """A leased chunk, and whether this lease was its job's first start."""

    chunk: Chunk
    first_start: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


def job_from_row(row: Row[Any]) -> Job:
    """A review_jobs row as a Job."""
    data = row._mapping
    return Job(
        id=JobId(data["id"]),
        forge=data["forge"],
        repo=data["repo"],
        number=data["number"],
        head_sha=data["head_sha"],
        base_level=Level(data["base_level"]),
        level=Level(data["level"]),
        state=JobState(data["state"]),
        enqueued_at=data["enqueued_at"],
        ready_at=data["ready_at"],
        first_started_at=data["first_started_at"],
        finished_at=data["finished_at"],
        attempts=data["attempts"],
        last_error=data["last_error"],
        reasons=tuple(data["reasons"] or ()),
        title=data["title"],
        author=data["author"],
        base_ref=data["base_ref"],
        head_ref=data["head_ref"],
        base_sha=data["base_sha"],
        total_lines=data["total_lines"],
        chunks_total=data["chunks_total"],
        chunks_done=data["chunks_done"],
        gpu_seconds=data["gpu_seconds"],
        depends_on=tuple(data["depends_on"] or ()),
        planned=data["planned"],
        pull_details=data["request"] or {},
        planning_attempt=int(data.get("planning_attempt") or 0),
        posting_attempt=int(data.get("posting_attempt") or 0),
        retry_at=data.get("retry_at"),
        planning_failures=int(data.get("planning_failures") or 0),
        posting_failures=int(data.get("posting_failures") or 0),
    )


class MappedRow(Protocol):
    """A row read by column name: SQLAlchemy's Row, or the connector's DriverRow."""

    @property
    def _mapping(self) -> Mapping[Any, Any]: ...


def chunk_from_row(row: MappedRow) -> Chunk:
    """A review_chunks row as a Chunk."""
    data = row._mapping
    return Chunk(
        id=ChunkId(data["id"]),
        job_id=JobId(data["job_id"]),
        seq=data["seq"],
        level=Level(data["level"]),
        state=ChunkState(data["state"]),
        files=tuple(data["files"] or ()),
        lines=data["lines"],
        attempts=data["attempts"],
        lease_owner=data["lease_owner"],
        lease_expires_at=data["lease_expires_at"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
        gpu_seconds=data["gpu_seconds"],
        result=data["result"],
        last_error=data["last_error"],
        lease_attempt=int(data.get("lease_attempt") or 0),
    )


def history_from_row(row: Row[Any]) -> HistoryEntry:
    """A job_history row as a HistoryEntry."""
    return HistoryEntry(
        job_id=JobId(row.job_id),
        at=row.at,
        kind=row.kind,
        from_value=row.from_value,
        to_value=row.to_value,
        reason=row.reason,
        actor=row.actor,
        detail=row.detail,
    )
