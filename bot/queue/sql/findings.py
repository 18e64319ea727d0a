"""The findings store's SQL, named, each with its intent. `now` is always a parameter."""

from __future__ import annotations

from bot.queue.sql import statement

# Everything earlier reviews recorded on one pull request, in the order it was first said.
SELECT_FINDINGS_OF_PULL = statement(
    """
    SELECT * FROM review_findings
    WHERE forge = :forge AND repo = :repo AND number = :number
    ORDER BY id
    """
)

# Record findings a review said (or said again after their code came back): open, with the
# job that said them last; a discussion id already known is kept when the new one is unknown.
# With a fence, nothing is recorded unless that posting attempt still holds the job's claim.
UPSERT_FINDINGS = statement(
    """
    INSERT INTO review_findings (forge, repo, number, fingerprint, path, line, side, severity,
                                 body, anchor_text, state, inline, forge_ref, first_job_id,
                                 last_job_id, created_at, updated_at)
    SELECT :forge, :repo, :number, item.fingerprint, item.path, item.line, item.side,
           item.severity, item.body, item.anchor_text, 'open', item.inline, item.forge_ref,
           :job_id, :job_id, :now, :now
    FROM jsonb_to_recordset(CAST(:findings AS jsonb)) AS item(
        fingerprint text, path text, line int, side text, severity text, body text,
        anchor_text text, inline boolean, forge_ref text)
    WHERE CAST(:fence_owner AS text) IS NULL
       OR EXISTS (SELECT 1 FROM review_jobs j
                       WHERE j.id = :job_id AND j.state = 'running'
                         AND j.posting_by = :fence_owner AND j.posting_attempt = :fence_attempt)
    ON CONFLICT (forge, repo, number, fingerprint) DO UPDATE
    SET state = 'open', resolved_at = NULL, line = EXCLUDED.line, last_job_id = :job_id,
        inline = review_findings.inline OR EXCLUDED.inline,
        forge_ref = COALESCE(EXCLUDED.forge_ref, review_findings.forge_ref),
        updated_at = :now
    """
)

# Findings whose code is gone: resolved by the review that noticed (fenced like the upsert).
RESOLVE_FINDINGS = statement(
    """
    UPDATE review_findings
    SET state = 'resolved', resolved_at = :now, updated_at = :now, last_job_id = :job_id
    WHERE forge = :forge AND repo = :repo AND number = :number
      AND fingerprint = ANY(CAST(:fingerprints AS text[])) AND state = 'open'
      AND (CAST(:fence_owner AS text) IS NULL
           OR EXISTS (SELECT 1 FROM review_jobs j
                       WHERE j.id = :job_id AND j.state = 'running'
                         AND j.posting_by = :fence_owner AND j.posting_attempt = :fence_attempt))
    RETURNING fingerprint
    """
)

# The reviews of one pull request that were posted, oldest first (what the summary lists).
SELECT_REVIEWED_HEADS = statement(
    """
    SELECT id, head_sha, finished_at, request->'increment' AS increment
    FROM review_jobs
    WHERE forge = :forge AND repo = :repo AND number = :number AND state = 'done'
    ORDER BY finished_at, id
    """
)

# The pull request's other jobs that ever claimed posting, with the summary comment a posted
# one recorded: where the living summary is, without searching the forge's comments.
SELECT_PRIOR_POSTINGS = statement(
    """
    SELECT id, state, review->>'summary_comment_id' AS summary_comment_id
    FROM review_jobs
    WHERE forge = :forge AND repo = :repo AND number = :number AND id <> :job_id
      AND posting_attempt > 0
    ORDER BY id
    """
)

# The newest posted review of a pull request other than :job_id: the head a next review
# starts from.
SELECT_LAST_REVIEWED = statement(
    """
    SELECT id, head_sha, finished_at, request->'increment' AS increment
    FROM review_jobs
    WHERE forge = :forge AND repo = :repo AND number = :number AND state = 'done'
      AND id <> :job_id
    ORDER BY finished_at DESC, id DESC
    LIMIT 1
    """
)

# An older review of the same pull request that is still underway (started, or finished but
# not yet posted): a newer one plans after it, from the head it reviewed.
SELECT_REVIEW_UNDERWAY = statement(
    """
    SELECT id FROM review_jobs
    WHERE forge = :forge AND repo = :repo AND number = :number AND id < :job_id
      AND state = 'running'
    ORDER BY id
    LIMIT 1
    """
)

# Hand an unplanned job back to the planners, to be planned again from :retry_at (no attempt
# is counted: waiting for another review is no failure).
PLAN_LATER = statement(
    """
    UPDATE review_jobs
    SET retry_at = :retry_at, planning_until = NULL
    WHERE id = :job_id AND NOT planned
    """
)
