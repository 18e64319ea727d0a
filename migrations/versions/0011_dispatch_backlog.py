"""dispatch backlog: the index behind the query an autoscaler polls

Revision ID: 0011_dispatch_backlog
Revises: 0010_fencing_contract
Create Date: 2026-12-04 17:50:00.000000

KEDA's postgresql scaler sizes the dispatcher Deployment by the work waiting for dispatchers
(bot.queue.sql.monitoring.DISPATCH_BACKLOG): chunks ready or running, counted by an index-only
scan of this partial index on `available_at`, and unplanned jobs (ix_review_jobs_unplanned).
Polled every few seconds by every scaler, it must not read the table's done chunks.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_dispatch_backlog"
down_revision: str | None = "0010_fencing_contract"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_review_chunks_backlog",
        "review_chunks",
        ["available_at"],
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )


def downgrade() -> None:
    op.drop_index("ix_review_chunks_backlog", table_name="review_chunks")
