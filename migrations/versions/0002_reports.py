"""alerts table and admin report views

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 15:10:00.000000

The views are for admins with psql (and `bot report`): they derive per-job waits, per-chunk
work and the aggregates from the queue tables, and change nothing. Thresholds in the views are
the defaults (P0 10 s, P1 60 s, P2 300 s); `bot report` applies the configured ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (name, body), in creation order; downgrade drops them in reverse.
VIEWS: list[tuple[str, str]] = [
    (
        "report_waits",
        # One row per job. level is the level the policy gave at intake (from the first history
        # entry), wait_s the time from ready to the first chunk's start, turnaround_s from
        # arrival to the end of a finished review.
        """
        SELECT j.id AS job_id, j.forge, j.repo, j.number, j.title, j.author,
               COALESCE(intake.level, j.base_level) AS level,
               j.level AS current_level, j.base_level, j.state,
               j.enqueued_at, COALESCE(j.ready_at, j.enqueued_at) AS ready_at,
               j.first_started_at, j.finished_at,
               EXTRACT(EPOCH FROM j.first_started_at - COALESCE(j.ready_at, j.enqueued_at))
                   ::float8 AS wait_s,
               CASE WHEN j.state = 'done'
                    THEN EXTRACT(EPOCH FROM j.finished_at - j.enqueued_at)::float8 END
                   AS turnaround_s,
               j.gpu_seconds, j.chunks_total, j.chunks_done, j.total_lines, j.files_changed,
               j.attempts, j.last_error, t.threshold_s,
               COALESCE(EXTRACT(EPOCH FROM j.first_started_at
                                - COALESCE(j.ready_at, j.enqueued_at)) > t.threshold_s, false)
                   AS breached
        FROM review_jobs j
        LEFT JOIN LATERAL (
            SELECT NULLIF(regexp_replace(h.detail ->> 'level', '[^0-9]', '', 'g'), '')
                       ::smallint AS level
            FROM job_history h
            WHERE h.job_id = j.id AND h.kind = 'state' AND h.from_value IS NULL
            ORDER BY h.id
            LIMIT 1
        ) intake ON true
        LEFT JOIN (VALUES (0, 10.0::float8), (1, 60.0::float8), (2, 300.0::float8))
            AS t(level, threshold_s) ON t.level = COALESCE(intake.level, j.base_level)
        """,
    ),
    (
        "report_waits_by_level",
        """
        SELECT CASE WHEN GROUPING(level) = 1 THEN 'all' ELSE 'P' || level END AS level,
               count(*) AS jobs,
               count(wait_s) AS started,
               round(avg(wait_s)::numeric, 3) AS mean_wait_s,
               round((percentile_cont(0.50) WITHIN GROUP (ORDER BY wait_s))::numeric, 3)
                   AS p50_wait_s,
               round((percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s))::numeric, 3)
                   AS p95_wait_s,
               round((percentile_cont(0.99) WITHIN GROUP (ORDER BY wait_s))::numeric, 3)
                   AS p99_wait_s,
               round(max(wait_s)::numeric, 3) AS max_wait_s,
               count(*) FILTER (WHERE breached) AS breaches,
               round(avg(turnaround_s)::numeric, 3) AS mean_turnaround_s,
               round((percentile_cont(0.50) WITHIN GROUP (ORDER BY turnaround_s))::numeric, 3)
                   AS p50_turnaround_s,
               round((percentile_cont(0.95) WITHIN GROUP (ORDER BY turnaround_s))::numeric, 3)
                   AS p95_turnaround_s,
               round((percentile_cont(0.99) WITHIN GROUP (ORDER BY turnaround_s))::numeric, 3)
                   AS p99_turnaround_s,
               round(max(turnaround_s)::numeric, 3) AS max_turnaround_s
        FROM report_waits
        GROUP BY GROUPING SETS ((level), ())
        """,
    ),
    (
        "report_chunks",
        # One row per chunk; worker is the lease owner that ran it.
        """
        SELECT c.id AS chunk_id, c.job_id, j.forge, j.repo, c.seq, c.level, c.state,
               c.lease_owner AS worker, c.started_at, c.finished_at, c.gpu_seconds,
               EXTRACT(EPOCH FROM c.finished_at - c.started_at)::float8 AS busy_s,
               c.attempts, c.lines, c.last_error
        FROM review_chunks c JOIN review_jobs j ON j.id = c.job_id
        """,
    ),
    (
        "report_durations",
        # Service time = GPU seconds per finished review. P99/P50 over 10: priorities pay off;
        # stddev under the mean: FIFO suffices.
        """
        SELECT CASE WHEN GROUPING(level) = 1 THEN 'all' ELSE 'P' || level END AS level,
               count(*) AS jobs,
               round(avg(gpu_seconds)::numeric, 3) AS mean_s,
               round((percentile_cont(0.50) WITHIN GROUP (ORDER BY gpu_seconds))::numeric, 3)
                   AS p50_s,
               round((percentile_cont(0.95) WITHIN GROUP (ORDER BY gpu_seconds))::numeric, 3)
                   AS p95_s,
               round((percentile_cont(0.99) WITHIN GROUP (ORDER BY gpu_seconds))::numeric, 3)
                   AS p99_s,
               round(max(gpu_seconds)::numeric, 3) AS max_s,
               round(stddev_pop(gpu_seconds)::numeric, 3) AS stddev_s,
               round((percentile_cont(0.99) WITHIN GROUP (ORDER BY gpu_seconds)
                      / NULLIF(percentile_cont(0.50) WITHIN GROUP (ORDER BY gpu_seconds), 0)
                     )::numeric, 3) AS p99_over_p50,
               round((stddev_pop(gpu_seconds) / NULLIF(avg(gpu_seconds), 0))::numeric, 3)
                   AS stddev_over_mean
        FROM report_waits
        WHERE state = 'done' AND gpu_seconds > 0
        GROUP BY GROUPING SETS ((level), ())
        """,
    ),
    (
        "report_workers",
        # busy_slots: chunk-seconds in the hour / 3600, the average number of slots busy.
        """
        SELECT worker, date_trunc('hour', finished_at AT TIME ZONE 'UTC') AS hour,
               count(*) AS chunks, count(DISTINCT job_id) AS jobs,
               round(sum(gpu_seconds)::numeric, 3) AS gpu_s,
               round(sum(busy_s)::numeric, 3) AS busy_s,
               round((sum(busy_s) / 3600.0)::numeric, 3) AS busy_slots
        FROM report_chunks
        WHERE state = 'done'
        GROUP BY worker, date_trunc('hour', finished_at AT TIME ZONE 'UTC')
        """,
    ),
    (
        "report_repos",
        """
        SELECT forge, repo, count(*) AS jobs, count(wait_s) AS started,
               round(avg(wait_s)::numeric, 3) AS mean_wait_s,
               round((percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s))::numeric, 3)
                   AS p95_wait_s,
               round(avg(turnaround_s)::numeric, 3) AS mean_turnaround_s,
               round(max(turnaround_s)::numeric, 3) AS max_turnaround_s,
               round(sum(gpu_seconds)::numeric, 3) AS gpu_s,
               round(avg(total_lines)::numeric, 1) AS mean_lines,
               max(total_lines) AS max_lines
        FROM report_waits
        GROUP BY forge, repo
        """,
    ),
    (
        "report_largest_reviews",
        """
        SELECT job_id, forge, repo, number, level, state, total_lines, files_changed,
               chunks_total, round(gpu_seconds::numeric, 3) AS gpu_s,
               round(turnaround_s::numeric, 3) AS turnaround_s, enqueued_at
        FROM report_waits
        """,
    ),
    (
        "report_commands",
        # Slash commands (accepted or refused) and level changes made by people, not by the
        # policy or the scheduler.
        """
        SELECT h.at, h.job_id, j.forge, j.repo, j.number, h.kind, h.actor,
               h.reason AS what, h.from_value, h.to_value, h.detail
        FROM job_history h JOIN review_jobs j ON j.id = h.job_id
        WHERE h.kind = 'command'
           OR (h.kind = 'level' AND h.actor NOT IN ('policy', 'scheduler', 'system'))
        """,
    ),
    (
        "report_failures",
        """
        SELECT j.id AS job_id, j.forge, j.repo, j.number, j.state, j.level, j.attempts,
               j.enqueued_at, j.finished_at, j.last_error,
               (SELECT count(*) FROM review_chunks c
                WHERE c.job_id = j.id AND c.state = 'dead') AS dead_chunks,
               (SELECT string_agg(DISTINCT c.last_error, ' | ') FROM review_chunks c
                WHERE c.job_id = j.id AND c.last_error IS NOT NULL) AS chunk_errors
        FROM review_jobs j
        WHERE j.state IN ('dead', 'failed')
        """,
    ),
    (
        "report_alerts",
        """
        SELECT a.fired_at, a.job_id, j.forge, j.repo, j.number, 'P' || a.level AS level,
               round(a.waited_s::numeric, 3) AS waited_s, a.threshold_s, a.message,
               j.state, j.first_started_at
        FROM alerts a JOIN review_jobs j ON j.id = a.job_id
        """,
    ),
]


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("waited_s", sa.Float(), nullable=False),
        sa.Column("threshold_s", sa.Float(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["review_jobs.id"],
            name=op.f("fk_alerts_job_id_review_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("job_id", name=op.f("uq_alerts_job_id")),
    )
    op.create_index("ix_alerts_fired_at", "alerts", ["fired_at"], unique=False)
    for name, body in VIEWS:
        op.execute(f"CREATE VIEW {name} AS {body}")


def downgrade() -> None:
    for name, _ in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_index("ix_alerts_fired_at", table_name="alerts")
    op.drop_table("alerts")
