"""The SQL of the forge write budget: its limits, claims waiting for room, writes spent."""

from __future__ import annotations

from bot.queue.sql import statement

# One decision at a time per budget, across processes (released at commit).
LOCK_BUDGET = statement(
    "SELECT pg_advisory_xact_lock(hashtextextended('forge_budget:' || :key, 0))"
)

# The budget's row with the limits this process runs with; returns a pause the forge asked for.
UPSERT_BUDGET = statement(
    """
    INSERT INTO forge_budgets (budget_key, forge, per_minute, per_hour, updated_at)
    VALUES (:key, :forge, :per_minute, :per_hour, :now)
    ON CONFLICT (budget_key) DO UPDATE
    SET per_minute = EXCLUDED.per_minute, per_hour = EXCLUDED.per_hour,
        updated_at = EXCLUDED.updated_at
    RETURNING blocked_until
    """
)

# A new claim; a claim replacing one of the same target keeps that one's place in line (a
# deferred one's too: its writer is trying again).
INSERT_CLAIM = statement(
    """
    INSERT INTO forge_write_claims (budget_key, value, level, target, job_id, requested_at,
                                    seen_at)
    VALUES (:key, :value, :level, :target, :job_id,
            LEAST(:now, COALESCE((SELECT min(c.requested_at) FROM forge_write_claims c
                                  WHERE c.budget_key = :key AND c.target = :target
                                    AND c.seen_at > :stale), :now)),
            :now)
    RETURNING id, requested_at
    """
)

# A waiting claim looks again (stays live); no row: it was coalesced away meanwhile.
TOUCH_CLAIM = statement(
    "UPDATE forge_write_claims SET seen_at = :now WHERE id = :id RETURNING requested_at"
)

# The writer of a claim gave up waiting (WriteDeferred): it leaves the line, and lends its place
# to the same target's next claim until it goes stale.
DEFER_CLAIM = statement("UPDATE forge_write_claims SET deferred_at = :now WHERE id = :id")

# A claim that spent, was dropped or gave up leaves the line.
DELETE_CLAIM = statement("DELETE FROM forge_write_claims WHERE id = :id")

# The live claims of a budget (claims of dead processes go stale and are ignored, deferred ones
# wait for no room).
SELECT_CLAIMS = statement(
    """
    SELECT id, value, level, target, requested_at FROM forge_write_claims
    WHERE budget_key = :key AND seen_at > :stale AND deferred_at IS NULL
    """
)

# The writes of the windows (ix_forge_writes_budget_spent).
SELECT_SPENT = statement(
    """
    SELECT spent_at FROM forge_writes
    WHERE budget_key = :key AND spent_at > :since
    ORDER BY spent_at
    """
)

# A write spent from the budget (the windows count these).
RECORD_WRITE = statement(
    """
    INSERT INTO forge_writes (budget_key, spent_at, asked_at, value, level, action, job_id)
    VALUES (:key, :now, :asked_at, :value, :level, :action, :job_id)
    RETURNING id
    """
)

# The forge has answered the write: it counts from `:at` (bot.budget.decide.counted_from) if that
# is later than its decision.
WRITE_ANSWERED = statement(
    "UPDATE forge_writes SET spent_at = GREATEST(spent_at, :at) WHERE id = :id"
)

# Writes older than any window, and claims long dead.
PRUNE_WRITES = statement("DELETE FROM forge_writes WHERE budget_key = :key AND spent_at < :before")
PRUNE_CLAIMS = statement(
    "DELETE FROM forge_write_claims WHERE budget_key = :key AND seen_at < :before"
)

# The forge said to stop (Retry-After): every process pauses this budget until then.
HOLD_BUDGET = statement(
    """
    INSERT INTO forge_budgets (budget_key, forge, per_minute, per_hour, blocked_until, updated_at)
    VALUES (:key, :forge, :per_minute, :per_hour, :until, :now)
    ON CONFLICT (budget_key) DO UPDATE
    SET blocked_until = GREATEST(COALESCE(forge_budgets.blocked_until, EXCLUDED.blocked_until),
                                 EXCLUDED.blocked_until),
        updated_at = EXCLUDED.updated_at
    """
)
