"""The SQL of `bot report`: one read per report over the report views and functions of the
migrations (0005, 0006). Every filter is a bound parameter, NULL meaning "no filter"
(`:since`, `:until`, `:repo`); each report filters its own time column, written out in it."""

from __future__ import annotations

from bot.queue.sql import statement

# The aggregate reports are SQL functions of migration 0005 (the psql views of the same names
# call them with their defaults). Waits by level, judged against each level's alert threshold
# (`:t0`..`:t2`), a job still waiting measured at `:as_of`.
WAITS = statement(
    """
    SELECT * FROM report_waits_by_level(
        CAST(:since AS timestamptz), CAST(:until AS timestamptz), CAST(:repo AS text),
        CAST(:t0 AS float8), CAST(:t1 AS float8), CAST(:t2 AS float8),
        CAST(:as_of AS timestamptz))
    """
)

# Service time: percentiles and spread, and what they mean for scheduling.
DURATIONS = statement(
    """
    SELECT * FROM report_durations(
        CAST(:since AS timestamptz), CAST(:until AS timestamptz), CAST(:repo AS text))
    """
)

# Throughput and utilization per worker and hour, against the slots each has.
WORKERS = statement(
    """
    SELECT * FROM report_workers(
        CAST(:since AS timestamptz), CAST(:until AS timestamptz), CAST(:repo AS text),
        CAST(:slots AS integer))
    """
)

# Per repository, slowest first: reviews, wait, turnaround, GPU time, the largest.
REPOS = statement(
    """
    SELECT * FROM report_repos(
        CAST(:since AS timestamptz), CAST(:until AS timestamptz), CAST(:repo AS text),
        CAST(:limit AS bigint))
    """
)

# The largest reviews by changed lines (the window is on enqueued_at).
LARGEST = statement(
    """
    SELECT job_id, forge, repo, number, 'P' || level AS level, state, total_lines,
           files_changed, chunks_total, gpu_s, turnaround_s
    FROM report_largest_reviews
    WHERE (CAST(:since AS timestamptz) IS NULL OR enqueued_at >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL OR enqueued_at < CAST(:until AS timestamptz))
      AND (CAST(:repo AS text) IS NULL OR repo = CAST(:repo AS text))
    ORDER BY total_lines DESC, job_id
    LIMIT :limit
    """
)

# Reprioritizations and slash commands, and who made them (the window is on `at`).
COMMANDS = statement(
    """
    SELECT at, job_id, forge, repo, number, kind, actor, what, from_value, to_value
    FROM report_commands
    WHERE (CAST(:since AS timestamptz) IS NULL OR at >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL OR at < CAST(:until AS timestamptz))
      AND (CAST(:repo AS text) IS NULL OR repo = CAST(:repo AS text))
    ORDER BY at, job_id
    LIMIT :limit
    """
)

# Dead and failed jobs with their errors, newest first (the window is on enqueued_at).
FAILURES = statement(
    """
    SELECT job_id, forge, repo, number, state, 'P' || level AS level, attempts, enqueued_at,
           finished_at, last_error, dead_chunks, chunk_errors
    FROM report_failures
    WHERE (CAST(:since AS timestamptz) IS NULL OR enqueued_at >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL OR enqueued_at < CAST(:until AS timestamptz))
      AND (CAST(:repo AS text) IS NULL OR repo = CAST(:repo AS text))
    ORDER BY finished_at DESC NULLS LAST, job_id DESC
    LIMIT :limit
    """
)

# Wait alerts raised, newest first (the window is on fired_at).
ALERTS = statement(
    """
    SELECT fired_at, job_id, forge, repo, number, level, waited_s, threshold_s, state, message
    FROM report_alerts
    WHERE (CAST(:since AS timestamptz) IS NULL OR fired_at >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL OR fired_at < CAST(:until AS timestamptz))
      AND (CAST(:repo AS text) IS NULL OR repo = CAST(:repo AS text))
    ORDER BY fired_at DESC, job_id DESC
    LIMIT :limit
    """
)

# Work per engine (LLM server) and hour: chunks, tokens, engine seconds (migration 0006). The
# window is on the hour read as UTC; engines belong to no repository, so there is no :repo.
ENGINES = statement(
    """
    SELECT engine, hour, chunks, prompt_tokens, completion_tokens, gpu_s, latency_s,
           tokens_per_gpu_s
    FROM report_engines
    WHERE (CAST(:since AS timestamptz) IS NULL
           OR (hour AT TIME ZONE 'UTC') >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL
           OR (hour AT TIME ZONE 'UTC') < CAST(:until AS timestamptz))
    ORDER BY engine, hour
    LIMIT :limit
    """
)
