"""The SQL of the learned cost estimate's tallies (review_costs) and the costs it learns from."""

from __future__ import annotations

from sqlalchemy import TextClause, text

from bot.queue.schema import REVIEW_COST_SUMS


def _sql(statement: str) -> TextClause:
    return text(statement)


_COLUMNS = ", ".join(REVIEW_COST_SUMS)
_RECORD = ", ".join(f"{name} double precision" for name in REVIEW_COST_SUMS)


def _upsert(assign: str) -> TextClause:
    sets = ", ".join(f"{name} = {assign.format(name=name)}" for name in REVIEW_COST_SUMS)
    return _sql(
        f"""
        INSERT INTO review_costs (scope, name, {_COLUMNS}, updated_at)
        SELECT row.scope, row.name, {", ".join(f"row.{name}" for name in REVIEW_COST_SUMS)}, :now
        FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS row(scope text, name text, {_RECORD})
        ON CONFLICT (scope, name) DO UPDATE SET {sets}, updated_at = EXCLUDED.updated_at
        """
    )


# Add a finished review to its groups' sums, in one statement (concurrent adds all count).
ADD_COSTS = _upsert("review_costs.{name} + EXCLUDED.{name}")

# Set groups that keep only their last review (a pull request's).
SET_COSTS = _upsert("EXCLUDED.{name}")

# Every group's sums; groups of one pull request only while recently updated (there is one
# per pull request ever reviewed, and an old one's next push is rare).
SELECT_COSTS = _sql(
    f"""
    SELECT scope, name, {_COLUMNS} FROM review_costs
    WHERE scope <> 'pull' OR updated_at >= :since
    """
)

# Groups of one pull request not updated since :before are forgotten.
DELETE_OLD_PULL_COSTS = _sql(
    "DELETE FROM review_costs WHERE scope = 'pull' AND updated_at < :before"
)

# What a finished job's chunks took: the files they covered, calls, engine seconds and tokens.
SELECT_JOB_COST = _sql(
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
