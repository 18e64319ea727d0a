"""The status publisher's SQL: live jobs and their ETA inputs, owed statuses, its lease."""

from __future__ import annotations

from bot.queue.sql import statement

# Every live job with what the ETA needs (its calls: ranks, sizes, running since when; its own
# finished calls) and the status last written for it. One lateral aggregate per job over its
# chunks (the (job_id, seq) unique index).
SELECT_LIVE_JOBS = statement(
    """
    SELECT j.id, j.forge, j.repo, j.number, j.head_sha, j.installation_id, j.project_id,
           j.level, j.state, j.planned, j.first_started_at IS NOT NULL AS started,
           j.enqueued_at, j.total_lines, j.additions, j.deletions, j.chunks_total,
           j.chunks_done, j.reasons,
           j.request->>'web_url' AS web_url,
           CASE WHEN j.state = 'waiting' THEN j.depends_on END AS waits_for,
           c.queued_ranks, c.queued_lines, c.running_lines, c.running_started,
           c.done_lines, c.done_calls, c.done_gpu_s,
           s.state AS status_state, s.level AS status_level, s.place AS status_place,
           s.finish_at AS status_finish_at, s.parts_done AS status_parts_done,
           s.parts_total AS status_parts_total, s.conclusion AS status_conclusion,
           s.published_at AS status_published_at, s.external_id AS status_external_id
    FROM review_jobs j
    CROSS JOIN LATERAL (
        SELECT array_agg(ch.rank ORDER BY ch.seq)
                   FILTER (WHERE ch.state IN ('queued', 'blocked')) AS queued_ranks,
               array_agg(ch.lines ORDER BY ch.seq)
                   FILTER (WHERE ch.state IN ('queued', 'blocked')) AS queued_lines,
               array_agg(ch.lines ORDER BY ch.seq) FILTER (WHERE ch.state = 'running')
                   AS running_lines,
               array_agg(ch.started_at ORDER BY ch.seq) FILTER (WHERE ch.state = 'running')
                   AS running_started,
               COALESCE(sum(ch.lines) FILTER (WHERE ch.state = 'done'), 0) AS done_lines,
               count(*) FILTER (WHERE ch.state = 'done') AS done_calls,
               COALESCE(sum(ch.gpu_seconds) FILTER (WHERE ch.state = 'done'), 0) AS done_gpu_s
        FROM review_chunks ch WHERE ch.job_id = j.id
    ) c
    LEFT JOIN status_reports s ON s.job_id = j.id
    WHERE j.state IN ('waiting', 'queued', 'running')
    """
)

# The writes every forge budget counted since :since, for the posting wait an ETA includes.
SELECT_RECENT_WRITES = statement(
    """
    SELECT budget_key, spent_at FROM forge_writes WHERE spent_at > :since ORDER BY spent_at
    """
)

# The reviews that arrived in a recent window: level and size, what the ETA expects more of.
SELECT_RECENT_ARRIVALS = statement(
    """
    SELECT level, COALESCE(NULLIF(total_lines, 0), additions + deletions) AS lines
    FROM review_jobs
    WHERE enqueued_at > :since AND enqueued_at <= :now
    """
)

# The model the publisher estimates with, kept for every other process (one row per name).
UPSERT_ETA_MODEL = statement(
    """
    INSERT INTO eta_model (name, model, updated_at) VALUES (:name, CAST(:model AS jsonb), :now)
    ON CONFLICT (name) DO UPDATE SET model = EXCLUDED.model, updated_at = EXCLUDED.updated_at
    """
)
# The model another process stored (a restarted publisher starts from it).
SELECT_ETA_MODEL = statement("SELECT model FROM eta_model WHERE name = :name")

# Ended jobs whose final status is owed (the outbox a trigger on review_jobs fills when a job
# ends; a Re-run marks its row `republish`), oldest end first.
SELECT_OWED = statement(
    """
    SELECT j.id, j.forge, j.repo, j.number, j.head_sha, j.installation_id, j.project_id,
           j.level, j.state, j.reasons, j.review, j.last_error, j.chunks_total, j.chunks_done,
           j.enqueued_at, j.finished_at, j.request->>'web_url' AS web_url, o.republish,
           s.state AS status_state, s.level AS status_level, s.place AS status_place,
           s.finish_at AS status_finish_at, s.parts_done AS status_parts_done,
           s.parts_total AS status_parts_total, s.conclusion AS status_conclusion,
           s.published_at AS status_published_at, s.external_id AS status_external_id
    FROM status_outbox o JOIN review_jobs j ON j.id = o.job_id
    LEFT JOIN status_reports s ON s.job_id = j.id
    WHERE j.state IN ('done', 'failed', 'dead', 'superseded', 'cancelled')
    ORDER BY j.finished_at, j.id
    LIMIT :limit
    """
)

# Which of these jobs ended, how and when (what the ETA learns from, outside the publisher).
SELECT_ENDED_AMONG = statement(
    """
    SELECT id, state, finished_at FROM review_jobs
    WHERE id = ANY(CAST(:ids AS bigint[]))
      AND state IN ('done', 'failed', 'dead', 'superseded', 'cancelled')
    """
)

# The owed status was written (or is not wanted): the job leaves the outbox, unless a Re-run
# asked again meanwhile.
SETTLE_OWED = statement(
    "DELETE FROM status_outbox WHERE job_id = :job_id AND republish = CAST(:republish AS boolean)"
)

# What GitLab holds now on each head (the newest status written there by any job): GitLab
# refuses transitions its state machine does not allow, whichever job asks.
SELECT_HEAD_STATES = statement(
    """
    SELECT DISTINCT ON (s.repo, s.head_sha) s.repo, s.head_sha, s.state, s.conclusion
    FROM status_reports s
    WHERE s.forge = :forge AND s.head_sha = ANY(CAST(:shas AS text[]))
    ORDER BY s.repo, s.head_sha, s.published_at DESC, s.job_id DESC
    """
)

# Remember what was written (only while the writing attempt holds the publisher's lease: no row
# comes back when another has taken it over); the first write keeps its ETA as the one given
# at enqueue.
RECORD_REPORT = statement(
    """
    INSERT INTO status_reports (job_id, forge, repo, head_sha, kind, external_id, state, level,
                                place, finish_at, first_finish_at, parts_done, parts_total,
                                conclusion, published_at, writes)
    SELECT :job_id, :forge, :repo, :head_sha, :kind, :external_id, :state, :level, :place,
           :finish_at, :finish_at, :parts_done, :parts_total, :conclusion, :now, 1
    FROM process_leases l
    WHERE l.name = :lease_name AND l.owner = :lease_owner AND l.attempt = :lease_attempt
    ON CONFLICT (job_id) DO UPDATE
    SET kind = EXCLUDED.kind,
        external_id = COALESCE(EXCLUDED.external_id, status_reports.external_id),
        state = EXCLUDED.state, level = EXCLUDED.level, place = EXCLUDED.place,
        finish_at = EXCLUDED.finish_at, parts_done = EXCLUDED.parts_done,
        parts_total = EXCLUDED.parts_total, conclusion = EXCLUDED.conclusion,
        published_at = EXCLUDED.published_at, writes = status_reports.writes + 1
    RETURNING job_id
    """
)

# A status written by a publisher whose lease was taken over reached the forge anyway (it was on
# the wire: a forge has no conditional writes). What the forge shows now is noted (its check run
# too, if the write made a new one), and an ended job owes its final status again, so the
# leader writes it over. Unfenced on purpose: it only ever asks for one more write.
NOTE_STALE_WRITE = statement(
    """
    WITH noted AS (
        UPDATE status_reports
        SET state = :state, conclusion = :conclusion, published_at = :now,
            external_id = COALESCE(:external_id, external_id)
        WHERE job_id = :job_id
        RETURNING job_id
    )
    INSERT INTO status_outbox (job_id)
    SELECT j.id FROM review_jobs j
    WHERE j.id = :job_id AND j.state IN ('done', 'failed', 'dead', 'superseded', 'cancelled')
    ON CONFLICT (job_id) DO NOTHING
    """
)

# One publisher at a time across processes: a lease (process_leases) taken or renewed at each
# pass. Its holder keeps its attempt; a takeover after it ran out is a new attempt, which
# fences every write of the one before. No connection is held during a pass.
ACQUIRE_LEASE = statement(
    """
    INSERT INTO process_leases (name, owner, attempt, acquired_at, expires_at)
    VALUES (:name, :owner, 1, :now, :until)
    ON CONFLICT (name) DO UPDATE
    SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at,
        attempt = CASE WHEN process_leases.owner = EXCLUDED.owner
                       THEN process_leases.attempt ELSE process_leases.attempt + 1 END,
        acquired_at = CASE WHEN process_leases.owner = EXCLUDED.owner
                           THEN process_leases.acquired_at ELSE EXCLUDED.acquired_at END
    WHERE process_leases.owner = EXCLUDED.owner OR process_leases.expires_at <= :now
    RETURNING attempt
    """
)

# Right before a status goes to the forge: this attempt still holds the lease, and a status
# that is not final is only written while its job is still live.
MAY_WRITE = statement(
    """
    SELECT 1 FROM process_leases l JOIN review_jobs j ON j.id = :job_id
    WHERE l.name = :name AND l.owner = :owner AND l.attempt = :attempt
      AND (CAST(:final AS boolean) OR j.state IN ('waiting', 'queued', 'running'))
    """
)
