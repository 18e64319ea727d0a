"""fencing: the jsonb copies of planning and posting claims are removed (contract)

Revision ID: 0010_fencing_contract
Revises: 0009_fencing
Create Date: 2026-12-04 17:46:00.000000

Once no worker runs the code that read claims from `request` (0009 moved them into columns),
the stale keys are dropped so nothing can mistake them for a live claim. The downgrade puts
them back from the columns.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010_fencing_contract"
down_revision: str | None = "0009_fencing"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEYS = "ARRAY['planning_by', 'planning_until', 'posting_by', 'posting_until']"


def upgrade() -> None:
    op.execute(f"UPDATE review_jobs SET request = request - {KEYS} WHERE request ?| {KEYS}")


def downgrade() -> None:
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
