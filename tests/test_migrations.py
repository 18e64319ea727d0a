"""Migrations: up, down, up again on an empty database, and they match the models."""

from __future__ import annotations

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from bot.db import async_url, downgrade_database, plain_url, upgrade_database
from bot.queue.schema import metadata

TABLES = {"review_jobs", "review_chunks", "webhook_deliveries", "job_history"}


async def _tables(url: str) -> set[str]:
    conn = await asyncpg.connect(plain_url(url))
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    return {row["tablename"] for row in rows}


async def test_upgrade_downgrade_upgrade(empty_db_url: str) -> None:
    assert not (await _tables(empty_db_url)) & TABLES
    await upgrade_database(empty_db_url)
    assert await _tables(empty_db_url) >= TABLES
    await downgrade_database(empty_db_url, "base")
    assert not (await _tables(empty_db_url)) & TABLES
    await upgrade_database(empty_db_url)
    assert await _tables(empty_db_url) >= TABLES


async def test_migrations_match_models(db_url: str) -> None:
    engine = create_async_engine(async_url(db_url))

    def _diff(sync_conn):  # type: ignore[no-untyped-def]
        context = MigrationContext.configure(sync_conn, opts={"compare_type": True})
        return compare_metadata(context, metadata)

    async with engine.connect() as conn:
        differences = await conn.run_sync(_diff)
    await engine.dispose()
    assert differences == []
