"""The SQL of a job's append-only history."""

from __future__ import annotations

from sqlalchemy import TextClause, text


def _sql(statement: str) -> TextClause:
    return text(statement)


# Append to the job's history (state, level and command entries).
INSERT_HISTORY = _sql(
    """
    INSERT INTO job_history (job_id, at, kind, from_value, to_value, reason, actor, detail)
    VALUES (:job_id, :now, :kind, :from_value, :to_value, :reason, :actor,
            CAST(:detail AS jsonb))
    """
)

SELECT_HISTORY = _sql("SELECT * FROM job_history WHERE job_id = :job_id ORDER BY id")
