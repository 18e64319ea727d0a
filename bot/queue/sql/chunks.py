"""The SQL of chunks and their leases: the dequeue, heartbeats, finishing, failing, reclaiming."""

from __future__ import annotations

from bot.queue.sql import statement

# Chunks of superseded or cancelled jobs that have not started will never run.
CANCEL_PENDING_CHUNKS = statement(
    """
    UPDATE review_chunks SET state = 'cancelled', finished_at = :now
    WHERE job_id = ANY(CAST(:job_ids AS bigint[])) AND state IN ('queued', 'blocked')
    """
)

# Store a job's chunks; they are queued, or blocked while the job waits for dependencies.
INSERT_CHUNKS = statement(
    """
    INSERT INTO review_chunks (job_id, seq, level, rank, state, files, lines, available_at)
    SELECT :job_id, plan.seq, job.level, plan.rank,
           CASE WHEN job.state = 'waiting' THEN 'blocked' ELSE 'queued' END,
           plan.files, plan.lines, :now
    FROM review_jobs job,
         jsonb_to_recordset(CAST(:plans AS jsonb))
             AS plan(seq int, rank double precision, files jsonb, lines int)
    WHERE job.id = :job_id
    """
)

# How much work is running and ready per level, across every dispatcher process.
SELECT_LEVEL_LOAD = statement(
    """
    SELECT level,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'queued' AND available_at <= :now) AS ready,
           -- the scheduler's rank bands: first chunks rank below :new_work_below, work expected
           -- to be short at or below :short_work_rank
           count(*) FILTER (WHERE state = 'running' AND rank > :short_work_rank)
               AS running_long_work,
           count(*) FILTER (WHERE state = 'queued' AND available_at <= :now
                                  AND rank < :new_work_below) AS ready_new_work,
           count(*) FILTER (WHERE state = 'queued' AND available_at <= :now
                                  AND rank <= :short_work_rank) AS ready_short_work
    FROM review_chunks
    WHERE state IN ('queued', 'running')
    GROUP BY level
    """
)

# Chunks running on each engine, in every process (the windows are per engine, not per process).
SELECT_ENGINE_LOAD = statement(
    """
    SELECT engine, count(*) AS running, count(*) FILTER (WHERE level = 0) AS p0
    FROM review_chunks
    WHERE state = 'running' AND engine IS NOT NULL
    GROUP BY engine
    """
)

# THE dequeue. For each level in the caller's order of preference, the best queued chunk of
# that level (the partial index ix_review_chunks_dequeue serves the inner ORDER BY), locked
# with SKIP LOCKED so concurrent dispatchers never meet. There is deliberately no outer ORDER
# BY: the lateral join is a nested loop over the preference array in its order, so LIMIT 1
# stops at the first level that has a chunk and locks nothing in the levels after it. The
# chunk is leased, its job marked started and a first start written to the history, all in
# one statement.
FETCH_CHUNK = statement(
    """
    WITH candidate AS (
        SELECT pick.id
        FROM unnest(CAST(:levels AS smallint[])) AS preference(level)
        CROSS JOIN LATERAL (
            SELECT c.id FROM review_chunks c
            WHERE c.state = 'queued' AND c.level = preference.level
              AND c.available_at <= :now AND c.rank <= :max_rank
            ORDER BY c.rank, c.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) AS pick
        LIMIT 1
    ),
    leased AS (
        UPDATE review_chunks c
        SET state = 'running', lease_owner = :owner, lease_expires_at = :lease_expires_at,
            started_at = :now, attempts = c.attempts + 1, engine = :engine,
            lease_attempt = c.lease_attempt + 1
        FROM candidate
        WHERE c.id = candidate.id
        RETURNING c.*
    ),
    started AS (
        -- Only a job's first chunk touches the job row: later ones need not (aging skips
        -- jobs with a running chunk, and finishing a chunk records progress). The test is on
        -- the row itself, so of two leases racing for a new job's chunks only one starts it:
        -- the other waits for its row lock, then finds first_started_at set.
        UPDATE review_jobs j
        SET state = 'running', first_started_at = :now, last_progress_at = :now
        FROM leased
        WHERE j.id = leased.job_id AND j.first_started_at IS NULL
        RETURNING j.id
    ),
    history AS (
        INSERT INTO job_history (job_id, at, kind, from_value, to_value, reason, actor)
        SELECT started.id, :now, 'state', 'queued', 'running', 'first chunk started', :owner
        FROM started
    )
    SELECT leased.*, EXISTS (SELECT 1 FROM started) AS first_start FROM leased
    """
)

# Extend the leases a worker still holds.
HEARTBEAT = statement(
    """
    UPDATE review_chunks SET lease_expires_at = :lease_expires_at
    WHERE id = ANY(CAST(:chunk_ids AS bigint[])) AND lease_owner = :owner AND state = 'running'
    """
)

# Name the engine a held chunk runs on after all (a review's chunk placed on its home engine).
MOVE_CHUNK_ENGINE = statement(
    """
    UPDATE review_chunks SET engine = :engine
    WHERE id = :chunk_id AND lease_owner = :owner AND state = 'running'
    """
)

# Finish a chunk the caller holds and count it against its job (progress, GPU time, GPU time
# at this level), in one statement; no row means the lease was lost. The lease's attempt
# (its fencing token) must match too: the same process may hold the chunk again by now.
FINISH_CHUNK = statement(
    """
    WITH finished AS (
        UPDATE review_chunks
        -- a preempted earlier attempt may have charged some seconds already
        SET state = 'done', finished_at = :now,
            gpu_seconds = COALESCE(gpu_seconds, 0) + :gpu_seconds,
            -- lease_owner stays: it records which worker ran the chunk (report_workers)
            result = CAST(:result AS jsonb), lease_expires_at = NULL
        WHERE id = :chunk_id AND lease_owner = :owner AND state = 'running'
          AND (CAST(:attempt AS integer) IS NULL OR lease_attempt = :attempt)
        RETURNING job_id
    )
    UPDATE review_jobs j
    SET chunks_done = j.chunks_done + 1, gpu_seconds = j.gpu_seconds + :gpu_seconds,
        level_gpu_seconds = j.level_gpu_seconds + :gpu_seconds, last_progress_at = :now
    FROM finished
    WHERE j.id = finished.job_id
    RETURNING j.id, j.state, j.level, j.base_level, j.level_gpu_seconds, j.chunks_done,
              j.chunks_total
    """
)

# A failed attempt: back to the queue after a backoff, while attempts remain.
RETRY_CHUNK = statement(
    """
    UPDATE review_chunks
    SET state = 'queued', available_at = :available_at, last_error = :error,
        lease_owner = NULL, lease_expires_at = NULL, started_at = NULL
    WHERE id = :chunk_id AND lease_owner = :owner AND state = 'running'
      AND (CAST(:attempt AS integer) IS NULL OR lease_attempt = :attempt)
      AND attempts < :max_attempts AND :retryable
    RETURNING job_id
    """
)

# A chunk out of attempts (or failing for good) is dead, and so is its job.
KILL_CHUNK = statement(
    """
    UPDATE review_chunks
    SET state = 'dead', finished_at = :now, last_error = :error,
        lease_owner = NULL, lease_expires_at = NULL
    WHERE id = :chunk_id AND lease_owner = :owner AND state = 'running'
      AND (CAST(:attempt AS integer) IS NULL OR lease_attempt = :attempt)
    RETURNING job_id
    """
)

# Give back a chunk that a stopping (or preempted) worker holds, without counting an attempt;
# GPU seconds a preempted call already used are charged to the chunk.
RELEASE_CHUNK = statement(
    """
    UPDATE review_chunks
    SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL, started_at = NULL,
        attempts = GREATEST(attempts - 1, 0), available_at = :now,
        gpu_seconds = CASE WHEN :used_s > 0 THEN COALESCE(gpu_seconds, 0) + :used_s
                           ELSE gpu_seconds END
    WHERE id = :chunk_id AND lease_owner = :owner AND state = 'running'
      AND (CAST(:attempt AS integer) IS NULL OR lease_attempt = :attempt)
    RETURNING job_id
    """
)

# ... and to its job (not to the GPU time at its level: feedback counts finished work only).
CHARGE_JOB_GPU = statement(
    "UPDATE review_jobs SET gpu_seconds = gpu_seconds + :used_s WHERE id = :job_id"
)

# Re-rank a job's continuation chunks that have not started (the scheduler's view of its
# remaining work changed); its first chunk keeps its own rank.
RERANK_CONTINUATIONS = statement(
    """
    UPDATE review_chunks SET rank = :rank
    WHERE job_id = :job_id AND seq > 0 AND state IN ('queued', 'blocked') AND rank <> :rank
    """
)

# Leases that expired (their worker died): back to the queue, or dead when out of attempts.
RECLAIM_EXPIRED = statement(
    """
    UPDATE review_chunks
    SET state = CASE WHEN attempts >= :max_attempts THEN 'dead' ELSE 'queued' END,
        finished_at = CASE WHEN attempts >= :max_attempts THEN :now END,
        last_error = 'lease expired (worker ' || COALESCE(lease_owner, '?') || ' stopped)',
        lease_owner = NULL, lease_expires_at = NULL, started_at = NULL, available_at = :now
    WHERE id IN (
        SELECT id FROM review_chunks
        WHERE state = 'running' AND lease_expires_at < :now
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, job_id, state
    """
)

# A job's chunks in order, with their results (the poster assembles the review from them).
SELECT_CHUNKS = statement("SELECT * FROM review_chunks WHERE job_id = :job_id ORDER BY seq")

# A job's chunk sizes in order (the scheduler ranks a job another process planned).
SELECT_CHUNK_LINES = statement(
    "SELECT lines FROM review_chunks WHERE job_id = :job_id ORDER BY seq"
)

# The attempts of a chunk the caller holds, locked while its failure is decided.
LOCK_LEASED_CHUNK = statement(
    "SELECT attempts FROM review_chunks WHERE id = :chunk_id AND lease_owner = :owner"
    " AND state = 'running' AND (CAST(:attempt AS integer) IS NULL OR lease_attempt = :attempt)"
    " FOR UPDATE"
)
