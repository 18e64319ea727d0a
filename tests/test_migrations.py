"""Migrations: up, down, up again on an empty database, and they match the models."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from bot.db import (
    MIGRATION_LOCK_KEY,
    async_url,
    downgrade_database,
    plain_url,
    upgrade_database,
)
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


async def _waiting_advisory_locks(connection: asyncpg.Connection) -> int:
    """Sessions waiting for the migration lock (an advisory lock splits its key in two)."""
    return int(
        await connection.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND ((classid::bigint << 32) | objid::bigint) = $1",
            MIGRATION_LOCK_KEY,
        )
    )


async def test_migrations_wait_for_the_advisory_lock(empty_db_url: str) -> None:
    """A replica migrating holds the lock: another one starting waits, then finds head."""
    holder = await asyncpg.connect(plain_url(empty_db_url))
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        upgrading = asyncio.create_task(upgrade_database(empty_db_url))
        for _ in range(600):  # the upgrade runs in a thread on its own connection
            if await _waiting_advisory_locks(holder) or upgrading.done():
                break
            await asyncio.sleep(0.05)  # polling the server for a real thread; no virtual time
        assert await _waiting_advisory_locks(holder) == 1
        assert not upgrading.done()
        assert not (await _tables(empty_db_url)) & TABLES
        await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
        await upgrading
    finally:
        await holder.close()
    assert await _tables(empty_db_url) >= TABLES


async def test_replicas_migrating_together_all_succeed(empty_db_url: str) -> None:
    """Three processes run `bot db upgrade` at once, as replicas starting together do."""
    environment = {**os.environ, "DATABASE_URL": empty_db_url}
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            "db",
            "upgrade",
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(3)
    ]
    outputs = [await process.communicate() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], [
        err.decode()[-2000:] for _, err in outputs
    ]
    assert await _tables(empty_db_url) >= TABLES


async def test_fencing_migrations_keep_claims_in_flight(db_url: str) -> None:
    """Claims held while 0019/0020 run move from the jsonb into columns and back, unchanged."""
    await downgrade_database(db_url, "0018_status_outbox")
    conn = await asyncpg.connect(plain_url(db_url))
    try:
        job_id = await conn.fetchval(
            """
            INSERT INTO review_jobs (forge, repo, number, head_sha, base_level, level, state,
                                     dedupe_key, enqueued_at, last_progress_at, planned,
                                     chunks_total, request)
            VALUES ('github', 'acme/shop', 1, 'abc', 2, 2, 'running', 'k1', now(), now(), true,
                    1, jsonb_build_object('posting_by', 'poster-1',
                                          'posting_until', '2026-12-04T18:00:00+00:00',
                                          'title', 'kept'))
            RETURNING id
            """
        )
        await conn.execute(
            """
            INSERT INTO review_chunks (job_id, seq, level, state, available_at, lease_owner,
                                       lease_expires_at, attempts)
            VALUES ($1, 0, 2, 'running', now(), 'w-1', now(), 2)
            """,
            job_id,
        )
        await upgrade_database(db_url, "0019_fencing")
        row = await conn.fetchrow("SELECT * FROM review_jobs WHERE id = $1", job_id)
        assert row["posting_by"] == "poster-1" and row["posting_attempt"] == 1
        assert row["posting_until"].isoformat() == "2026-12-04T18:00:00+00:00"
        assert row["planning_by"] is None and row["planning_attempt"] == 0
        chunk = await conn.fetchrow("SELECT * FROM review_chunks WHERE job_id = $1", job_id)
        assert chunk["lease_attempt"] == 2 and chunk["lease_owner"] == "w-1"
        await upgrade_database(db_url)
        request = json.loads(
            await conn.fetchval("SELECT request FROM review_jobs WHERE id = $1", job_id)
        )
        assert request == {"title": "kept"}
        await downgrade_database(db_url, "0018_status_outbox")
        request = json.loads(
            await conn.fetchval("SELECT request FROM review_jobs WHERE id = $1", job_id)
        )
        assert request["posting_by"] == "poster-1" and request["title"] == "kept"
        assert datetime.fromisoformat(request["posting_until"]) == row["posting_until"]
        await upgrade_database(db_url)
    finally:
        await conn.close()
