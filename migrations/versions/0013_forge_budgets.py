"""forge_budgets, forge_writes, forge_write_claims: one write budget per forge identity

Revision ID: 0013_forge_budgets
Revises: 0012_eta_model
Create Date: 2026-12-04 17:40:00.000000

Every process's content-creating forge calls (reviews, summaries, check runs, statuses) spend
from one budget per GitHub installation or token and per GitLab token: the writes of the last
hour are counted in `forge_writes`, writes waiting for room are `forge_write_claims`, and a
pause the forge asked for (Retry-After) is `forge_budgets.blocked_until`. New tables only.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_forge_budgets"
down_revision: str | None = "0012_eta_model"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "forge_budgets",
        sa.Column("budget_key", sa.Text(), nullable=False),
        sa.Column("forge", sa.Text(), nullable=False),
        sa.Column("per_minute", sa.Integer(), nullable=False),
        sa.Column("per_hour", sa.Integer(), nullable=False),
        sa.Column("blocked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("budget_key", name=op.f("pk_forge_budgets")),
    )
    op.create_table(
        "forge_writes",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("budget_key", sa.Text(), nullable=False),
        sa.Column("spent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("value", sa.SmallInteger(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_forge_writes")),
    )
    op.create_index(
        "ix_forge_writes_budget_spent", "forge_writes", ["budget_key", "spent_at"], unique=False
    )
    op.create_table(
        "forge_write_claims",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("budget_key", sa.Text(), nullable=False),
        sa.Column("value", sa.SmallInteger(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_forge_write_claims")),
    )
    op.create_index(
        "ix_forge_write_claims_budget",
        "forge_write_claims",
        ["budget_key", "seen_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_forge_write_claims_budget", table_name="forge_write_claims")
    op.drop_table("forge_write_claims")
    op.drop_index("ix_forge_writes_budget_spent", table_name="forge_writes")
    op.drop_table("forge_writes")
    op.drop_table("forge_budgets")
