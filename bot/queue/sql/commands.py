"""The SQL of the command inbox: command deliveries claimed once, renewed, deferred, marked done,
and what the job history says about commands already run."""

from __future__ import annotations

from bot.queue.sql import statement

# Claim pending command deliveries (and ones whose claimer died) for one worker, in one
# statement; SKIP LOCKED keeps concurrent workers apart. Only deliveries received since
# :since are looked at, so the scan stays on ix_webhook_deliveries_received_at.
CLAIM_PENDING_COMMANDS = statement(
    """
    UPDATE webhook_deliveries d
    SET outcome = 'command_running', claimed_by = :owner, claimed_at = :now,
        claim_attempt = d.claim_attempt + 1
    WHERE d.id IN (
        SELECT id FROM webhook_deliveries
        WHERE received_at >= :since
          AND (outcome IN ('command', 'command_pending')
               OR (outcome = 'command_running' AND claimed_at < :stale_before)
               OR (outcome = 'command_reply_pending' AND retry_at <= :now))
        ORDER BY id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    RETURNING d.id, d.delivery_id, d.forge, d.received_at, d.detail, d.claim_attempt
    """
)

# Finish a delivery this worker holds: its outcome, the job it touched, what each command did.
MARK_COMMAND_DONE = statement(
    """
    UPDATE webhook_deliveries
    SET outcome = :outcome, job_id = COALESCE(:job_id, job_id),
        detail = COALESCE(detail, '{}'::jsonb) || CAST(:result AS jsonb)
    WHERE id = :id AND outcome = 'command_running' AND claimed_by = :owner
      AND claim_attempt = :attempt
    RETURNING id
    """
)

# Keep what a held delivery still has to tell the forge (its outbox), before telling it: a
# worker that dies then leaves the outbox to whoever takes the claim over, not the commands.
SAVE_OUTBOX = statement(
    """
    UPDATE webhook_deliveries
    SET job_id = COALESCE(:job_id, job_id),
        detail = COALESCE(detail, '{}'::jsonb) || CAST(:saved AS jsonb)
    WHERE id = :id AND outcome = 'command_running' AND claimed_by = :owner
      AND claim_attempt = :attempt
    RETURNING id
    """
)

# Hand a held delivery's unsent outbox back until :retry_at (the forge failed meanwhile).
DEFER_OUTBOX = statement(
    """
    UPDATE webhook_deliveries
    SET outcome = 'command_reply_pending', retry_at = :retry_at,
        detail = COALESCE(detail, '{}'::jsonb) || CAST(:deferred AS jsonb)
    WHERE id = :id AND outcome = 'command_running' AND claimed_by = :owner
      AND claim_attempt = :attempt
    RETURNING id
    """
)

# Renew the claims a live worker holds (its heartbeat): a claim is taken over only once its
# holder stopped renewing it for a lease.
RENEW_CLAIMS = statement(
    """
    UPDATE webhook_deliveries
    SET claimed_at = :now
    WHERE id = ANY(CAST(:ids AS bigint[])) AND outcome = 'command_running'
      AND claimed_by = :owner
    """
)

# Whether a claim attempt still holds the delivery: each claim counts an attempt
# (claim_attempt), which fences the attempt before it; checked right before each forge write.
CLAIM_HELD = statement(
    """
    SELECT 1 FROM webhook_deliveries
    WHERE id = :id AND outcome = 'command_running' AND claimed_by = :owner
      AND claim_attempt = :attempt
    """
)

# Accepted raises by one user of one forge since midnight UTC (the per-day quota).
COUNT_RAISES_TODAY = statement(
    """
    SELECT count(*) FROM job_history
    WHERE kind = 'command' AND actor = :actor AND at >= :since AND at <= :now
      AND to_value = 'accepted' AND detail->>'raise' = 'true' AND detail->>'forge' = :forge
    """
)

# Which commands of a delivery already ran (a claim taken over after a crash skips them).
SELECT_EXECUTED_COMMANDS = statement(
    """
    SELECT CAST(detail->>'index' AS int) AS command_index FROM job_history
    WHERE kind = 'command' AND at >= :since AND detail->>'delivery_id' = :delivery_id
    """
)
