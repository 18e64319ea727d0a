"""status_outbox: a job's state change owes its status a write, recorded by the change itself

Revision ID: 0008_status_outbox
Revises: 0007_operations
Create Date: 2026-12-04 17:40:00.000000

A trigger on review_jobs records, in the transaction that ends a job, that its final status
is owed (one row per job), and NOTIFYs the status publisher on every state change, so a
review that starts and ends between two passes still gets its status and no state change
waits for a poll. A Re-run marks the row `republish`. Jobs that ended before this migration
with a status still showing them queued or running are owed theirs too (seeded). A new table
and a trigger only: older workers keep working (expand step).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_status_outbox"
down_revision: str | None = "0007_operations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENDED = "('done', 'failed', 'dead', 'superseded', 'cancelled')"


def upgrade() -> None:
    op.create_table(
        "status_outbox",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("republish", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["review_jobs.id"],
            name=op.f("fk_status_outbox_job_id_review_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_status_outbox")),
    )
    op.execute(
        f"""
        CREATE FUNCTION review_jobs_status_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'UPDATE' AND OLD.state = NEW.state
               AND OLD.first_started_at IS NOT DISTINCT FROM NEW.first_started_at THEN
                RETURN NULL;
            END IF;
            IF NEW.state IN {ENDED} THEN
                INSERT INTO status_outbox (job_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
            END IF;
            PERFORM pg_notify('review_bot_status', NEW.id::text);
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER review_jobs_status_event
        AFTER INSERT OR UPDATE OF state, first_started_at ON review_jobs
        FOR EACH ROW EXECUTE FUNCTION review_jobs_status_event()
        """
    )
    op.execute(
        f"""
        INSERT INTO status_outbox (job_id)
        SELECT s.job_id FROM status_reports s JOIN review_jobs j ON j.id = s.job_id
        WHERE s.state <> 'completed' AND j.state IN {ENDED}
        ON CONFLICT DO NOTHING
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER review_jobs_status_event ON review_jobs")
    op.execute("DROP FUNCTION review_jobs_status_event()")
    op.drop_table("status_outbox")
