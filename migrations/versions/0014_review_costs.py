"""review_costs: what finished reviews cost, per group, for the learned cost estimate

Revision ID: 0014_review_costs
Revises: 0013_forge_budgets
Create Date: 2026-12-06 10:00:00.000000

One row per group of reviews (all, a language, a repository, a pull request): sums over its
finished reviews of changed lines, files, chunks, engine seconds, tokens and how much costlier
than the scheduler's line they were (bot.sched.cost). Every dispatcher adds the review it
finished and reads the others'. A new table only.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_review_costs"
down_revision: str | None = "0013_forge_budgets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SUMS = (
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


def upgrade() -> None:
    op.create_table(
        "review_costs",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        *(sa.Column(name, sa.Float(), server_default="0", nullable=False) for name in SUMS),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "scope IN ('all', 'language', 'repo', 'pull')", name=op.f("ck_review_costs_scope")
        ),
        sa.PrimaryKeyConstraint("scope", "name", name=op.f("pk_review_costs")),
    )
    op.create_index("ix_review_costs_updated_at", "review_costs", ["updated_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_review_costs_updated_at", table_name="review_costs")
    op.drop_table("review_costs")
