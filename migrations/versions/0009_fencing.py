"""fencing: lease owners, expiries and attempt numbers in typed columns (expand)

Revision ID: 0009_fencing
Revises: 0008_status_outbox
Create Date: 2026-12-04 17:45:00.000000

Every lease carries an attempt number that grows on each takeover, and every write that
follows from a lease checks it (a fencing token). Planning and posting claims move from the
job's `request` jsonb into typed columns, copied from the jsonb for rows in flight; chunks get
their own attempt number (their `attempts` count failures and goes down on a release, so it
cannot fence); process-wide leases (the status publisher) get a table. The jsonb keys are left
in place for workers still running the older code; 0010 removes them (contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_fencing"
down_revision: str | None = "0008_status_outbox"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "review_chunks",
        sa.Column("lease_attempt", sa.Integer(), server_default="0", nullable=False),
    )
    for kind in ("planning", "posting"):
        op.add_column("review_jobs", sa.Column(f"{kind}_by", sa.Text(), nullable=True))
        op.add_column(
            "review_jobs",
            sa.Column(f"{kind}_until", sa.DateTime(timezone=True), nullable=True),
        )
        op.add_column(
            "review_jobs",
            sa.Column(f"{kind}_attempt", sa.Integer(), server_default="0", nullable=False),
        )
    # Claims in flight keep their holder and expiry; a held claim is its first attempt.
    op.execute(
        """
        UPDATE review_jobs
        SET planning_by = request->>'planning_by',
            planning_until = CAST(request->>'planning_until' AS timestamptz),
            planning_attempt = CASE WHEN request ? 'planning_by' THEN 1 ELSE 0 END,
            posting_by = request->>'posting_by',
            posting_until = CAST(request->>'posting_until' AS timestamptz),
            posting_attempt = CASE WHEN request ? 'posting_by' THEN 1 ELSE 0 END
        WHERE request ?| ARRAY['planning_by', 'planning_until', 'posting_by', 'posting_until']
        """
    )
    op.execute("UPDATE review_chunks SET lease_attempt = attempts WHERE attempts > 0")
    op.create_table(
        "process_leases",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="1", nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_process_leases")),
    )


def downgrade() -> None:
    op.drop_table("process_leases")
    # Claims in flight go back into the jsonb the older code reads.
    op.execute(
        """
        UPDATE review_jobs
        SET request = request
            || CASE WHEN planning_by IS NULL THEN '{}'::jsonb ELSE jsonb_build_object(
                   'planning_by', planning_by, 'planning_until', planning_until::text) END
            || CASE WHEN posting_by IS NULL THEN '{}'::jsonb ELSE jsonb_build_object(
                   'posting_by', posting_by, 'posting_until', posting_until::text) END
        WHERE planning_by IS NOT NULL OR posting_by IS NOT NULL
        """
    )
    for kind in ("posting", "planning"):
        op.drop_column("review_jobs", f"{kind}_attempt")
        op.drop_column("review_jobs", f"{kind}_until")
        op.drop_column("review_jobs", f"{kind}_by")
    op.drop_column("review_chunks", "lease_attempt")
