"""The SQL of monitoring: queue gauges, wait alerts, dispatcher presence, the dashboard, budgets."""

from __future__ import annotations

from bot.queue.sql import statement

# Live jobs per level: not yet started (and ready), blocked on dependencies, running; and since
# when the oldest ready job has waited for its first chunk.
SELECT_QUEUE_JOBS = statement(
    """
    SELECT level,
           count(*) FILTER (WHERE state = 'queued' AND first_started_at IS NULL) AS waiting,
           count(*) FILTER (WHERE state = 'waiting') AS blocked,
           count(*) FILTER (WHERE state = 'running' OR first_started_at IS NOT NULL) AS running,
           min(COALESCE(ready_at, enqueued_at))
               FILTER (WHERE state = 'queued' AND first_started_at IS NULL) AS oldest_ready_at
    FROM review_jobs
    WHERE state IN ('waiting', 'queued', 'running')
    GROUP BY level
    """
)

# Work waiting for a dispatcher process: chunks ready now or running (ix_review_chunks_backlog,
# an index-only scan) and jobs not planned into chunks yet (ix_review_jobs_unplanned), which
# only a dispatcher plans, so a backlog shows even with no dispatcher running. KEDA's
# postgresql scaler polls it to size the dispatcher Deployment; the manifest carries a copy
# (deploy/k8s/base/dispatcher-autoscaling.yaml) that tests/system/test_kubernetes.py holds equal.
DISPATCH_BACKLOG = (
    "SELECT (SELECT count(*) FROM review_chunks"
    " WHERE state IN ('queued', 'running') AND available_at <= now())"
    " + (SELECT count(*) FROM review_jobs WHERE NOT planned AND state = 'queued')"
)

# Chunks per level that can be taken now, and that are running (uses ix_review_chunks_load).
SELECT_QUEUE_CHUNKS = statement(
    """
    SELECT level,
           count(*) FILTER (WHERE state = 'queued' AND available_at <= :now) AS ready,
           count(*) FILTER (WHERE state = 'running') AS running
    FROM review_chunks
    WHERE state IN ('queued', 'running')
    GROUP BY level
    """
)

# Ready jobs that have not started and have not been alerted, ready since before `cutoff`.
SELECT_ALERT_CANDIDATES = statement(
    """
    SELECT j.id, j.forge, j.repo, j.number, j.level, j.ready_at
    FROM review_jobs j
    WHERE j.state = 'queued' AND j.first_started_at IS NULL
      AND j.ready_at IS NOT NULL AND j.ready_at <= :cutoff
      AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.job_id = j.id)
    ORDER BY j.ready_at
    LIMIT :limit
    """
)

# Record an alert once per job across every process; no row back means another got there first.
INSERT_ALERT = statement(
    """
    INSERT INTO alerts (job_id, level, waited_s, threshold_s, fired_at, message)
    VALUES (:job_id, :level, :waited_s, :threshold_s, :fired_at, :message)
    ON CONFLICT (job_id) DO NOTHING
    RETURNING job_id
    """
)

# The newest alerts, for the dashboard.
SELECT_RECENT_ALERTS = statement(
    """
    SELECT fired_at, job_id, forge, repo, number, level, waited_s, threshold_s, message, state
    FROM report_alerts
    ORDER BY fired_at DESC
    LIMIT :limit
    """
)

# Waits of jobs that started in a window, for the dashboard's charts.
SELECT_STARTED_WAITS = statement(
    """
    SELECT level, first_started_at, wait_s
    FROM report_waits
    WHERE wait_s IS NOT NULL AND first_started_at >= :since AND first_started_at <= :until
    ORDER BY first_started_at
    """
)


# Work per engine (LLM server) finished in a window: the engine seconds its chunks were
# charged (their shares of each batch add up to the time the engine was busy) and tokens.
SELECT_ENGINE_WORK = statement(
    """
    SELECT engine, count(*) AS chunks, COALESCE(sum(gpu_seconds), 0) AS busy_s,
           sum(COALESCE((result -> 'usage' ->> 'completion_tokens')::bigint, 0)) AS tokens
    FROM review_chunks
    WHERE state = 'done' AND engine IS NOT NULL
      AND finished_at >= :since AND finished_at <= :until
    GROUP BY engine
    ORDER BY engine
    """
)


# A dispatcher's heartbeat: its row, created on the first beat, refreshed on every other.
UPSERT_DISPATCHER = statement(
    """
    INSERT INTO dispatchers (name, host, pid, started_at, last_seen, stopped_at, slots, running,
                             engines)
    VALUES (:name, :host, :pid, :started_at, :now, NULL, :slots, :running,
            CAST(:engines AS jsonb))
    ON CONFLICT (name) DO UPDATE
    SET last_seen = EXCLUDED.last_seen, stopped_at = NULL, slots = EXCLUDED.slots,
        running = EXCLUDED.running, engines = EXCLUDED.engines
    RETURNING name
    """
)

# A dispatcher that stops cleanly says so, rather than going stale.
MARK_DISPATCHER_STOPPED = statement(
    """
    UPDATE dispatchers SET stopped_at = :now, last_seen = :now, running = 0
    WHERE name = :name RETURNING name
    """
)

# Rows of processes long gone (each restart is a new name).
PRUNE_DISPATCHERS = statement("DELETE FROM dispatchers WHERE last_seen < :before RETURNING name")

# Dispatchers heard from since `since`, alive or not (the caller judges which are alive).
SELECT_DISPATCHERS = statement(
    """
    SELECT name, host, pid, started_at, last_seen, stopped_at, slots, running, engines
    FROM dispatchers WHERE last_seen >= :since ORDER BY name
    """
)

# Open an operational alert once per outage across every process; no row: already open.
OPEN_OPERATIONAL_ALERT = statement(
    """
    INSERT INTO operational_alerts (kind, fired_at, message) VALUES (:kind, :now, :message)
    ON CONFLICT (kind) WHERE resolved_at IS NULL DO NOTHING
    RETURNING id
    """
)

# The outage is over: close its alert (a row back means this process saw the recovery first).
RESOLVE_OPERATIONAL_ALERT = statement(
    """
    UPDATE operational_alerts SET resolved_at = :now
    WHERE kind = :kind AND resolved_at IS NULL
    RETURNING id
    """
)


# Each forge identity's write budget: its limits, writes spent in the last minute and hour,
# writes waiting for room, and a pause the forge asked for (ix_forge_writes_budget_spent).
SELECT_FORGE_BUDGETS = statement(
    """
    SELECT b.budget_key, b.per_minute, b.per_hour, b.blocked_until,
           count(w.id) FILTER (
               WHERE w.spent_at > CAST(:now AS timestamptz) - interval '1 minute'
           ) AS minute_used,
           count(w.id) AS hour_used,
           (SELECT count(*) FROM forge_write_claims c
            WHERE c.budget_key = b.budget_key
              AND c.seen_at > CAST(:now AS timestamptz) - interval '1 minute'
              AND c.deferred_at IS NULL) AS waiting
    FROM forge_budgets b
    LEFT JOIN forge_writes w
      ON w.budget_key = b.budget_key AND w.spent_at > CAST(:now AS timestamptz) - interval '1 hour'
         AND w.spent_at <= CAST(:now AS timestamptz)
    GROUP BY b.budget_key
    """
)

# Wait alerts raised so far (the demo's summary).
COUNT_ALERTS = statement("SELECT count(*) FROM alerts")

# Every operational alert's message, oldest first (the demo's summary).
SELECT_OPERATIONAL_ALERT_MESSAGES = statement(
    "SELECT message FROM operational_alerts ORDER BY fired_at"
)
