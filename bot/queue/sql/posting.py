"""The SQL of finished jobs waiting to be posted: posting claims, their renewal and release,
and planning or posting tries deferred after a failure."""

from __future__ import annotations

from bot.queue.sql import statement

# Jobs whose chunks are all done but whose review was never posted (a crash in between).
# With :now, jobs another poster holds a live claim on, or whose retry time has not come,
# are left out: they must not fill the batch while others wait.
SELECT_UNPOSTED_JOBS = statement(
    """
    SELECT * FROM review_jobs
    WHERE state = 'running' AND planned AND chunks_done >= chunks_total
      AND (CAST(:now AS timestamptz) IS NULL OR retry_at IS NULL OR retry_at <= :now)
      AND (CAST(:now AS timestamptz) IS NULL OR posting_until IS NULL
           OR posting_until <= :now)
    ORDER BY level, id LIMIT :limit
    """
)

# Claim a finished job for posting until :until, unless another poster's claim is still valid:
# a completion and a recovery pass (or two processes) never post the same review at once. The
# claim is a lease: its holder renews it (RENEW_POSTING_CLAIMS); if the holder dies, it runs out
# and the next claim is a new attempt, which fences every write of the one before.
CLAIM_POSTING = statement(
    """
    UPDATE review_jobs
    SET posting_by = :owner, posting_until = :until, posting_attempt = posting_attempt + 1
    WHERE id = :job_id AND state = 'running'
      AND (posting_until IS NULL OR posting_until <= :now)
    RETURNING posting_attempt
    """
)

# Whether a posting attempt still holds its claim, checked right before each forge write;
# with :now, the claim must also not have run out (a process that resumes from a pause past
# its lease holds nothing, even before another poster takes the job over), and it is
# extended to :until, so the write that follows has a whole lease before anyone may take over.
POSTING_HELD = statement(
    """
    UPDATE review_jobs
    SET posting_until = CASE WHEN CAST(:until AS timestamptz) IS NULL THEN posting_until
                             ELSE GREATEST(posting_until, :until) END
    WHERE id = :job_id AND state = 'running'
      AND posting_by = :owner AND posting_attempt = :attempt
      AND (CAST(:now AS timestamptz) IS NULL OR posting_until > :now)
    RETURNING id
    """
)

# Renew the posting claims `owner` still holds (its heartbeat): a live poster keeps its jobs
# however slow the forge is, a dead one loses them when the claim runs out. A claim that ran
# out is not revived (its holder was paused past it): the recovery pass claims it again, as a
# new attempt that looks for what the old one may have posted.
RENEW_POSTING_CLAIMS = statement(
    """
    UPDATE review_jobs
    SET posting_until = :until
    WHERE id = ANY(CAST(:job_ids AS bigint[])) AND state = 'running'
      AND posting_by = :owner AND posting_until > :now
    RETURNING id
    """
)

# Give up the posting claims `owner` holds (a stopping process): another poster may take
# them at once; the marker on the forge keeps a post that got through from being repeated.
RELEASE_POSTING_CLAIMS = statement(
    """
    UPDATE review_jobs
    SET posting_until = NULL
    WHERE state = 'running' AND posting_by = :owner AND posting_until IS NOT NULL
    RETURNING id
    """
)

# Give up the planning claims `owner` holds (a stopping process): another planner may take
# them at once; the claim's attempt fences anything the stopped one might still write.
RELEASE_PLANNING_CLAIMS = statement(
    """
    UPDATE review_jobs
    SET planning_until = NULL
    WHERE NOT planned AND planning_by = :owner AND planning_until IS NOT NULL
    RETURNING id
    """
)

# A planning or posting try (:kind) failed with a retryable error: count it and set when the
# next try may start, giving the claim back; no row when the job has ended
# meanwhile, or (with a fence) when that attempt no longer holds its claim.
DEFER_JOB = statement(
    """
    UPDATE review_jobs
    SET attempts = attempts + 1, last_error = :error,
        retry_at = :retry_at,
        planning_failures = planning_failures + CASE WHEN :kind = 'planning' THEN 1 ELSE 0 END,
        posting_failures = posting_failures + CASE WHEN :kind = 'posting' THEN 1 ELSE 0 END,
        posting_until = NULL, planning_until = NULL
    WHERE id = :job_id AND state IN ('waiting', 'queued', 'running')
      AND (CAST(:fence_owner AS text) IS NULL
           OR (:fence_kind = 'planning' AND planning_by = :fence_owner
               AND planning_attempt = :fence_attempt)
           OR (:fence_kind = 'posting' AND posting_by = :fence_owner
               AND posting_attempt = :fence_attempt))
    RETURNING state,
              CASE WHEN :kind = 'planning' THEN planning_failures ELSE posting_failures END
                  AS tries
    """
)
