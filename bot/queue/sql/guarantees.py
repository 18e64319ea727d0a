"""The SQL of `bot check`: each guarantee of the queue as one query returning the rows that
break it, one line of text each (bot/queue/guarantees.py names and runs them)."""

from __future__ import annotations

from bot.queue.sql import statement

# Done jobs still holding a planning or posting claim, or a running chunk.
DONE_JOBS_HOLD_NO_LEASE = statement(
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
)

# Jobs whose done count is not their chunks done (a chunk counted twice), or above their total.
NO_CHUNK_DONE_TWICE = statement(
    """
    SELECT 'job ' || j.id || ' counts ' || j.chunks_done || ' chunks done of '
           || j.chunks_total || ', its chunks show ' || d.done AS detail
    FROM review_jobs j
    CROSS JOIN LATERAL (SELECT count(*) AS done FROM review_chunks c
                        WHERE c.job_id = j.id AND c.state = 'done') d
    WHERE j.chunks_done <> d.done OR j.chunks_done > j.chunks_total
    ORDER BY j.id
    """
)

# Jobs (and heads) whose history records the posting more than once.
ONE_POSTING_PER_JOB = statement(
    """
    SELECT 'job ' || h.job_id || ' (head ' || left(j.head_sha, 12)
           || ') recorded posted ' || count(*) || ' times' AS detail
    FROM job_history h JOIN review_jobs j ON j.id = h.job_id
    WHERE h.kind = 'state' AND h.to_value = 'done'
    GROUP BY h.job_id, j.head_sha
    HAVING count(*) > 1
    ORDER BY h.job_id
    """
)

# Deliveries answered as queued whose job was never made (or is gone).
ACKNOWLEDGED_DELIVERIES_HAVE_JOBS = statement(
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
)

# Chunk leases held by a process that stopped, or went silent for longer than a lease and
# a heartbeat.
NO_LEASE_OUTLIVES_ITS_HOLDER = statement(
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
)

# Chunks, and jobs' planning or posting, tried more often than the configured maximum.
ATTEMPTS_WITHIN_LIMITS = statement(
    """
    SELECT 'chunk ' || id || ' ran ' || attempts || ' attempts (at most '
           || CAST(:max_chunk_attempts AS int) || ')' AS detail
    FROM review_chunks WHERE attempts > CAST(:max_chunk_attempts AS int)
    UNION ALL
    SELECT 'job ' || j.id || ' tried ' || stage.name || ' ' || stage.tries
           || ' times (at most ' || CAST(:max_stage_attempts AS int) || ')'
    FROM review_jobs j
    CROSS JOIN LATERAL (VALUES
        ('planning', j.planning_failures),
        ('posting', j.posting_failures)
    ) AS stage(name, tries)
    WHERE stage.tries > CAST(:max_stage_attempts AS int)
    """
)
