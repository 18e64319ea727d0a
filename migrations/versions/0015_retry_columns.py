"""retry and claim state in typed columns: jobs' retry time and failed tries, command claims
(expand)

Revision ID: 0015_retry_columns
Revises: 0014_review_costs
Create Date: 2026-12-04 21:00:00.000000

The last lease and retry state kept in jsonb moves into columns, copied for rows in flight:
a job's next planning or posting try (`request->>'retry_at'`) and its failed tries
(`request->>'planning_attempts'`, `'posting_attempts'`); a command delivery's claim (`detail`'s
`claimed_by`, `claimed_at`, `attempts`) and the time its deferred reply is tried again
(`detail->>'retry_at'`). The jsonb keys stay for workers still running the older code; 0016
removes them (contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_retry_columns"
down_revision: str | None = "0014_review_costs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("review_jobs", sa.Column("retry_at", sa.DateTime(timezone=True)))
    for kind in ("planning", "posting"):
        op.add_column(
            "review_jobs",
            sa.Column(f"{kind}_failures", sa.Integer(), server_default="0", nullable=False),
        )
    op.execute(
        """
        UPDATE review_jobs
        SET retry_at = CAST(request->>'retry_at' AS timestamptz),
            planning_failures = COALESCE(CAST(request->>'planning_attempts' AS integer), 0),
            posting_failures = COALESCE(CAST(request->>'posting_attempts' AS integer), 0)
        WHERE request ?| ARRAY['retry_at', 'planning_attempts', 'posting_attempts']
        """
    )
    op.add_column("webhook_deliveries", sa.Column("claimed_by", sa.Text()))
    op.add_column("webhook_deliveries", sa.Column("claimed_at", sa.DateTime(timezone=True)))
    op.add_column(
        "webhook_deliveries",
        sa.Column("claim_attempt", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column("webhook_deliveries", sa.Column("retry_at", sa.DateTime(timezone=True)))
    # A claim held without an attempt count was its first attempt (the older code's reading).
    op.execute(
        """
        UPDATE webhook_deliveries
        SET claimed_by = detail->>'claimed_by',
            claimed_at = CAST(detail->>'claimed_at' AS timestamptz),
            claim_attempt = COALESCE(CAST(detail->>'attempts' AS integer),
                                     CASE WHEN detail ? 'claimed_by' THEN 1 ELSE 0 END),
            retry_at = CAST(detail->>'retry_at' AS timestamptz)
        WHERE detail ?| ARRAY['claimed_by', 'claimed_at', 'attempts', 'retry_at']
        """
    )


def downgrade() -> None:
    # State in flight goes back into the jsonb the older code reads.
    op.execute(
        """
        UPDATE webhook_deliveries
        SET detail = COALESCE(detail, '{}'::jsonb)
            || jsonb_strip_nulls(jsonb_build_object(
                   'claimed_by', claimed_by, 'claimed_at', claimed_at,
                   'attempts', NULLIF(claim_attempt, 0), 'retry_at', retry_at))
        WHERE claimed_by IS NOT NULL OR claim_attempt > 0 OR retry_at IS NOT NULL
        """
    )
    for column in ("retry_at", "claim_attempt", "claimed_at", "claimed_by"):
        op.drop_column("webhook_deliveries", column)
    op.execute(
        """
        UPDATE review_jobs
        SET request = request
            || jsonb_strip_nulls(jsonb_build_object(
                   'retry_at', CAST(retry_at AS text),
                   'planning_attempts', NULLIF(planning_failures, 0),
                   'posting_attempts', NULLIF(posting_failures, 0)))
        WHERE retry_at IS NOT NULL OR planning_failures > 0 OR posting_failures > 0
        """
    )
    for column in ("posting_failures", "planning_failures", "retry_at"):
        op.drop_column("review_jobs", column)
