"""queue schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-02 13:04:26.893049
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "review_jobs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("forge", sa.Text(), nullable=False),
        sa.Column("repo", sa.Text(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.BigInteger(), nullable=True),
        sa.Column("installation_id", sa.BigInteger(), nullable=True),
        sa.Column("title", sa.Text(), server_default="", nullable=False),
        sa.Column("author", sa.Text(), server_default="", nullable=False),
        sa.Column("author_is_bot", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("base_ref", sa.Text(), server_default="", nullable=False),
        sa.Column("head_ref", sa.Text(), server_default="", nullable=False),
        sa.Column("base_sha", sa.Text(), server_default="", nullable=False),
        sa.Column("head_sha", sa.Text(), nullable=False),
        sa.Column("files_changed", sa.Integer(), nullable=True),
        sa.Column("additions", sa.Integer(), nullable=True),
        sa.Column("deletions", sa.Integer(), nullable=True),
        sa.Column("total_lines", sa.Integer(), server_default="0", nullable=False),
        sa.Column("base_level", sa.SmallInteger(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("level_gpu_seconds", sa.Float(), server_default="0", nullable=False),
        sa.Column(
            "reasons",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("dedupe_key", sa.Text(), nullable=False),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_progress_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "depends_on",
            postgresql.ARRAY(sa.BigInteger()),
            server_default=sa.text("'{}'::bigint[]"),
            nullable=False,
        ),
        sa.Column("planned", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("chunks_total", sa.Integer(), server_default="0", nullable=False),
        sa.Column("chunks_done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("gpu_seconds", sa.Float(), server_default="0", nullable=False),
        sa.Column(
            "request",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("review", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("superseded_by", sa.BigInteger(), nullable=True),
        sa.CheckConstraint(
            "state IN ('waiting', 'queued', 'running', 'done', 'failed', 'dead',"
            " 'superseded', 'cancelled')",
            name=op.f("ck_review_jobs_state"),
        ),
        sa.CheckConstraint(
            "base_level BETWEEN 0 AND 3 AND level BETWEEN 0 AND 3",
            name=op.f("ck_review_jobs_level"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_jobs")),
        sa.UniqueConstraint("dedupe_key", name=op.f("uq_review_jobs_dedupe_key")),
    )
    op.create_index("ix_review_jobs_enqueued_at", "review_jobs", ["enqueued_at"], unique=False)
    op.create_index(
        "ix_review_jobs_live_pull",
        "review_jobs",
        ["forge", "repo", "number"],
        unique=False,
        postgresql_where=sa.text("state IN ('waiting', 'queued', 'running')"),
    )
    op.create_index(
        "ix_review_jobs_unplanned",
        "review_jobs",
        ["enqueued_at"],
        unique=False,
        postgresql_where=sa.text("NOT planned AND state IN ('queued', 'waiting')"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.Text(), nullable=False),
        sa.Column("forge", sa.Text(), nullable=False),
        sa.Column("event", sa.Text(), server_default="", nullable=False),
        sa.Column("action", sa.Text(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("delivery_id", name=op.f("uq_webhook_deliveries_delivery_id")),
    )
    op.create_index(
        "ix_webhook_deliveries_received_at", "webhook_deliveries", ["received_at"], unique=False
    )
    op.create_table(
        "job_history",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("from_value", sa.Text(), nullable=True),
        sa.Column("to_value", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("actor", sa.Text(), server_default="system", nullable=False),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.CheckConstraint(
            "kind IN ('state', 'level', 'command')", name=op.f("ck_job_history_kind")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["review_jobs.id"],
            name=op.f("fk_job_history_job_id_review_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_history")),
    )
    op.create_index("ix_job_history_at", "job_history", ["at"], unique=False)
    op.create_index("ix_job_history_job_id", "job_history", ["job_id", "id"], unique=False)
    op.create_table(
        "review_chunks",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("rank", sa.Float(), server_default="0", nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column(
            "files",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("lines", sa.Integer(), server_default="0", nullable=False),
        sa.Column("available_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.CheckConstraint(
            "state IN ('blocked', 'queued', 'running', 'done', 'dead', 'cancelled')",
            name=op.f("ck_review_chunks_state"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["review_jobs.id"],
            name=op.f("fk_review_chunks_job_id_review_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_chunks")),
        sa.UniqueConstraint("job_id", "seq", name=op.f("uq_review_chunks_job_id_seq")),
    )
    op.create_index(
        "ix_review_chunks_dequeue",
        "review_chunks",
        ["level", "rank", "id"],
        unique=False,
        postgresql_where=sa.text("state = 'queued'"),
    )
    op.create_index(
        "ix_review_chunks_lease",
        "review_chunks",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_index(
        "ix_review_chunks_load",
        "review_chunks",
        ["level", "state"],
        unique=False,
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )
    # Chunks churn: every one is inserted, updated two or three times and finished within
    # minutes, so vacuum early instead of at the default 20% of dead rows.
    # Jobs are updated once per chunk; leave room on the page so those updates stay HOT
    # (no indexed column changes), which is also why last_progress_at has no index.
    op.execute("ALTER TABLE review_jobs SET (fillfactor = 80)")
    op.execute(
        "ALTER TABLE review_chunks SET (autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_analyze_scale_factor = 0.02, fillfactor = 80)"
    )


def downgrade() -> None:
    op.drop_index(
        "ix_review_chunks_load",
        table_name="review_chunks",
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )
    op.drop_index(
        "ix_review_chunks_lease",
        table_name="review_chunks",
        postgresql_where=sa.text("state = 'running'"),
    )
    op.drop_index(
        "ix_review_chunks_dequeue",
        table_name="review_chunks",
        postgresql_where=sa.text("state = 'queued'"),
    )
    op.drop_table("review_chunks")
    op.drop_index("ix_job_history_job_id", table_name="job_history")
    op.drop_index("ix_job_history_at", table_name="job_history")
    op.drop_table("job_history")
    op.drop_index("ix_webhook_deliveries_received_at", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index(
        "ix_review_jobs_unplanned",
        table_name="review_jobs",
        postgresql_where=sa.text("NOT planned AND state IN ('queued', 'waiting')"),
    )
    op.drop_index(
        "ix_review_jobs_live_pull",
        table_name="review_jobs",
        postgresql_where=sa.text("state IN ('waiting', 'queued', 'running')"),
    )
    op.drop_index("ix_review_jobs_enqueued_at", table_name="review_jobs")
    op.drop_table("review_jobs")
