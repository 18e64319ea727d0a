"""review findings: what reviews said on each pull request

Revision ID: 0003_review_findings
Revises: 0002
Create Date: 2026-12-03 16:50:00.000000

One row per finding fingerprint and pull request, so a later review never says the same thing
again while its code is there, and knows which findings were resolved. A new table only: older
workers that do not know it keep working (expand step).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_review_findings"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "review_findings",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("forge", sa.Text(), nullable=False),
        sa.Column("repo", sa.Text(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("side", sa.Text(), nullable=False),
        sa.Column("severity", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("anchor_text", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("inline", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("forge_ref", sa.Text(), nullable=True),
        sa.Column("first_job_id", sa.BigInteger(), nullable=False),
        sa.Column("last_job_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('open', 'resolved')", name=op.f("ck_review_findings_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_findings")),
        sa.UniqueConstraint(
            "forge",
            "repo",
            "number",
            "fingerprint",
            name=op.f("uq_review_findings_forge_repo_number_fingerprint"),
        ),
    )


def downgrade() -> None:
    op.drop_table("review_findings")
