"""status_reports: the status last written on the forge per job

Revision ID: 0004_status_reports
Revises: 0003_review_findings
Create Date: 2026-12-03 17:30:00.000000

One row per job whose check run (GitHub App), commit status (GitHub token, GitLab) was
written: what it said, when, and the check run's id for later updates. `first_finish_at` keeps
the ETA given when the job was first shown, to measure it against the real finish.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_status_reports"
down_revision: str | None = "0003_review_findings"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "status_reports",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("forge", sa.Text(), nullable=False),
        sa.Column("repo", sa.Text(), nullable=False),
        sa.Column("head_sha", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("place", sa.Integer(), nullable=True),
        sa.Column("finish_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("first_finish_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("parts_done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("parts_total", sa.Integer(), server_default="0", nullable=False),
        sa.Column("conclusion", sa.Text(), nullable=True),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("writes", sa.Integer(), server_default="1", nullable=False),
        sa.CheckConstraint(
            "state IN ('queued', 'in_progress', 'completed')",
            name=op.f("ck_status_reports_state"),
        ),
        sa.CheckConstraint(
            "kind IN ('check_run', 'commit_status')", name=op.f("ck_status_reports_kind")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["review_jobs.id"],
            name=op.f("fk_status_reports_job_id_review_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_status_reports")),
    )
    op.create_index(
        "ix_status_reports_open",
        "status_reports",
        ["job_id"],
        unique=False,
        postgresql_where=sa.text("state <> 'completed'"),
    )


def downgrade() -> None:
    op.drop_index("ix_status_reports_open", table_name="status_reports")
    op.drop_table("status_reports")
