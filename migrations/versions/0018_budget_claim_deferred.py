"""forge_write_claims.deferred_at: a claim whose writer gave up waiting no longer holds the line

Revision ID: 0018_budget_claim_deferred
Revises: 0017_status_wake_after_insert
Create Date: 2026-12-08 02:20:00.000000

A write that waits past its own bound (a status the publisher will write at its next pass)
raises WriteDeferred. Its claim stayed in line until it went stale, so that the retry would
keep its place; but the line scheduled it first at every look without it ever spending, and
each claim behind it waited a slot more. A deferred claim is now marked: it is left out of the
line and only lends its place to the next claim for the same target. Processes still running
the older code leave no mark, and their deferred claims hold the line until stale, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_budget_claim_deferred"
down_revision: str | None = "0017_status_wake_after_insert"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "forge_write_claims", sa.Column("deferred_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("forge_write_claims", "deferred_at")
