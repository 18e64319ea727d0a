"""What must hold in the queue after any fault (a process killed, paused, restarted, stopped),
checked in SQL: each guarantee is one named query that returns the rows breaking it.

`bot check` runs them all against the live database for an operator; the fault drills run them
after every drill. A guarantee that returns no row holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import TextClause

from bot.queue.connector import Connector
from bot.queue.sql import guarantees as sql

# How many breaking rows each guarantee reports (the count says how many there are).
SHOWN = 20


@dataclass(frozen=True, slots=True)
class Guarantee:
    """One property of the queue and the query that finds the rows breaking it."""

    name: str
    says: str
    query: TextClause


@dataclass(frozen=True, slots=True)
class GuaranteeLimits:
    """The configured limits some guarantees are measured against."""

    lease_s: float  # the chunk lease
    heartbeat_s: float  # a process's presence may lag its leases by one heartbeat
    max_chunk_attempts: int
    max_stage_attempts: int = 5  # planning and posting tries of a job


@dataclass(frozen=True, slots=True)
class GuaranteeResult:
    """A guarantee and the rows that break it (none: it holds)."""

    guarantee: Guarantee
    broken_by: tuple[str, ...]

    @property
    def holds(self) -> bool:
        return not self.broken_by


GUARANTEES: tuple[Guarantee, ...] = (
    Guarantee(
        "done_jobs_hold_no_lease",
        "no job is both done and holding a lease (planning, posting or a chunk)",
        sql.DONE_JOBS_HOLD_NO_LEASE,
    ),
    Guarantee(
        "no_chunk_done_twice",
        "no chunk is counted done twice: a job's done count is its chunks done",
        sql.NO_CHUNK_DONE_TWICE,
    ),
    Guarantee(
        "one_posting_per_job",
        "at most one posting is recorded per job and head",
        sql.ONE_POSTING_PER_JOB,
    ),
    Guarantee(
        "acknowledged_deliveries_have_jobs",
        "every acknowledged (queued) webhook delivery has its job",
        sql.ACKNOWLEDGED_DELIVERIES_HAVE_JOBS,
    ),
    Guarantee(
        "no_lease_outlives_its_holder",
        "no lease is held by a process whose heartbeat is older than the lease",
        sql.NO_LEASE_OUTLIVES_ITS_HOLDER,
    ),
    Guarantee(
        "attempts_within_limits",
        "attempts never exceed the configured maximum",
        sql.ATTEMPTS_WITHIN_LIMITS,
    ),
)


async def check_guarantees(
    connector: Connector,
    *,
    now: datetime,
    limits: GuaranteeLimits,
    guarantees: Sequence[Guarantee] = GUARANTEES,
) -> list[GuaranteeResult]:
    """Run every guarantee's query in one read-only snapshot; raises StoreError."""
    params = {
        "now": now,
        "lease_s": limits.lease_s,
        "heartbeat_s": limits.heartbeat_s,
        "max_chunk_attempts": limits.max_chunk_attempts,
        "max_stage_attempts": limits.max_stage_attempts,
    }
    results: list[GuaranteeResult] = []
    async with connector.snapshot() as conn:
        for guarantee in guarantees:
            names = guarantee.query.compile().params
            rows = (
                await conn.execute(guarantee.query, {k: v for k, v in params.items() if k in names})
            ).all()
            results.append(GuaranteeResult(guarantee, tuple(str(row[0]) for row in rows)))
    return results


def render_guarantees(results: Sequence[GuaranteeResult]) -> str:
    """One line per guarantee (`ok` or `FAILED`), the first breaking rows under a failed one."""
    lines: list[str] = []
    for result in results:
        guarantee = result.guarantee
        if result.holds:
            lines.append(f"ok      {guarantee.name}: {guarantee.says}")
            continue
        lines.append(
            f"FAILED  {guarantee.name}: {guarantee.says} ({len(result.broken_by)} rows break it)"
        )
        lines.extend(f"          {detail}" for detail in result.broken_by[:SHOWN])
    return "\n".join(lines)


__all__ = [
    "GUARANTEES",
    "Guarantee",
    "GuaranteeLimits",
    "GuaranteeResult",
    "check_guarantees",
    "render_guarantees",
]
