"""report aggregates defined once: functions with a window, views over them

Revision ID: 0005_report_views
Revises: 0004_status_reports
Create Date: 2026-12-03 17:40:00.000000

The aggregate reports (waits by level, durations, workers, repos) were written twice: as views
here and again, with a time window and the configured thresholds, in bot/obs/reports.py. Each
is now one SQL function taking the window and knobs (every argument has a default), and the
view of the same name is that function with its defaults, so `SELECT * FROM report_repos` in
psql and `bot report repos` read the same SQL.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0005_report_views"
down_revision: str | None = "0004_status_reports"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The arguments every report takes: a window on its time column and one repository.
WINDOW_ARGUMENTS = """
    window_start timestamptz DEFAULT NULL,
    window_end timestamptz DEFAULT NULL,
    only_repo text DEFAULT NULL"""


def _in_window(column: str, *, repo: bool = True) -> str:
    clauses = [
        f"(window_start IS NULL OR {column} >= window_start)",
        f"(window_end IS NULL OR {column} < window_end)",
    ]
    if repo:
        clauses.append("(only_repo IS NULL OR repo = only_repo)")
    return " AND ".join(clauses)


def _percentile(share: float, column: str) -> str:
    return f"round((percentile_cont({share}) WITHIN GROUP (ORDER BY {column}))::numeric, 3)"


# (name, arguments after the window, result columns, body), in creation order.
FUNCTIONS: list[tuple[str, str, str, str]] = [
    (
        "report_waits_by_level",
        # A breach is a wait past the level's threshold: a job that started late, or one still
        # waiting at as_of (the window's end, or now) longer than the threshold.
        """,
    p0_threshold_s float8 DEFAULT 10.0,
    p1_threshold_s float8 DEFAULT 60.0,
    p2_threshold_s float8 DEFAULT 300.0,
    as_of timestamptz DEFAULT NULL""",
        """
    level text, jobs bigint, started bigint, waiting bigint,
    mean_wait_s numeric, p50_wait_s numeric, p95_wait_s numeric, p99_wait_s numeric,
    max_wait_s numeric, breaches bigint,
    mean_turnaround_s numeric, p50_turnaround_s numeric, p95_turnaround_s numeric,
    p99_turnaround_s numeric, max_turnaround_s numeric""",
        f"""
    WITH w AS (SELECT * FROM report_waits WHERE {_in_window("enqueued_at")}),
    t AS (
        SELECT * FROM (VALUES (0, p0_threshold_s), (1, p1_threshold_s), (2, p2_threshold_s))
            AS t(level, threshold_s)
    )
    SELECT CASE WHEN GROUPING(w.level) = 1 THEN 'all' ELSE 'P' || w.level END,
           count(*), count(w.wait_s),
           count(*) FILTER (WHERE w.first_started_at IS NULL AND w.finished_at IS NULL),
           round(avg(w.wait_s)::numeric, 3),
           {_percentile(0.50, "w.wait_s")},
           {_percentile(0.95, "w.wait_s")},
           {_percentile(0.99, "w.wait_s")},
           round(max(w.wait_s)::numeric, 3),
           count(*) FILTER (
               WHERE w.wait_s > t.threshold_s
                  OR (w.first_started_at IS NULL AND w.finished_at IS NULL
                      AND EXTRACT(EPOCH FROM as_of - w.ready_at) > t.threshold_s)
           ),
           round(avg(w.turnaround_s)::numeric, 3),
           {_percentile(0.50, "w.turnaround_s")},
           {_percentile(0.95, "w.turnaround_s")},
           {_percentile(0.99, "w.turnaround_s")},
           round(max(w.turnaround_s)::numeric, 3)
    FROM w LEFT JOIN t ON t.level = w.level
    GROUP BY GROUPING SETS ((w.level), ())
    ORDER BY GROUPING(w.level), w.level
    """,
    ),
    (
        "report_durations",
        # Service time = GPU seconds per finished review. P99/P50 over 10: priorities pay off;
        # stddev under the mean: FIFO suffices.
        "",
        """
    level text, jobs bigint, mean_s numeric, p50_s numeric, p95_s numeric, p99_s numeric,
    max_s numeric, stddev_s numeric, p99_over_p50 numeric, stddev_over_mean numeric""",
        f"""
    SELECT CASE WHEN GROUPING(level) = 1 THEN 'all' ELSE 'P' || level END,
           count(*),
           round(avg(gpu_seconds)::numeric, 3),
           {_percentile(0.50, "gpu_seconds")},
           {_percentile(0.95, "gpu_seconds")},
           {_percentile(0.99, "gpu_seconds")},
           round(max(gpu_seconds)::numeric, 3),
           round(stddev_pop(gpu_seconds)::numeric, 3),
           round((percentile_cont(0.99) WITHIN GROUP (ORDER BY gpu_seconds)
                  / NULLIF(percentile_cont(0.50) WITHIN GROUP (ORDER BY gpu_seconds), 0)
                 )::numeric, 3),
           round((stddev_pop(gpu_seconds) / NULLIF(avg(gpu_seconds), 0))::numeric, 3)
    FROM report_waits
    WHERE state = 'done' AND gpu_seconds > 0 AND {_in_window("enqueued_at")}
    GROUP BY GROUPING SETS ((level), ())
    ORDER BY GROUPING(level), level
    """,
    ),
    (
        "report_workers",
        # Chunks, GPU and busy time per worker and hour (hour empty: the worker's whole window).
        # utilization = busy seconds / (slots x seconds of the span).
        """,
    slots integer DEFAULT 8""",
        """
    worker text, hour timestamp, chunks bigint, jobs bigint, gpu_s numeric, busy_s numeric,
    utilization numeric""",
        f"""
    SELECT worker,
           date_trunc('hour', finished_at AT TIME ZONE 'UTC'),
           count(*), count(DISTINCT job_id),
           round(sum(gpu_seconds)::numeric, 3),
           round(sum(busy_s)::numeric, 3),
           round((sum(busy_s) / (slots * CASE
               WHEN GROUPING(date_trunc('hour', finished_at AT TIME ZONE 'UTC')) = 0 THEN 3600.0
               ELSE GREATEST(EXTRACT(EPOCH FROM max(finished_at) - min(started_at)), 1.0)
           END))::numeric, 4)
    FROM report_chunks
    WHERE state = 'done' AND {_in_window("finished_at")}
    GROUP BY GROUPING SETS ((worker, date_trunc('hour', finished_at AT TIME ZONE 'UTC')),
                            (worker))
    ORDER BY worker, GROUPING(date_trunc('hour', finished_at AT TIME ZONE 'UTC')), 2
    """,
    ),
    (
        "report_repos",
        # Slowest repositories first, with each one's largest review.
        """,
    row_limit bigint DEFAULT NULL""",
        """
    forge text, repo text, jobs bigint, mean_wait_s numeric, p95_wait_s numeric,
    mean_turnaround_s numeric, max_turnaround_s numeric, gpu_s numeric, mean_lines numeric,
    largest_lines integer, largest_job_id bigint""",
        f"""
    WITH w AS (SELECT * FROM report_waits WHERE {_in_window("enqueued_at")}),
    largest AS (
        SELECT DISTINCT ON (forge, repo) forge, repo, job_id, total_lines
        FROM w ORDER BY forge, repo, total_lines DESC, job_id
    )
    SELECT w.forge, w.repo, count(*),
           round(avg(w.wait_s)::numeric, 3),
           {_percentile(0.95, "w.wait_s")},
           round(avg(w.turnaround_s)::numeric, 3),
           round(max(w.turnaround_s)::numeric, 3),
           round(sum(w.gpu_seconds)::numeric, 3),
           round(avg(w.total_lines)::numeric, 1),
           max(largest.total_lines), max(largest.job_id)
    FROM w JOIN largest ON largest.forge = w.forge AND largest.repo = w.repo
    GROUP BY w.forge, w.repo
    ORDER BY avg(w.turnaround_s) DESC NULLS LAST, w.repo
    LIMIT row_limit
    """,
    ),
]

# What the psql views pass beyond the defaults: "still waiting" is judged now.
VIEW_ARGUMENTS = {"report_waits_by_level": "as_of => now()"}


def _previous_views() -> dict[str, str]:
    """The 0002 bodies of the views this revision replaces, for the downgrade."""
    path = Path(__file__).with_name("0002_reports.py")
    spec = importlib.util.spec_from_file_location("reports_0002", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.VIEWS)


def upgrade() -> None:
    for name, arguments, columns, body in FUNCTIONS:
        op.execute(f"DROP VIEW {name}")
        op.execute(
            f"CREATE FUNCTION {name}({WINDOW_ARGUMENTS}{arguments}) RETURNS TABLE ({columns})"
            f" LANGUAGE sql STABLE AS $report$ {body} $report$"
        )
        op.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}({VIEW_ARGUMENTS.get(name, '')})")


def downgrade() -> None:
    previous = _previous_views()
    for name, _, _, _ in reversed(FUNCTIONS):
        op.execute(f"DROP VIEW {name}")
        op.execute(f"DROP FUNCTION {name}")
        op.execute(f"CREATE VIEW {name} AS {previous[name]}")
