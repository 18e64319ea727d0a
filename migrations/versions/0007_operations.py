"""operations: dispatcher heartbeats and once-per-outage operational alerts

Revision ID: 0007_operations
Revises: 0006_engines
Create Date: 2026-12-03 17:00:00.000000

Each dispatcher process writes one `dispatchers` row and refreshes `last_seen` every heartbeat,
with the engines (LLM servers) it feeds and whether each is in rotation; a row whose
`last_seen` is older than three heartbeats is a dispatcher that died. `operational_alerts`
records alerts about the service itself (no dispatcher alive while work waits) once per outage
across every process: at most one unresolved row per kind.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007_operations"
down_revision: str | None = "0006_engines"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dispatchers",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False, server_default=""),
        sa.Column("pid", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("slots", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("running", sa.Integer(), nullable=False, server_default="0"),
        sa.Column(
            "engines",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_dispatchers")),
    )
    op.create_index("ix_dispatchers_last_seen", "dispatchers", ["last_seen"], unique=False)
    op.create_table(
        "operational_alerts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operational_alerts")),
    )
    op.create_index(
        "ix_operational_alerts_open",
        "operational_alerts",
        ["kind"],
        unique=True,
        postgresql_where=sa.text("resolved_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_operational_alerts_open", table_name="operational_alerts")
    op.drop_table("operational_alerts")
    op.drop_index("ix_dispatchers_last_seen", table_name="dispatchers")
    op.drop_table("dispatchers")
