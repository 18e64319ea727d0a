"""The SQL of the learned cost estimate's tallies (review_costs) and the costs it learns from.

The sums are bot.queue.schema.REVIEW_COST_SUMS, written out in each statement (a store test
runs them against the migrated table)."""

from __future__ import annotations

from bot.queue.sql import statement

# Add a finished review to its groups' sums, in one statement (concurrent adds all count).
ADD_COSTS = statement(
    """
    INSERT INTO review_costs (scope, name, reviews, lines, files, chunks, engine_s,
                              prompt_tokens, completion_tokens, log_factor, prompt_per_line,
                              completion_per_line, updated_at)
    SELECT row.scope, row.name, row.reviews, row.lines, row.files, row.chunks, row.engine_s,
           row.prompt_tokens, row.completion_tokens, row.log_factor, row.prompt_per_line,
           row.completion_per_line, :now
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS row(
        scope text, name text, reviews double precision, lines double precision,
        files double precision, chunks double precision, engine_s double precision,
        prompt_tokens double precision, completion_tokens double precision,
        log_factor double precision, prompt_per_line double precision,
        completion_per_line double precision)
    ON CONFLICT (scope, name) DO UPDATE
    SET reviews = review_costs.reviews + EXCLUDED.reviews,
        lines = review_costs.lines + EXCLUDED.lines,
        files = review_costs.files + EXCLUDED.files,
        chunks = review_costs.chunks + EXCLUDED.chunks,
        engine_s = review_costs.engine_s + EXCLUDED.engine_s,
        prompt_tokens = review_costs.prompt_tokens + EXCLUDED.prompt_tokens,
        completion_tokens = review_costs.completion_tokens + EXCLUDED.completion_tokens,
        log_factor = review_costs.log_factor + EXCLUDED.log_factor,
        prompt_per_line = review_costs.prompt_per_line + EXCLUDED.prompt_per_line,
        completion_per_line = review_costs.completion_per_line + EXCLUDED.completion_per_line,
        updated_at = EXCLUDED.updated_at
    """
)

# Set groups that keep only their last review (a pull request's).
SET_COSTS = statement(
    """
    INSERT INTO review_costs (scope, name, reviews, lines, files, chunks, engine_s,
                              prompt_tokens, completion_tokens, log_factor, prompt_per_line,
                              completion_per_line, updated_at)
    SELECT row.scope, row.name, row.reviews, row.lines, row.files, row.chunks, row.engine_s,
           row.prompt_tokens, row.completion_tokens, row.log_factor, row.prompt_per_line,
           row.completion_per_line, :now
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS row(
        scope text, name text, reviews double precision, lines double precision,
        files double precision, chunks double precision, engine_s double precision,
        prompt_tokens double precision, completion_tokens double precision,
        log_factor double precision, prompt_per_line double precision,
        completion_per_line double precision)
    ON CONFLICT (scope, name) DO UPDATE
    SET reviews = EXCLUDED.reviews, lines = EXCLUDED.lines, files = EXCLUDED.files,
        chunks = EXCLUDED.chunks, engine_s = EXCLUDED.engine_s,
        prompt_tokens = EXCLUDED.prompt_tokens, completion_tokens = EXCLUDED.completion_tokens,
        log_factor = EXCLUDED.log_factor, prompt_per_line = EXCLUDED.prompt_per_line,
        completion_per_line = EXCLUDED.completion_per_line, updated_at = EXCLUDED.updated_at
    """
)

# Every group's sums; groups of one pull request only while recently updated (there is one
# per pull request ever reviewed, and an old one's next push is rare).
SELECT_COSTS = statement(
    """
    SELECT scope, name, reviews, lines, files, chunks, engine_s, prompt_tokens,
           completion_tokens, log_factor, prompt_per_line, completion_per_line
    FROM review_costs
    WHERE scope <> 'pull' OR updated_at >= :since
    """
)

# Groups of one pull request not updated since :before are forgotten.
DELETE_OLD_PULL_COSTS = statement(
    "DELETE FROM review_costs WHERE scope = 'pull' AND updated_at < :before"
)

# What a finished job's chunks took: the files they covered, calls, engine seconds and tokens.
SELECT_JOB_COST = statement(
    """
    SELECT job.forge, job.repo, job.number,
           count(chunk.id) AS chunks,
           COALESCE(sum(chunk.gpu_seconds), 0) AS engine_s,
           COALESCE(sum((chunk.result -> 'usage' ->> 'prompt_tokens')::bigint), 0)
               AS prompt_tokens,
           COALESCE(sum((chunk.result -> 'usage' ->> 'completion_tokens')::bigint), 0)
               AS completion_tokens,
           COALESCE(jsonb_agg(chunk.files ORDER BY chunk.seq)
                        FILTER (WHERE chunk.id IS NOT NULL), '[]'::jsonb) AS files
    FROM review_jobs job
    LEFT JOIN review_chunks chunk ON chunk.job_id = job.id AND chunk.state = 'done'
    WHERE job.id = :job_id
    GROUP BY job.id
    """
)
