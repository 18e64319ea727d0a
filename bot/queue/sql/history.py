"""The SQL of a job's append-only history."""

from __future__ import annotations

from bot.queue.sql import statement

# Append to the job's history (state, level and command entries).
INSERT_HISTORY = statement(
    """
    INSERT INTO job_history (job_id, at, kind, from_value, to_value, reason, actor, detail)
    VALUES (:job_id, :now, :kind, :from_value, :to_value, :reason, :actor,
            CAST(:detail AS jsonb))
    """
)

# A job's history, oldest first.
SELECT_HISTORY = statement("SELECT * FROM job_history WHERE job_id = :job_id ORDER BY id")
