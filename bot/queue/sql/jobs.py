"""The SQL of jobs: intake, planning, levels, reading and ending; `now` is a parameter."""

from __future__ import annotations

from bot.queue.sql import statement

# Record a webhook delivery once; returns no row when the delivery id was seen before.
INSERT_DELIVERY = statement(
    """
    INSERT INTO webhook_deliveries (delivery_id, forge, event, action, received_at, outcome,
                                    detail, job_id)
    VALUES (:delivery_id, :forge, :event, :action, :now, :outcome,
            CAST(:detail AS jsonb), :job_id)
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING id
    """
)

# Link an accepted delivery to the job it created or touched.
UPDATE_DELIVERY_OUTCOME = statement(
    """
    UPDATE webhook_deliveries SET outcome = :outcome, job_id = :job_id,
           detail = COALESCE(CAST(:detail AS jsonb), detail)
    WHERE delivery_id = :delivery_id
    """
)

# The job already created for this exact change (idempotent enqueue).
SELECT_JOB_BY_DEDUPE_KEY = statement("SELECT * FROM review_jobs WHERE dedupe_key = :dedupe_key")

# Cancel every live job of one PR (closed without merge, `/review cancel`).
CANCEL_LIVE_JOBS = statement(
    """
    UPDATE review_jobs SET state = 'cancelled', finished_at = :now, last_error = :reason
    WHERE forge = :forge AND repo = :repo AND number = :number
      AND state IN ('waiting', 'queued', 'running')
    RETURNING id
    """
)

# Dependencies that are still unfinished (a job waits while any is live).
SELECT_LIVE_DEPENDENCIES = statement(
    """
    SELECT id, level FROM review_jobs
    WHERE id = ANY(CAST(:ids AS bigint[])) AND state IN ('waiting', 'queued', 'running')
    """
)

# Claim jobs whose diff has not been fetched and chunked yet, oldest first, for one planner
# until :until (a lease: a planner that dies loses its jobs to another when it runs out, and
# each claim is a new attempt, which fences the one before); a job whose last planning try
# failed waits for its retry time.
CLAIM_UNPLANNED_JOBS = statement(
    """
    WITH candidate AS (
        SELECT id FROM review_jobs
        WHERE NOT planned AND state IN ('queued', 'waiting')
          AND (retry_at IS NULL OR retry_at <= :now)
          AND (planning_until IS NULL OR planning_until <= :now)
        ORDER BY level, enqueued_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE review_jobs j
    SET planning_by = :owner, planning_until = :until,
        planning_attempt = j.planning_attempt + 1
    FROM candidate
    WHERE j.id = candidate.id
    RETURNING j.*
    """
)

# Mark a job planned, with its size, what planning learned (`details`: skipped files, diff
# shas) merged into its request, and (possibly re-evaluated) level.
MARK_JOB_PLANNED = statement(
    """
    UPDATE review_jobs SET planned = true, chunks_total = :chunks_total,
           total_lines = :total_lines, files_changed = COALESCE(:files_changed, files_changed),
           additions = COALESCE(:additions, additions),
           deletions = COALESCE(:deletions, deletions),
           request = request || CAST(:details AS jsonb), planning_until = NULL,
           state = CASE WHEN :chunks_total = 0 AND state = 'queued' THEN 'running' ELSE state END
    WHERE id = :job_id AND NOT planned
      -- fenced: only the planning attempt that still holds the claim stores its plan
      AND (CAST(:fence_owner AS text) IS NULL
           OR (planning_by = :fence_owner AND planning_attempt = :fence_attempt))
    RETURNING id, state
    """
)

# Planning's common path in one statement, in autocommit (one round trip, one commit, as
# intake's): mark the job planned as MARK_JOB_PLANNED does, take the policy's reasons and
# insert its chunks at its level; the caller wakes the dispatchers once it commits. Nothing
# happens when the decision would move the job's level (:level neither its base nor its
# current one): that move writes history and moves chunks, and runs in plan_job's
# transaction instead; nor when the claim is lost or the job was planned already.
PLAN_JOB_AT_ITS_LEVEL = statement(
    """
    WITH marked AS (
        UPDATE review_jobs SET planned = true, chunks_total = :chunks_total,
               total_lines = :total_lines,
               files_changed = COALESCE(:files_changed, files_changed),
               additions = COALESCE(:additions, additions),
               deletions = COALESCE(:deletions, deletions),
               request = request || CAST(:details AS jsonb), planning_until = NULL,
               reasons = COALESCE(CAST(:reasons AS jsonb), reasons),
               state = CASE WHEN :chunks_total = 0 AND state = 'queued' THEN 'running'
                            ELSE state END
        WHERE id = :job_id AND NOT planned
          AND (CAST(:level AS smallint) IS NULL OR :level = base_level OR :level = level)
          AND (CAST(:fence_owner AS text) IS NULL
               OR (planning_by = :fence_owner AND planning_attempt = :fence_attempt))
        RETURNING id, state, level
    ),
    chunks AS (
        INSERT INTO review_chunks (job_id, seq, level, rank, state, files, lines, available_at)
        SELECT marked.id, plan.seq, marked.level, plan.rank,
               CASE WHEN marked.state = 'waiting' THEN 'blocked' ELSE 'queued' END,
               plan.files, plan.lines, :now
        FROM marked,
             jsonb_to_recordset(CAST(:plans AS jsonb))
                 AS plan(seq int, rank double precision, files jsonb, lines int)
        RETURNING 1
    )
    SELECT marked.id, (SELECT count(*) FROM chunks) AS chunks
    FROM marked
    """
)

# End a job (done, failed, dead, cancelled) unless it already ended; an ended job holds no
# claim. With a fence, only while that planning or posting attempt still holds its claim.
FINISH_JOB = statement(
    """
    UPDATE review_jobs
    SET state = :state, finished_at = :now, last_error = COALESCE(:error, last_error),
        review = COALESCE(CAST(:review AS jsonb), review),
        planning_until = NULL, posting_until = NULL
    WHERE id = :job_id AND state IN ('waiting', 'queued', 'running')
      AND (CAST(:fence_owner AS text) IS NULL
           OR (:fence_kind = 'planning' AND planning_by = :fence_owner
               AND planning_attempt = :fence_attempt)
           OR (:fence_kind = 'posting' AND posting_by = :fence_owner
               AND posting_attempt = :fence_attempt))
    RETURNING id, state
    """
)

# Move a live job (and its unstarted chunks) to another level.
SET_JOB_LEVEL = statement(
    """
    UPDATE review_jobs new
    SET level = :level, level_gpu_seconds = 0, last_progress_at = :now
    FROM review_jobs old
    WHERE new.id = old.id AND new.id = :job_id AND new.state IN ('waiting', 'queued', 'running')
      AND new.level <> :level
    RETURNING old.level AS from_level, new.depends_on
    """
)

# ... and its chunks that have not started (running ones finish where they are).
SET_CHUNK_LEVEL = statement(
    """
    UPDATE review_chunks SET level = :level
    WHERE job_id = :job_id AND state IN ('queued', 'blocked')
    """
)

# Jobs that have waited an aging interval without progress rise one level (P0 only if born P0).
AGE_JOBS = statement(
    """
    WITH aged AS (
        UPDATE review_jobs j
        SET level = j.level - 1, level_gpu_seconds = 0, last_progress_at = :now
        WHERE j.state IN ('queued', 'running') AND j.level > 0
          AND j.last_progress_at <= :cutoff
          AND (j.level > 1 OR j.base_level = 0)
          AND EXISTS (SELECT 1 FROM review_chunks c WHERE c.job_id = j.id AND c.state = 'queued')
          AND NOT EXISTS (
              SELECT 1 FROM review_chunks c WHERE c.job_id = j.id AND c.state = 'running')
        RETURNING j.id, j.level
    ),
    moved AS (
        UPDATE review_chunks c SET level = aged.level
        FROM aged WHERE c.job_id = aged.id AND c.state = 'queued'
    )
    INSERT INTO job_history (job_id, at, kind, from_value, to_value, reason, actor)
    SELECT id, :now, 'level', 'P' || (level + 1), 'P' || level,
           :reason, 'scheduler'
    FROM aged
    RETURNING job_id
    """
)

# Waiting jobs whose dependencies have all ended become ready now.
RELEASE_DEPENDENTS = statement(
    """
    WITH ready AS (
        UPDATE review_jobs j SET state = 'queued', ready_at = :now, last_progress_at = :now
        WHERE j.state = 'waiting' AND :job_id = ANY(j.depends_on)
          AND NOT EXISTS (
              SELECT 1 FROM review_jobs d
              WHERE d.id = ANY(j.depends_on) AND d.state IN ('waiting', 'queued', 'running'))
        RETURNING j.id
    ),
    unblocked AS (
        UPDATE review_chunks c SET state = 'queued', available_at = :now
        FROM ready WHERE c.job_id = ready.id AND c.state = 'blocked'
    )
    SELECT id FROM ready
    """
)

# One job by id.
SELECT_JOB = statement("SELECT * FROM review_jobs WHERE id = :job_id")

# The newest job of one PR (live ones first).
SELECT_NEWEST_JOB_OF_PULL = statement(
    """
    SELECT * FROM review_jobs WHERE forge = :forge AND repo = :repo AND number = :number
    ORDER BY (state IN ('waiting', 'queued', 'running')) DESC, id DESC
    LIMIT 1
    """
)

# The newest jobs, of one state or all (`bot queue ls`).
SELECT_JOBS = statement(
    """
    SELECT * FROM review_jobs WHERE (CAST(:state AS text) IS NULL OR state = :state)
    ORDER BY id DESC LIMIT :limit
    """
)

# Place in line: queued jobs of more urgent levels, or of this level with a better rank.
SELECT_QUEUE_POSITION = statement(
    """
    SELECT count(DISTINCT c.job_id) AS ahead
    FROM review_chunks c, (
        SELECT min(level) AS level, min(rank) AS rank FROM review_chunks
        WHERE job_id = :job_id AND state = 'queued') me
    WHERE c.state = 'queued' AND c.job_id <> :job_id
      AND (c.level < me.level OR (c.level = me.level AND c.rank < me.rank))
    """
)

# The policy's level changes with the change itself (labels, size), not a person's say.
SET_BASE_LEVEL = statement("UPDATE review_jobs SET base_level = :level WHERE id = :job_id")

# The policy's reasons, re-decided once the diff's size is known (a hook's guesses go stale).
SET_JOB_REASONS = statement(
    "UPDATE review_jobs SET reasons = CAST(:reasons AS jsonb) WHERE id = :job_id"
)

# Intake's common path in one statement: record the delivery (once), insert the job (once per
# change), write its history, supersede older live reviews of the same PR (running ones only
# with :supersede_running) with their history and
# cancel their unstarted chunks. The job id is drawn first so the
# delivery can point at it. When the delivery was seen before nothing else happens; when the
# change was seen before (`job_id` is NULL but the delivery is new), the caller re-evaluates.
SUBMIT_NEW_JOB = statement(
    """
    WITH new_job AS (
        SELECT nextval(pg_get_serial_sequence('review_jobs', 'id')) AS id
    ),
    delivery AS (
        INSERT INTO webhook_deliveries (delivery_id, forge, event, action, received_at, outcome,
                                        job_id)
        SELECT :delivery_id, :forge, :event, :action, :now, 'queued', new_job.id FROM new_job
        WHERE CAST(:delivery_id AS text) IS NOT NULL
        ON CONFLICT (delivery_id) DO NOTHING
        RETURNING id
    ),
    job AS (
        INSERT INTO review_jobs (id, forge, repo, number, project_id, installation_id, title,
            author, author_is_bot, base_ref, head_ref, base_sha, head_sha, files_changed,
            additions, deletions, total_lines, base_level, level, reasons, state, dedupe_key,
            enqueued_at, ready_at, last_progress_at, depends_on, request)
        SELECT new_job.id, :forge, :repo, :number, :project_id, :installation_id, :title,
            :author, :author_is_bot, :base_ref, :head_ref, :base_sha, :head_sha, :files_changed,
            :additions, :deletions, :total_lines, :level, :level, CAST(:reasons AS jsonb),
            :state, :dedupe_key, :now, :ready_at, :now, CAST(:depends_on AS bigint[]),
            CAST(:request AS jsonb)
        FROM new_job
        WHERE CAST(:delivery_id AS text) IS NULL OR EXISTS (SELECT 1 FROM delivery)
        ON CONFLICT (dedupe_key) DO NOTHING
        RETURNING id
    ),
    history AS (
        INSERT INTO job_history (job_id, at, kind, from_value, to_value, reason, actor, detail)
        SELECT job.id, :now, 'state', NULL, :state, :reason, :actor, CAST(:detail AS jsonb)
        FROM job
    ),
    superseded AS (
        UPDATE review_jobs old
        SET state = 'superseded', finished_at = :now, superseded_by = job.id
        FROM job
        WHERE old.forge = :forge AND old.repo = :repo AND old.number = :number
          AND old.id <> job.id
          AND (old.state IN ('waiting', 'queued')
               OR (CAST(:supersede_running AS boolean) AND old.state = 'running'))
        RETURNING old.id
    ),
    cancelled_chunks AS (
        UPDATE review_chunks c SET state = 'cancelled', finished_at = :now
        FROM superseded
        WHERE c.job_id = superseded.id AND c.state IN ('queued', 'blocked')
    ),
    superseded_history AS (
        INSERT INTO job_history (job_id, at, kind, from_value, to_value, reason, actor)
        SELECT superseded.id, :now, 'state', NULL, 'superseded',
               'superseded by job ' || job.id || ' for head ' || left(:head_sha, 12), 'intake'
        FROM superseded, job
    )
    SELECT EXISTS (SELECT 1 FROM delivery) AS delivery_new,
           (SELECT id FROM job) AS job_id,
           ARRAY(SELECT id FROM superseded) AS superseded
    """
)

# A Re-run: an ended job's status is written again (a new check run); a live one's is written
# as it moves anyway. Either way the publisher wakes.
REQUEST_REPUBLISH = statement(
    """
    WITH job AS (
        SELECT id, state IN ('done', 'failed', 'dead', 'superseded', 'cancelled') AS ended
        FROM review_jobs WHERE id = :job_id
    ), owed AS (
        INSERT INTO status_outbox (job_id, republish) SELECT id, true FROM job WHERE ended
        ON CONFLICT (job_id) DO UPDATE SET republish = true
    )
    SELECT pg_notify('review_bot_status', CAST(id AS text)) FROM job
    """
)
