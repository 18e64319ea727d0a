"""What must hold in the queue after any fault (a process killed, paused, restarted, stopped),
checked in SQL: each guarantee is one named query that returns the rows breaking it.

`bot check` runs them all against the live database for an operator; the fault drills run them
after every drill. A guarantee that returns no row holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.queue.connector import database_errors

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
        text(
            """
            SELECT 'job ' || j.id || ' is done and holds '
                   || concat_ws(', ',
                        CASE WHEN j.planning_until > :now THEN 'its planning claim' END,
                        CASE WHEN j.posting_until > :now THEN 'its posting claim' END,
                        CASE WHEN EXISTS (SELECT 1 FROM review_chunks c
                                          WHERE c.job_id = j.id AND c.state = 'running')
                             THEN 'a running chunk' END) AS detail
            FROM review_jobs j
            WHERE j.state = 'done'
              AND (j.planning_until > :now OR j.posting_until > :now
                   OR EXISTS (SELECT 1 FROM review_chunks c
                              WHERE c.job_id = j.id AND c.state = 'running'))
            ORDER BY j.id
            """
        ),
    ),
    Guarantee(
        "no_chunk_done_twice",
        "no chunk is counted done twice: a job's done count is its chunks done",
        text(
            """
            SELECT 'job ' || j.id || ' counts ' || j.chunks_done || ' chunks done of '
                   || j.chunks_total || ', its chunks show ' || d.done AS detail
            FROM review_jobs j
            CROSS JOIN LATERAL (SELECT count(*) AS done FROM review_chunks c
                                WHERE c.job_id = j.id AND c.state = 'done') d
            WHERE j.chunks_done <> d.done OR j.chunks_done > j.chunks_total
            ORDER BY j.id
            """
        ),
    ),
    Guarantee(
        "one_posting_per_job",
        "at most one posting is recorded per job and head",
        text(
            """
            SELECT 'job ' || h.job_id || ' (head ' || left(j.head_sha, 12)
                   || ') recorded posted ' || count(*) || ' times' AS detail
            FROM job_history h JOIN review_jobs j ON j.id = h.job_id
            WHERE h.kind = 'state' AND h.to_value = 'done'
            GROUP BY h.job_id, j.head_sha
            HAVING count(*) > 1
            ORDER BY h.job_id
            """
        ),
    ),
    Guarantee(
        "acknowledged_deliveries_have_jobs",
        "every acknowledged (queued) webhook delivery has its job",
        text(
            """
            SELECT 'delivery ' || d.delivery_id || ' was queued '
                   || CASE WHEN d.job_id IS NULL THEN 'without a job'
                           ELSE 'for job ' || d.job_id || ', which does not exist' END
                   AS detail
            FROM webhook_deliveries d
            WHERE d.outcome = 'queued'
              AND (d.job_id IS NULL
                   OR NOT EXISTS (SELECT 1 FROM review_jobs j WHERE j.id = d.job_id))
            ORDER BY d.id
            """
        ),
    ),
    Guarantee(
        "no_lease_outlives_its_holder",
        "no lease is held by a process whose heartbeat is older than the lease",
        text(
            """
            SELECT 'chunk ' || c.id || ' is leased to ' || c.lease_owner || ' until '
                   || c.lease_expires_at || ', last seen ' || p.last_seen AS detail
            FROM review_chunks c JOIN dispatchers p ON p.name = c.lease_owner
            WHERE c.state = 'running' AND c.lease_expires_at > :now
              AND (p.stopped_at IS NOT NULL
                   OR p.last_seen < CAST(:now AS timestamptz)
                                    - make_interval(secs => CAST(:lease_s AS double precision)
                                                    + CAST(:heartbeat_s AS double precision)))
            ORDER BY c.id
            """
        ),
    ),
    Guarantee(
        "attempts_within_limits",
        "attempts never exceed the configured maximum",
        text(
            """
            SELECT 'chunk ' || id || ' ran ' || attempts || ' attempts (at most '
                   || CAST(:max_chunk_attempts AS int) || ')' AS detail
            FROM review_chunks WHERE attempts > CAST(:max_chunk_attempts AS int)
            UNION ALL
            SELECT 'job ' || j.id || ' tried ' || stage.name || ' ' || stage.tries
                   || ' times (at most ' || CAST(:max_stage_attempts AS int) || ')'
            FROM review_jobs j
            CROSS JOIN LATERAL (VALUES
                ('planning', COALESCE(CAST(j.request->>'planning_attempts' AS int), 0)),
                ('posting', COALESCE(CAST(j.request->>'posting_attempts' AS int), 0))
            ) AS stage(name, tries)
            WHERE stage.tries > CAST(:max_stage_attempts AS int)
            """
        ),
    ),
)


async def check_guarantees(
    engine: AsyncEngine,
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
    with database_errors():
        async with engine.connect() as conn:
            await conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"))
            for guarantee in guarantees:
                names = guarantee.query.compile().params
                rows = (
                    await conn.execute(
                        guarantee.query, {k: v for k, v in params.items() if k in names}
                    )
                ).all()
                results.append(GuaranteeResult(guarantee, tuple(str(row[0]) for row in rows)))
            await conn.rollback()
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
