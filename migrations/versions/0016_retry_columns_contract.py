"""retry and claim state: the jsonb copies are removed (contract)

Revision ID: 0016_retry_columns_contract
Revises: 0015_retry_columns
Create Date: 2026-12-04 21:01:00.000000

Once no worker runs the code that read retry times, failed tries and command claims from
`review_jobs.request` and `webhook_deliveries.detail` (0015 moved them into columns), the
stale keys are dropped so nothing can mistake them for live state. The downgrade puts them
back from the columns.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016_retry_columns_contract"
down_revision: str | None = "0015_retry_columns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_KEYS = "ARRAY['retry_at', 'planning_attempts', 'posting_attempts']"
DELIVERY_KEYS = "ARRAY['claimed_by', 'claimed_at', 'attempts', 'retry_at']"


def upgrade() -> None:
    op.execute(f"UPDATE review_jobs SET request = request - {JOB_KEYS} WHERE request ?| {JOB_KEYS}")
    op.execute(
        f"UPDATE webhook_deliveries SET detail = detail - {DELIVERY_KEYS}"
        f" WHERE detail ?| {DELIVERY_KEYS}"
    )


def downgrade() -> None:
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
