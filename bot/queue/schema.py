"""Table definitions: the queue's one source of truth (Alembic migrations create the same)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from bot.model import ChunkState, JobState

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def _in_list(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


JOB_STATES = [state.value for state in JobState]
CHUNK_STATES = [state.value for state in ChunkState]
LIVE_JOB_STATES = ["waiting", "queued", "running"]

review_jobs = Table(
    "review_jobs",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("forge", Text, nullable=False),
    Column("repo", Text, nullable=False),
    Column("number", Integer, nullable=False),
    Column("project_id", BigInteger),
    Column("installation_id", BigInteger),
    Column("title", Text, nullable=False, server_default=""),
    Column("author", Text, nullable=False, server_default=""),
    Column("author_is_bot", Boolean, nullable=False, server_default=text("false")),
    Column("base_ref", Text, nullable=False, server_default=""),
    Column("head_ref", Text, nullable=False, server_default=""),
    Column("base_sha", Text, nullable=False, server_default=""),
    Column("head_sha", Text, nullable=False),
    Column("files_changed", Integer),
    Column("additions", Integer),
    Column("deletions", Integer),
    Column("total_lines", Integer, nullable=False, server_default="0"),
    Column("base_level", SmallInteger, nullable=False),
    Column("level", SmallInteger, nullable=False),
    Column("level_gpu_seconds", Float, nullable=False, server_default="0"),
    Column("reasons", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("state", Text, nullable=False),
    Column("dedupe_key", Text, nullable=False),
    Column("enqueued_at", DateTime(timezone=True), nullable=False),
    Column("ready_at", DateTime(timezone=True)),
    Column("last_progress_at", DateTime(timezone=True), nullable=False),
    Column("first_started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    Column(
        "depends_on",
        ARRAY(BigInteger),
        nullable=False,
        server_default=text("'{}'::bigint[]"),
    ),
    Column("planned", Boolean, nullable=False, server_default=text("false")),
    Column("chunks_total", Integer, nullable=False, server_default="0"),
    Column("chunks_done", Integer, nullable=False, server_default="0"),
    Column("gpu_seconds", Float, nullable=False, server_default="0"),
    Column("request", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("review", JSONB),
    Column("superseded_by", BigInteger),
    # Planning and posting claims (leases): holder, expiry, and the attempt number that grows
    # on each takeover; a write that follows from a claim checks holder and attempt (fencing).
    Column("planning_by", Text),
    Column("planning_until", DateTime(timezone=True)),
    Column("planning_attempt", Integer, nullable=False, server_default="0"),
    Column("posting_by", Text),
    Column("posting_until", DateTime(timezone=True)),
    Column("posting_attempt", Integer, nullable=False, server_default="0"),
    # After a failed planning or posting try: when the next may start, and how many failed.
    Column("retry_at", DateTime(timezone=True)),
    Column("planning_failures", Integer, nullable=False, server_default="0"),
    Column("posting_failures", Integer, nullable=False, server_default="0"),
    CheckConstraint(_in_list("state", JOB_STATES), name="state"),
    CheckConstraint("base_level BETWEEN 0 AND 3 AND level BETWEEN 0 AND 3", name="level"),
    UniqueConstraint("dedupe_key"),
    Index(
        "ix_review_jobs_live_pull",
        "forge",
        "repo",
        "number",
        postgresql_where=text(_in_list("state", LIVE_JOB_STATES)),
    ),
    Index(
        "ix_review_jobs_unplanned",
        "enqueued_at",
        postgresql_where=text("NOT planned AND state IN ('queued', 'waiting')"),
    ),
    Index("ix_review_jobs_enqueued_at", "enqueued_at"),
)

review_chunks = Table(
    "review_chunks",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column(
        "job_id",
        BigInteger,
        ForeignKey("review_jobs.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("seq", Integer, nullable=False),
    Column("level", SmallInteger, nullable=False),
    Column("rank", Float, nullable=False, server_default="0"),
    Column("state", Text, nullable=False),
    Column("files", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("lines", Integer, nullable=False, server_default="0"),
    Column("available_at", DateTime(timezone=True), nullable=False),
    Column("lease_owner", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("gpu_seconds", Float),
    Column("result", JSONB),
    # The engine (LLM server) the chunk's lease runs it on: windows are counted per engine.
    Column("engine", Text),
    # Grows on every lease and never goes back (unlike `attempts`, which a release returns):
    # the fencing token a finishing worker must still hold.
    Column("lease_attempt", Integer, nullable=False, server_default="0"),
    CheckConstraint(_in_list("state", CHUNK_STATES), name="state"),
    UniqueConstraint("job_id", "seq"),
    # Matches the dequeue's ORDER BY within one level, and only covers what can be taken.
    Index(
        "ix_review_chunks_dequeue",
        "level",
        "rank",
        "id",
        postgresql_where=text("state = 'queued'"),
    ),
    Index(
        "ix_review_chunks_lease",
        "lease_expires_at",
        postgresql_where=text("state = 'running'"),
    ),
    Index(
        "ix_review_chunks_engine",
        "engine",
        postgresql_where=text("state = 'running'"),
    ),
    Index(
        "ix_review_chunks_load",
        "level",
        "state",
        postgresql_where=text("state IN ('queued', 'running')"),
    ),
    # The dispatch backlog an autoscaler polls (bot.queue.sql.monitoring.DISPATCH_BACKLOG).
    Index(
        "ix_review_chunks_backlog",
        "available_at",
        postgresql_where=text("state IN ('queued', 'running')"),
    ),
)

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("delivery_id", Text, nullable=False),
    Column("forge", Text, nullable=False),
    Column("event", Text, nullable=False, server_default=""),
    Column("action", Text),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("outcome", Text, nullable=False),
    Column("detail", JSONB),
    Column("job_id", BigInteger),
    # A command delivery's claim (the worker holding it, renewed at, the attempt that fences
    # it) and when its deferred reply is tried again.
    Column("claimed_by", Text),
    Column("claimed_at", DateTime(timezone=True)),
    Column("claim_attempt", Integer, nullable=False, server_default="0"),
    Column("retry_at", DateTime(timezone=True)),
    UniqueConstraint("delivery_id"),
    Index("ix_webhook_deliveries_received_at", "received_at"),
)

job_history = Table(
    "job_history",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column(
        "job_id",
        BigInteger,
        ForeignKey("review_jobs.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("kind", Text, nullable=False),
    Column("from_value", Text),
    Column("to_value", Text),
    Column("reason", Text, nullable=False, server_default=""),
    Column("actor", Text, nullable=False, server_default="system"),
    Column("detail", JSONB),
    CheckConstraint("kind IN ('state', 'level', 'command')", name="kind"),
    Index("ix_job_history_job_id", "job_id", "id"),
    Index("ix_job_history_at", "at"),
)

# Created by migration 0002 (with the report views, which metadata does not track).
alerts = Table(
    "alerts",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column(
        "job_id",
        BigInteger,
        ForeignKey("review_jobs.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("level", SmallInteger, nullable=False),
    Column("waited_s", Float, nullable=False),
    Column("threshold_s", Float, nullable=False),
    Column("fired_at", DateTime(timezone=True), nullable=False),
    Column("message", Text, nullable=False),
    UniqueConstraint("job_id"),
    Index("ix_alerts_fired_at", "fired_at"),
)

# Created by migration 0003: what reviews said on each pull request, so nothing is said twice.
FINDING_STATES = ["open", "resolved"]
review_findings = Table(
    "review_findings",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("forge", Text, nullable=False),
    Column("repo", Text, nullable=False),
    Column("number", Integer, nullable=False),
    Column("fingerprint", Text, nullable=False),
    Column("path", Text, nullable=False),
    Column("line", Integer, nullable=False),
    Column("side", Text, nullable=False),
    Column("severity", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("anchor_text", Text),
    Column("state", Text, nullable=False),
    Column("inline", Boolean, nullable=False, server_default=text("true")),
    Column("forge_ref", Text),
    Column("first_job_id", BigInteger, nullable=False),
    Column("last_job_id", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("resolved_at", DateTime(timezone=True)),
    CheckConstraint(_in_list("state", FINDING_STATES), name="state"),
    UniqueConstraint("forge", "repo", "number", "fingerprint"),
)

# Created by migration 0004: the status last written on the forge for each job (check run or
# commit status), so a restarted bot neither repeats nor forgets one.
status_reports = Table(
    "status_reports",
    metadata,
    Column(
        "job_id",
        BigInteger,
        ForeignKey("review_jobs.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("forge", Text, nullable=False),
    Column("repo", Text, nullable=False),
    Column("head_sha", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("external_id", Text),
    Column("state", Text, nullable=False),
    Column("level", SmallInteger, nullable=False),
    Column("place", Integer),
    Column("finish_at", DateTime(timezone=True)),
    Column("first_finish_at", DateTime(timezone=True)),
    Column("parts_done", Integer, nullable=False, server_default="0"),
    Column("parts_total", Integer, nullable=False, server_default="0"),
    Column("conclusion", Text),
    Column("published_at", DateTime(timezone=True), nullable=False),
    Column("writes", Integer, nullable=False, server_default="1"),
    CheckConstraint("state IN ('queued', 'in_progress', 'completed')", name="state"),
    CheckConstraint("kind IN ('check_run', 'commit_status')", name="kind"),
    Index("ix_status_reports_open", "job_id", postgresql_where=text("state <> 'completed'")),
)

# Created by migration 0008: a job whose final status is still owed to the forge (written by a
# trigger on review_jobs in the transaction that ends it), or whose status a Re-run asked for.
status_outbox = Table(
    "status_outbox",
    metadata,
    Column(
        "job_id",
        BigInteger,
        ForeignKey("review_jobs.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("republish", Boolean, nullable=False, server_default=text("false")),
)

# Created by migration 0012: what the status publisher estimates with (slots, scheduler knobs,
# service estimator, learnt ETA factors), so every process's ETA is the check run's.
eta_model = Table(
    "eta_model",
    metadata,
    Column("name", Text, primary_key=True),
    Column("model", JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Created by migration 0007: one row per dispatcher process, refreshed every heartbeat.
dispatchers = Table(
    "dispatchers",
    metadata,
    Column("name", Text, primary_key=True),
    Column("host", Text, nullable=False, server_default=""),
    Column("pid", Integer, nullable=False, server_default="0"),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("last_seen", DateTime(timezone=True), nullable=False),
    Column("stopped_at", DateTime(timezone=True)),
    Column("slots", Integer, nullable=False, server_default="0"),
    Column("running", Integer, nullable=False, server_default="0"),
    # [{"name": base URL or engine name, "alive": in rotation}, ...]
    Column("engines", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Index("ix_dispatchers_last_seen", "last_seen"),
)

# Created by migration 0007: alerts about the service itself, at most one open per kind.
operational_alerts = Table(
    "operational_alerts",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("kind", Text, nullable=False),
    Column("fired_at", DateTime(timezone=True), nullable=False),
    Column("resolved_at", DateTime(timezone=True)),
    Column("message", Text, nullable=False),
    Index(
        "ix_operational_alerts_open",
        "kind",
        unique=True,
        postgresql_where=text("resolved_at IS NULL"),
    ),
)

# Created by migration 0009: leases held by one process at a time for the whole service (the
# status publisher); `attempt` grows on each takeover and fences the holder's writes.
process_leases = Table(
    "process_leases",
    metadata,
    Column("name", Text, primary_key=True),
    Column("owner", Text, nullable=False),
    Column("attempt", Integer, nullable=False, server_default="1"),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

# Created by migration 0013: one row per forge identity whose writes are budgeted (a GitHub
# installation or token, a GitLab token), with its limits and a pause a forge asked for.
forge_budgets = Table(
    "forge_budgets",
    metadata,
    Column("budget_key", Text, primary_key=True),
    Column("forge", Text, nullable=False),
    Column("per_minute", Integer, nullable=False),
    Column("per_hour", Integer, nullable=False),
    Column("blocked_until", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Created by migration 0013: the content-creating writes of the last hours, per budget (the
# sliding windows are counted from these).
forge_writes = Table(
    "forge_writes",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("budget_key", Text, nullable=False),
    Column("spent_at", DateTime(timezone=True), nullable=False),
    # When the write asked for the budget: spent_at - asked_at is the wait the budget caused.
    Column("asked_at", DateTime(timezone=True), nullable=False),
    Column("value", SmallInteger, nullable=False),
    Column("level", SmallInteger, nullable=False),
    Column("action", Text, nullable=False),
    Column("job_id", BigInteger),
    Index("ix_forge_writes_budget_spent", "budget_key", "spent_at"),
)

# Created by migration 0013: writes waiting for their budget, by any process; a claim not
# looked at for a while is ignored (its process died). Migration 0018: a claim whose writer
# gave up waiting (deferred_at) is out of the line and only lends its place to the next claim
# for its target.
forge_write_claims = Table(
    "forge_write_claims",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("budget_key", Text, nullable=False),
    Column("value", SmallInteger, nullable=False),
    Column("level", SmallInteger, nullable=False),
    Column("target", Text),
    Column("job_id", BigInteger),
    Column("requested_at", DateTime(timezone=True), nullable=False),
    Column("seen_at", DateTime(timezone=True), nullable=False),
    Column("deferred_at", DateTime(timezone=True)),
    Index("ix_forge_write_claims_budget", "budget_key", "seen_at"),
)

# Created by migration 0014: sums over finished reviews per group (all, a language, a
# repository, a pull request), which the learned cost estimate (bot.sched.cost) predicts from.
REVIEW_COST_SUMS = (
    "reviews",
    "lines",
    "files",
    "chunks",
    "engine_s",
    "prompt_tokens",
    "completion_tokens",
    "log_factor",
    "prompt_per_line",
    "completion_per_line",
)
review_costs = Table(
    "review_costs",
    metadata,
    Column("scope", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    *(Column(name, Float, nullable=False, server_default="0") for name in REVIEW_COST_SUMS),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("scope IN ('all', 'language', 'repo', 'pull')", name="scope"),
    Index("ix_review_costs_updated_at", "updated_at"),
)
