"""Migrations: up, down, up again on an empty database, and they match the models."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime, timedelta

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
from bot.queue.store import QueueSettings, QueueStore

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


async def test_retry_column_migrations_keep_state_in_flight(db_url: str) -> None:
    """Retry times, failed tries and command claims held while 0025/0026 run move from the
    jsonb into columns, are read from there by the store, and go back on a downgrade."""
    await downgrade_database(db_url, "0024_review_costs")
    conn = await asyncpg.connect(plain_url(db_url))
    retry_at = datetime.fromisoformat("2026-12-04T18:00:00+00:00")
    try:
        job_id = await conn.fetchval(
            """
            INSERT INTO review_jobs (forge, repo, number, head_sha, base_level, level, state,
                                     dedupe_key, enqueued_at, last_progress_at, request)
            VALUES ('github', 'acme/shop', 1, 'abc', 2, 2, 'queued', 'k1', now(), now(),
                    jsonb_build_object('retry_at', '2026-12-04T18:00:00+00:00',
                                       'planning_attempts', 2, 'title', 'kept'))
            RETURNING id
            """
        )
        claimed = await conn.fetchval(
            """
            INSERT INTO webhook_deliveries (delivery_id, forge, event, received_at, outcome,
                                            detail)
            VALUES ('d-1', 'github', 'issue_comment', '2026-12-04T17:00:00+00:00',
                    'command_running',
                    jsonb_build_object('claimed_by', 'commands-1',
                                       'claimed_at', '2026-12-04T17:00:05+00:00',
                                       'attempts', 3, 'repo', 'acme/shop'))
            RETURNING id
            """
        )
        deferred = await conn.fetchval(
            """
            INSERT INTO webhook_deliveries (delivery_id, forge, event, received_at, outcome,
                                            detail)
            VALUES ('d-2', 'github', 'issue_comment', '2026-12-04T17:00:00+00:00',
                    'command_reply_pending',
                    jsonb_build_object('claimed_by', 'commands-1', 'attempts', 1,
                                       'retry_at', '2026-12-04T18:00:00+00:00',
                                       'outbox', jsonb_build_array()))
            RETURNING id
            """
        )
        await upgrade_database(db_url, "0025_retry_columns")
        job = await conn.fetchrow("SELECT * FROM review_jobs WHERE id = $1", job_id)
        assert (job["retry_at"], job["planning_failures"], job["posting_failures"]) == (
            retry_at,
            2,
            0,
        )
        row = await conn.fetchrow("SELECT * FROM webhook_deliveries WHERE id = $1", claimed)
        assert (row["claimed_by"], row["claim_attempt"], row["retry_at"]) == ("commands-1", 3, None)
        assert row["claimed_at"] == datetime.fromisoformat("2026-12-04T17:00:05+00:00")
        row = await conn.fetchrow("SELECT * FROM webhook_deliveries WHERE id = $1", deferred)
        assert (row["claim_attempt"], row["retry_at"]) == (1, retry_at)
        await upgrade_database(db_url)
        request = json.loads(
            await conn.fetchval("SELECT request FROM review_jobs WHERE id = $1", job_id)
        )
        assert request == {"title": "kept"}
        detail = json.loads(
            await conn.fetchval("SELECT detail FROM webhook_deliveries WHERE id = $1", claimed)
        )
        assert detail == {"repo": "acme/shop"}

        store = QueueStore.from_url(db_url, settings=QueueSettings(notify=False))
        try:
            early = await store.fetch_unplanned_jobs(now=retry_at - timedelta(seconds=1))
            [due] = await store.fetch_unplanned_jobs(now=retry_at)
            assert not early and due.id == job_id and due.planning_failures == 2
            taken = await store.commands.claim_pending_commands(
                owner="commands-2", now=retry_at, limit=10, lease_s=60, max_age_s=86400
            )
            assert {(item.id, item.attempts) for item in taken} == {(claimed, 4), (deferred, 2)}
        finally:
            await store.close()

        await downgrade_database(db_url, "0024_review_costs")
        request = json.loads(
            await conn.fetchval("SELECT request FROM review_jobs WHERE id = $1", job_id)
        )
        assert request["planning_attempts"] == 2 and request["title"] == "kept"
        assert datetime.fromisoformat(request["retry_at"]) == retry_at
        detail = json.loads(
            await conn.fetchval("SELECT detail FROM webhook_deliveries WHERE id = $1", claimed)
        )
        assert (detail["claimed_by"], detail["attempts"], detail["repo"]) == (
            "commands-2",
            4,
            "acme/shop",
        )
        await upgrade_database(db_url)
    finally:
        await conn.close()
