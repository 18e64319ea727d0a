"""engines: the engine a chunk ran on, and a report of each engine's work

Revision ID: 0006_engines
Revises: 0005_report_views
Create Date: 2026-12-03 18:10:00.000000

A chunk's lease names the engine (LLM server) it runs on, so every dispatcher process counts
what runs on each engine from the database and keeps to its window. `report_engines` sums each
engine's chunks, tokens and engine seconds per hour; under batching `gpu_s` is the engine time
the chunks were charged (their shares of what they ran alongside), not their latency.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_engines"
down_revision: str | None = "0005_report_views"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REPORT_ENGINES = """
CREATE VIEW report_engines AS
SELECT c.engine,
       date_trunc('hour', c.finished_at AT TIME ZONE 'UTC') AS hour,
       count(*) AS chunks,
       sum(COALESCE((c.result -> 'usage' ->> 'prompt_tokens')::bigint, 0)) AS prompt_tokens,
       sum(COALESCE((c.result -> 'usage' ->> 'completion_tokens')::bigint, 0))
           AS completion_tokens,
       round(sum(c.gpu_seconds)::numeric, 3) AS gpu_s,
       round(sum(EXTRACT(EPOCH FROM c.finished_at - c.started_at))::numeric, 3) AS latency_s,
       -- completion tokens per engine second: what the engine made of the time it had
       round((sum(COALESCE((c.result -> 'usage' ->> 'completion_tokens')::bigint, 0))
              / NULLIF(sum(c.gpu_seconds), 0))::numeric, 1) AS tokens_per_gpu_s
FROM review_chunks c
WHERE c.state = 'done' AND c.engine IS NOT NULL
GROUP BY c.engine, date_trunc('hour', c.finished_at AT TIME ZONE 'UTC')
"""


def upgrade() -> None:
    op.add_column("review_chunks", sa.Column("engine", sa.Text(), nullable=True))
    op.create_index(
        "ix_review_chunks_engine",
        "review_chunks",
        ["engine"],
        postgresql_where=sa.text("state = 'running'"),
    )
    op.execute(REPORT_ENGINES)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS report_engines")
    op.drop_index("ix_review_chunks_engine", table_name="review_chunks")
    op.drop_column("review_chunks", "engine")
