"""status event: a new job's wake-up is sent by intake after its commit, not by the insert

Revision ID: 0017_status_wake_after_insert
Revises: 0016_retry_columns_contract
Create Date: 2026-12-06 17:40:00.000000

The status trigger (0008) NOTIFYs the publisher on every state change, inserts included. A
NOTIFY in a transaction makes its commit wait for PostgreSQL's notify lock, held through each
earlier notifying commit's WAL flush, so intake's inserts committed one flush at a time.
Intake now wakes the publisher in a transaction of its own once the job is committed
(bot/queue/wakeups.py); the trigger keeps the outbox row and the NOTIFY for every update that
changes a state or a first start. Workers still running the older code insert jobs that reach
the publisher at its next poll (a few seconds); nothing is lost. The downgrade restores the
NOTIFY on insert.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017_status_wake_after_insert"
down_revision: str | None = "0016_retry_columns_contract"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENDED = "('done', 'failed', 'dead', 'superseded', 'cancelled')"


def _status_event(notify_on_insert: bool) -> str:
    insert_rule = (
        ""
        if notify_on_insert
        else """
            IF TG_OP = 'INSERT' THEN
                RETURN NULL;
            END IF;"""
    )
    return f"""
        CREATE OR REPLACE FUNCTION review_jobs_status_event() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'UPDATE' AND OLD.state = NEW.state
               AND OLD.first_started_at IS NOT DISTINCT FROM NEW.first_started_at THEN
                RETURN NULL;
            END IF;
            IF NEW.state IN {ENDED} THEN
                INSERT INTO status_outbox (job_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
            END IF;{insert_rule}
            PERFORM pg_notify('review_bot_status', NEW.id::text);
            RETURN NULL;
        END
        $$
        """


def upgrade() -> None:
    op.execute(_status_event(notify_on_insert=False))


def downgrade() -> None:
    op.execute(_status_event(notify_on_insert=True))
