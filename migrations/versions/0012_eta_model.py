"""eta_model: what the status publisher estimates with, for every process to estimate alike

Revision ID: 0012_eta_model
Revises: 0011_dispatch_backlog
Create Date: 2026-12-04 18:15:00.000000

One row per estimating process role (today one: the status publisher's), refreshed every pass:
the slots and scheduler knobs of the dry run, the service estimator the dispatcher learnt, and
the factors the ETA learnt of its misses. `/review status` and the dashboard read it and run
the same dry run over the same queue, so they say what the check run says. A new table only.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012_eta_model"
down_revision: str | None = "0011_dispatch_backlog"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "eta_model",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("model", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_eta_model")),
    )


def downgrade() -> None:
    op.drop_table("eta_model")
